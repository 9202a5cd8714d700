package outbox

import (
	"fmt"
	"slices"
	"testing"
	"time"

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
	busy := pq.Array([]string{"ord_p1"})
	age := (72 * time.Hour).Microseconds()
	plan, out := pgtest.Explain(t, db, dueEvents, now, batchSize, busy, age)
	if plan.Pages() > 2000 {
		t.Fatalf("a fetch of due events read %.0f pages among 3,002 pending events:\n%s", plan.Pages(), out)
	}
	var due []event
	if err := db.Select(&due, dueEvents, now, batchSize, busy, age); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range due {
		got = append(got, e.ID)
	}
	var want []string
	for g := 3; len(want) < batchSize; g += 2 {
		want = append(want, fmt.Sprintf("evp_%d", g))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("due events %v,\nwant %v", got, want)
	}
	t.Logf("a fetch read %.0f pages", plan.Pages())
}
