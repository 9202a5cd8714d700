package evm_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paywatch/paywatch/chains/evm"
	"github.com/paywatch/paywatch/chains/evm/evmtest"
	"github.com/paywatch/paywatch/chains/scan"
)

// README's claims about how the EVM scanner reads a chain (README, "How it
// works": Watching, Reorgs, Faults and scale), each asserted on what goes
// over the wire to a real node and what lands in the database.

// rpcFront stands between the scanner and its node and records every HTTP
// request: its JSON-RPC calls, when it was sent and when it was answered.
// It can refuse wide eth_getLogs ranges with a "too many results" message,
// or leave them unanswered.
type rpcFront struct {
	URL    string
	target string
	// refuseOver, when non-zero, answers eth_getLogs over more blocks with
	// {"code":-32000,"message":"too many results"}.
	refuseOver atomic.Uint64
	// refusal, when set before the first request, is the error refused
	// ranges get in place of "too many results".
	refusal string
	// hangWiderThan, when not negative, leaves unanswered the requests
	// reading logs over more blocks than that (until the caller gives up);
	// hung counts them.
	hangWiderThan atomic.Int64
	hung          atomic.Int64

	mu   sync.Mutex
	reqs []*frontRequest
}

type frontCall struct {
	ID     json.RawMessage   `json:"id"`
	Method string            `json:"method"`
	Params []json.RawMessage `json:"params"`
}

// frontRequest is one HTTP request: one call, or a JSON-RPC batch.
type frontRequest struct {
	Start, End time.Time
	Calls      []frontCall
	Refused    bool // a range in it was refused (refuseOver)
	Hung       bool // left unanswered (hangWiderThan)
}

func newRPCFront(t *testing.T, target string) *rpcFront {
	f := &rpcFront{target: target}
	f.hangWiderThan.Store(-1)
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(srv.Close)
	f.URL = srv.URL
	return f
}

func (f *rpcFront) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req := &frontRequest{Start: time.Now()}
	trimmed := bytes.TrimSpace(body)
	batch := len(trimmed) > 0 && trimmed[0] == '['
	if batch {
		_ = json.Unmarshal(body, &req.Calls)
	} else {
		var one frontCall
		_ = json.Unmarshal(body, &one)
		req.Calls = []frontCall{one}
	}
	if limit := f.hangWiderThan.Load(); limit >= 0 {
		for _, c := range req.Calls {
			if from, to, ok := c.logRange(); ok && to-from+1 > uint64(limit) {
				req.Hung = true
			}
		}
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	if req.Hung {
		f.hung.Add(1)
		<-r.Context().Done() // until the caller gives up
		return
	}
	fwd, err := http.NewRequestWithContext(r.Context(), http.MethodPost, f.target, bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	fwd.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(fwd)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out, _ := io.ReadAll(res.Body)
	res.Body.Close()
	refused := false
	if limit := f.refuseOver.Load(); limit > 0 {
		out, refused = f.refuse(req, batch, out, limit)
	}
	f.mu.Lock()
	req.End, req.Refused = time.Now(), refused
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(out)
}

// refuse replaces the answers to eth_getLogs calls over more than limit
// blocks with the error some providers give: no -32005 code, only words.
func (f *rpcFront) refuse(req *frontRequest, batch bool, out []byte, limit uint64) ([]byte, bool) {
	wide := map[string]bool{}
	for _, c := range req.Calls {
		if from, to, ok := c.logRange(); ok && to-from+1 > limit {
			wide[string(c.ID)] = true
		}
	}
	if len(wide) == 0 {
		return out, false
	}
	var answers []map[string]json.RawMessage
	if batch {
		_ = json.Unmarshal(out, &answers)
	} else {
		var one map[string]json.RawMessage
		_ = json.Unmarshal(out, &one)
		answers = []map[string]json.RawMessage{one}
	}
	for _, a := range answers {
		if wide[string(a["id"])] {
			delete(a, "result")
			a["error"] = json.RawMessage(cmp.Or(f.refusal, `{"code":-32000,"message":"too many results"}`))
		}
	}
	if batch {
		out, _ = json.Marshal(answers)
	} else {
		out, _ = json.Marshal(answers[0])
	}
	return out, true
}

// served returns the widths of the log ranges answered so far (neither
// refused nor left unanswered), in the order they came.
func (f *rpcFront) served() []uint64 {
	var widths []uint64
	for _, r := range f.requests() {
		if r.Refused || r.Hung || r.End.IsZero() {
			continue
		}
		for _, c := range r.Calls {
			if from, to, ok := c.logRange(); ok {
				widths = append(widths, to-from+1)
			}
		}
	}
	return widths
}

// requests returns the requests recorded so far, in the order they came.
func (f *rpcFront) requests() []frontRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]frontRequest, len(f.reqs))
	for i, r := range f.reqs {
		out[i] = *r
	}
	return out
}

