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

// Before a pass, the runner analyzes a table that changed by AnalyzeAfter
// rows since it was last analyzed: the pass plans on what the tables hold.
func TestRunnerAnalyzesWhatChangedBeforeAPass(t *testing.T) {
	db := pgtest.New(t)
	pgtest.Exec(t, db, `INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at, body, status, delivered_at)
		SELECT 'evt_' || g, 'ord_' || g, 'order.settled', now(), now(), 'x', 'delivered', now()
		FROM generate_series(1, $1::int) g`, reconcile.AnalyzeAfter)
	pgtest.WaitModified(t, db, "webhook_outbox", reconcile.AnalyzeAfter)
	// When each was last analyzed (the migrations analyze them all).
	lastAnalyzed := func() map[string]string {
		var rows []struct {
			Table string `db:"relname"`
			At    string `db:"at"`
		}
		if err := db.Select(&rows, `SELECT relname, COALESCE(last_analyze::text, '') AS at FROM pg_stat_user_tables
			WHERE relname IN ('orders', 'transfers', 'mempool_transfers', 'webhook_outbox')`); err != nil || len(rows) != 4 {
			t.Fatalf("%d tables' statistics (%v)", len(rows), err)
		}
		at := map[string]string{}
		for _, r := range rows {
			at[r.Table] = r.At
		}
		return at
	}
	before := lastAnalyzed()
	log := slog.New(slog.DiscardHandler)
	r := reconcile.NewRunner(reconcile.New(db, log, time.Hour, 48*time.Hour), "@every 1h", "", "", log)
	passed := make(chan struct{}, 1)
	r.Observe = func(time.Duration, error) {
		select {
		case passed <- struct{}{}:
		default:
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	select {
	case <-passed:
	case <-time.After(10 * time.Second):
		t.Fatal("no pass")
	}
	after := lastAnalyzed()
	if after["webhook_outbox"] == before["webhook_outbox"] {
		t.Fatalf("webhook_outbox, %d rows written, not analyzed before the first pass (last at %q)", reconcile.AnalyzeAfter, after["webhook_outbox"])
	}
	for _, table := range []string{"orders", "transfers", "mempool_transfers"} {
		if after[table] != before[table] {
			t.Fatalf("%s, which did not change, was analyzed (at %q, before at %q)", table, after[table], before[table])
		}
	}
}

// A table someone else is analyzing or vacuuming (autovacuum, another
// instance) is left for the next pass, at once: a wait would hold the pass
// back (and could cancel autovacuum's work); the others are analyzed.
func TestRefreshStatisticsLeavesALockedTableForNextTime(t *testing.T) {
	db := pgtest.New(t)
	for _, q := range []string{
		`INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at, body, status, delivered_at)
			SELECT 'evt_' || g, 'ord_' || g, 'order.settled', now(), now(), 'x', 'delivered', now() FROM generate_series(1, $1::int) g`,
		`INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
			pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time)
			SELECT 'ord_' || g, 'e-' || g, '\x00', 'bitcoin', 'BTC', '', 1000 + g, 1000 + g, 'bc1qshop', g % 1000, 'settled',
				now() - interval '2 hours', now() - interval '1 hour', now(), now(), 0, now() FROM generate_series(1, $1::int) g`,
	} {
		pgtest.Exec(t, db, q, reconcile.AnalyzeAfter)
	}
	pgtest.WaitModified(t, db, "webhook_outbox", reconcile.AnalyzeAfter)
	pgtest.WaitModified(t, db, "orders", reconcile.AnalyzeAfter)
	holder := db.MustBegin()
	defer holder.Rollback()
	holder.MustExec(`LOCK TABLE webhook_outbox IN SHARE UPDATE EXCLUSIVE MODE`) // what VACUUM and ANALYZE take
	rec := reconcile.New(db, slog.New(slog.DiscardHandler), time.Hour, 48*time.Hour)
	start := time.Now()
	tables, err := rec.RefreshStatistics(t.Context())
	if err != nil || len(tables) != 1 || tables[0] != "orders" {
		t.Fatalf("analyzed %v (%v), want orders alone", tables, err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Fatalf("waited %v for the locked table", took)
	}
	holder.Rollback()
	if tables, err := rec.RefreshStatistics(t.Context()); err != nil || len(tables) != 1 || tables[0] != "webhook_outbox" {
		t.Fatalf("once the lock is gone, analyzed %v (%v), want webhook_outbox", tables, err)
	}
}
