package reconcile_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
)

// sight records a mempool sighting of amount to an address, as a Bitcoin
// mempool watcher would, now.
func (f *fixture) sight(o *paywatch.Order, to string, amount int64, tx string) {
	f.t.Helper()
	f.n++
	pgtest.Exec(f.t, f.db, `INSERT INTO mempool_transfers (id, network, asset, tx_hash, tx_key, idx, to_address, amount,
		first_seen_at, updated_at) VALUES ($1, $2, $3, $4, 'vout:0', 0, $5, $6, $7, $7)`,
		fmt.Sprintf("mpt_%04d", f.n), o.Network, o.Asset, tx, to, amount, f.clock.Now())
}

// gone marks a sighting missing from the mempool at the network's cursor,
// as the watcher does when a read no longer holds it.
func (f *fixture) gone(tx string, replacedBy string) {
	f.t.Helper()
	pgtest.Exec(f.t, f.db, `UPDATE chain_cursors SET block_number = coalesce(block_number, head)`)
	pgtest.Exec(f.t, f.db, `UPDATE mempool_transfers m SET missing_at_height = coalesce(c.block_number, 0), missing_since = $2,
		replaced_by = NULLIF($3, ''), dirty = true FROM chain_cursors c WHERE c.network = m.network AND m.tx_hash = $1`,
		tx, f.clock.Now(), replacedBy)
}

// scanned moves the network's cursor to its head, as a scanner would.
func (f *fixture) scanned(network string, blocks int) {
	f.t.Helper()
	pgtest.Exec(f.t, f.db, `UPDATE chain_cursors SET head = head + $2, block_number = coalesce(block_number, head) + $2
		WHERE network = $1`, network, blocks)
}

// A sighting in the mempool holds no payment: an order confirming on a
// sighting alone is still waiting for its money, so a customer's claim on
// a payment of about its amount does not link (the victim's own second,
// inexact payment cannot be taken by an older order's claim).
func TestMempoolSightingKeepsTheClaimGuard(t *testing.T) {
	f := newFixture(t)
	attacker := f.order(usdt, 1_000_000)
	victim := f.order(usdt, 1_000_000_000)
	f.clock.Advance(time.Second)
	f.sight(victim, victim.PayAddress, victim.PayAmount.Int64(), "stuck")
	f.pass()
	f.expect(victim, paywatch.StatusConfirming, "")
	h := hash(f, "victim-second-inexact")
	if _, err := f.store.MarkPaid(context.Background(), attacker.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Second)
	tr := f.pay(payment{asset: usdt, to: victim.PayAddress, amount: 999_000_000, tx: h})
	f.pass()
	if got := f.transferOrder(tr); got == attacker.ID {
		t.Fatalf("the claim took a payment the sighted order may be owed: attacker %s, victim %s", statusOf(f, attacker), statusOf(f, victim))
	}
}

// A payment detected, then mined where it cannot pay the order (a reorg
// mined it again below the order's height): it was taken away, not
// withdrawn: the order is disputed, not silently back to awaiting payment.
func TestMempoolMinedPaymentTakenAwayIsDisputed(t *testing.T) {
	f := newFixture(t)
	o := f.order(btc, 100_000)
	f.clock.Advance(time.Second)
	f.sight(o, o.PayAddress, 100_000, "txa")
	f.pass()
	f.expect(o, paywatch.StatusConfirming, "")
	tr := f.pay(payment{asset: btc, to: o.PayAddress, amount: 100_000, tx: "txa", state: "seen"})
	pgtest.Exec(t, f.db, `UPDATE transfers SET tx_key = 'vout:0' WHERE id = $1`, tr)
	f.gone("txa", "")
	f.scanned("bitcoin", 1)
	f.pass()
	f.expect(o, paywatch.StatusConfirming, "")
	pgtest.Exec(t, f.db, `UPDATE transfers SET block_number = 0, block_hash = '0xnew', ledger_dirty = true WHERE id = $1`, tr)
	f.pass()
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment)
}

