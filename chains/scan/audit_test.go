package scan

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// README, "Catching up": "a scanner more than 1,000 blocks behind logs
// `catching up`". After a batch that leaves 1,000 blocks to scan the
// scanner is not more than 1,000 behind and says nothing; 1,001 behind, it
// logs the line, with the blocks remaining.
func TestCatchingUpLoggedOnlyMoreThan1000BlocksBehind(t *testing.T) {
	for _, c := range []struct {
		behind uint64
		logs   bool
	}{{999, false}, {1000, false}, {1001, true}, {5000, true}} {
		var buf bytes.Buffer
		s := &Scanner{Log: slog.New(slog.NewTextHandler(&buf, nil))}
		const cursor = 20_000
		s.logProgress(time.Now(), cursor, cursor+c.behind)
		logged := strings.Contains(buf.String(), `msg="catching up"`)
		if logged != c.logs {
			t.Errorf("%d blocks behind: logged %q, want a catching up line: %v", c.behind, buf.String(), c.logs)
		}
		if logged && !strings.Contains(buf.String(), fmt.Sprintf("remaining=%d", c.behind)) {
			t.Errorf("%d blocks behind: the line %q does not say remaining=%d", c.behind, buf.String(), c.behind)
		}
	}
}

// README, "Faults and scale": "every 10 s, in the background, the scanner
// compares the heads its nodes report and moves to the one ahead when the
// current one trails it by more than 2 blocks". Nodes as NewNodes makes
// them (no interval set) compare the heads at most once every 10 s, and
// the comparison runs in the background: the caller is not held up while
// the nodes are asked. 2 blocks behind, the current node is kept; 3
// behind, the one ahead becomes the current one.
func TestHeadsComparedEvery10sInTheBackgroundSwitchingPast2Blocks(t *testing.T) {
	if LagCheckInterval != 10*time.Second {
		t.Fatalf("LagCheckInterval is %s, README says 10 s", LagCheckInterval)
	}
	if MaxLag != 2 {
		t.Fatalf("MaxLag is %d blocks, README says a node trailing by more than 2 blocks is passed over", MaxLag)
	}
	n, err := NewNodes([]string{"current", "ahead"}, func(u string) (string, error) { return u, nil })
	if err != nil {
		t.Fatal(err)
	}
	heads := map[string]uint64{"current": 100, "ahead": 100}
	var headsMu sync.Mutex // background comparisons read heads while the test changes it
	var asked atomic.Int64
	release := make(chan struct{})
	head := func(ctx context.Context, e string) (uint64, error) {
		asked.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		headsMu.Lock()
		defer headsMu.Unlock()
		return heads[e], nil
	}
	hashAt := func(ctx context.Context, e string, h uint64) (string, error) { return fmt.Sprintf("0x%d", h), nil }

	// In the background: the nodes do not answer until released, and the
	// caller goes on at once.
	start := time.Now()
	n.PreferAhead(t.Context(), head, hashAt)
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Fatalf("PreferAhead held its caller %s while the nodes were asked", took)
	}
	for deadline := time.Now().Add(5 * time.Second); asked.Load() < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("the heads were not asked in the background: %d nodes asked", asked.Load())
		}
		time.Sleep(time.Millisecond)
	}
	close(release)

	// At most once every 10 s: 9.9 s after the last comparison none is
	// started, 10.1 s after one is.
	compared := func(since time.Duration) bool {
		last := time.Now().Add(-since).UnixNano()
		n.lagChecked.Store(last)
		n.PreferAhead(t.Context(), head, hashAt)
		return n.lagChecked.Load() != last
	}
	if compared(9900 * time.Millisecond) {
		t.Fatal("the heads were compared again 9.9 s after the last comparison, README says every 10 s")
	}
	if !compared(10100 * time.Millisecond) {
		t.Fatal("the heads were not compared 10.1 s after the last comparison, README says every 10 s")
	}

	// The boundary, on one comparison each.
	for _, c := range []struct {
		ahead    uint64
		switches bool
	}{{101, false}, {102, false}, {103, true}, {120, true}} {
		n.current.Store(0)
		headsMu.Lock()
		heads["ahead"] = c.ahead
		headsMu.Unlock()
		n.compareHeads(t.Context(), head, hashAt)
		switched := n.current.Load() == 1
		if switched != c.switches {
			t.Errorf("the current node at 100, another at %d (%d blocks ahead): switched %v, want %v",
				c.ahead, c.ahead-100, switched, c.switches)
		}
	}
}

// README, "Faults and scale": "the holder checks its lease's connection
// every 2 s (a check unanswered within 2 s counts as lost, even on a
// connection gone silent) and stops its jobs when it is gone, and the
// instance that takes the lease over waits 6 s before it starts". With the
// 2 s interval serve uses, a lease's check may take 2 s and a takeover
// waits 6 s. Seen on a holder checking every 2 s whose connection goes
// silent just after its job started: the check 2 s in gets no answer, and
// 2 s later the job is stopped.
func TestLeaseCheckUnansweredWithin2sCountsAsLost(t *testing.T) {
	const interval = 2 * time.Second // serve's leaseInterval
	if got := aliveTimeout(interval); got != 2*time.Second {
		t.Fatalf("a lease checked every %s counts a check as lost after %s, README says 2 s", interval, got)
	}
	if got := takeoverDelay(interval); got != 6*time.Second {
		t.Fatalf("a lease checked every %s is taken over after %s, README says 6 s", interval, got)
	}

	dbURL := pgtest.NewURL(t)
	p, viaProxy := pgtest.NewProxy(t, dbURL)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	db, err := migrations.Open(ctx, viaProxy)
	if err != nil {
		t.Fatal(err)
	}
	// (db is not closed: its silent connection would hold Close up.)
	started, stopped := make(chan time.Time, 1), make(chan time.Time, 1)
	go func() {
		_ = RunLeased(ctx, db, "job", interval, slog.New(slog.NewTextHandler(io.Discard, nil)), func(ctx context.Context) error {
			started <- time.Now()
			<-ctx.Done()
			stopped <- time.Now()
			return nil
		})
	}()
	var begun time.Time
	select {
	case begun = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the job never started on a free lease")
	}
	time.Sleep(200 * time.Millisecond) // the job runs; then the network goes quiet
	p.Silence()
	select {
	case end := <-stopped:
		took := end.Sub(begun)
		// The first check comes one interval in; unanswered, it counts as
		// lost after another 2 s.
		if took < interval+2*time.Second-100*time.Millisecond || took > interval+2*time.Second+time.Second {
			t.Fatalf("the job stopped %s after it started, its connection silent from 0.2 s: want about 4 s "+
				"(a check every 2 s, lost when unanswered for 2 s)", took.Round(time.Millisecond))
		}
		t.Logf("the job stopped %s after it started", took.Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		t.Fatal("the job still runs 15 s after its lease's connection went silent")
	}
}