// logRange is the block range of an eth_getLogs call.
func (c frontCall) logRange() (from, to uint64, ok bool) {
	if c.Method != "eth_getLogs" || len(c.Params) != 1 {
		return 0, 0, false
	}
	var q struct{ FromBlock, ToBlock string }
	if json.Unmarshal(c.Params[0], &q) != nil {
		return 0, 0, false
	}
	from, err1 := strconv.ParseUint(strings.TrimPrefix(q.FromBlock, "0x"), 16, 64)
	to, err2 := strconv.ParseUint(strings.TrimPrefix(q.ToBlock, "0x"), 16, 64)
	return from, to, err1 == nil && err2 == nil
}

func (r frontRequest) has(method string) bool {
	return slices.ContainsFunc(r.Calls, func(c frontCall) bool { return c.Method == method })
}

// blocks returns the block tags the request reads headers of ("latest",
// "0x1f", …).
func (r frontRequest) blocks() map[string]bool {
	tags := map[string]bool{}
	for _, c := range r.Calls {
		var tag string
		if c.Method == "eth_getBlockByNumber" && len(c.Params) > 0 && json.Unmarshal(c.Params[0], &tag) == nil {
			tags[tag] = true
		}
	}
	return tags
}

// logRange is the range of the request's first eth_getLogs call.
func (r frontRequest) logRange() (from, to uint64, ok bool) {
	for _, c := range r.Calls {
		if from, to, ok := c.logRange(); ok {
			return from, to, true
		}
	}
	return 0, 0, false
}

// readsRange tells a scanner's range read (the logs and the head together)
// from the verifier's reads (balance calls and logs, no head).
func (r frontRequest) readsRange() bool { return r.has("eth_getLogs") && r.blocks()["latest"] }

func (r frontRequest) String() string {
	var methods []string
	for _, c := range r.Calls {
		m := c.Method
		if from, to, ok := c.logRange(); ok {
			m += fmt.Sprintf("(%s-%s)", tag(from), tag(to))
		} else if c.Method == "eth_getBlockByNumber" && len(c.Params) > 0 {
			m += "(" + strings.Trim(string(c.Params[0]), `"`) + ")"
		}
		methods = append(methods, m)
	}
	return "[" + strings.Join(methods, " ") + "]"
}

func tag(n uint64) string { return "0x" + strconv.FormatUint(n, 16) }

// stepUntilHead steps the scanner (no verifier) until it reaches the head,
// failing on the first error.
func stepUntilHead(t *testing.T, s *scan.Scanner) {
	t.Helper()
	for i := 0; i < 1000; i++ {
		caught, err := s.Step(t.Context())
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if caught {
			return
		}
	}
	t.Fatal("the scanner never reached the head")
}

