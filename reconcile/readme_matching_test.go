package reconcile_test

import (
	"testing"
	"time"

	"github.com/paywatch/paywatch"
)

// README: "a block whose own time is more than 5 minutes (EVM) or 2 hours
// (Bitcoin) before the order's creation never pays it": a block exactly 5
// minutes (EVM) or 2 hours (Bitcoin) before it is not more than that, and
// pays it when its height is above the one the order was created at.
func TestBlockTimeExactly5MinutesEVMOr2HoursBitcoinBeforeTheOrderStillPays(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		asset *paywatch.Asset
		slack time.Duration
		order *paywatch.Order
	}{
		{asset: usdt, slack: 5 * time.Minute},
		{asset: btc, slack: 2 * time.Hour},
	}
	for i := range cases {
		cases[i].order = f.order(cases[i].asset, 100_000)
	}
	// The head was recorded late: each block is above the height the
	// orders were created at, and paywatch records it after them.
	f.clock.Advance(time.Second)
	transfers := make([]string, len(cases))
	for i, c := range cases {
		transfers[i] = f.pay(payment{asset: c.asset, to: c.order.PayAddress, amount: c.order.PayAmount.Int64(),
			blockAgo: c.slack + time.Second})
		var exact bool
		if err := f.db.Get(&exact, `SELECT t.block_time = o.created_at - make_interval(secs => $3) AND t.block_number > o.created_height
			FROM transfers t, orders o WHERE t.id = $1 AND o.id = $2`, transfers[i], c.order.ID, c.slack.Seconds()); err != nil || !exact {
			t.Fatalf("setup: the %s block is not exactly %v before the order's creation and above its height (%v)",
				c.asset.Network, c.slack, err)
		}
	}
	f.pass()
	for i, c := range cases {
		if got := f.transferOrder(transfers[i]); got != c.order.ID {
			t.Fatalf("a block on %s exactly %v before the order's creation did not pay it: transfer on %q, order %s",
				c.asset.Network, c.slack, got, statusOf(f, c.order))
		}
		f.expect(c.order, paywatch.StatusSettled, "")
	}
}
