package reconcile_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
)

// batchesDueOrders inserts n orders awaiting payment on the shop's shared
// USDT address, ids ord_00000001 upwards, that expire an hour after the
// fixture's clock: all due to move once the clock is past that.
func batchesDueOrders(f *fixture, n int) {
	f.t.Helper()
	pgtest.Exec(f.t, f.db, `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
		pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time)
		SELECT 'ord_' || lpad(g::text, 8, '0'), 'due-' || g, '\x00', 'ethereum', 'USDT', $1, 1000000 + g, 1000000 + g, $2, g,
			'awaiting_payment', $3::timestamptz, $3::timestamptz + interval '1 hour', $3::timestamptz + interval '25 hours', $3::timestamptz,
			0, $3::timestamptz - interval '5 minutes'
		FROM generate_series(1, $4) g`, usdtSC, shop, f.clock.Now(), n)
}

// batchesMoves returns, by order id, the transaction that wrote each
// status change of the reconciler (the xmin of its timeline entry), and
// fails the test unless every order in ids moved exactly once.
func batchesMoves(f *fixture, ids []string) map[string]string {
	f.t.Helper()
	var rows []struct {
		Order string `db:"order_id"`
		Xmin  string `db:"xmin"`
	}
	if err := f.db.Select(&rows, `SELECT order_id, xmin::text FROM order_events
		WHERE type = 'status_changed' AND actor = 'reconciler' ORDER BY order_id`); err != nil {
		f.t.Fatal(err)
	}
	moves := map[string]string{}
	for _, r := range rows {
		if _, twice := moves[r.Order]; twice {
			f.t.Fatalf("order %s moved twice", r.Order)
		}
		moves[r.Order] = r.Xmin
	}
	for _, id := range ids {
		if _, ok := moves[id]; !ok {
			f.t.Fatalf("order %s did not move (moves: %v)", id, moves)
		}
	}
	if len(moves) != len(ids) {
		f.t.Fatalf("%d orders moved, want %d", len(moves), len(ids))
	}
	return moves
}

// batchesIDs returns the ids batchesDueOrders gives orders from to to.
func batchesIDs(from, to int) []string {
	var ids []string
	for i := from; i <= to; i++ {
		ids = append(ids, fmt.Sprintf("ord_%08d", i))
	}
	return ids
}