// "Each reads `(cursor, head]` in batches (up to 2,000 blocks, …)": the
// scanner serve builds for an EVM network scans at most 2,000 blocks at
// once, and asks the node for that many.
func TestScanBatchIsUpTo2000Blocks(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	front := newRPCFront(t, e.chain.URL)
	e.network.RPCURLs = []string{front.URL}
	e.network.StartBlock = e.chain.Head()
	e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(5_000_000))
	e.chain.Mine(1)
	s := e.scanner() // scan.NewScanner over evm.NewSource, as serve builds it
	if s.MaxBatch != 2000 {
		t.Fatalf("an EVM scanner's largest batch is %d blocks, README says 2,000", s.MaxBatch)
	}
	// Before it knows the head, the scanner reads the first batch ahead:
	// a whole one.
	stepUntilHead(t, s)
	var widest uint64
	for _, r := range front.requests() {
		if from, to, ok := r.logRange(); ok {
			if to-from+1 > 2000 {
				t.Fatalf("eth_getLogs over %d blocks (%d-%d): more than 2,000", to-from+1, from, to)
			}
			widest = max(widest, to-from+1)
		}
	}
	if widest != 2000 {
		t.Fatalf("the widest eth_getLogs asked for %d blocks, want a batch of 2,000", widest)
	}
	if n := len(e.transfers()); n != 1 {
		t.Fatalf("%d transfers recorded, want the payment", n)
	}
}

