package reconcile_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
)

// The reconciler runs a pass when it starts, on its schedule, when a
// scanner's commit (or a claim) notifies, and when nudged (an operator's
// action): each counted as the pass it causes.
func TestRunnerPassesOnScheduleNotifyAndNudge(t *testing.T) {
	db, dbURL := pgtest.NewWithURL(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	passes := func(schedule string) (*reconcile.Runner, *atomic.Int64, context.CancelFunc) {
		var n atomic.Int64
		r := reconcile.NewRunner(reconcile.New(db, log, time.Hour, 48*time.Hour), schedule, dbURL, pg.NotifyChannel, log)
		r.Observe = func(time.Duration, error) { n.Add(1) }
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { _ = r.Run(ctx); close(done) }()
		return r, &n, func() { cancel(); <-done }
	}
	waitPasses := func(n *atomic.Int64, want int64, what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for n.Load() < want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d passes, want %d", what, n.Load(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// A schedule that never fires during the test: passes come from the
	// start, the notifications and the nudges alone.
	r, n, stop := passes("@every 1h")
	waitPasses(n, 1, "at start")
	time.Sleep(300 * time.Millisecond) // the listener is up; nothing else runs a pass
	if got := n.Load(); got != 1 {
		t.Fatalf("%d passes with nothing to cause them, want 1", got)
	}
	pgtest.Exec(t, db, `SELECT pg_notify($1, 'devnet')`, pg.NotifyChannel)
	waitPasses(n, 2, "after a scanner's notification")
	r.Nudge()
	waitPasses(n, 3, "after a nudge")
	stop()
	// The schedule alone.
	_, n, stop = passes("@every 1s")
	waitPasses(n, 3, "on a schedule of every second")
	stop()
}
