package bitcoin

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/btcsuite/btcd/blockchain"
	"github.com/btcsuite/btcd/btcutil"
	"github.com/btcsuite/btcd/chaincfg"
	"github.com/btcsuite/btcd/txscript"
	"github.com/btcsuite/btcd/wire"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/scan"
)

// BlocksPerRange is the most blocks one scan batch reads: raw blocks are
// up to a few megabytes each.
const BlocksPerRange = 25

// Source reads a Bitcoin network for scan.Scanner: the outputs of its
// blocks that pay a watched address, one transfer per output (txid and
// output index). Blocks are read raw (getblock verbosity 0) and decoded
// with btcd's wire, which btcd and Bitcoin Core answer alike.
type Source struct {
	network *paywatch.Network
	params  *chaincfg.Params
	nodes   *scan.Nodes[*client]
	asset   *paywatch.Asset
	watch   *WatchSet
	log     *slog.Logger
	// announce logs the size of the watch set once it is first loaded.
	announce sync.Once
}

var (
	_ scan.Source      = (*Source)(nil)
	_ scan.HashBatcher = (*Source)(nil)
	_ scan.HeadHasher  = (*Source)(nil)
)

// chainNames are the names nodes give each configured chain in
// getblockchaininfo (Bitcoin Core's first, btcd's second).
var chainNames = map[string][]string{
	"mainnet": {"main", "mainnet"},
	"testnet": {"test", "testnet3"},
	"signet":  {"signet"},
	"regtest": {"regtest"},
	"simnet":  {"simnet"},
}

// NewSource prepares a Source for a bitcoin network watching the scripts
// of watch. It contacts no node.
func NewSource(n *paywatch.Network, cred Credentials, watch *WatchSet, log *slog.Logger) (*Source, error) {
	params, err := Params(n.Chain)
	if err != nil {
		return nil, err
	}
	var asset *paywatch.Asset
	for _, a := range n.Assets {
		if a.Native {
			asset = a
		}
	}
	if asset == nil {
		return nil, fmt.Errorf("network %s has no native asset to watch", n.Name)
	}
	nodes, err := scan.NewNodes(n.RPCURLs, func(u string) (*client, error) { return newClient(u, cred) })
	if err != nil {
		return nil, err
	}
	log = log.With("network", n.Name)
	nodes.Log = log
	nodes.Check = func(ctx context.Context, c *client) error {
		var info struct {
			Chain string `json:"chain"`
		}
		if err := c.one(ctx, &info, "getblockchaininfo"); err != nil {
			return fmt.Errorf("read the node's chain: %w", err)
		}
		if !slices.Contains(chainNames[n.Chain], info.Chain) {
			return fmt.Errorf("node is on chain %q, the configuration says %s", info.Chain, n.Chain)
		}
		return nil
	}
	return &Source{network: n, params: params, nodes: nodes, asset: asset, watch: watch, log: log}, nil
}

// SetCallTimeout bounds each call (or batch) to one node; past it, the
// next node is tried.
func (s *Source) SetCallTimeout(d time.Duration) { s.nodes.CallTimeout = d }

// MaxRange is the widest batch the scanner should ask for.
func (s *Source) MaxRange() uint64 { return BlocksPerRange }

// ReadAhead is how many batches the scanner reads ahead: one. Raw blocks
// are large (a request's answer can hold several megabytes each), and a
// Bitcoin catch-up is bound by decoding them, not by the node's distance.
func (s *Source) ReadAhead() int { return 1 }

// Head returns the node's best height (Bitcoin has no finality tag).
func (s *Source) Head(ctx context.Context) (scan.Head, error) {
	s.preferAhead(ctx)
	var count int64
	err := s.nodes.Call(ctx, func(ctx context.Context, c *client) error {
		return c.one(ctx, &count, "getblockcount")
	})
	return scan.Head{Number: uint64(count)}, err
}

