package evm_test

import (
	"bytes"
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/evm/evmtest"
	"github.com/paywatch/paywatch/chains/scan"
)

// Attacks on the balance check that runs behind the scanner, and on the
// batch reads around it: each test failed before its fix.

// stepToHead steps without verifying (the verifier is behind: backoff, a
// flood, the poll interval of a catch-up), retrying failed steps.
func stepToHead(t *testing.T, s *scan.Scanner) {
	t.Helper()
	for i := 0; i < 10000; i++ {
		caught, err := s.Step(t.Context())
		if err != nil {
			continue
		}
		if caught {
			return
		}
	}
	t.Fatal("never caught up")
}

// withoutNative keeps the token assets only (a native scan re-reads whole
// blocks, which would hide what these tests look at).
func (e *env) withoutNative() {
	var kept []*paywatch.Asset
	for _, a := range e.network.Assets {
		if !a.Native {
			kept = append(kept, a)
		}
	}
	e.network.Assets = kept
}

// A fake deposit recorded at the head, whose check runs only after the
// pruned node dropped the block's state (the verifier fell behind): the
// check came late, it did not fail, so the transfer waits — it never
// becomes balance_unchecked, the one flag that pays.
func TestLateCheckOnAPrunedNodeWaits(t *testing.T) {
	e := newEnv(t, evmtest.Pruned())
	e.network.StartBlock = e.chain.Head()
	s := e.scanner()
	fake := e.usdt.FakeTransfer(e.chain.Payer, e.shop, big.NewInt(1_000_000))
	e.chain.Mine(1)
	stepToHead(t, s)
	e.chain.Mine(300)
	stepToHead(t, s)
	if _, err := s.VerifyPending(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.expect(want{fake, "USDT", "1000000", "seen", scan.FlagBalancePending})
}

// The operator removes a token (it emitted fake events, say): its pending
// transfers get no verdict, so they can never pay.
func TestRemovedTokensTransfersStayPending(t *testing.T) {
	e := newEnv(t)
	e.network.StartBlock = e.chain.Head()
	fake := e.usdt.FakeTransfer(e.chain.Payer, e.shop, big.NewInt(1_000_000))
	e.chain.Mine(1)
	stepToHead(t, e.scanner())
	var kept []*paywatch.Asset
	for _, a := range e.network.Assets {
		if a.Symbol != "USDT" {
			kept = append(kept, a)
		}
	}
	e.network.Assets = kept
	e.chain.Mine(5)
	s := e.scanner()
	stepToHead(t, s)
	if _, err := s.VerifyPending(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.expect(want{fake, "USDT", "1000000", "seen", scan.FlagBalancePending})
}

// The first node has no state ("missing trie node") and then fails the
// check's second round; the second node answers everything. The first
// node's answers die with its attempt: the verdict is the second node's.
func TestBalanceCheckFailoverKeepsNoStaleAnswer(t *testing.T) {
	e := newEnv(t)
	var armed atomic.Bool
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if armed.Load() && bytes.Contains(body, []byte(`"eth_getLogs"`)) && !bytes.Contains(body, []byte(`"eth_call"`)) {
			http.Error(w, "bad gateway", http.StatusBadGateway) // the second round
			return
		}
		res, err := http.Post(e.chain.URL, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		out, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if armed.Load() && bytes.Contains(body, []byte(`"eth_call"`)) {
			var reqs []map[string]json.RawMessage
			var answers []map[string]json.RawMessage
			_ = json.Unmarshal(body, &reqs)
			_ = json.Unmarshal(out, &answers)
			calls := map[string]bool{}
			for _, q := range reqs {
				if string(q["method"]) == `"eth_call"` {
					calls[string(q["id"])] = true
				}
			}
			for _, a := range answers {
				if calls[string(a["id"])] {
					delete(a, "result")
					a["error"] = json.RawMessage(`{"code":-32000,"message":"missing trie node 1234 (path )"}`)
				}
			}
			out, _ = json.Marshal(answers)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	}))
	t.Cleanup(front.Close)
	e.network.RPCURLs = []string{front.URL, e.chain.URL}
	e.network.StartBlock = e.chain.Head()
	fake := e.usdt.FakeTransfer(e.chain.Payer, e.shop, big.NewInt(1_000_000))
	e.chain.Mine(5)
	s := e.scanner()
	stepToHead(t, s)
	armed.Store(true)
	if _, err := s.VerifyPending(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.expect(want{fake, "USDT", "1000000", "confirmed", "balance_mismatch"})
}

// A reorg between a batch's eth_getLogs and the block hashes read after it
// in the same request: the batch is read again, and the new chain's
// payment is recorded.
func TestReorgInsideOneBatchRequest(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	var armed atomic.Bool
	var fired atomic.Bool
	var replacement atomic.Value
	forward := func(reqs []json.RawMessage) []json.RawMessage {
		body, _ := json.Marshal(reqs)
		res, err := http.Post(e.chain.URL, "application/json", bytes.NewReader(body))
		if err != nil {
			panic(err)
		}
		defer res.Body.Close()
		var out []json.RawMessage
		b, _ := io.ReadAll(res.Body)
		if err := json.Unmarshal(b, &out); err != nil {
			panic(string(b))
		}
		return out
	}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var reqs []json.RawMessage
		if len(body) > 0 && body[0] == '[' && armed.Load() && json.Unmarshal(body, &reqs) == nil {
			logsAt := -1
			for i, q := range reqs {
				if strings.Contains(string(q), `"eth_getLogs"`) {
					logsAt = i
				}
			}
			if logsAt >= 0 && logsAt < len(reqs)-1 && fired.CompareAndSwap(false, true) {
				out := forward(reqs[:logsAt+1])
				// Blocks cursor+1 and cursor+2 are replaced; the new first
				// block holds a payment.
				e.chain.Reorg(2, 1, false, func() {
					replacement.Store(e.usdt.Transfer(e.chain.Keys[1], e.shop, big.NewInt(42_000_000)))
				})
				out = append(out, forward(reqs[logsAt+1:])...)
				b, _ := json.Marshal(out)
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(b)
				return
			}
		}
		res, err := http.Post(e.chain.URL, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		out, _ := io.ReadAll(res.Body)
		res.Body.Close()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	}))
	t.Cleanup(front.Close)
	e.network.RPCURLs = []string{front.URL}
	e.network.StartBlock = e.chain.Head()
	s := e.scanner()
	stepToHead(t, s)
	e.chain.Mine(2)
	armed.Store(true)
	stepToHead(t, s)
	if !fired.Load() {
		t.Fatal("the reorg never happened")
	}
	armed.Store(false)
	e.chain.Mine(5)
	stepToHead(t, s)
	if _, err := s.VerifyPending(t.Context()); err != nil {
		t.Fatal(err)
	}
	h := replacement.Load().(common.Hash)
	e.expect(want{h, "USDT", "42000000", "confirmed", ""})
}

