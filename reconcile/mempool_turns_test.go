package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
)

// The reconciler's mempool step writes sightings in turns with the Bitcoin
// watchers, but never waits for its turn: while a watcher records what it
// read (here, a transaction holding the sightings' lock as a watcher's
// does), a pass goes on without the step and does the rest of its work at
// once. The next pass ties the sighting.
func TestPassDoesNotWaitForAMempoolWatchersWrite(t *testing.T) {
	f := newFixture(t)
	sighted, paid := f.order(btc, 100_000), f.order(usdt, 5_000_000)
	f.clock.Advance(time.Second)
	f.sight(sighted, sighted.PayAddress, sighted.PayAmount.Int64(), "mempool-tx")
	f.pay(payment{asset: usdt, to: paid.PayAddress, amount: paid.PayAmount.Int64()})

	watcher, err := f.db.BeginTxx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Rollback()
	if _, err := watcher.Exec(`SELECT pg_advisory_xact_lock(hashtextextended('paywatch:mempool_transfers', 0))`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.rec.Pass(ctx); err != nil {
		t.Fatalf("a pass while a mempool watcher records: %v", err)
	}
	f.expect(paid, paywatch.StatusSettled, "")
	f.expect(sighted, paywatch.StatusAwaitingPayment, "")

	if err := watcher.Commit(); err != nil {
		t.Fatal(err)
	}
	f.pass()
	f.expect(sighted, paywatch.StatusConfirming, "")
}
