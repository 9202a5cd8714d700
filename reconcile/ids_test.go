package reconcile_test

import (
	"context"
	"regexp"
	"testing"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// The webhook events of orders disputed as ambiguous are written by the
// statement that flags the payment (README, HTTP API): `evt_` and 32
// hexadecimal characters, unlike the other identifiers.
func TestAmbiguousDisputeEventIDs(t *testing.T) {
	f := newFixture(t)
	a := f.order(usdt, 6_000_000)
	b := f.order(usdt, 6_000_001)
	// Two orders one payment could pay (a pay amount forced equal).
	pgtest.Exec(t, f.db, `UPDATE orders SET pay_amount = 6000001 WHERE id = $1`, a.ID)
	pgtest.Exec(t, f.db, `DELETE FROM amount_slots`)
	f.pay(payment{asset: usdt, to: shop, amount: 6_000_001})
	f.pass()
	f.expect(a, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
	var ids []string
	if err := f.db.Select(&ids, `SELECT id FROM webhook_outbox WHERE type = 'order.disputed'`); err != nil || len(ids) != 2 {
		t.Fatalf("dispute events %v (%v), want 2", ids, err)
	}
	form := regexp.MustCompile(`^evt_[0-9a-f]{32}$`)
	for _, id := range ids {
		if !form.MatchString(id) {
			t.Errorf("webhook event id %q is not evt_ and 32 hexadecimal characters", id)
		}
	}
	// Closed, so that the forced pay amount leaves no invariant broken.
	for _, o := range []*paywatch.Order{a, b} {
		if err := f.op.Resolve(context.Background(), o.ID, paywatch.StatusCancelled, "test", "alice"); err != nil {
			t.Fatal(err)
		}
	}
}