// A reorg replacing the cursor block lands between the cursor check and
// the batch read: the batch does not continue the cursor, so it is not
// committed; the reorg is walked back and the replaced block's payment is
// orphaned (it pays nothing).
func TestBatchMustContinueTheCursor(t *testing.T) {
	e := newEnv(t)
	var kept []*paywatch.Asset
	for _, a := range e.network.Assets {
		if !a.Native {
			a.SkipBalanceCheck = true // verify_balance: false (or think native ETH)
			kept = append(kept, a)
		}
	}
	e.network.Assets = kept
	var armed, fired atomic.Bool
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		res, err := http.Post(e.chain.URL, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		out, _ := io.ReadAll(res.Body)
		res.Body.Close()
		s := string(body)
		if armed.Load() && strings.Contains(s, `"latest"`) && !strings.Contains(s, "eth_getLogs") && len(body) > 0 && body[0] == '[' &&
			fired.CompareAndSwap(false, true) {
			var reqs []json.RawMessage
			_ = json.Unmarshal(body, &reqs)
			if len(reqs) >= 2 { // HeadAndHash: head and cursor hash read; now the cursor block goes
				e.chain.Reorg(3, 1, false, nil)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	}))
	t.Cleanup(front.Close)
	e.network.RPCURLs = []string{front.URL}
	e.network.StartBlock = e.chain.Head()
	s := e.scanner()
	pay := e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(7_000_000))
	e.chain.Mine(1)
	stepToHead(t, s) // cursor at the payment's block
	e.chain.Mine(2)
	armed.Store(true)
	stepToHead(t, s)
	if !fired.Load() {
		t.Fatal("no reorg")
	}
	armed.Store(false)
	e.chain.Mine(6)
	stepToHead(t, s)
	if _, err := s.VerifyPending(t.Context()); err != nil {
		t.Fatal(err)
	}
	stepToHead(t, s)
	for _, g := range e.transfers() {
		if g.TxHash == pay.Hex() && g.State != "orphaned" && g.Hash != e.chain.HashAt(g.Block).Hex() {
			t.Errorf("payment %s is %s in a block that is no longer canonical", pay.Hex()[:10], g.State)
		}
	}
}

// A node slow with many calls at once: checks that do not fit the call
// timeout are split until they do, instead of timing out for ever while
// every token payment waits.
func TestBalanceChecksShrinkToASlowNode(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	proxy := evmtest.NewProxy(t, e.chain.URL)
	e.network.RPCURLs = []string{proxy.URL}
	e.network.StartBlock = e.chain.Head()
	var holders []common.Address
	for _, a := range e.network.Assets {
		if a.Symbol == "USDT" {
			for i := range 25 {
				h := common.BigToAddress(big.NewInt(int64(0x5000 + i)))
				holders = append(holders, h)
				a.Addresses = append(a.Addresses, h.Hex())
			}
		}
	}
	for range 20 { // 500 checks: 25 holders in each of 20 blocks
		for _, h := range holders {
			e.usdt.Transfer(e.chain.Payer, h, big.NewInt(20_000))
		}
		e.chain.Mine(1)
	}
	s := e.scanner()
	stepToHead(t, s)
	if n := len(e.transfers()); n != 500 {
		t.Fatalf("%d transfers recorded, want 500", n)
	}
	// 1,000 balance calls at 3 ms each, four batches of 200 at a time:
	// about 1.2 s in one go, over the 1 s the node is given.
	proxy.CallDelay.Store(int64(3 * time.Millisecond))
	s.Source.(interface{ SetCallTimeout(time.Duration) }).SetCallTimeout(time.Second)
	n, err := s.VerifyPending(t.Context())
	if err != nil {
		// The attempt that timed out is reported; the next one fits.
		n, err = s.VerifyPending(t.Context())
	}
	if err != nil || n != 500 {
		t.Fatalf("verified %d of 500 (%v)", n, err)
	}
}