// What a sighting may move: the whole pay amount, seen before expiry, and
// only so many times.
func TestMempoolSightingsAreBounded(t *testing.T) {
	f := newFixture(t)

	// Part of the amount: listed, but the order does not move.
	part := f.order(btc, 100_000)
	f.clock.Advance(time.Second)
	f.sight(part, part.PayAddress, 1_000, "tiny")
	f.pass()
	f.expect(part, paywatch.StatusAwaitingPayment, "")
	if got, _ := f.store.Get(context.Background(), part.ID); len(got.Transfers) != 1 || got.Transfers[0].State != paywatch.TransferMempool {
		t.Fatalf("the part payment is not listed: %+v", got.Transfers)
	}

	// A sighting holds an order confirming only until its expiry.
	stuck := f.order(btc, 100_000)
	f.clock.Advance(time.Second)
	f.sight(stuck, stuck.PayAddress, 100_000, "lowfee")
	f.pass()
	f.expect(stuck, paywatch.StatusConfirming, "")
	f.clock.Advance(expires)
	f.pass()
	f.expect(stuck, paywatch.StatusExpired, "")

	// Seen after expiry: matches nothing.
	late := f.order(btc, 100_000)
	f.clock.Advance(expires + time.Second)
	f.pass()
	f.expect(late, paywatch.StatusExpired, "")
	f.sight(late, late.PayAddress, 100_000, "toolate")
	f.pass()
	f.expect(late, paywatch.StatusExpired, "")

	// Replacing a payment back and forth moves an order at most
	// MaxWithdrawals times.
	flip := f.order(btc, 100_000)
	moves := 0
	for i := 0; i < reconcile.MaxWithdrawals+2; i++ {
		f.clock.Advance(time.Second)
		tx := fmt.Sprintf("flip%d", i)
		f.sight(flip, flip.PayAddress, 100_000, tx)
		f.pass()
		if got, _ := f.store.Get(context.Background(), flip.ID); got.Status == paywatch.StatusConfirming {
			moves++
		}
		f.gone(tx, fmt.Sprintf("self%d", i))
		f.pass()
		f.expect(flip, paywatch.StatusAwaitingPayment, "")
	}
	if moves != reconcile.MaxWithdrawals {
		t.Fatalf("the order moved to confirming %d times, want %d", moves, reconcile.MaxWithdrawals)
	}
}

// A sighting merely missing (a node restarting, a failover) is dropped only
// once a block has passed and a minute has gone by: a brief absence
// withdraws nothing.
func TestMempoolBriefAbsenceWithdrawsNothing(t *testing.T) {
	f := newFixture(t)
	o := f.order(btc, 100_000)
	f.clock.Advance(time.Second)
	f.sight(o, o.PayAddress, 100_000, "blip")
	f.pass()
	f.gone("blip", "")
	f.clock.Advance(2 * reconcile.DroppedAfter)
	f.pass()
	f.expect(o, paywatch.StatusConfirming, "") // no block passed yet
	f.scanned("bitcoin", 1)
	f.pass()
	f.expect(o, paywatch.StatusAwaitingPayment, "")
	if evs := f.events(o); evs[len(evs)-2] != "payment_withdrawn" {
		t.Fatalf("timeline %v", evs)
	}
}

// A paid order that once had another sighting (a fee bump, or a stranger's
// few satoshis) and whose payment a reorg then took away is disputed, not
// sent back to wait and expire in silence.
func TestMempoolHistoryDoesNotHideATakenPayment(t *testing.T) {
	for _, stray := range []bool{false, true} {
		t.Run(fmt.Sprintf("stray=%v", stray), func(t *testing.T) {
			f := newFixture(t)
			o := f.order(btc, 100_000)
			f.clock.Advance(time.Second)
			if stray {
				f.sight(o, o.PayAddress, 600, "stray") // still in the mempool
			} else {
				f.sight(o, o.PayAddress, 100_000, "txa0")
				f.pass()
				f.gone("txa0", "txa") // a fee bump
			}
			f.sight(o, o.PayAddress, 100_000, "txa")
			f.pass()
			f.expect(o, paywatch.StatusConfirming, "")
			tr := f.pay(payment{asset: btc, to: o.PayAddress, amount: 100_000, tx: "txa", state: "seen"})
			pgtest.Exec(t, f.db, `UPDATE transfers SET tx_key = 'vout:0' WHERE id = $1`, tr)
			f.gone("txa", "")
			f.scanned("bitcoin", 1)
			f.pass()
			f.expect(o, paywatch.StatusConfirming, "")
			pgtest.Exec(t, f.db, `UPDATE transfers SET block_number = 0, block_hash = '0xnew', ledger_dirty = true WHERE id = $1`, tr)
			f.pass()
			f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment)
		})
	}
}

// Fee bumps are no withdrawals: an order whose payment is replaced by a
// higher-fee one paying it again, many times, stays confirming, and
// cannot be cancelled meanwhile.
func TestMempoolFeeBumpsKeepTheOrder(t *testing.T) {
	f := newFixture(t)
	o := f.order(btc, 100_000)
	f.clock.Advance(time.Second)
	f.sight(o, o.PayAddress, 100_000, "bump0")
	f.pass()
	for i := 1; i <= reconcile.MaxWithdrawals+2; i++ {
		f.gone(fmt.Sprintf("bump%d", i-1), fmt.Sprintf("bump%d", i))
		f.sight(o, o.PayAddress, 100_000, fmt.Sprintf("bump%d", i))
		f.pass()
		f.expect(o, paywatch.StatusConfirming, "")
	}
	if _, err := f.store.Cancel(context.Background(), o.ID, "shop"); err == nil {
		t.Fatal("the storefront cancelled an order whose full payment is in the mempool")
	}
	evs := f.events(o)
	if n := strings.Count(strings.Join(evs, " "), "payment_replaced"); n != reconcile.MaxWithdrawals+2 || slices.Contains(evs, "payment_withdrawn") {
		t.Fatalf("timeline %v", evs)
	}
}