// README ("Reconciling"): "Step (4) walks the orders in batches of 2,000,
// each its own transaction". A new reconciler moves 2,001 due orders in
// two transactions: the first 2,000 by id in one, the last in another.
func TestReconcilerMovesOrdersInBatchesOf2000EachItsOwnTransaction(t *testing.T) {
	f := newFixture(t)
	rec := reconcile.New(f.db, slog.New(slog.NewTextHandler(io.Discard, nil)), grace, 8*24*time.Hour)
	rec.Now = f.clock.Now
	if rec.Batch != 2000 {
		t.Fatalf("a new reconciler's batch is %d orders, README says 2,000", rec.Batch)
	}
	batchesDueOrders(f, 2001)
	f.clock.Advance(expires + time.Minute)
	res, err := rec.Pass(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Transitions != 2001 {
		t.Fatalf("the pass moved %d orders, want 2001", res.Transitions)
	}
	moves := batchesMoves(f, batchesIDs(1, 2001))
	first := moves["ord_00000001"]
	for _, id := range batchesIDs(1, 2000) {
		if moves[id] != first {
			t.Fatalf("order %s moved in transaction %s, order ord_00000001 in %s: the first 2,000 orders are not one batch",
				id, moves[id], first)
		}
	}
	if last := moves["ord_00002001"]; last == first {
		t.Fatalf("the 2,001st order moved in the first batch's transaction (%s)", last)
	}
}

// README ("Reconciling"): step (4) walks the orders in batches, "two at
// once (a batch reads and locks its orders while the one before applies
// its moves; their orders never overlap)". With batches of 2 and four due
// orders, the first batch's moves are held up (its timeline entries wait
// on a lock the test holds): the second batch has meanwhile read and
// locked the other two orders, in a transaction of its own, before the
// first commits. Released, every order moves exactly once, two per
// transaction.
func TestTwoTransitionBatchesAreInFlightAtOnceOnDisjointOrders(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.rec.Batch = 2
	batchesDueOrders(f, 4)
	f.clock.Advance(expires + time.Minute)
	ids := batchesIDs(1, 4)

	const key = 731_100 // the advisory lock a status change waits for
	pgtest.Exec(t, f.db, `CREATE FUNCTION batches_hold_moves() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock_shared(`+fmt.Sprint(key)+`); RETURN NEW; END $$`)
	pgtest.Exec(t, f.db, `CREATE TRIGGER batches_hold_moves BEFORE INSERT ON order_events FOR EACH ROW
		WHEN (NEW.type = 'status_changed') EXECUTE FUNCTION batches_hold_moves()`)
	hold, err := f.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	if _, err := hold.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			if _, err := hold.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
				t.Error(err)
			}
		}
	}
	defer release()

	type outcome struct {
		res reconcile.Result
		err error
	}
	passed := make(chan outcome, 1)
	go func() {
		res, err := f.rec.Pass(ctx)
		passed <- outcome{res, err}
	}()
	f.waitForLockWaits(2)

	// Who locks each order: the transaction id in its row (xmax), and the
	// session that holds that transaction open.
	var locks []struct {
		Order string `db:"id"`
		PID   *int   `db:"pid"`
	}
	if err := f.db.Select(&locks, `SELECT o.id, l.pid FROM orders o
		LEFT JOIN pg_locks l ON l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
			AND l.transactionid::text = o.xmax::text
		WHERE o.id = ANY($1) ORDER BY o.id`, pq.Array(ids)); err != nil {
		t.Fatal(err)
	}
	var waiting []int
	if err := f.db.Select(&waiting, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted ORDER BY pid`); err != nil {
		t.Fatal(err)
	}
	lockedBy := map[string]int{}
	for _, l := range locks {
		if l.PID == nil {
			t.Fatalf("order %s is not locked while the first batch applies its moves: %+v", l.Order, locks)
		}
		lockedBy[l.Order] = *l.PID
	}
	first, second := lockedBy[ids[0]], lockedBy[ids[2]]
	if lockedBy[ids[1]] != first || lockedBy[ids[3]] != second || first == second {
		t.Fatalf("orders locked by sessions %v; want the first two by one batch, the last two by another", lockedBy)
	}
	if !slices.Contains(waiting, first) || !slices.Contains(waiting, second) {
		t.Fatalf("sessions %v wait to write their moves; want both batches' (%d and %d)", waiting, first, second)
	}
	var expired int
	if err := f.db.Get(&expired, `SELECT count(*) FROM orders WHERE status <> 'awaiting_payment'`); err != nil {
		t.Fatal(err)
	}
	if expired != 0 {
		t.Fatalf("%d orders moved before the first batch committed", expired)
	}

	release()
	var out outcome
	select {
	case out = <-passed:
	case <-time.After(10 * time.Second):
		t.Fatal("the pass did not end within 10 s of the moves being let through")
	}
	if out.err != nil || out.res.Transitions != 4 {
		t.Fatalf("the pass moved %d orders (%v), want 4", out.res.Transitions, out.err)
	}
	moves := batchesMoves(f, ids)
	if moves[ids[0]] != moves[ids[1]] || moves[ids[2]] != moves[ids[3]] || moves[ids[0]] == moves[ids[2]] {
		t.Fatalf("the moves' transactions by order: %v; want two, two orders each", moves)
	}
	for _, id := range ids {
		var status paywatch.Status
		if err := f.db.Get(&status, `SELECT status FROM orders WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		if status != paywatch.StatusExpired {
			t.Fatalf("order %s is %s after the pass, want expired", id, status)
		}
	}
}
