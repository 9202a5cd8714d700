package evm_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/paywatch/paywatch/chains/evm"
	"github.com/paywatch/paywatch/chains/evm/evmtest"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// More of README's claims about how the EVM scanner reads a chain, each
// asserted on a real node (through fronts that record or misbehave) and a
// real database.

// auBatches is a scan.Observer noting when each batch's commit returned.
type auBatches struct {
	mu        sync.Mutex
	committed []time.Time
}

func (o *auBatches) Batch(_ string, _, _ int, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.committed = append(o.committed, time.Now())
}

func (o *auBatches) StepFailed(string, string) {}

func (o *auBatches) times() []time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]time.Time(nil), o.committed...)
}

// auLog is a log destination safe for concurrent writers.
type auLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *auLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *auLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// "While one batch commits the next two are read, at once ... none further
// ahead": with every commit slowed down in the database (the cursor's
// update waits 300 ms), the requests reading the two ranges after each
// batch reach the node before that batch's commit has returned, and the
// range after those only once it has.
func TestNextBatchIsReadWhileOneCommits(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	const ranges, width = 5, 10
	e.network.StartBlock = e.chain.Head() + 1
	e.chain.Mine(ranges * width)
	front := newRPCFront(t, e.chain.URL)
	e.network.RPCURLs = []string{front.URL}
	pgtest.Exec(t, e.db, `CREATE FUNCTION au_slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$`)
	pgtest.Exec(t, e.db, `CREATE TRIGGER au_slow_commit BEFORE UPDATE OF block_number ON chain_cursors
		FOR EACH ROW EXECUTE FUNCTION au_slow_commit()`)
	obs := &auBatches{}
	s := e.scanner()
	s.MaxBatch = width
	s.Observer = obs
	stepUntilHead(t, s)

	reads := map[uint64]frontRequest{} // by first block: the first read of each range
	for _, r := range front.requests() {
		if from, _, ok := r.logRange(); ok && r.readsRange() {
			if _, seen := reads[from]; !seen {
				reads[from] = r
			}
		}
	}
	committed := obs.times()
	if len(committed) != ranges || len(reads) != ranges {
		t.Fatalf("%d batches committed, %d ranges read; want %d of %d blocks", len(committed), len(reads), ranges, width)
	}
	if scan.DefaultReadAhead != 2 {
		t.Fatalf("%d ranges are read ahead, want 2", scan.DefaultReadAhead)
	}
	first := func(k int) uint64 { return e.network.StartBlock + uint64(k*width) }
	for k := 0; k < ranges; k++ {
		for j := k + 1; j < ranges && j <= k+2; j++ {
			if r := reads[first(j)]; !r.Start.Before(committed[k]) {
				t.Fatalf("blocks %d-%d were asked for %s after the commit of blocks %d-%d returned: not read while it committed",
					first(j), first(j+1)-1, r.Start.Sub(committed[k]).Round(time.Millisecond), first(k), first(k+1)-1)
			}
		}
		if j := k + 3; j < ranges {
			if r := reads[first(j)]; r.Start.Before(committed[k]) {
				t.Fatalf("blocks %d-%d were asked for before the commit of blocks %d-%d returned: three ranges ahead",
					first(j), first(j+1)-1, first(k), first(k+1)-1)
			}
		}
	}
}

// auStepUntilHead steps the scanner until it reaches the head, failing on
// an error or after steps steps.
func auStepUntilHead(t *testing.T, s *scan.Scanner, steps int, what func() string) {
	t.Helper()
	for i := 0; i < steps; i++ {
		caught, err := s.Step(t.Context())
		if err != nil {
			t.Fatalf("step %d: %v (%s)", i, err, what())
		}
		if caught {
			return
		}
	}
	t.Fatalf("the scanner did not reach the head in %d steps (%s)", steps, what())
}