// preferAhead makes the node furthest ahead the current one when the
// current lags behind it (scan.Nodes.PreferAhead).
func (s *Source) preferAhead(ctx context.Context) {
	s.nodes.PreferAhead(ctx, func(ctx context.Context, c *client) (uint64, error) {
		var count int64
		err := c.one(ctx, &count, "getblockcount")
		return uint64(count), err
	}, func(ctx context.Context, c *client, n uint64) (string, error) {
		var hash string
		err := c.one(ctx, &hash, "getblockhash", n)
		return hash, err
	})
}

// BlockHash returns the canonical hash at height n.
func (s *Source) BlockHash(ctx context.Context, n uint64) (string, error) {
	hashes, err := s.BlockHashes(ctx, []uint64{n})
	if err != nil {
		return "", err
	}
	if hashes[0] == "" {
		return "", scan.ErrNoBlock
	}
	return hashes[0], nil
}

// BlockHashes returns the canonical hashes at many heights in one batch;
// "" where the node has no block.
func (s *Source) BlockHashes(ctx context.Context, numbers []uint64) ([]string, error) {
	out := make([]string, len(numbers))
	err := s.nodes.Call(ctx, func(ctx context.Context, c *client) error {
		calls := make([]*call, len(numbers))
		for i, n := range numbers {
			calls[i] = &call{Method: "getblockhash", Params: []any{n}, Result: &out[i]}
		}
		if err := c.do(ctx, calls); err != nil {
			return err
		}
		for i, cl := range calls {
			switch {
			case noBlock(cl.Err):
				out[i] = ""
			case cl.Err != nil:
				return fmt.Errorf("getblockhash %d: %w", numbers[i], cl.Err)
			}
		}
		return nil
	})
	return out, err
}

// HeadAndHash reads the head and the hash at height n in one batch ("" for
// the hash when there is no block there).
func (s *Source) HeadAndHash(ctx context.Context, n uint64) (scan.Head, string, error) {
	s.preferAhead(ctx)
	var count int64
	var hash string
	err := s.nodes.Call(ctx, func(ctx context.Context, c *client) error {
		head := &call{Method: "getblockcount", Result: &count}
		at := &call{Method: "getblockhash", Params: []any{n}, Result: &hash}
		if err := c.do(ctx, []*call{head, at}); err != nil {
			return err
		}
		if head.Err != nil {
			return fmt.Errorf("getblockcount: %w", head.Err)
		}
		if at.Err != nil && !noBlock(at.Err) {
			return fmt.Errorf("getblockhash %d: %w", n, at.Err)
		}
		return nil
	})
	return scan.Head{Number: uint64(count)}, hash, err
}

