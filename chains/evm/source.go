package evm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/scan"
)

// TransferTopic is the topic of Transfer(address,address,uint256).
var TransferTopic = crypto.Keccak256Hash([]byte("Transfer(address,address,uint256)"))

// Flags set on transfers that must never match an order.
const (
	FlagDust            = "dust"
	FlagBalanceMismatch = "balance_mismatch"  // a Transfer event without the balance moving
	FlagBalanceUnknown  = "balance_unchecked" // the node had no state to check against
)

// TopicFilterMax is the largest watch set sent to the node as a topic
// filter; above it, all Transfer logs of the configured contracts are read
// and filtered here.
const TopicFilterMax = 256

// Source reads an EVM network for scan.Scanner: ERC-20 Transfer logs of the
// configured token contracts and native transfers to watched addresses.
type Source struct {
	network *paywatch.Network
	nodes   *nodes
	log     *slog.Logger

	tokens      map[common.Address]*paywatch.Asset
	tokenWatch  map[common.Address]map[common.Address]bool // contract → watched recipients
	native      *paywatch.Asset
	nativeWatch map[common.Address]bool
	// VerifyBalances checks, for every block and recipient with incoming
	// token transfers, that the recipient's balance moved by as much as the
	// Transfer events say (the "fake deposit" guard). Scan flags such
	// transfers scan.FlagBalancePending and Verify decides them.
	VerifyBalances bool
	// verifySpan is the widest block range Verify reads logs over; it
	// halves when the node refuses a range.
	verifySpan atomic.Uint64
	// verifyKeys is how many checks one call carries (MaxVerifyKeys when
	// zero); it halves while the node times out.
	verifyKeys atomic.Int64

	filterOnce      sync.Once
	filterContracts []common.Address
	filterTopics    [][]common.Hash
}

var _ scan.Source = (*Source)(nil)
var _ scan.HashBatcher = (*Source)(nil)
var _ scan.HeadHasher = (*Source)(nil)
var _ scan.Verifier = (*Source)(nil)
var _ scan.HashScanner = (*Source)(nil)

// NewSource prepares a Source for an evm network. It contacts no node.
func NewSource(n *paywatch.Network, log *slog.Logger) (*Source, error) {
	nodes, err := dialNodes(n.RPCURLs, n.ChainID, log.With("network", n.Name))
	if err != nil {
		return nil, err
	}
	s := &Source{network: n, nodes: nodes, log: log, tokens: map[common.Address]*paywatch.Asset{},
		tokenWatch: map[common.Address]map[common.Address]bool{}, nativeWatch: map[common.Address]bool{},
		VerifyBalances: true}
	for _, a := range n.Assets {
		watch := map[common.Address]bool{}
		for _, addr := range a.Addresses {
			watch[common.HexToAddress(addr)] = true
		}
		if a.Native {
			s.native, s.nativeWatch = a, watch
			continue
		}
		c := common.HexToAddress(a.Contract)
		s.tokens[c], s.tokenWatch[c] = a, watch
	}
	return s, nil
}

// SetCallTimeout bounds each JSON-RPC call (or batch) to one node; past
// it, the next node is tried. The default is scan.DefaultCallTimeout.
func (s *Source) SetCallTimeout(d time.Duration) { s.nodes.CallTimeout = d }

// SetLagCheckInterval sets how often the nodes' heads are compared
// (scan.LagCheckInterval by default).
func (s *Source) SetLagCheckInterval(d time.Duration) { s.nodes.LagCheckEvery = d }

// Close closes the node connections.
func (s *Source) Close() { s.nodes.close() }

// Head reads the latest block and, with confirmations: finalized, the
// finalized one.
func (s *Source) Head(ctx context.Context) (scan.Head, error) {
	s.preferAhead(ctx)
	var h scan.Head
	err := s.nodes.call(ctx, func(ctx context.Context, e *endpoint) error {
		latest, err := header(ctx, e, "latest")
		if err != nil {
			return err
		}
		h.Number = uint64(latest.Number)
		if s.network.UseFinalized {
			fin, err := header(ctx, e, "finalized")
			if err != nil && !errors.Is(err, scan.ErrNoBlock) {
				return fmt.Errorf("read finalized block: %w", err)
			}
			h.Finalized = uint64(fin.Number)
		}
		return nil
	})
	return h, err
}

