package outbox

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch/migrations/pgtest"
)

// A receiver was down while orders kept changing: 3,000 events wait, two
// per order, beside 100,000 delivered ones, and the statistics the
// planner holds were taken before the backlog (autovacuum analyzes after a
// tenth of the table changed). Fetching the next batch reads the pending
// events once, not once per pending event: the planner, told of no pending
// event, paired each with every other (369,000 pages, 2.7 s a fetch, every
// fetch). The batch is still the earliest pending event of each order, in
// the order they fall due: an order whose first event is not due sends
// none, and a busy order none.
func TestDueEventsReadEachPendingEventOnce(t *testing.T) {
	db := pgtest.New(t)
	now := time.Now().UTC()
	pgtest.Exec(t, db, `INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at, body, status, delivered_at)
		SELECT 'evh_' || g, 'ord_h' || (g / 2), 'order.settled', $1::timestamptz - interval '2 days',
			$1::timestamptz - interval '2 days', repeat('x', 300), 'delivered', $1::timestamptz - interval '2 days'
		FROM generate_series(1, 100000) g`, now)
	pgtest.Exec(t, db, `VACUUM ANALYZE webhook_outbox`)
	// The order whose first event is not due yet, and whose second is.
	pgtest.Exec(t, db, `INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at, body)
		VALUES ('evx_1', 'ord_x', 'order.confirming', $1::timestamptz, $1::timestamptz + interval '1 minute', 'x')`, now)
	pgtest.Exec(t, db, `INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at, body)
		VALUES ('evx_2', 'ord_x', 'order.settled', $1::timestamptz, $1::timestamptz - interval '2 hours', 'x')`, now)
	// The backlog: evp_1 and evp_2 of ord_p1, evp_3 and evp_4 of ord_p2...
	// falling due a second apart, in the order they were written.
	pgtest.Exec(t, db, `INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at, body)
		SELECT 'evp_' || g, 'ord_p' || ((g + 1) / 2), 'order.settled', $1::timestamptz - interval '1 hour',
			$1::timestamptz - interval '1 hour' + g * interval '1 second', repeat('x', 300)
		FROM generate_series(1, 3000) g ORDER BY g`, now)
	pages, got := fetchDue(t, db, now, "ord_p1")
	if pages > 2000 {
		t.Fatalf("a fetch of due events read %.0f pages among 3,002 pending events", pages)
	}
	var want []string
	for g := 3; len(want) < batchSize; g += 2 {
		want = append(want, fmt.Sprintf("evp_%d", g))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("due events %v,\nwant %v", got, want)
	}
	t.Logf("a fetch read %.0f pages", pages)
}

// A long outage: 20,000 events wait for their next attempt, and 10 are
// due. A fetch reads the due events and their orders' pending events, not
// every event that waits (which cost 145–245 ms a fetch at 100,000).
func TestDueEventsReadTheDueOnes(t *testing.T) {
	db := pgtest.New(t)
	now := time.Now().UTC()
	pgtest.Exec(t, db, `INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at, body)
		SELECT 'evw_' || g, 'ord_w' || ((g + 1) / 2), 'order.settled', $1::timestamptz - interval '1 hour',
			$1::timestamptz + g * interval '1 second', repeat('x', 300)
		FROM generate_series(1, 20000) g ORDER BY g`, now)
	pgtest.Exec(t, db, `INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at, body)
		SELECT 'evd_' || g, 'ord_d' || g, 'order.settled', $1::timestamptz - interval '1 hour',
			$1::timestamptz - g * interval '1 second', repeat('x', 300)
		FROM generate_series(1, 10) g`, now)
	pgtest.Exec(t, db, `VACUUM ANALYZE webhook_outbox`)
	pages, got := fetchDue(t, db, now)
	want := []string{"evd_10", "evd_9", "evd_8", "evd_7", "evd_6", "evd_5", "evd_4", "evd_3", "evd_2", "evd_1"}
	if !slices.Equal(got, want) {
		t.Fatalf("due events %v, want %v", got, want)
	}
	if pages > 200 {
		t.Fatalf("a fetch of 10 due events among 20,010 pending read %.0f pages", pages)
	}
	t.Logf("a fetch read %.0f pages", pages)
}

// fetchDue runs a fetch's two statements (dueOrders, then dueEvents) at
// now, with the orders of busy busy, and returns the pages they read and
// the events fetched.
func fetchDue(t *testing.T, db *sqlx.DB, now time.Time, busy ...string) (float64, []string) {
	t.Helper()
	if busy == nil {
		busy = []string{}
	}
	plan, out := pgtest.Explain(t, db, dueOrders, now, pq.Array(busy))
	pages := plan.Pages()
	var orders []string
	if err := db.Select(&orders, dueOrders, now, pq.Array(busy)); err != nil {
		t.Fatal(err)
	}
	age := (72 * time.Hour).Microseconds()
	plan, out2 := pgtest.Explain(t, db, dueEvents, now, batchSize, pq.Array(orders), age)
	pages += plan.Pages()
	var due []event
	if err := db.Select(&due, dueEvents, now, batchSize, pq.Array(orders), age); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range due {
		got = append(got, e.ID)
	}
	if testing.Verbose() {
		t.Logf("%s\n%s", out, out2)
	}
	return pages, got
}