// Scan returns the outputs paying watched addresses in blocks [from, to].
// The head, the hashes of the range and of its parent travel in one batch,
// the raw blocks in a second.
func (s *Source) Scan(ctx context.Context, from, to uint64) (*scan.Batch, error) {
	if err := s.watch.Refresh(ctx); err != nil {
		return nil, err
	}
	s.announce.Do(func() { s.log.Info("watching addresses", "scripts", s.watch.Len()) })
	coverage := s.watch.coverage()
	first := from
	if from > 0 {
		first = from - 1 // the parent, to anchor the range
	}
	heights := make([]uint64, 0, to-first+1)
	for h := first; h <= to; h++ {
		heights = append(heights, h)
	}
	var count int64
	hashes := make([]string, len(heights))
	err := s.nodes.Call(ctx, func(ctx context.Context, c *client) error {
		calls := []*call{{Method: "getblockcount", Result: &count}}
		for i, h := range heights {
			calls = append(calls, &call{Method: "getblockhash", Params: []any{h}, Result: &hashes[i]})
		}
		if err := c.do(ctx, calls); err != nil {
			return err
		}
		for i, cl := range calls {
			switch {
			case cl.Err == nil:
			case i > 0 && noBlock(cl.Err):
				return fmt.Errorf("block %d: %w", heights[i-1], scan.ErrNoBlock)
			default:
				return fmt.Errorf("%s: %w", cl.Method, cl.Err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read blocks %d-%d: %w", from, to, err)
	}
	b := &scan.Batch{Head: &scan.Head{Number: uint64(count)}}
	prev := ""
	for i, h := range heights {
		b.Blocks = append(b.Blocks, scan.Block{Number: h, Hash: hashes[i]})
		if h < from {
			b.Parent = &scan.Block{Number: h, Hash: hashes[i]}
			prev = hashes[i]
		}
	}
	// The raw blocks, a few per request, each decoded and let go before
	// the next are read: a batch never holds more than a few blocks.
	for start := 0; start < len(heights); start += rawBlocksPerRequest {
		end := min(start+rawBlocksPerRequest, len(heights))
		raws := make([]string, end-start)
		err := s.nodes.Call(ctx, func(ctx context.Context, c *client) error {
			var calls []*call
			for i := start; i < end; i++ {
				if heights[i] >= from {
					calls = append(calls, &call{Method: "getblock", Params: []any{hashes[i], 0}, Result: &raws[i-start]})
				}
			}
			if err := c.do(ctx, calls); err != nil {
				return err
			}
			for _, cl := range calls {
				if cl.Err != nil {
					// A block replaced meanwhile: the node no longer serves
					// it on the main chain.
					return fmt.Errorf("getblock %v: %w", cl.Params[0], cl.Err)
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("read blocks %d-%d: %w", from, to, err)
		}
		for i := start; i < end; i++ {
			h := heights[i]
			if h < from {
				continue
			}
			block, txs, err := decodeBlock(raws[i-start], hashes[i])
			raws[i-start] = ""
			if err != nil {
				return nil, fmt.Errorf("block %d: %w", h, err)
			}
			if prev != "" && block.Header.PrevBlock.String() != prev {
				return nil, fmt.Errorf("block %d does not follow block %d: the chain moved while it was read", h, h-1)
			}
			prev = hashes[i]
			b.Transfers = append(b.Transfers, s.outputs(block, txs, h, hashes[i])...)
		}
	}
	if err := s.watch.checkCovered(ctx, coverage); err != nil {
		return nil, err
	}
	return b, nil
}

// rawBlocksPerRequest is how many raw blocks one request reads (a full
// mainnet block is up to 4 MB, 8 MB as hex).
const rawBlocksPerRequest = 4

// decodeBlock decodes a raw block and checks it is the one asked for; it
// returns its transactions with their hashes.
func decodeBlock(raw, hash string) (*wire.MsgBlock, []*btcutil.Tx, error) {
	data, err := hex.DecodeString(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("raw block is not hex: %w", err)
	}
	var block wire.MsgBlock
	if err := block.Deserialize(bytes.NewReader(data)); err != nil {
		return nil, nil, fmt.Errorf("decode raw block: %w", err)
	}
	if got := block.BlockHash().String(); got != hash {
		return nil, nil, fmt.Errorf("the node sent block %s for %s", got, hash)
	}
	if len(block.Transactions) == 0 {
		return nil, nil, fmt.Errorf("block %s has no transactions", hash) // not even a coinbase
	}
	// The header is the block asked for; its merkle root ties the
	// transactions to it.
	txs := make([]*btcutil.Tx, len(block.Transactions))
	for i, tx := range block.Transactions {
		txs[i] = btcutil.NewTx(tx)
	}
	if root := blockchain.CalcMerkleRoot(txs, false); root != block.Header.MerkleRoot {
		return nil, nil, fmt.Errorf("the transactions of block %s do not match its header's merkle root", hash)
	}
	return &block, txs, nil
}

// outputs returns the transfers of a block's outputs to watched scripts.
func (s *Source) outputs(block *wire.MsgBlock, txs []*btcutil.Tx, height uint64, hash string) []scan.Found {
	var found []scan.Found
	at := block.Header.Timestamp.UTC()
	for n, tx := range block.Transactions {
		var txid string
		for i, out := range tx.TxOut {
			if out.Value <= 0 || !s.watch.Has(out.PkScript) {
				continue
			}
			if txid == "" {
				txid = txs[n].Hash().String()
			}
			f := s.transfer(txid, i, out, height, hash, at)
			if n == 0 {
				// A miner's reward: spendable only after 100 blocks, and
				// no customer's payment. An operator decides.
				f.Flags = append(f.Flags, "coinbase")
			}
			found = append(found, f)
		}
	}
	return found
}

// transfer is one watched output as a scan.Found.
func (s *Source) transfer(txid string, vout int, out *wire.TxOut, height uint64, hash string, at time.Time) scan.Found {
	f := scan.Found{Asset: s.asset, TxHash: txid, TxKey: "vout:" + strconv.Itoa(vout), Index: int64(vout),
		To: s.address(out.PkScript), Amount: big.NewInt(out.Value), BlockNumber: height, BlockHash: hash, BlockTime: at}
	if s.asset.Dust != nil && f.Amount.Cmp(s.asset.Dust) < 0 {
		f.Flags = append(f.Flags, "dust")
	}
	return f
}

// address renders an output script as the address it pays.
func (s *Source) address(script []byte) string {
	_, addrs, _, err := txscript.ExtractPkScriptAddrs(script, s.params)
	if err != nil || len(addrs) != 1 {
		return hex.EncodeToString(script)
	}
	return addrs[0].EncodeAddress()
}

// LookupTx reads one transaction from the node and returns its outputs to
// watched addresses, for a customer's claim the scanner has not reached.
// A transaction not mined (or unknown to the node, which may keep no index
// of transactions) yields nothing.
func (s *Source) LookupTx(ctx context.Context, txid string) ([]scan.Found, error) {
	if !ValidTxHash(txid) {
		return nil, fmt.Errorf("%q is not a transaction id", txid)
	}
	if err := s.watch.Refresh(ctx); err != nil {
		return nil, err
	}
	var tx struct {
		Hex       string `json:"hex"`
		BlockHash string `json:"blockhash"`
	}
	var header struct {
		Height int64 `json:"height"`
		Time   int64 `json:"time"`
	}
	err := s.nodes.Call(ctx, func(ctx context.Context, c *client) error {
		// Nothing of an attempt that failed (another node's, or a dropped
		// connection's) is kept: a block hash read before the transaction
		// went back to the mempool would say it is mined.
		tx.Hex, tx.BlockHash, header.Height, header.Time = "", "", 0, 0
		if err := c.one(ctx, &tx, "getrawtransaction", txid, 1); err != nil {
			return err
		}
		if tx.BlockHash == "" {
			return nil
		}
		return c.one(ctx, &header, "getblockheader", tx.BlockHash, true)
	})
	switch {
	case noTx(err):
		return nil, nil // unknown to the node (or it keeps no index)
	case err != nil:
		return nil, err // a node down is not "not found"
	case tx.BlockHash == "":
		return nil, nil // not mined yet
	}
	data, err := hex.DecodeString(tx.Hex)
	if err != nil {
		return nil, fmt.Errorf("raw transaction is not hex: %w", err)
	}
	var msg wire.MsgTx
	if err := msg.Deserialize(bytes.NewReader(data)); err != nil {
		return nil, fmt.Errorf("decode raw transaction: %w", err)
	}
	if msg.TxHash().String() != txid {
		return nil, errors.New("the node sent another transaction")
	}
	var found []scan.Found
	at := time.Unix(header.Time, 0).UTC()
	for i, out := range msg.TxOut {
		if out.Value > 0 && s.watch.Has(out.PkScript) {
			f := s.transfer(txid, i, out, uint64(header.Height), tx.BlockHash, at)
			if blockchain.IsCoinBaseTx(&msg) {
				f.Flags = append(f.Flags, "coinbase")
			}
			found = append(found, f)
		}
	}
	return found, nil
}