// "a node that errs, or does not answer within 20 s, is left for the next
// at once (only a range that no node answers in time is read in halves)":
// a first node that times out on every range, beside a healthy second,
// leaves the range as it was (the second node is asked for the whole of
// it); once both time out on ranges wider than half the batch, the step
// reads the range in halves instead of failing.
func TestOnlyARangeNoNodeAnswersInTimeIsReadInHalves(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	first, second := newRPCFront(t, e.chain.URL), newRPCFront(t, e.chain.URL)
	e.network.RPCURLs = []string{first.URL, second.URL}
	e.network.StartBlock = e.chain.Head() + 1
	const width = 8
	wants := e.sprinkle(3*width, 4)
	src, err := evm.NewSource(e.network, e.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	src.SetCallTimeout(300 * time.Millisecond)
	s := scan.NewScanner(e.network, src, e.store, e.log)
	s.MaxBatch = width
	widths := func() string {
		return fmt.Sprintf("ranges served by the first node %v, by the second %v", first.served(), second.served())
	}

	first.hangWiderThan.Store(0) // it times out on any range
	auStepUntilHead(t, s, 20, widths)
	if first.hung.Load() == 0 {
		t.Fatal("the first node was never asked for a range: the test tests nothing")
	}
	if got := second.served(); len(got) != 3 || got[0] != width || got[1] != width || got[2] != width {
		t.Fatalf("after the first node timed out on a range of %d blocks, the second served ranges of %v blocks: "+
			"want 3 of %d (a single sick node does not shrink the range)", width, got, width)
	}

	first.hangWiderThan.Store(width / 2)
	second.hangWiderThan.Store(width / 2)
	hung := first.hung.Load() + second.hung.Load()
	servedBefore := len(first.served()) + len(second.served())
	wants = append(wants, e.sprinkle(2*width, 4)...)
	caught, err := s.Step(t.Context())
	if err != nil {
		t.Fatalf("a step whose range no node answered in time failed (%v): want the range read in halves", err)
	}
	if caught {
		t.Fatal("a step whose range no node answered in time reported the scanner at the head")
	}
	if n := first.hung.Load() + second.hung.Load() - hung; n < 2 {
		t.Fatalf("%d nodes timed out on the range: want both asked before the range is halved", n)
	}
	auStepUntilHead(t, s, 20, widths)
	after := append(first.served(), second.served()...)[servedBefore:]
	if len(after) == 0 {
		t.Fatalf("no range served after both nodes timed out (%s)", widths())
	}
	for _, w := range after {
		if w != width/2 {
			t.Fatalf("after both nodes timed out on %d blocks, ranges of %v blocks were served: want halves of %d", width, after, width/2)
		}
	}
	got := map[string]bool{}
	for _, g := range e.transfers() {
		got[g.TxHash] = true
	}
	for _, w := range wants {
		if !got[w.tx.Hex()] {
			t.Fatalf("payment %s was not recorded (%d of %d recorded)", w.tx.Hex(), len(got), len(wants))
		}
	}
}

// "every 10 s, in the background, the scanner compares the heads its
// nodes report and moves to the one ahead when the current one trails it
// by more than 2 blocks": a current node 2 blocks behind the other is kept
// however many times the heads are compared; 3 behind, the scanner moves
// to the one ahead. (The comparisons come every 50 ms here.)
func TestNodeTrailingByMoreThan2BlocksIsPassedOver(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	e.chain.Mine(10)
	lagging := evmtest.NewProxy(t, e.chain.URL)
	lagging.Lag.Store(2)
	current, ahead := newRPCFront(t, lagging.URL), newRPCFront(t, e.chain.URL)
	e.network.RPCURLs = []string{current.URL, ahead.URL}
	e.network.StartBlock = e.chain.Head() - 5
	e.network.PollInterval = 20 * time.Millisecond
	var logs auLog
	log := slog.New(slog.NewTextHandler(&logs, nil))
	src, err := evm.NewSource(e.network, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	src.SetLagCheckInterval(50 * time.Millisecond)
	s := scan.NewScanner(e.network, src, e.store, log)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// The node ahead is asked for its head alone when the heads are
	// compared, and in batches only by the scanner itself.
	count := func(f *rpcFront) (compared, scanned int) {
		for _, r := range f.requests() {
			switch {
			case len(r.Calls) > 1:
				scanned++
			case r.blocks()["latest"]:
				compared++
			}
		}
		return compared, scanned
	}
	waitFor(t, func() bool { c, _ := count(ahead); return c >= 5 }, "five comparisons of the heads")
	const switched = `msg="a node lags behind another; switched to the one ahead"`
	if _, scanned := count(ahead); scanned > 0 || bytes.Contains([]byte(logs.String()), []byte(switched)) {
		t.Fatalf("the current node trails the other by 2 blocks and the scanner moved to the other (%d of its reads there):\n%s",
			scanned, logs.String())
	}

	lagging.Lag.Store(3)
	waitFor(t, func() bool { _, scanned := count(ahead); return scanned > 0 }, "the scanner to move to the node 3 blocks ahead")
	head := e.chain.Head()
	line := regexp.MustCompile(switched + ` network=devnet url=(\S+) head=(\d+) lagging=(\S+) its_head=(\d+)`).FindStringSubmatch(logs.String())
	if line == nil || line[1] != ahead.URL || line[2] != strconv.FormatUint(head, 10) || line[3] != current.URL ||
		line[4] != strconv.FormatUint(head-3, 10) {
		t.Fatalf("the switch was not logged from %s (head %d) to %s (head %d):\n%s", current.URL, head-3, ahead.URL, head, logs.String())
	}
}

// auStatus returns what the scanner recorded of the devnet network.
func (e *env) auStatus() scan.Status {
	e.t.Helper()
	st, err := e.store.Statuses(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	return st["devnet"]
}

func auText(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// README, "Operating it": "A halted network (`/healthz` 503, `health:
// halted`) ... `paywatch rescan` ... clears the halt; the running daemons
// resume scanning by themselves." After the rewind paywatch rescan makes
// (Store.Rewind), what /healthz and GET /v1/networks read says the network
// is neither halted nor in error, and the running scanner goes on to the
// head and stays healthy.
func TestRescanClearsTheHaltAndTheRunningScannerIsHealthyAgain(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	e.network.StartBlock = e.chain.Head()
	s := e.scanner()
	s.Window = 4
	e.chain.Mine(8)
	stepUntilHead(t, s)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	e.chain.Reorg(7, 1, false, nil) // deeper than the 4 blocks kept
	waitFor(t, func() bool { return e.auStatus().Halted }, "the halt recorded")
	if st := e.auStatus(); st.LastError == nil {
		t.Fatalf("a halted network records no error: %+v", st)
	}
	fork := e.chain.Head() - 8 // below the reorg
	if _, err := e.store.Rewind(t.Context(), "devnet", scan.Block{Number: fork, Hash: e.chain.HashAt(fork).Hex()}); err != nil {
		t.Fatal(err)
	}
	if st := e.auStatus(); st.Halted || st.LastError != nil {
		t.Fatalf("right after the rewind the network is halted %v, last error %v: want the halt cleared and health ok",
			st.Halted, auText(st.LastError))
	}
	head := e.chain.Head()
	waitFor(t, func() bool { c := e.auStatus().Cursor; return c != nil && uint64(*c) == head }, "the running scanner to reach the head")
	e.chain.Mine(2)
	waitFor(t, func() bool { c := e.auStatus().Cursor; return c != nil && uint64(*c) == head+2 }, "the scanner to follow new blocks")
	if st := e.auStatus(); st.Halted || st.LastError != nil {
		t.Fatalf("after the rescan the network is halted %v, last error %q: want health ok", st.Halted, auText(st.LastError))
	}
}

// README: "`PAYWATCH_LOG_LEVEL` sets the log level: `debug` adds a line
// ... per scanned batch". A scanner logging at debug writes one "batch
// committed" line per batch it commits, saying which blocks and how many
// transfers; at the default level it writes none.
func TestDebugLevelLogsALinePerScannedBatch(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	const batches, width = 5, 10
	e.network.StartBlock = e.chain.Head() + 1
	e.sprinkle(batches*width, width) // a payment in each batch
	scanner := func(level slog.Level) (*scan.Scanner, *auLog, *auBatches) {
		var logs auLog
		log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: level}))
		src, err := evm.NewSource(e.network, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(src.Close)
		s := scan.NewScanner(e.network, src, e.store, log)
		s.MaxBatch = width
		obs := &auBatches{}
		s.Observer = obs
		return s, &logs, obs
	}
	s, logs, obs := scanner(slog.LevelDebug)
	stepUntilHead(t, s)
	line := regexp.MustCompile(`level=DEBUG msg="batch committed" network=devnet from=(\d+) to=(\d+) head=\d+ transfers=(\d+) took=`)
	lines := line.FindAllStringSubmatch(logs.String(), -1)
	if len(obs.times()) != batches || len(lines) != batches {
		t.Fatalf("%d batches committed, %d debug lines for them; want %d of each:\n%s", len(obs.times()), len(lines), batches, logs.String())
	}
	for k, l := range lines {
		from := e.network.StartBlock + uint64(k*width)
		if l[1] != strconv.FormatUint(from, 10) || l[2] != strconv.FormatUint(from+width-1, 10) || l[3] != "1" {
			t.Fatalf("debug line %d: blocks %s-%s with %s transfers, want blocks %d-%d with 1", k, l[1], l[2], l[3], from, from+width-1)
		}
	}

	e.sprinkle(width, width)
	quiet, logs, obs := scanner(slog.LevelInfo)
	stepUntilHead(t, quiet)
	if len(obs.times()) != 1 || line.MatchString(logs.String()) || bytes.Contains([]byte(logs.String()), []byte("batch committed")) {
		t.Fatalf("at the default level, %d batches committed and logged:\n%s", len(obs.times()), logs.String())
	}
}
