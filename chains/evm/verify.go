package evm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"sync"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"
	"golang.org/x/sync/errgroup"

	"github.com/paywatch/paywatch/chains/scan"
)

// MaxVerifyKeys bounds the (token, recipient, block) checks of one call to
// the node; it halves while a node times out on them, and grows back.
const MaxVerifyKeys = 500

// balanceKey is one check of the fake-deposit guard: a holder's balance of
// a token across one block.
type balanceKey struct {
	contract, holder common.Address
	block            uint64
}

// Verify is the fake-deposit guard, run after the scanner recorded the
// transfers: for every (token, recipient, block) of the pending transfers
// it checks that the recipient's balance moved, from the block before to
// the block, by the block's Transfer events into it less those out of it.
// A transfer whose block's events the balance does not bear out is flagged
// balance_mismatch; one the node has no state for (a pruned node, for a
// block older than the state it keeps) balance_unchecked. The events into
// the holder are read after the balances: a key gets a verdict only if
// they still hold the transfer's block, at the hash it was recorded in.
// Transfers of a token no longer configured, whose block changed, or whose
// balance call failed otherwise (a token whose balanceOf reverts) get no
// verdict and wait; the others are decided regardless.
func (s *Source) Verify(ctx context.Context, pending []scan.Unverified) ([]scan.Verdict, error) {
	byKey := map[balanceKey][]scan.Unverified{}
	var verdicts []scan.Verdict
	for _, p := range pending {
		c := common.HexToAddress(p.Contract)
		asset := s.tokens[c]
		switch {
		case asset == nil:
			// The token is no longer configured: nothing decides for it
			// (its transfers wait, paying nothing).
		case asset.SkipBalanceCheck || !s.VerifyBalances:
			// The operator has since said they trust this token.
			verdicts = append(verdicts, scan.Verdict{ID: p.ID, BlockHash: p.BlockHash})
		case p.BlockNumber == 0:
			// Nothing before the genesis block to compare with.
		default:
			k := balanceKey{c, common.HexToAddress(p.To), p.BlockNumber}
			byKey[k] = append(byKey[k], p)
		}
	}
	keys := make([]balanceKey, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b balanceKey) int {
		if a.block != b.block {
			return int(int64(a.block) - int64(b.block))
		}
		if c := a.contract.Cmp(b.contract); c != 0 {
			return c
		}
		return a.holder.Cmp(b.holder)
	})
	for len(keys) > 0 {
		span, most := s.verifySpan.Load(), int(s.verifyKeys.Load())
		if span == 0 {
			span = scan.DefaultMaxBatch
		}
		if most == 0 {
			most = MaxVerifyKeys
		}
		n := 1
		for n < len(keys) && n < most && keys[n].block-keys[0].block < span {
			n++
		}
		flags, hashes, err := s.checkKeys(ctx, keys[:n])
		switch {
		case err != nil && rangeRefused(err) && span > 1:
			s.verifySpan.Store(max(span/2, 1))
			continue
		case err == nil && span < scan.DefaultMaxBatch:
			s.verifySpan.Store(min(2*span, scan.DefaultMaxBatch)) // grows back
		case err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil && n > 1:
			// Too many calls for the node in one go: fewer at a time.
			s.verifyKeys.Store(int64(max(n/2, 1)))
			continue
		case err != nil:
			return verdicts, err
		}
		if n == most && most < MaxVerifyKeys {
			s.verifyKeys.Store(int64(min(2*most, MaxVerifyKeys)))
		}
		for _, k := range keys[:n] {
			flag, decided := flags[k]
			if !decided {
				continue
			}
			for _, p := range byKey[k] {
				if p.BlockHash != hashes[k] {
					continue // recorded in a block since replaced
				}
				verdicts = append(verdicts, scan.Verdict{ID: p.ID, BlockHash: p.BlockHash, Flag: flag})
			}
		}
		keys = keys[n:]
	}
	return verdicts, nil
}

