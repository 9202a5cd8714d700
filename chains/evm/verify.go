package evm

import (
	"context"
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
// balance_mismatch; one the node has no state for (a pruned node) is
// flagged balance_unchecked. The events are read after the balances, so a
// block that changed meanwhile is seen: its transfers get no verdict and
// wait for the scanner to record the chain as it is now.
func (s *Source) Verify(ctx context.Context, pending []scan.Unverified) ([]scan.Verdict, error) {
	byKey := map[balanceKey][]scan.Unverified{}
	var verdicts []scan.Verdict
	for _, p := range pending {
		c := common.HexToAddress(p.Contract)
		asset := s.tokens[c]
		switch {
		case asset == nil:
			// The token is no longer configured: nothing can vouch for it.
			verdicts = append(verdicts, scan.Verdict{ID: p.ID, BlockHash: p.BlockHash, Flag: FlagBalanceUnknown})
		case asset.SkipBalanceCheck || !s.VerifyBalances:
			// The operator has since said they trust this token.
			verdicts = append(verdicts, scan.Verdict{ID: p.ID, BlockHash: p.BlockHash})
		case p.BlockNumber == 0:
			verdicts = append(verdicts, scan.Verdict{ID: p.ID, BlockHash: p.BlockHash, Flag: FlagBalanceUnknown})
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
		span := s.verifySpan.Load()
		if span == 0 {
			span = scan.DefaultMaxBatch
		}
		n := 1
		for n < len(keys) && keys[n].block-keys[0].block < span {
			n++
		}
		flags, hashes, err := s.verifyKeys(ctx, keys[:n])
		if err != nil && rangeRefused(err) && span > 1 {
			s.verifySpan.Store(max(span/2, 1))
			continue
		}
		if err != nil {
			return verdicts, err
		}
		for _, k := range keys[:n] {
			flag, decided := flags[k]
			if !decided {
				continue
			}
			for _, p := range byKey[k] {
				if p.BlockHash == hashes[k] { // else recorded in a block since replaced
					verdicts = append(verdicts, scan.Verdict{ID: p.ID, BlockHash: p.BlockHash, Flag: flag})
				}
			}
		}
		keys = keys[n:]
	}
	return verdicts, nil
}

// verifyKeys checks keys (sorted by block, within one span) and returns the
// flag each earned ("" for none) and the hash of the block it was checked
// in; a key left out got no verdict.
func (s *Source) verifyKeys(ctx context.Context, keys []balanceKey) (map[balanceKey]string, map[balanceKey]string, error) {
	from, to := keys[0].block, keys[len(keys)-1].block
	holders := map[common.Address]map[common.Address]bool{} // contract → holders
	for _, k := range keys {
		if holders[k.contract] == nil {
			holders[k.contract] = map[common.Address]bool{}
		}
		holders[k.contract][k.holder] = true
	}
	// The Transfer events out of (outgoing) and into (incoming) the holders
	// over the span: a filter per contract and per TopicFilterMax holders.
	type logQuery struct {
		q      map[string]any
		result []types.Log
	}
	var outgoing, incoming []*logQuery
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
			outgoing = append(outgoing, &logQuery{q: out})
			incoming = append(incoming, &logQuery{q: in})
		}
	}
	before, after := make([]*hexutil.Bytes, len(keys)), make([]*hexutil.Bytes, len(keys))
	first := make([]rpc.BatchElem, 0, 2*len(keys)+len(outgoing))
	for _, o := range outgoing {
		first = append(first, rpc.BatchElem{Method: "eth_getLogs", Args: []any{o.q}, Result: &o.result})
	}
	callsAt := len(first)
	for i, k := range keys {
		data := hexutil.Bytes(append(common.Hex2Bytes("70a08231"), common.LeftPadBytes(k.holder.Bytes(), 32)...))
		call := map[string]any{"to": k.contract, "data": data}
		first = append(first,
			rpc.BatchElem{Method: "eth_call", Args: []any{call, blockTag(k.block - 1)}, Result: &before[i]},
			rpc.BatchElem{Method: "eth_call", Args: []any{call, blockTag(k.block)}, Result: &after[i]})
	}
	second := make([]rpc.BatchElem, 0, len(incoming))
	for _, in := range incoming {
		second = append(second, rpc.BatchElem{Method: "eth_getLogs", Args: []any{in.q}, Result: &in.result})
	}
	unknown := map[balanceKey]bool{} // the node has no state for it
	var mu sync.Mutex
	err := s.nodes.call(ctx, func(ctx context.Context, e *endpoint) error {
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
					if !stateUnavailable(el.Error) {
						return fmt.Errorf("eth_call balanceOf: %w", el.Error)
					}
					mu.Lock()
					unknown[keys[(i+j-callsAt)/2]] = true
					mu.Unlock()
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		// The events into the holders, read after the balances: each
		// key's block is still the one recorded if its events say so.
		if err := e.rpc.BatchCallContext(ctx, second); err != nil {
			return err
		}
		for _, el := range second {
			if el.Error != nil {
				return fmt.Errorf("eth_getLogs: %w", el.Error)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("check balances of blocks %d-%d: %w", from, to, err)
	}
	wanted := map[balanceKey]bool{}
	for _, k := range keys {
		wanted[k] = true
	}
	expected := map[balanceKey]*big.Int{}
	blockHash := map[balanceKey]common.Hash{}
	stale := map[balanceKey]bool{} // its block is not the one its transfers were recorded in
	add := func(logs []types.Log, holderTopic int, sign int) {
		for _, l := range logs {
			if l.Removed || len(l.Topics) != 3 || l.Topics[0] != TransferTopic || len(l.Data) != 32 {
				continue
			}
			k := balanceKey{l.Address, common.BytesToAddress(l.Topics[holderTopic].Bytes()), l.BlockNumber}
			if !wanted[k] {
				continue
			}
			if h, ok := blockHash[k]; ok && h != l.BlockHash {
				stale[k] = true
			}
			blockHash[k] = l.BlockHash
			if expected[k] == nil {
				expected[k] = new(big.Int)
			}
			v := new(big.Int).SetBytes(l.Data)
			if sign < 0 {
				v.Neg(v)
			}
			expected[k].Add(expected[k], v)
		}
	}
	for _, q := range incoming {
		add(q.result, 2, +1)
	}
	for _, q := range outgoing {
		add(q.result, 1, -1)
	}
	flags, hashes := map[balanceKey]string{}, map[balanceKey]string{}
	for i, k := range keys {
		h, ok := blockHash[k]
		if !ok || stale[k] {
			continue // the block changed (or lost its events): no verdict
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