// "… halved when a node refuses a range with -32005 or "too many results",
// grown back after successes": a node that answers wide eth_getLogs with
// the words alone (code -32000) has the range halved; once it serves wide
// ranges again, the range grows back to the largest batch.
func TestTooManyResultsHalvesTheRangeThenItGrowsBack(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	front := newRPCFront(t, e.chain.URL)
	front.refuseOver.Store(40)
	e.network.RPCURLs = []string{front.URL}
	e.network.StartBlock = e.chain.Head() + 1
	wants := e.sprinkle(256, 16)
	s := e.scanner()
	s.MaxBatch = 64
	if _, err := s.Step(t.Context()); err != nil {
		t.Fatalf("a step whose range was refused: %v (a refusal should halve the range, not fail)", err)
	}
	front.refuseOver.Store(0) // the node serves wide ranges again
	stepUntilHead(t, s)
	if _, err := s.VerifyPending(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.expect(wants...)
	var refused, served []uint64 // widths of the ranges refused, and read after
	for _, r := range front.requests() {
		if from, to, ok := r.logRange(); ok && r.readsRange() { // (not the verifier's reads)
			if r.Refused {
				refused = append(refused, to-from+1)
			} else {
				served = append(served, to-from+1)
			}
		}
	}
	if len(refused) == 0 || slices.Max(refused) != 64 || slices.Min(refused) != 64 {
		t.Fatalf("ranges refused: %v, want the largest batch (64)", refused)
	}
	if len(served) == 0 || served[0] != 32 {
		t.Fatalf("after 64 blocks were refused the ranges were %v, want halved to 32", served)
	}
	i := slices.Index(served, 64)
	if i < 0 {
		t.Fatalf("ranges after the refusal %v: never grown back to 64", served)
	}
	// Grown after 3 successes; the ranges already read ahead keep the
	// width they were read with.
	if i > 3+scan.DefaultReadAhead {
		t.Fatalf("ranges after the refusal %v: grown back only after %d successes", served, i)
	}
	for _, w := range served[i:] {
		if w != 64 && w != served[len(served)-1] {
			t.Fatalf("ranges after the refusal %v: shrank again without a refusal", served)
		}
	}
}

// "a verifier beside the scanner replaces the flag with its verdict — at
// once when the scanner is at the head": with a 10 s poll interval, the
// transfers of the batch that reaches the head get their verdicts within
// a fraction of it (the verifier is woken, it does not wait for its turn).
func TestVerdictAtOnceWhenTheScannerIsAtTheHead(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	// A distant node: the scanner's batch lands well after the verifier's
	// first look (at start), so the verdict must come from the wake-up.
	proxy := evmtest.NewProxy(t, e.chain.URL)
	proxy.Delay.Store(int64(150 * time.Millisecond))
	e.network.RPCURLs = []string{proxy.URL}
	e.network.PollInterval = 10 * time.Second
	e.network.StartBlock = e.chain.Head()
	honest := e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(5_000_000))
	e.chain.Mine(1)
	fake := e.usdt.FakeTransfer(e.chain.Payer, e.shop, big.NewInt(1_000_000))
	e.chain.Mine(1) // the head holds the fake
	s := e.scanner()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	limit := e.network.PollInterval / 2
	for !e.recorded(2) {
		if time.Since(start) > limit {
			t.Fatalf("no verdict %s after the scanner started at the head (poll interval %s): %v",
				limit, e.network.PollInterval, e.transfers())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("verdicts %s after the start", time.Since(start).Round(time.Millisecond))
	e.expect(want{honest, "USDT", "5000000", "", ""}, want{fake, "USDT", "1000000", "", "balance_mismatch"})
}

// "… at each poll interval during a catch-up": while the scanner catches
// up over many batches, each with a payment, the verifier's balance calls
// come once per poll interval, not once per batch, and they do come before
// the catch-up ends.
func TestVerdictsAtEachPollIntervalDuringACatchUp(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	e.network.StartBlock = e.chain.Head()
	wants := e.sprinkle(120, 3) // a payment in each 3-block range
	proxy := evmtest.NewProxy(t, e.chain.URL)
	proxy.Delay.Store(int64(40 * time.Millisecond)) // 40 ranges take at least 1.6 s
	front := newRPCFront(t, proxy.URL)
	e.network.RPCURLs = []string{front.URL}
	e.network.PollInterval = 400 * time.Millisecond
	s := e.scanner()
	s.MaxBatch = 3
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- s.Run(ctx) }()
	waitFor(t, func() bool { return e.recorded(len(wants)) }, "every payment verified")
	cancel()
	<-done
	e.expect(wants...)

	reqs := front.requests()
	lastRead, ranges := -1, 0
	for i, r := range reqs {
		if r.readsRange() {
			lastRead, ranges = i, ranges+1
		}
	}
	if ranges < 40 {
		t.Fatalf("setup: %d range reads, want a catch-up of 40 or more", ranges)
	}
	catchUp := reqs[lastRead].Start.Sub(start)
	during := 0 // the verifier's rounds before the last range was read
	for _, r := range reqs[:lastRead] {
		if r.has("eth_call") {
			during++
		}
	}
	t.Logf("%d verifier rounds during a catch-up of %s over %d ranges", during, catchUp.Round(time.Millisecond), ranges)
	if during == 0 {
		t.Fatalf("no verdict during a catch-up of %s over %d ranges (poll interval %s): the verifier waited for the head",
			catchUp.Round(time.Millisecond), ranges, e.network.PollInterval)
	}
	if most := int(catchUp/e.network.PollInterval) + 2; during > most {
		t.Fatalf("the verifier ran %d times during a catch-up of %s over %d ranges: more often than each poll interval (%s), want at most %d",
			during, catchUp.Round(time.Millisecond), ranges, e.network.PollInterval, most)
	}
}

// "the logs, the head, the hashes of the range's ends and of the blocks
// within the reorg window travel in one JSON-RPC batch: one round trip per
// range to a distant node, and the first batch is read while the head is":
// a catch-up over 10 ranges costs 10 requests carrying all of that, plus
// the chain id check and one head read, which the first range does not
// wait for.
func TestOneRoundTripPerRange(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	const ranges, width = 10, 20
	e.network.StartBlock = e.chain.Head() + 1
	wants := e.sprinkle(ranges*width, 20)
	head := e.chain.Head()
	proxy := evmtest.NewProxy(t, e.chain.URL)
	proxy.Delay.Store(int64(100 * time.Millisecond)) // a distant node
	front := newRPCFront(t, proxy.URL)
	e.network.RPCURLs = []string{front.URL}
	s := e.scanner()
	s.MaxBatch = width
	start := time.Now()
	stepUntilHead(t, s)
	took := time.Since(start)
	if n := len(e.transfers()); n != len(wants) {
		t.Fatalf("%d transfers recorded, want %d", n, len(wants))
	}
	var reads, others []frontRequest
	for _, r := range front.requests() {
		if r.has("eth_getLogs") {
			reads = append(reads, r)
		} else {
			others = append(others, r)
		}
	}
	if len(reads) != ranges {
		t.Fatalf("%d requests read logs for %d ranges of %d blocks: %v", len(reads), ranges, width, reads)
	}
	// Two ranges are read at once: in the order of their blocks, each
	// follows the one before.
	slices.SortFunc(reads, func(a, b frontRequest) int {
		af, _, _ := a.logRange()
		bf, _, _ := b.logRange()
		return cmp.Compare(af, bf)
	})
	next := e.network.StartBlock
	for _, r := range reads {
		from, to, _ := r.logRange()
		if from != next || to != from+width-1 {
			t.Fatalf("read blocks %d-%d after block %d, want the next %d", from, to, next-1, width)
		}
		need := []string{"latest", tag(from - 1), tag(to)}
		for n := max(from, head-s.Window+1); n <= to; n++ {
			need = append(need, tag(n))
		}
		have := r.blocks()
		for _, b := range need {
			if !have[b] {
				t.Fatalf("blocks %d-%d (head %d, window %d) were read without block %s in the same request: %v",
					from, to, head, s.Window, b, r)
			}
		}
		next = to + 1
	}
	if next != head+1 {
		t.Fatalf("read up to block %d, the head is %d", next-1, head)
	}
	// Besides: the chain id check (once, or twice when the first range and
	// the head are read at the same time) and one head read.
	if len(others) > 3 {
		t.Fatalf("%d requests besides the %d range reads, want at most 3 (chain id, head): %v", len(others), ranges, others)
	}
	firstHead := slices.IndexFunc(others, func(r frontRequest) bool { return r.blocks()["latest"] })
	if firstHead < 0 {
		t.Fatalf("no head read before the catch-up: %v", others)
	}
	if !reads[0].Start.Before(others[firstHead].End) {
		t.Fatal("the first range was asked for only once the head was answered: two round trips, not one")
	}
	t.Logf("%d ranges in %d requests, %s through a node 100 ms away", ranges, len(reads)+len(others), took.Round(time.Millisecond))
}

// keptHashes returns the block hashes stored for reorg detection.
func (e *env) keptHashes() map[uint64]string {
	e.t.Helper()
	var rows []struct {
		Number uint64 `db:"block_number"`
		Hash   string `db:"block_hash"`
	}
	if err := e.db.Select(&rows, `SELECT block_number, block_hash FROM chain_blocks WHERE network = 'devnet'`); err != nil {
		e.t.Fatal(err)
	}
	out := map[uint64]string{}
	for _, r := range rows {
		out[r.Number] = r.Hash
	}
	return out
}

// checkKept checks that the hashes kept are those of the window of the
// head (window blocks up to the head) and of the block just below it, each
// canonical, and no other.
func (e *env) checkKept(window uint64) {
	e.t.Helper()
	head := e.chain.Head()
	kept := e.keptHashes()
	for n := head - window; n <= head; n++ {
		h, ok := kept[n]
		if !ok {
			e.t.Fatalf("head %d, window %d: the hash of block %d is not kept (%d kept)", head, window, n, len(kept))
		}
		if h != e.chain.HashAt(n).Hex() {
			e.t.Fatalf("the kept hash of block %d is %s, the chain's is %s", n, h, e.chain.HashAt(n).Hex())
		}
	}
	if len(kept) != int(window)+1 {
		var below []uint64
		for n := range kept {
			if n < head-window {
				below = append(below, n)
			}
		}
		slices.Sort(below)
		e.t.Fatalf("head %d, window %d: %d hashes kept, want %d; below the window: %v", head, window, len(kept), window+1, below)
	}
}

// "The hashes of the last 128 blocks (or of the last 2 × confirmations + 2,
// when that is more) are kept, with the block just below them" (where a
// reorg replacing the whole window forks), after a catch-up as block by
// block.
func TestBlockHashesKeptForTheWindowOfTheHead(t *testing.T) {
	for _, c := range []struct {
		confirmations int
		window        uint64
	}{{3, 128}, {100, 202}} {
		t.Run(fmt.Sprintf("%d confirmations", c.confirmations), func(t *testing.T) {
			e := newEnv(t)
			e.withoutNative()
			e.network.Confirmations = c.confirmations
			e.network.StartBlock = e.chain.Head()
			s := e.scanner()
			if s.Window != c.window {
				t.Fatalf("with %d confirmations the window is %d blocks, want %d", c.confirmations, s.Window, c.window)
			}
			e.chain.Mine(int(c.window) + 20)
			stepUntilHead(t, s) // a catch-up
			e.checkKept(c.window)
			for range 3 { // then block by block
				e.chain.Mine(1)
				stepUntilHead(t, s)
				e.checkKept(c.window)
			}
		})
	}
}

// "Each step compares the cursor's stored hash with the node's; on a
// mismatch it walks back to the highest kept block still canonical": a
// reorg replacing every block of the window right after a catch-up is
// walked back, not taken for one deeper than the window; one a block
// deeper halts the scanner.
func TestReorgOfTheWholeWindowAfterACatchUpIsWalkedBack(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	e.network.StartBlock = e.chain.Head()
	e.chain.Mine(60)
	pay := e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(5_000_000))
	e.chain.Mine(80)
	s := e.scanner()
	stepUntilHead(t, s)
	old := e.chain.Head()
	e.chain.Reorg(int(s.Window), 1, false, nil)
	stepUntilHead(t, s)
	e.expect(want{pay, "USDT", "5000000", "orphaned", scan.FlagBalancePending})
	var fork int64
	if err := e.db.Get(&fork, `SELECT fork_block FROM chain_reorgs WHERE network = 'devnet'`); err != nil || uint64(fork) != old-s.Window {
		t.Fatalf("reorg recorded at block %d (%v), want %d", fork, err, old-s.Window)
	}
	e.chain.Reorg(int(s.Window)+1, 1, false, nil)
	if _, err := s.Step(t.Context()); !isTooDeep(err) {
		t.Fatalf("a reorg of %d blocks, one deeper than the window: %v, want the scanner halted", s.Window+1, err)
	}
}