// A sighting that comes back (re-broadcast, failover) is matched again
// under the rules: it cannot flip an order past the cap.
func TestMempoolReopenedSightingKeepsTheCap(t *testing.T) {
	f := newFixture(t)
	o := f.order(btc, 100_000)
	moves := 0
	for i := 0; i < reconcile.MaxWithdrawals+3; i++ {
		f.clock.Advance(time.Second)
		if i == 0 {
			f.sight(o, o.PayAddress, 100_000, "again")
		} else {
			// The watcher's upsert for a transaction seen again.
			pgtest.Exec(t, f.db, `UPDATE mempool_transfers SET missing_at_height = NULL, missing_since = NULL, left_at = NULL,
				left_reason = NULL, replaced_by = NULL, order_id = NULL, dirty = true WHERE tx_hash = 'again'`)
		}
		f.pass()
		if got, _ := f.store.Get(context.Background(), o.ID); got.Status == paywatch.StatusConfirming {
			moves++
		}
		f.gone("again", "")
		f.scanned("bitcoin", 1)
		f.clock.Advance(2 * reconcile.DroppedAfter)
		f.pass()
	}
	if moves != reconcile.MaxWithdrawals {
		t.Fatalf("a sighting seen again moved the order %d times, want %d", moves, reconcile.MaxWithdrawals)
	}
}

// README: "Mempool sightings stand apart from the transfers: when the step
// that follows them fails, the rest of the pass goes on and reports it."
// Here the database refuses to tie a sighting; the rest of the pass goes on — another order's confirmed payment settles it — and the
// pass reports the failure.
func TestAFailingMempoolStepHoldsBackNoPayment(t *testing.T) {
	f := newFixture(t)
	paid := f.order(usdt, 1_234_000_000)
	f.pay(payment{asset: usdt, to: shop, amount: 1_234_000_000, state: "confirmed"})
	seen := f.order(btc, 100_000)
	f.clock.Advance(time.Second)
	f.sight(seen, seen.PayAddress, seen.PayAmount.Int64(), "c-seen")
	pgtest.Exec(t, f.db, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'sightings refused'; END $$`)
	pgtest.Exec(t, f.db, `CREATE TRIGGER refuse BEFORE UPDATE ON mempool_transfers FOR EACH ROW EXECUTE FUNCTION refuse()`)
	_, err := f.rec.Pass(context.Background())
	if err == nil || !strings.Contains(err.Error(), "sightings refused") {
		t.Fatalf("the pass returned %v, want the mempool step's failure", err)
	}
	f.expect(paid, paywatch.StatusSettled, "")
	f.expect(seen, paywatch.StatusAwaitingPayment, "")
	pgtest.Exec(t, f.db, `DROP TRIGGER refuse ON mempool_transfers`)
	f.pass()
	f.expect(seen, paywatch.StatusConfirming, "")
}

// The rounds of a pass go on too while the mempool step fails: an order on
// its own address whose payment a reorg took away, with another exact
// payment waiting there, is settled again by that payment in the same
// pass (its later rounds), as when the mempool step works.
func TestAFailingMempoolStepStopsNoRound(t *testing.T) {
	for _, failing := range []bool{false, true} {
		t.Run(map[bool]string{false: "mempool step working", true: "mempool step failing"}[failing], func(t *testing.T) {
			f := newFixture(t)
			o := f.order(btc, 100_000)
			f.clock.Advance(time.Second)
			first := f.pay(payment{asset: btc, to: o.PayAddress, amount: 100_000})
			f.pass()
			f.expect(o, paywatch.StatusSettled, "")
			f.clock.Advance(time.Second)
			f.pay(payment{asset: btc, to: o.PayAddress, amount: 100_000})
			f.pass()
			f.setState(first, "orphaned")
			if failing {
				pgtest.Exec(t, f.db, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
					BEGIN RAISE EXCEPTION 'sightings refused'; END $$`)
				pgtest.Exec(t, f.db, `CREATE TRIGGER refuse BEFORE UPDATE ON mempool_transfers FOR EACH STATEMENT EXECUTE FUNCTION refuse()`)
				other := f.order(btc, 200_000)
				f.clock.Advance(time.Second)
				f.sight(other, other.PayAddress, 200_000, "c-other")
			}
			_, err := f.rec.Pass(context.Background())
			if failing != (err != nil) {
				t.Fatalf("the pass returned %v", err)
			}
			f.expect(o, paywatch.StatusSettled, "")
			if failing {
				pgtest.Exec(t, f.db, `DROP TRIGGER refuse ON mempool_transfers`)
			}
		})
	}
}