// HeadAndHash reads the head and the canonical hash at height n in one
// JSON-RPC batch ("" when the node has no block there).
func (s *Source) HeadAndHash(ctx context.Context, n uint64) (scan.Head, string, error) {
	s.preferAhead(ctx)
	var h scan.Head
	hash := ""
	err := s.nodes.call(ctx, func(ctx context.Context, e *endpoint) error {
		var latest, at, fin *blockRef
		elems := []rpc.BatchElem{
			{Method: "eth_getBlockByNumber", Args: []any{"latest", false}, Result: &latest},
			{Method: "eth_getBlockByNumber", Args: []any{blockTag(n), false}, Result: &at},
		}
		if s.network.UseFinalized {
			elems = append(elems, rpc.BatchElem{Method: "eth_getBlockByNumber", Args: []any{"finalized", false}, Result: &fin})
		}
		if err := batch(ctx, e, elems); err != nil {
			return err
		}
		if latest == nil {
			return fmt.Errorf("read head: %w", scan.ErrNoBlock)
		}
		h = scan.Head{Number: uint64(latest.Number)}
		if fin != nil {
			h.Finalized = uint64(fin.Number)
		}
		if at != nil {
			hash = at.Hash.Hex()
		}
		return nil
	})
	return h, hash, err
}

// preferAhead makes the node furthest ahead the current one when the
// current lags behind it (scan.Nodes.PreferAhead).
func (s *Source) preferAhead(ctx context.Context) {
	s.nodes.PreferAhead(ctx, func(ctx context.Context, e *endpoint) (uint64, error) {
		h, err := header(ctx, e, "latest") // as the scanner reads the head
		return uint64(h.Number), err
	}, func(ctx context.Context, e *endpoint, n uint64) (string, error) {
		h, err := header(ctx, e, blockTag(n))
		return h.Hash.Hex(), err
	})
}

// BlockHash returns the canonical hash at height n.
func (s *Source) BlockHash(ctx context.Context, n uint64) (string, error) {
	var h string
	err := s.nodes.call(ctx, func(ctx context.Context, e *endpoint) error {
		b, err := header(ctx, e, blockTag(n))
		h = b.Hash.Hex()
		return err
	})
	return h, err
}

// BlockHashes returns the canonical hashes at many heights in batched calls;
// "" where the node has no block.
func (s *Source) BlockHashes(ctx context.Context, numbers []uint64) ([]string, error) {
	out := make([]string, len(numbers))
	err := s.nodes.call(ctx, func(ctx context.Context, e *endpoint) error {
		refs := make([]*blockRef, len(numbers))
		elems := make([]rpc.BatchElem, len(numbers))
		for i, n := range numbers {
			elems[i] = rpc.BatchElem{Method: "eth_getBlockByNumber", Args: []any{blockTag(n), false}, Result: &refs[i]}
		}
		if err := batch(ctx, e, elems); err != nil {
			return err
		}
		for i, r := range refs {
			if r != nil {
				out[i] = r.Hash.Hex()
			}
		}
		return nil
	})
	return out, err
}

// Scan returns the token and native transfers to watched addresses in
// blocks [from, to]. The logs, the hashes of the range's last block and of
// its parent, and the head travel in one JSON-RPC batch: one round trip per
// range when the node is far away.
func (s *Source) Scan(ctx context.Context, from, to uint64) (*scan.Batch, error) {
	return s.ScanWithHashes(ctx, from, to, nil)
}

