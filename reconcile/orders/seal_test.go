package orders_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/webhook"
)

// Enqueue writes each event with its own body (its id and type, its order
// as the transaction sees it), however many events and orders a batch
// holds; without a Sealer the events wait unsealed.
func TestEnqueueWritesEachEventsBody(t *testing.T) {
	db := pgtest.New(t)
	s, clock := newStore(t, db)
	ctx := context.Background()
	// What the shop wrote travels byte for byte, whatever it holds.
	ra := req("enq-a", usdt, 5_000_000)
	ra.Metadata = json.RawMessage(`{"note":"tab\there\nline\\back \\N é \u2028 ✓"}`)
	a, _, err := s.Create(ctx, ra)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := s.Create(ctx, req("enq-b", usdt, 7_000_000))
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db, `DELETE FROM webhook_outbox`) // creation's own events
	sealer := orders.NewSealer([]*paywatch.Network{eth})
	before := time.Now()
	events := []orders.Event{{OrderID: a.ID, Type: "order.confirming"}, {OrderID: b.ID, Type: "order.expired"},
		{OrderID: a.ID, Type: "order.settled"}}
	err = pg.Tx(ctx, db, func(tx *sqlx.Tx) error {
		// A change earlier in the transaction shows in the body.
		if _, err := tx.Exec(`UPDATE orders SET status = 'expired' WHERE id = $1`, b.ID); err != nil {
			return err
		}
		return sealer.Enqueue(ctx, tx, clock.Now(), events)
	})
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		ID, OrderID, Type string
		Body              string
	}
	if err := db.Select(&rows, `SELECT id AS "id", order_id AS "orderid", type AS "type", body AS "body"
		FROM webhook_outbox ORDER BY seq`); err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(events) {
		t.Fatalf("%d events written, want %d", len(rows), len(events))
	}
	var stamped int
	if err := db.Get(&stamped, `SELECT count(*) FROM webhook_outbox WHERE created_at = $1 AND next_attempt_at = $1
		AND status = 'pending'`, clock.Now()); err != nil || stamped != len(events) {
		t.Fatalf("%d events made and due at %v, pending (%v); want %d", stamped, clock.Now(), err, len(events))
	}
	// Their ids begin with the (wall clock) time they were made: "evt_"
	// and 9 characters hold its milliseconds but the last 3 bits.
	lo, hi := paywatch.NewSortableID("evt", before)[:13], paywatch.NewSortableID("evt", time.Now().Add(8*time.Millisecond))[:13]
	for _, r := range rows {
		if r.ID[:13] < lo || r.ID[:13] > hi {
			t.Errorf("event id %s does not begin with when it was made (%s to %s)", r.ID, lo, hi)
		}
	}
	for i, r := range rows {
		var ev webhook.Event
		if err := json.Unmarshal([]byte(r.Body), &ev); err != nil {
			t.Fatalf("event %d: body %q: %v", i, r.Body, err)
		}
		var o struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		}
		if err := json.Unmarshal(ev.Order, &o); err != nil {
			t.Fatal(err)
		}
		if events[i].OrderID == a.ID {
			got, err := s.Get(ctx, a.ID)
			if err != nil {
				t.Fatal(err)
			}
			view, err := json.Marshal(orders.NewView(got, eth))
			if err != nil {
				t.Fatal(err)
			}
			if string(ev.Order) != string(view) {
				t.Fatalf("event %d carries order\n%s\nwhich the API shows as\n%s", i, ev.Order, view)
			}
		}
		want := map[string]string{a.ID: "awaiting_payment", b.ID: "expired"}[events[i].OrderID]
		if ev.ID != r.ID || ev.Type != events[i].Type || r.OrderID != events[i].OrderID || o.ID != events[i].OrderID ||
			o.Status != want || !ev.CreatedAt.Equal(clock.Now()) {
			t.Fatalf("event %d: %s %s for %s, body %+v with order %+v", i, r.ID, r.Type, r.OrderID, ev, o)
		}
	}
	// Without a Sealer: written unsealed, for the sender.
	var none *orders.Sealer
	if err := pg.Tx(ctx, db, func(tx *sqlx.Tx) error {
		return none.Enqueue(ctx, tx, clock.Now().Add(time.Second), events[:1])
	}); err != nil {
		t.Fatal(err)
	}
	var unsealed int
	if err := db.Get(&unsealed, `SELECT count(*) FROM webhook_outbox WHERE body IS NULL`); err != nil || unsealed != 1 {
		t.Fatalf("%d unsealed events (%v), want 1", unsealed, err)
	}
}