// "a node that errs, or does not answer within 20 s, is left for the next
// at once": a first node that stops answering holds a step up for the
// call timeout (lowered here), once, and the second node answers right
// after; no retry waits in between.
func TestUnansweringNodeIsLeftAfterTheCallTimeout(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	hung := evmtest.NewProxy(t, e.chain.URL)
	e.network.RPCURLs = []string{hung.URL, e.chain.URL}
	e.network.StartBlock = e.chain.Head()
	src, err := evm.NewSource(e.network, e.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	const timeout = 500 * time.Millisecond
	src.SetCallTimeout(timeout)
	s := scan.NewScanner(e.network, src, e.store, e.log)
	stepUntilHead(t, s) // on the first node
	hung.Hang.Store(true)
	pay := e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(5_000_000))
	e.chain.Mine(1)
	start := time.Now()
	caught, err := s.Step(t.Context())
	took := time.Since(start)
	if err != nil || !caught {
		t.Fatalf("step past a node that does not answer: caught up %v, %v", caught, err)
	}
	if hung.Hung.Load() != 1 {
		t.Fatalf("the node that does not answer was asked %d times, want once", hung.Hung.Load())
	}
	if took < timeout {
		t.Fatalf("the step took %s: it did not wait for the first node's %s", took, timeout)
	}
	if took > timeout+2*time.Second {
		t.Fatalf("the step took %s with a call timeout of %s: the second node was not asked at once", took, timeout)
	}
	e.expect(want{pay, "USDT", "5000000", "", scan.FlagBalancePending})
}