// checkKeys checks keys (sorted by block, within one span) and returns the
// flag each earned ("" for none) and the hash of the block its transfers
// were found in when checked; a key left out got no verdict.
func (s *Source) checkKeys(ctx context.Context, keys []balanceKey) (map[balanceKey]string, map[balanceKey]string, error) {
	from, to := keys[0].block, keys[len(keys)-1].block
	holders := map[common.Address]map[common.Address]bool{} // contract → holders
	for _, k := range keys {
		if holders[k.contract] == nil {
			holders[k.contract] = map[common.Address]bool{}
		}
		holders[k.contract][k.holder] = true
	}
	// Filters of the Transfer events out of (outgoing) and into (incoming)
	// the holders over the span: per contract and per TopicFilterMax holders.
	var outFilters, inFilters []map[string]any
	for c, hs := range holders {
		list := make([]common.Hash, 0, len(hs))
		for h := range hs {
			list = append(list, common.BytesToHash(h.Bytes()))
		}
		slices.SortFunc(list, func(a, b common.Hash) int { return a.Cmp(b) })
		for i := 0; i < len(list); i += TopicFilterMax {
			part := list[i:min(i+TopicFilterMax, len(list))]
			base := map[string]any{"fromBlock": blockTag(from), "toBlock": blockTag(to), "address": c}
			out, in := maps.Clone(base), maps.Clone(base)
			out["topics"] = [][]common.Hash{{TransferTopic}, part}
			in["topics"] = [][]common.Hash{{TransferTopic}, nil, part}
			outFilters, inFilters = append(outFilters, out), append(inFilters, in)
		}
	}
	// What one attempt on one node read; a failed attempt's answers never
	// reach the next node's.
	var outLogs, inLogs [][]types.Log
	var outWire, inWire [][]wireLog
	var before, after []*hexutil.Bytes
	var unknown map[balanceKey]bool // the node has no state for it
	var failed map[balanceKey]bool  // its balance call failed otherwise: no verdict
	err := s.nodes.call(ctx, func(ctx context.Context, e *endpoint) error {
		outWire, inWire = make([][]wireLog, len(outFilters)), make([][]wireLog, len(inFilters))
		before, after = make([]*hexutil.Bytes, len(keys)), make([]*hexutil.Bytes, len(keys))
		unknown, failed = map[balanceKey]bool{}, map[balanceKey]bool{}
		first := make([]rpc.BatchElem, 0, 2*len(keys)+len(outFilters))
		for i, q := range outFilters {
			first = append(first, rpc.BatchElem{Method: "eth_getLogs", Args: []any{q}, Result: &outWire[i]})
		}
		callsAt := len(first)
		for i, k := range keys {
			data := hexutil.Bytes(append(common.Hex2Bytes("70a08231"), common.LeftPadBytes(k.holder.Bytes(), 32)...))
			call := map[string]any{"to": k.contract, "data": data}
			first = append(first,
				rpc.BatchElem{Method: "eth_call", Args: []any{call, blockTag(k.block - 1)}, Result: &before[i]},
				rpc.BatchElem{Method: "eth_call", Args: []any{call, blockTag(k.block)}, Result: &after[i]})
		}
		var mu sync.Mutex
		// Batches of 200 calls, four at a time: a remote node's round trip
		// is paid once per four batches.
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(4)
		for i := 0; i < len(first); i += 200 {
			g.Go(func() error {
				part := first[i:min(i+200, len(first))]
				if err := e.rpc.BatchCallContext(gctx, part); err != nil {
					return err
				}
				for j, el := range part {
					if el.Error == nil {
						continue
					}
					if i+j < callsAt {
						return fmt.Errorf("eth_getLogs: %w", el.Error)
					}
					k := keys[(i+j-callsAt)/2]
					mu.Lock()
					if stateUnavailable(el.Error) {
						unknown[k] = true
					} else {
						// This key alone waits (a token whose balanceOf
						// reverts stalls no one else).
						failed[k] = true
						s.log.Warn("a balance call failed; its transfers wait", "network", s.network.Name,
							"contract", k.contract.Hex(), "holder", k.holder.Hex(), "block", k.block, "err", el.Error)
					}
					mu.Unlock()
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		// The events into the holders, read after the balances.
		second := make([]rpc.BatchElem, len(inFilters))
		for i, q := range inFilters {
			second[i] = rpc.BatchElem{Method: "eth_getLogs", Args: []any{q}, Result: &inWire[i]}
		}
		if err := e.rpc.BatchCallContext(ctx, second); err != nil {
			return err
		}
		for _, el := range second {
			if el.Error != nil {
				return fmt.Errorf("eth_getLogs: %w", el.Error)
			}
		}
		var err error
		if outLogs, err = decodeLogLists(outWire); err != nil {
			return err
		}
		inLogs, err = decodeLogLists(inWire)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("check balances of blocks %d-%d: %w", from, to, err)
	}
	wanted := map[balanceKey]bool{}
	for _, k := range keys {
		wanted[k] = true
	}
	expected := map[balanceKey]*big.Int{}
	inHash := map[balanceKey]common.Hash{} // the block hash the events into the holder carry
	stale := map[balanceKey]bool{}         // the two reads saw different blocks at its height
	seen := map[balanceKey]common.Hash{}
	add := func(logs []types.Log, holderTopic int, incoming bool) {
		for _, l := range logs {
			if l.Removed || len(l.Topics) != 3 || l.Topics[0] != TransferTopic || len(l.Data) != 32 ||
				!paddedAddress(l.Topics[1]) || !paddedAddress(l.Topics[2]) {
				continue
			}
			k := balanceKey{l.Address, common.BytesToAddress(l.Topics[holderTopic].Bytes()), l.BlockNumber}
			if !wanted[k] {
				continue
			}
			if h, ok := seen[k]; ok && h != l.BlockHash {
				stale[k] = true
			}
			seen[k] = l.BlockHash
			if incoming {
				inHash[k] = l.BlockHash
			}
			if expected[k] == nil {
				expected[k] = new(big.Int)
			}
			v := new(big.Int).SetBytes(l.Data)
			if !incoming {
				v.Neg(v)
			}
			expected[k].Add(expected[k], v)
		}
	}
	for _, logs := range inLogs {
		add(logs, 2, true)
	}
	for _, logs := range outLogs {
		add(logs, 1, false)
	}
	flags, hashes := map[balanceKey]string{}, map[balanceKey]string{}
	for i, k := range keys {
		h, ok := inHash[k]
		if !ok || stale[k] || failed[k] {
			continue // its block changed, lost the transfers, or its call failed: no verdict
		}
		hashes[k] = h.Hex()
		if unknown[k] || before[i] == nil || after[i] == nil {
			flags[k] = FlagBalanceUnknown
			continue
		}
		delta := new(big.Int).Sub(new(big.Int).SetBytes(*after[i]), new(big.Int).SetBytes(*before[i]))
		if delta.Cmp(expected[k]) != 0 {
			flags[k] = FlagBalanceMismatch
			s.log.Warn("token transfer without the balance moving", "network", s.network.Name,
				"contract", k.contract.Hex(), "to", k.holder.Hex(), "block", k.block, "events", expected[k], "moved", delta)
			continue
		}
		flags[k] = ""
	}
	return flags, hashes, nil
}

// paddedAddress reports whether a topic holds an address as Solidity
// encodes one: twenty bytes, zero-padded on the left.
func paddedAddress(h common.Hash) bool {
	for _, b := range h[:12] {
		if b != 0 {
			return false
		}
	}
	return true
}
