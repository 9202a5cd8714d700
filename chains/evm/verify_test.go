package evm_test

import (
	"bytes"
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"slices"
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
	for range 20 { // 500 checks: 25 holders in each of 20 blocks (or more)
		var last common.Hash
		for _, h := range holders {
			last = e.usdt.Transfer(e.chain.Payer, h, big.NewInt(20_000))
		}
		for i := 0; ; i++ {
			e.chain.Mine(1)
			if _, err := e.chain.Client.TransactionReceipt(t.Context(), last); err == nil {
				break
			}
			if i > 20 {
				t.Fatal("setup: the transfers were never mined")
			}
		}
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

// A reorg reaching below the first scanned block (scanning began less than
// a window ago): the scan starts again from there, its anchor replaced,
// instead of refusing every batch for not continuing the replaced anchor.
func TestReorgBelowTheFirstScannedBlock(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	c := e.chain
	c.Mine(5)
	e.network.StartBlock = c.Head()
	s := e.scanner()
	e.usdt.Transfer(c.Payer, e.shop, big.NewInt(3_000_000))
	c.Mine(1)
	stepToHead(t, s)
	// Replace everything from the block before the first scanned one.
	c.Reorg(4, 2, false, nil)
	var last error
	for i := 0; i < 50; i++ {
		caught, err := s.Step(t.Context())
		last = err
		if err == nil && caught {
			cur, _, _ := e.store.Cursor(t.Context(), "devnet")
			if cur.Hash == c.HashAt(cur.Number).Hex() {
				return
			}
		}
	}
	t.Fatalf("scanner never got past the reorg below its first block; last error: %v", last)
}

// poisonFront is a node front that answers eth_call to contract with the
// given error (a token whose balanceOf reverts; or, with a pruning
// message, a Nethermind/Besu node without the state).
func poisonFront(t *testing.T, target string, contract string, errJSON string) string {
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		res, err := http.Post(target, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		out, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if len(body) > 0 && body[0] == '[' && bytes.Contains(body, []byte(`"eth_call"`)) {
			var reqs []map[string]json.RawMessage
			var answers []map[string]json.RawMessage
			_ = json.Unmarshal(body, &reqs)
			_ = json.Unmarshal(out, &answers)
			bad := map[string]bool{}
			for _, q := range reqs {
				if string(q["method"]) == `"eth_call"` && strings.Contains(strings.ToLower(string(q["params"])), strings.ToLower(contract)) {
					bad[string(q["id"])] = true
				}
			}
			for _, a := range answers {
				if bad[string(a["id"])] {
					delete(a, "result")
					a["error"] = json.RawMessage(errJSON)
				}
			}
			out, _ = json.Marshal(answers)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	}))
	t.Cleanup(front.Close)
	return front.URL
}

// One token's balanceOf errs (a token whose owner makes it revert for the
// shop, with a reason that even says "pruned"; Nethermind's or Besu's
// answer for state they dropped): the other tokens' payments are decided
// all the same, and the failing key never passes as checked.
func TestOneFailingBalanceCallStallsNoOtherToken(t *testing.T) {
	for name, errJSON := range map[string]string{
		"revert":     `{"code":3,"message":"execution reverted: pruned"}`,
		"nethermind": `{"code":-32002,"message":"No state available for block 0xabc (12)"}`,
		"besu":       `{"code":-32000,"message":"World state unavailable"}`,
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.withoutNative()
			e.network.RPCURLs = []string{poisonFront(t, e.chain.URL, e.dai.Address.Hex()[2:], errJSON)}
			e.network.StartBlock = e.chain.Head()
			dai := e.dai.Transfer(e.chain.Payer, e.shop, big.NewInt(1)) // one DAI wei, earliest block
			e.chain.Mine(1)
			var honest []common.Hash
			for i := range 5 {
				honest = append(honest, e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(int64(5_000_000+i))))
				e.chain.Mine(1)
			}
			s := e.scanner()
			stepToHead(t, s)
			for range 3 {
				_, _ = s.VerifyPending(t.Context())
			}
			e.chain.Mine(5)
			stepToHead(t, s)
			stuck := 0
			for _, g := range e.transfers() {
				if g.Asset == "USDT" && slices.Contains(g.Flags, scan.FlagBalancePending) {
					stuck++
				}
			}
			if stuck > 0 {
				t.Fatalf("%d of %d honest USDT payments wait for ever behind one DAI key", stuck, len(honest))
			}
			for _, g := range e.transfers() {
				if g.TxHash == dai.Hex() && name == "revert" && !slices.Equal(g.Flags, []string{scan.FlagBalancePending}) {
					t.Fatalf("a token whose balanceOf reverts got a verdict: %s", g)
				}
				if g.TxHash == dai.Hex() && name != "revert" && !slices.Equal(g.Flags, []string{"balance_unchecked"}) {
					t.Fatalf("a node without the state: %s, want balance_unchecked", g)
				}
			}
		})
	}
}

// A pruned node, and a daemon that stops right after recording a payment
// at the head and stays down for longer than the node keeps state: the
// payment is decided when it comes back (balance_unchecked, as a catch-up
// over the same blocks gives), it does not wait for ever.
func TestPrunedNodeLateCheckDecides(t *testing.T) {
	e := newEnv(t, evmtest.Pruned())
	e.withoutNative()
	e.network.StartBlock = e.chain.Head()
	s := e.scanner()
	honest := e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(9_000_000))
	e.chain.Mine(1)
	stepToHead(t, s) // recorded at the head; the daemon stops before its check
	// What a pruned node cannot check stays unchecked, as README says:
	// this one a catch-up reads more than 128 blocks late.
	fake := e.usdt.FakeTransfer(e.chain.Payer, e.shop, big.NewInt(1_000_000))
	e.chain.Mine(1)
	e.chain.Mine(300)
	s = e.scanner() // restart
	stepToHead(t, s)
	for range 2 {
		if _, err := s.VerifyPending(t.Context()); err != nil {
			t.Log(err)
		}
	}
	e.expect(want{honest, "USDT", "9000000", "confirmed", "balance_unchecked"},
		want{fake, "USDT", "1000000", "confirmed", "balance_unchecked"})
}
