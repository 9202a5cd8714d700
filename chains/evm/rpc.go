package evm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/paywatch/paywatch/chains/scan"
)

// endpoint is one node URL.
type endpoint struct {
	url string
	rpc *rpc.Client
	eth *ethclient.Client
}

// nodes are a network's node URLs, used in turn (scan.Nodes), each checked
// once to be on the configured chain; a node's refusal of a range's size
// is reported as scan.ErrRangeTooLarge, which another node is not asked.
type nodes struct {
	*scan.Nodes[*endpoint]
}

func dialNodes(urls []string, chainID uint64, log *slog.Logger) (*nodes, error) {
	// For HTTP this opens no connection yet: an unreachable node is found
	// out by the first call, not here.
	n, err := scan.NewNodes(urls, func(u string) (*endpoint, error) {
		c, err := rpc.DialOptions(context.Background(), u, rpc.WithHTTPClient(httpClient(u)))
		if err != nil {
			return nil, err
		}
		return &endpoint{url: u, rpc: c, eth: ethclient.NewClient(c)}, nil
	})
	if err != nil {
		return nil, err
	}
	n.Log = log
	n.Check = func(ctx context.Context, e *endpoint) error {
		id, err := e.eth.ChainID(ctx)
		if err != nil {
			return fmt.Errorf("read chain id: %w", err)
		}
		if id.Uint64() != chainID {
			return fmt.Errorf("node is on chain %s, the configuration says %d", id, chainID)
		}
		return nil
	}
	return &nodes{n}, nil
}

// idleConnsPerNode is how many connections to a node are kept open between
// calls: the scan's reads ahead, the head reads and the verifier's calls
// run at once, and the default of two would close and open connections
// all through a catch-up (a TLS handshake each, for a hosted node).
const idleConnsPerNode = 8

// httpClient is the HTTP client of the node at rawURL. A node on the
// loopback interface is asked for its answers uncompressed: the bytes never
// leave the machine, and compressing them (eth_getLogs answers of hundreds
// of kilobytes) costs the node's CPU and paywatch's, which share the
// machine: a quarter of a catch-up's time here. A node elsewhere is asked
// for them compressed, as Go's client does by default.
func httpClient(rawURL string) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = idleConnsPerNode
	t.DisableCompression = loopback(rawURL)
	return &http.Client{Transport: t}
}

// loopback reports whether rawURL names a host on the loopback interface.
func loopback(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

func (n *nodes) close() {
	for _, e := range n.Endpoints {
		e.rpc.Close()
	}
}

// call runs fn on the nodes in turn (scan.Nodes.Call).
func (n *nodes) call(ctx context.Context, fn func(ctx context.Context, e *endpoint) error) error {
	return n.Call(ctx, func(ctx context.Context, e *endpoint) error {
		err := fn(ctx, e)
		if err != nil && rangeRefused(err) {
			return fmt.Errorf("%w: %v", scan.ErrRangeTooLarge, err)
		}
		return err
	})
}

// rangeRefused recognises a node's refusal of a log query's size: the
// -32005 "limit exceeded" code and the messages providers use for too many
// results, too wide a range or a query that ran too long on their side. A
// call that gets no answer in time is not one: the next node is tried.
func rangeRefused(err error) bool {
	msg := strings.ToLower(err.Error())
	if errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "too many requests") || strings.Contains(msg, "rate limit") {
		return false // a rate limit is no answer about the range
	}
	var rpcErr rpc.Error
	if errors.As(err, &rpcErr) && rpcErr.ErrorCode() == -32005 {
		return true
	}
	for _, s := range []string{"too many", "range", "limit exceeded", "query returned more than", "response size", "query timeout", "exceeds"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// blockRef is the part of eth_getBlockByNumber's answer paywatch reads
// when it needs no transactions.
type blockRef struct {
	Number hexutil.Uint64 `json:"number"`
	Hash   common.Hash    `json:"hash"`
}

// fullBlock is a block with its transactions (eth_getBlockByNumber, true).
type fullBlock struct {
	Number       hexutil.Uint64 `json:"number"`
	Hash         common.Hash    `json:"hash"`
	Time         hexutil.Uint64 `json:"timestamp"`
	Transactions []rpcTx        `json:"transactions"`
}

type rpcTx struct {
	Hash             common.Hash     `json:"hash"`
	From             common.Address  `json:"from"`
	To               *common.Address `json:"to"`
	Value            *hexutil.Big    `json:"value"`
	TransactionIndex hexutil.Uint64  `json:"transactionIndex"`
}

type rpcReceipt struct {
	Status    hexutil.Uint64 `json:"status"`
	BlockHash common.Hash    `json:"blockHash"`
}

// header reads a block's number and hash by tag ("latest", "finalized",
// "0x1f"); ErrNoBlock when the node has none there.
func header(ctx context.Context, e *endpoint, tag string) (blockRef, error) {
	var raw *blockRef
	if err := e.rpc.CallContext(ctx, &raw, "eth_getBlockByNumber", tag, false); err != nil {
		return blockRef{}, err
	}
	if raw == nil {
		return blockRef{}, scan.ErrNoBlock
	}
	return *raw, nil
}

func blockTag(n uint64) string { return hexutil.EncodeUint64(n) }

// batch runs JSON-RPC calls in batches of at most batchSize.
func batch(ctx context.Context, e *endpoint, elems []rpc.BatchElem) error {
	const batchSize = 200
	for i := 0; i < len(elems); i += batchSize {
		part := elems[i:min(i+batchSize, len(elems))]
		if err := e.rpc.BatchCallContext(ctx, part); err != nil {
			return err
		}
		for _, el := range part {
			if el.Error != nil {
				return fmt.Errorf("%s: %w", el.Method, el.Error)
			}
		}
	}
	return nil
}