// ScanWithHashes is Scan that also reads the canonical hashes at heights,
// in the same JSON-RPC batch, after the logs.
func (s *Source) ScanWithHashes(ctx context.Context, from, to uint64, heights []uint64) (*scan.Batch, error) {
	var latest, finalized, last, parent *blockRef
	var wire []wireLog
	var incoming []types.Log
	elems := []rpc.BatchElem{
		{Method: "eth_getBlockByNumber", Args: []any{"latest", false}, Result: &latest},
		{Method: "eth_getBlockByNumber", Args: []any{blockTag(to), false}, Result: &last},
	}
	if from > 0 {
		elems = append(elems, rpc.BatchElem{Method: "eth_getBlockByNumber", Args: []any{blockTag(from - 1), false}, Result: &parent})
	}
	if s.network.UseFinalized {
		elems = append(elems, rpc.BatchElem{Method: "eth_getBlockByNumber", Args: []any{"finalized", false}, Result: &finalized})
	}
	logsAt := len(elems)
	if len(s.tokens) > 0 {
		elems = append(elems, rpc.BatchElem{Method: "eth_getLogs", Args: []any{s.incomingFilter(from, to)}, Result: &wire})
	}
	hashesAt := len(elems)
	refs := make([]*blockRef, len(heights))
	for i, n := range heights {
		elems = append(elems, rpc.BatchElem{Method: "eth_getBlockByNumber", Args: []any{blockTag(n), false}, Result: &refs[i]})
	}
	err := s.nodes.call(ctx, func(ctx context.Context, e *endpoint) error {
		// Each node's answer alone: nothing a node that failed answered
		// stays in what the next one answers (JSON decodes into what is
		// already there).
		latest, finalized, last, parent, wire = nil, nil, nil, nil, nil
		clear(refs)
		if err := e.rpc.BatchCallContext(ctx, elems); err != nil {
			return err
		}
		for i, el := range elems {
			if el.Error == nil {
				continue
			}
			if i >= logsAt && i < hashesAt && rangeRefused(el.Error) {
				return fmt.Errorf("%w: %v", scan.ErrRangeTooLarge, el.Error)
			}
			return fmt.Errorf("%s: %w", el.Method, el.Error)
		}
		var err error
		if incoming, err = decodeLogs(wire); err != nil {
			return fmt.Errorf("eth_getLogs: %w", err)
		}
		// A node (or a relay in front of it) that ignores the range asked
		// for must not move the cursor past blocks nobody read.
		for _, l := range incoming {
			if l.BlockNumber < from || l.BlockNumber > to {
				return fmt.Errorf("eth_getLogs for blocks %d-%d answered a log of block %d", from, to, l.BlockNumber)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read blocks %d-%d: %w", from, to, err)
	}
	if latest == nil || last == nil || (from > 0 && parent == nil) {
		return nil, fmt.Errorf("blocks %d-%d: %w", from, to, scan.ErrNoBlock)
	}
	b := &scan.Batch{
		Head:   &scan.Head{Number: uint64(latest.Number)},
		Blocks: []scan.Block{{Number: to, Hash: last.Hash.Hex()}},
	}
	if finalized != nil {
		b.Head.Finalized = uint64(finalized.Number)
	}
	if parent != nil {
		b.Parent = &scan.Block{Number: from - 1, Hash: parent.Hash.Hex()}
	}
	if len(heights) > 0 {
		b.Hashes = make(map[uint64]string, len(heights)+1)
		for i, n := range heights {
			if refs[i] != nil {
				b.Hashes[n] = refs[i].Hash.Hex()
			}
		}
	}
	if len(s.tokens) > 0 {
		found := s.tokenTransfers(incoming)
		if err := s.fillBlockTimes(ctx, found); err != nil {
			return nil, err
		}
		for i := range found {
			// The fake-deposit check comes after the transfer is recorded
			// (Verify): until then it cannot confirm.
			if s.VerifyBalances && !found[i].Asset.SkipBalanceCheck {
				found[i].Flags = append(found[i].Flags, scan.FlagBalancePending)
			}
		}
		b.Transfers = append(b.Transfers, found...)
	}
	if s.native != nil && len(s.nativeWatch) > 0 {
		found, blocks, err := s.scanNative(ctx, from, to)
		if err != nil {
			return nil, err
		}
		b.Transfers = append(b.Transfers, found...)
		b.Blocks = append(b.Blocks, blocks...)
	}
	return b, nil
}

// contracts returns the configured token contracts, sorted.
func (s *Source) contracts() []common.Address {
	var cs []common.Address
	for c := range s.tokens {
		cs = append(cs, c)
	}
	slices.SortFunc(cs, func(a, b common.Address) int { return a.Cmp(b) })
	return cs
}

// watchedRecipients returns the watched token recipients as topics, sorted.
func (s *Source) watchedRecipients() []common.Hash {
	var topics []common.Hash
	seen := map[common.Address]bool{}
	for _, w := range s.tokenWatch {
		for a := range w {
			if !seen[a] {
				seen[a] = true
				topics = append(topics, common.BytesToHash(a.Bytes()))
			}
		}
	}
	slices.SortFunc(topics, func(a, b common.Hash) int { return a.Cmp(b) })
	return topics
}

// incomingFilter is the eth_getLogs filter of Transfer logs of the
// configured contracts: naming the recipients when the watch set is small,
// leaving them to be filtered here otherwise. (The watch set is fixed:
// its topics are worked out once.)
func (s *Source) incomingFilter(from, to uint64) map[string]any {
	s.filterOnce.Do(func() {
		s.filterContracts = s.contracts()
		s.filterTopics = [][]common.Hash{{TransferTopic}}
		if recipients := s.watchedRecipients(); len(recipients) <= TopicFilterMax {
			s.filterTopics = [][]common.Hash{{TransferTopic}, nil, recipients}
		}
	})
	return map[string]any{"fromBlock": blockTag(from), "toBlock": blockTag(to), "address": s.filterContracts,
		"topics": s.filterTopics}
}

// tokenTransfers turns Transfer logs into transfers to watched addresses.
func (s *Source) tokenTransfers(logs []types.Log) []scan.Found {
	ordinals := map[string]int{}
	var found []scan.Found
	for _, l := range logs {
		asset := s.tokens[l.Address]
		// ERC-20 Transfer: three topics and a 32-byte value. (ERC-721 uses
		// four topics; anything else is not a token payment.)
		if l.Removed || asset == nil || len(l.Topics) != 3 || l.Topics[0] != TransferTopic || len(l.Data) != 32 ||
			!paddedAddress(l.Topics[1]) || !paddedAddress(l.Topics[2]) {
			continue // (an address topic with stray high bytes is no ERC-20 Transfer either)
		}
		recipient := common.BytesToAddress(l.Topics[2].Bytes())
		if !s.tokenWatch[l.Address][recipient] {
			continue
		}
		amount := new(big.Int).SetBytes(l.Data)
		if amount.Sign() == 0 {
			continue // zero-value transfers (address poisoning) are no payment
		}
		// Identity within the transaction that survives a re-mining in
		// another block (where log indexes change): the n-th log of this
		// contract to this recipient in the transaction.
		key := "log:" + asset.Contract + ":" + recipient.Hex()
		n := ordinals[l.TxHash.Hex()+key]
		ordinals[l.TxHash.Hex()+key] = n + 1
		f := scan.Found{Asset: asset, TxHash: l.TxHash.Hex(), TxKey: key + ":" + strconv.Itoa(n), Index: int64(l.Index),
			From: common.BytesToAddress(l.Topics[1].Bytes()).Hex(), To: recipient.Hex(), Amount: amount,
			BlockNumber: l.BlockNumber, BlockHash: l.BlockHash.Hex()}
		if l.BlockTimestamp > 0 {
			f.BlockTime = time.Unix(int64(l.BlockTimestamp), 0).UTC()
		}
		if asset.Dust != nil && amount.Cmp(asset.Dust) < 0 {
			f.Flags = append(f.Flags, FlagDust)
		}
		found = append(found, f)
	}
	return found
}

// fillBlockTimes sets the block time of transfers whose logs did not carry
// it (nodes that do not return blockTimestamp in eth_getLogs), from the
// headers of their blocks, in one batch: whether a payment was late is
// decided by when it was mined, never by when paywatch saw it.
func (s *Source) fillBlockTimes(ctx context.Context, found []scan.Found) error {
	var numbers []uint64
	seen := map[uint64]bool{}
	for _, f := range found {
		if f.BlockTime.IsZero() && !seen[f.BlockNumber] {
			seen[f.BlockNumber] = true
			numbers = append(numbers, f.BlockNumber)
		}
	}
	if len(numbers) == 0 {
		return nil
	}
	headers := make([]*struct {
		Hash common.Hash    `json:"hash"`
		Time hexutil.Uint64 `json:"timestamp"`
	}, len(numbers))
	err := s.nodes.call(ctx, func(ctx context.Context, e *endpoint) error {
		clear(headers) // this node's answer alone
		elems := make([]rpc.BatchElem, len(numbers))
		for i, n := range numbers {
			elems[i] = rpc.BatchElem{Method: "eth_getBlockByNumber", Args: []any{blockTag(n), false}, Result: &headers[i]}
		}
		return batch(ctx, e, elems)
	})
	if err != nil {
		return fmt.Errorf("read block times: %w", err)
	}
	times := map[uint64]time.Time{}
	hashes := map[uint64]string{}
	for i, n := range numbers {
		if headers[i] == nil {
			return fmt.Errorf("block %d: %w", n, scan.ErrNoBlock)
		}
		times[n], hashes[n] = time.Unix(int64(headers[i].Time), 0).UTC(), headers[i].Hash.Hex()
	}
	for i := range found {
		f := &found[i]
		if !f.BlockTime.IsZero() {
			continue
		}
		if hashes[f.BlockNumber] != f.BlockHash {
			return fmt.Errorf("block %d changed while its logs were read", f.BlockNumber)
		}
		f.BlockTime = times[f.BlockNumber]
	}
	return nil
}

// scanNative reads every block of the range with its transactions and
// keeps the successful ones that pay a watched address.
func (s *Source) scanNative(ctx context.Context, from, to uint64) ([]scan.Found, []scan.Block, error) {
	blocks := make([]*fullBlock, to-from+1)
	err := s.nodes.call(ctx, func(ctx context.Context, e *endpoint) error {
		clear(blocks) // this node's answer alone
		elems := make([]rpc.BatchElem, len(blocks))
		for i := range blocks {
			elems[i] = rpc.BatchElem{Method: "eth_getBlockByNumber", Args: []any{blockTag(from + uint64(i)), true}, Result: &blocks[i]}
		}
		if err := batch(ctx, e, elems); err != nil {
			return err
		}
		for i, b := range blocks {
			if b != nil && uint64(b.Number) != from+uint64(i) {
				return fmt.Errorf("asked for block %d, the node answered block %d", from+uint64(i), uint64(b.Number))
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read blocks %d-%d: %w", from, to, err)
	}
	var found []scan.Found
	var refs []scan.Block
	for i, b := range blocks {
		if b == nil {
			return nil, nil, fmt.Errorf("block %d: %w", from+uint64(i), scan.ErrNoBlock)
		}
		refs = append(refs, scan.Block{Number: uint64(b.Number), Hash: b.Hash.Hex()})
		for _, tx := range b.Transactions {
			if tx.To == nil || !s.nativeWatch[*tx.To] || tx.Value == nil || tx.Value.ToInt().Sign() == 0 {
				continue
			}
			f := scan.Found{Asset: s.native, TxHash: tx.Hash.Hex(), TxKey: "native", Index: int64(tx.TransactionIndex),
				From: tx.From.Hex(), To: tx.To.Hex(), Amount: tx.Value.ToInt(), BlockNumber: uint64(b.Number), BlockHash: b.Hash.Hex(),
				BlockTime: time.Unix(int64(b.Time), 0).UTC()}
			if s.native.Dust != nil && f.Amount.Cmp(s.native.Dust) < 0 {
				f.Flags = append(f.Flags, FlagDust)
			}
			found = append(found, f)
		}
	}
	if len(found) == 0 {
		return nil, refs, nil
	}
	// A reverted transaction moves no value: keep only successful ones.
	receipts := make([]*rpcReceipt, len(found))
	err = s.nodes.call(ctx, func(ctx context.Context, e *endpoint) error {
		clear(receipts) // this node's answer alone
		elems := make([]rpc.BatchElem, len(found))
		for i, f := range found {
			elems[i] = rpc.BatchElem{Method: "eth_getTransactionReceipt", Args: []any{f.TxHash}, Result: &receipts[i]}
		}
		return batch(ctx, e, elems)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read receipts: %w", err)
	}
	kept := found[:0]
	for i, f := range found {
		r := receipts[i]
		if r == nil || r.BlockHash.Hex() != f.BlockHash {
			return nil, nil, fmt.Errorf("receipt of %s is not in block %d any more", f.TxHash, f.BlockNumber)
		}
		if uint64(r.Status) == types.ReceiptStatusSuccessful {
			kept = append(kept, f)
		}
	}
	return kept, refs, nil
}

// stateUnavailable recognises a pruned node's answer for old state (geth,
// Erigon, Nethermind, Besu). A revert is never one, whatever its reason
// says: a token's own code must not pass its check as "unchecked".
func stateUnavailable(err error) bool {
	msg := strings.ToLower(err.Error())
	if strings.Contains(msg, "revert") {
		return false
	}
	for _, s := range []string{"missing trie node", "state not available", "historical state", "pruned",
		"no state available", "world state unavailable", "state is not available"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// LookupTx reads one transaction from the node — its receipt's Transfer
// logs and, for the native coin, the transaction itself — and returns the
// transfers it made to watched addresses. It lets a customer's tx hash be
// checked before the scanner reaches its block. A transaction not mined (or
// not known to the node) yields nothing; a reverted one too.
func (s *Source) LookupTx(ctx context.Context, hash string) ([]scan.Found, error) {
	if !ValidTxHash(hash) {
		return nil, fmt.Errorf("%q is not a transaction hash", hash)
	}
	var receipt *struct {
		Status      hexutil.Uint64 `json:"status"`
		BlockHash   common.Hash    `json:"blockHash"`
		BlockNumber hexutil.Uint64 `json:"blockNumber"`
		Logs        []wireLog      `json:"logs"`
	}
	var tx *rpcTx
	var logs []types.Log
	var block *struct {
		Time hexutil.Uint64 `json:"timestamp"`
	}
	err := s.nodes.call(ctx, func(ctx context.Context, e *endpoint) error {
		receipt, tx, block, logs = nil, nil, nil, nil // this node's answer alone
		elems := []rpc.BatchElem{
			{Method: "eth_getTransactionReceipt", Args: []any{hash}, Result: &receipt},
			{Method: "eth_getTransactionByHash", Args: []any{hash}, Result: &tx},
		}
		if err := e.rpc.BatchCallContext(ctx, elems); err != nil {
			return err
		}
		if elems[0].Error != nil {
			return fmt.Errorf("%s: %w", elems[0].Method, elems[0].Error)
		}
		if receipt == nil {
			return nil // not mined (a pending transaction's fields are null: not read)
		}
		if elems[1].Error != nil {
			return fmt.Errorf("%s: %w", elems[1].Method, elems[1].Error)
		}
		var err error
		if logs, err = decodeLogs(receipt.Logs); err != nil {
			return fmt.Errorf("eth_getTransactionReceipt: %w", err)
		}
		// A receipt's logs are its transaction's, in its block. (Only the
		// block's number is held to the receipt's: some chains' clients
		// give system transactions' logs another block hash.)
		for _, l := range logs {
			if l.BlockNumber != uint64(receipt.BlockNumber) || !strings.EqualFold(l.TxHash.Hex(), hash) {
				return fmt.Errorf("eth_getTransactionReceipt of %s in block %d: a log of %s in block %d", hash,
					uint64(receipt.BlockNumber), l.TxHash.Hex(), l.BlockNumber)
			}
		}
		return e.rpc.CallContext(ctx, &block, "eth_getBlockByHash", receipt.BlockHash, false)
	})
	if err != nil || receipt == nil || tx == nil || uint64(receipt.Status) != types.ReceiptStatusSuccessful {
		return nil, err
	}
	var at time.Time
	if block != nil {
		at = time.Unix(int64(block.Time), 0).UTC()
	}
	found := s.tokenTransfers(logs)
	if s.native != nil && tx.To != nil && s.nativeWatch[*tx.To] && tx.Value != nil && tx.Value.ToInt().Sign() > 0 {
		f := scan.Found{Asset: s.native, TxHash: tx.Hash.Hex(), TxKey: "native", Index: int64(tx.TransactionIndex),
			From: tx.From.Hex(), To: tx.To.Hex(), Amount: tx.Value.ToInt(), BlockNumber: uint64(receipt.BlockNumber),
			BlockHash: receipt.BlockHash.Hex()}
		if s.native.Dust != nil && f.Amount.Cmp(s.native.Dust) < 0 {
			f.Flags = append(f.Flags, FlagDust)
		}
		found = append(found, f)
	}
	for i := range found {
		if found[i].BlockTime.IsZero() {
			found[i].BlockTime = at
		}
	}
	// No balance check here: what a look-up records is provisional, and
	// the fake-deposit guard needs every transfer of the block, which only
	// the scanner reads. Its flags replace these when it gets there.
	return found, nil
}
