package reconcile_test

// Tests of README's lifecycle table, of what a payment seen in a mempool
// may and may not do, and of the checking tools (CheckDecisions,
// CheckInvariants), each driven through real reconciler passes over a
// real database (and, where the chain matters, a real btcd node).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/btcsuite/btcd/btcutil"
	"github.com/btcsuite/btcd/txscript"
	"github.com/btcsuite/btcd/wire"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
	"github.com/paywatch/paywatch/ledger"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// alExpectMoves fails unless the order's status changes are want.
func alExpectMoves(f *fixture, o *paywatch.Order, want ...string) {
	f.t.Helper()
	if got := f.moves(o); !slices.Equal(got, want) {
		f.t.Fatalf("order %s moved %v, want %v", o.ExternalID, got, want)
	}
}

// alMinedAgain records what the scanner does when a reorg mines an
// orphaned transfer again, in a new block: its state there, the ledger to
// repost.
func alMinedAgain(f *fixture, transfer, state string) {
	f.t.Helper()
	f.n++
	pgtest.Exec(f.t, f.db, `UPDATE transfers SET state = $2, block_number = $3, block_hash = $4, orphaned_at = NULL,
		ledger_dirty = true WHERE id = $1`, transfer, state, f.n, fmt.Sprintf("0xagain%d", f.n))
}

// README, lifecycle table: "expired | disputed `ambiguous` | reconciler | a
// transfer could pay this order or another, or another order's customer
// claims the payment it claims"; and "disputed | settled | reconciler |
// decided again when its payments change: an exact payment confirms after
// ... `ambiguous`".
func TestExpiredOrderDisputedAmbiguousThenSettledByAnExactPayment(t *testing.T) {
	t.Run("a transfer could pay this order or another", func(t *testing.T) {
		f := newFixture(t)
		first := f.order(usdt, 10_000_000)
		f.clock.Advance(expires + time.Minute)
		f.pass()
		f.expect(first, paywatch.StatusExpired, "")
		// Once the first order's window has ended its pay amount is free, and
		// the next order for the same amount gets it.
		f.clock.Advance(first.MonitorUntil.Sub(f.clock.Now()) + time.Second)
		second := f.order(usdt, 10_000_000)
		if second.PayAmount.Cmp(first.PayAmount) != 0 {
			t.Fatalf("setup: the second order pays %s, the first %s: want the same pay amount", second.PayAmount, first.PayAmount)
		}
		// Mined 10 s before the first order's window ended (and so within 5
		// minutes before the second was created), recorded only now by a
		// lagging scanner: it could pay either.
		tr := f.pay(payment{asset: usdt, to: shop, amount: first.PayAmount.Int64(),
			blockAgo: f.clock.Now().Sub(first.MonitorUntil) + 10*time.Second})
		f.pass()
		if got := f.transferOrder(tr); got != "" {
			t.Fatalf("a payment either order could take paid %s: a guess", got)
		}
		if flags := f.flags(tr); !slices.Contains(flags, paywatch.FlagAmbiguous) {
			t.Fatalf("the payment two orders could take is flagged %v, want ambiguous", flags)
		}
		f.expect(first, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
		f.expect(second, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
		alExpectMoves(f, first, "awaiting_payment>expired", "expired>disputed/ambiguous")

		// The second order's customer pays again, now: only the second order
		// can take it. It waits for its confirmations, then settles.
		again := f.pay(payment{asset: usdt, to: shop, amount: second.PayAmount.Int64(), state: "seen"})
		f.pass()
		if got := f.transferOrder(again); got != second.ID {
			t.Fatalf("the second order's own exact payment is on %q, want %s", got, second.ID)
		}
		f.expect(second, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
		f.setState(again, "confirmed")
		f.pass()
		f.expect(second, paywatch.StatusSettled, "")
		alExpectMoves(f, second, "awaiting_payment>disputed/ambiguous", "disputed>settled")
		if got := f.balance(ledger.Settled("ethereum", "USDT")); got != second.PayAmount.String() {
			t.Fatalf("settled:ethereum:USDT holds %s, want the exact payment %s", got, second.PayAmount)
		}
		f.expect(first, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
	})

	t.Run("another order's customer claims the payment it claims", func(t *testing.T) {
		f := newFixture(t)
		ctx := context.Background()
		late := f.order(usdt, 9_000_000)
		other := f.order(usdt, 50_000_000)
		f.clock.Advance(expires + time.Minute)
		f.pass()
		f.expect(late, paywatch.StatusExpired, "")
		f.expect(other, paywatch.StatusExpired, "")
		// An inexact payment, mined in the window of both; both customers
		// say it is theirs, and the pass decides both claims.
		h := hash(f, "claimed-twice")
		tr := f.pay(payment{asset: usdt, to: shop, amount: 8_000_000, tx: h})
		for _, o := range []*paywatch.Order{late, other} {
			if _, err := f.store.MarkPaid(ctx, o.ID, h, "shop"); err != nil {
				t.Fatal(err)
			}
			f.clock.Advance(time.Second)
		}
		f.pass()
		if got := f.transferOrder(tr); got != "" {
			t.Fatalf("a payment two customers claim paid %s", got)
		}
		for _, o := range []*paywatch.Order{late, other} {
			f.expect(o, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
			alExpectMoves(f, o, "awaiting_payment>expired", "expired>disputed/ambiguous")
			if evs := f.events(o); !slices.Contains(evs, "hint_contested") {
				t.Fatalf("order %s's timeline %v does not say its claim was contested", o.ExternalID, evs)
			}
		}
	})
}

// README, lifecycle table: "expired | disputed `wrong_asset` | reconciler |
// the customer's tx hash paid in another asset".
func TestExpiredOrderDisputedWrongAssetByItsCustomersTxHash(t *testing.T) {
	f := newFixture(t)
	o := f.order(usdt, 9_000_000)
	f.clock.Advance(expires + time.Minute)
	f.pass()
	f.expect(o, paywatch.StatusExpired, "")
	h := hash(f, "paid-in-dai")
	tr := f.pay(payment{asset: dai, to: shop, amount: 9_000_000, tx: h})
	if _, err := f.store.MarkPaid(context.Background(), o.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonWrongAsset)
	alExpectMoves(f, o, "awaiting_payment>expired", "expired>disputed/wrong_asset")
	if why := f.rejection(o); why != "it paid another network or asset" {
		t.Fatalf("the claim was rejected with %q, want that it paid another asset", why)
	}
	if got := f.transferOrder(tr); got != "" {
		t.Fatalf("the payment in another asset paid %s", got)
	}
}

// README, lifecycle table: "disputed | settled | reconciler | decided again
// when its payments change: an exact payment confirms after ...
// `wrong_asset` ...".
func TestWrongAssetDisputeSettledWhenTheExactPaymentConfirms(t *testing.T) {
	f := newFixture(t)
	o := f.order(usdt, 9_000_000)
	h := hash(f, "paid-in-dai")
	f.pay(payment{asset: dai, to: shop, amount: 9_000_000, tx: h})
	if _, err := f.store.MarkPaid(context.Background(), o.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonWrongAsset)

	// The customer pays again, in the right asset, exactly.
	tr := f.pay(payment{asset: usdt, to: shop, amount: o.PayAmount.Int64(), state: "seen"})
	f.pass()
	if got := f.transferOrder(tr); got != o.ID {
		t.Fatalf("the exact payment in the order's asset is on %q, want %s", got, o.ID)
	}
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonWrongAsset) // until it confirms
	f.setState(tr, "confirmed")
	f.pass()
	f.expect(o, paywatch.StatusSettled, "")
	alExpectMoves(f, o, "awaiting_payment>disputed/wrong_asset", "disputed>settled")
	if got := f.balance(ledger.Settled("ethereum", "USDT")); got != o.PayAmount.String() {
		t.Fatalf("settled:ethereum:USDT holds %s, want %s", got, o.PayAmount)
	}
}

// README, lifecycle table: "expired | confirming | reconciler | a payment is
// matched after expiry (late, or found late) and waits for its
// confirmations"; then "expired | settled ... a payment mined before expiry
// but found after it (a lagging scanner)" and "`late_payment` when mined
// after expiry".
func TestExpiredOrderConfirmingWhenAPaymentIsMatchedAfterExpiry(t *testing.T) {
	cases := []struct {
		name     string
		blockAgo time.Duration // the block's time, before the scanner records it
		end      []string      // the moves once it is confirmed
	}{
		{"late: mined after expiry", 0, []string{"confirming>disputed/late_payment"}},
		{"found late: mined before expiry, recorded after it", expires, []string{"confirming>settled"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			o := f.order(usdt, 7_000_000)
			f.clock.Advance(expires + 10*time.Minute)
			f.pass()
			f.expect(o, paywatch.StatusExpired, "")
			tr := f.pay(payment{asset: usdt, to: shop, amount: o.PayAmount.Int64(), state: "seen", blockAgo: c.blockAgo})
			f.pass()
			if got := f.transferOrder(tr); got != o.ID {
				t.Fatalf("the exact payment is on %q, want %s", got, o.ID)
			}
			f.expect(o, paywatch.StatusConfirming, "")
			f.setState(tr, "confirmed")
			f.pass()
			alExpectMoves(f, o, append([]string{"awaiting_payment>expired", "expired>confirming"}, c.end...)...)
		})
	}
}

// README, lifecycle table: "disputed | disputed `underpaid`, `overpaid`,
// `late_payment`, `multiple_payments`, `orphaned_payment` | reconciler |
// decided again when its payments change (a top-up, a reorg taking or
// giving back a part)".
func TestDisputedOrderDecidedAgainWhenItsPaymentsChange(t *testing.T) {
	t.Run("an address of its own: a reorg takes and gives back parts, a top-up comes late", func(t *testing.T) {
		f := newFixture(t)
		o := f.order(btc, 100_000)
		p1 := f.pay(payment{asset: btc, to: o.PayAddress, amount: 60_000})
		p2 := f.pay(payment{asset: btc, to: o.PayAddress, amount: 60_000})
		f.pass()
		f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOverpaid)
		f.clock.Advance(expires + time.Minute)
		f.pass()
		f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOverpaid)

		f.setState(p2, "orphaned") // a reorg takes a part
		f.pass()
		f.expect(o, paywatch.StatusDisputed, paywatch.ReasonUnderpaid)
		f.setState(p1, "orphaned") // and the rest
		f.pass()
		f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment)
		alMinedAgain(f, p1, "confirmed") // a reorg gives a part back
		f.pass()
		f.expect(o, paywatch.StatusDisputed, paywatch.ReasonUnderpaid)
		f.pay(payment{asset: btc, to: o.PayAddress, amount: 40_000}) // a top-up, after expiry
		f.pass()
		f.expect(o, paywatch.StatusDisputed, paywatch.ReasonLatePayment)
		alExpectMoves(f, o, "awaiting_payment>disputed/overpaid", "disputed>disputed/underpaid",
			"disputed>disputed/orphaned_payment", "disputed>disputed/underpaid", "disputed>disputed/late_payment")
	})

	t.Run("a shared address: a second payment", func(t *testing.T) {
		f := newFixture(t)
		o := f.order(usdt, 9_000_000)
		h := hash(f, "short")
		f.pay(payment{asset: usdt, to: shop, amount: 8_000_000, tx: h})
		if _, err := f.store.MarkPaid(context.Background(), o.ID, h, "shop"); err != nil {
			t.Fatal(err)
		}
		f.pass()
		f.expect(o, paywatch.StatusDisputed, paywatch.ReasonUnderpaid)
		f.pay(payment{asset: usdt, to: shop, amount: o.PayAmount.Int64()})
		f.pass()
		f.expect(o, paywatch.StatusDisputed, paywatch.ReasonMultiplePayments)
		alExpectMoves(f, o, "awaiting_payment>disputed/underpaid", "disputed>disputed/multiple_payments")
	})
}

// README, lifecycle table: "disputed | confirming | reconciler | after a
// reorg, a part payment to the order's own address before expiry waits for
// a top-up"; and "settled | disputed ... `orphaned_payment` | reconciler |
// a reorg took the payment ... away ... (the settlement is reversed)".
func TestDisputedOrderConfirmingWhenAReorgGivesBackAPartBeforeExpiry(t *testing.T) {
	f := newFixture(t)
	o := f.order(btc, 100_000)
	p1 := f.pay(payment{asset: btc, to: o.PayAddress, amount: 60_000})
	p2 := f.pay(payment{asset: btc, to: o.PayAddress, amount: 40_000})
	f.pass()
	f.expect(o, paywatch.StatusSettled, "")
	settled := ledger.Settled("bitcoin", "BTC")
	f.setState(p1, "orphaned")
	f.setState(p2, "orphaned")
	f.pass()
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment)
	if got := f.balance(settled); got != "0" {
		t.Fatalf("%s holds %s after the reorg took the settled order's payments, want the settlement reversed", settled, got)
	}

	alMinedAgain(f, p1, "seen") // a part comes back, below its confirmations
	f.pass()
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment) // decided again once it counts
	f.setState(p1, "confirmed")
	f.pass()
	f.expect(o, paywatch.StatusConfirming, "") // before expiry: waits for a top-up
	f.pay(payment{asset: btc, to: o.PayAddress, amount: 40_000})
	f.pass()
	f.expect(o, paywatch.StatusSettled, "")
	alExpectMoves(f, o, "awaiting_payment>settled", "settled>disputed/orphaned_payment", "disputed>confirming", "confirming>settled")
	if got := f.balance(settled); got != "100000" {
		t.Fatalf("%s holds %s, want the 100000 the order settled on", settled, got)
	}
}

// README, lifecycle table: "settled | disputed `underpaid`, `overpaid`,
// `late_payment`, `multiple_payments`, `orphaned_payment` | reconciler | a
// reorg took the payment, or part of it, away, or gave back a replaced one
// (the settlement is reversed)".
func TestSettledOrderDisputedWhenAReorgTakesOrGivesBackAPayment(t *testing.T) {
	settled := ledger.Settled("bitcoin", "BTC")
	t.Run("part of it taken away after expiry", func(t *testing.T) {
		f := newFixture(t)
		o := f.order(btc, 100_000)
		f.pay(payment{asset: btc, to: o.PayAddress, amount: 60_000})
		p2 := f.pay(payment{asset: btc, to: o.PayAddress, amount: 40_000})
		f.pass()
		f.expect(o, paywatch.StatusSettled, "")
		f.clock.Advance(expires + time.Minute)
		f.setState(p2, "orphaned")
		f.pass()
		f.expect(o, paywatch.StatusDisputed, paywatch.ReasonUnderpaid)
		alExpectMoves(f, o, "awaiting_payment>settled", "settled>disputed/underpaid")
		if got := f.balance(settled); got != "0" {
			t.Fatalf("%s holds %s, want the settlement reversed", settled, got)
		}
	})
	t.Run("a replaced payment given back", func(t *testing.T) {
		f := newFixture(t)
		o := f.order(btc, 100_000)
		first := f.pay(payment{asset: btc, to: o.PayAddress, amount: 100_000})
		f.pass()
		f.expect(o, paywatch.StatusSettled, "")
		f.setState(first, "orphaned")
		f.pass()
		f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment)
		f.pay(payment{asset: btc, to: o.PayAddress, amount: 100_000}) // the customer pays again
		f.pass()
		f.expect(o, paywatch.StatusSettled, "")
		alMinedAgain(f, first, "confirmed") // a reorg gives the first one back
		f.pass()
		f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOverpaid)
		alExpectMoves(f, o, "awaiting_payment>settled", "settled>disputed/orphaned_payment", "disputed>settled",
			"settled>disputed/overpaid")
		if got := f.balance(settled); got != "0" {
			t.Fatalf("%s holds %s, want the settlement reversed", settled, got)
		}
	})
}

// alBTCOrder creates an order on the btcd network expiring after expiresIn.
func alBTCOrder(e *btcEnv, sats int64, expiresIn time.Duration) *paywatch.Order {
	e.t.Helper()
	e.n++
	o, _, err := e.store.Create(context.Background(), orders.CreateRequest{ExternalID: fmt.Sprintf("al-btc-%d", e.n),
		Network: e.network, Asset: e.asset, Amount: big.NewInt(sats), ExpiresIn: expiresIn, Actor: "shop"})
	if err != nil {
		e.t.Fatal(err)
	}
	return o
}

// alEmptyBlocks mines n blocks holding no transaction but their coinbase
// (what the mempool holds stays there).
func alEmptyBlocks(e *btcEnv, n int) {
	e.t.Helper()
	for i := 0; i < n; i++ {
		if _, err := e.node.H.GenerateAndSubmitBlock(nil, -1, time.Time{}); err != nil {
			e.t.Fatal(err)
		}
	}
}

// README, lifecycle table: "settled | confirming | reconciler | a reorg moved
// a payment below its confirmations, or back to the mempool (the settlement
// is reversed)". On btcd: invalidateblock and a new chain.
func TestSettledOrderConfirmingWhenAReorgMovesItsPayment(t *testing.T) {
	settled := ledger.Settled("btc", "BTC")
	t.Run("below its confirmations", func(t *testing.T) {
		e := newBTCEnv(t)
		e.sync()
		o := e.order(150_000)
		txid := e.node.Pay(btctest.Output{Address: o.PayAddress, Sats: 150_000})
		mined := e.node.Height() + 1
		e.node.Mine(2)
		e.sync()
		e.expect(o, paywatch.StatusSettled, "")
		// The new chain: an empty block where the payment's was, then the
		// payment in the block above, one confirmation deep.
		e.node.Invalidate(mined)
		alEmptyBlocks(e, 1)
		e.node.Mine(1)
		e.sync()
		got := e.get(o)
		if got.Status != paywatch.StatusConfirming || len(got.Transfers) != 1 || got.Transfers[0].TxHash != txid ||
			got.Transfers[0].BlockNumber != mined+1 || got.Transfers[0].Confirmations != 1 {
			t.Fatalf("after the reorg: %s, transfers %+v; want confirming on %s, 1 confirmation in block %d",
				got.Status, got.Transfers, txid, mined+1)
		}
		if b := e.balance(settled); b != "0" {
			t.Fatalf("%s holds %s once the payment is below its confirmations, want the settlement reversed", settled, b)
		}
		e.node.Mine(1)
		e.sync()
		e.expect(o, paywatch.StatusSettled, "")
		if moves := e.fixture.moves(o); !slices.Equal(moves, []string{"awaiting_payment>settled", "settled>confirming",
			"confirming>settled"}) {
			t.Fatalf("moves %v", moves)
		}
		if b := e.balance(settled); b != "150000" {
			t.Fatalf("%s holds %s, want 150000 settled once", settled, b)
		}
	})
	t.Run("back to the mempool", func(t *testing.T) {
		e := newBTCEnv(t)
		e.sync()
		o := e.order(150_000)
		txid := e.node.Pay(btctest.Output{Address: o.PayAddress, Sats: 150_000})
		e.mempool()
		e.pass()
		e.expect(o, paywatch.StatusConfirming, "")
		mined := e.node.Height() + 1
		e.node.Mine(2)
		e.sync()
		e.expect(o, paywatch.StatusSettled, "")
		// A longer chain without the payment: back in the mempool. The
		// watcher had not read the mempool since the payment was mined, so
		// its sighting is still open and still the order's. (Had the watcher
		// seen it mined, the sighting would be closed; seen again, it is
		// matched to no settled order, and the order goes to disputed
		// orphaned_payment instead.)
		e.node.Invalidate(mined)
		alEmptyBlocks(e, 3)
		if !e.node.InMempool(txid) {
			t.Fatal("setup: the payment is not back in the mempool")
		}
		e.mempool()
		e.sync()
		got := e.get(o)
		if got.Status != paywatch.StatusConfirming || got.ReceivedAmount.Sign() != 0 ||
			!slices.ContainsFunc(got.Transfers, func(tr paywatch.Transfer) bool {
				return tr.TxHash == txid && tr.State == paywatch.TransferMempool
			}) {
			t.Fatalf("with its payment back in the mempool: %s, received %s, transfers %+v; want confirming on the mempool payment",
				got.Status, got.ReceivedAmount, got.Transfers)
		}
		if b := e.balance(settled); b != "0" {
			t.Fatalf("%s holds %s with the payment back in the mempool, want the settlement reversed", settled, b)
		}
		e.node.Mine(2)
		e.mempool()
		e.sync()
		e.expect(o, paywatch.StatusSettled, "")
		if moves := e.fixture.moves(o); !slices.Equal(moves, []string{"awaiting_payment>confirming", "confirming>settled",
			"settled>confirming", "confirming>settled"}) {
			t.Fatalf("moves %v", moves)
		}
	})
}

// README, lifecycle table: "confirming | awaiting_payment | reconciler | all
// it had were payments seen in a mempool, replaced or dropped before any
// block held them, or still unmined at expiry"; "confirming | expired | ...
// as to awaiting payment, past expiry and not marked paid"; "confirming |
// disputed `no_payment_found` | ... as to awaiting payment, marked paid and
// past `paid_grace`". And: "A sighting holds an order only until its
// expiry." On btcd: the payments stay in the node's mempool throughout.
func TestOrderConfirmingOnASightingAloneAtExpiry(t *testing.T) {
	e := newBTCEnv(t)
	e.sync()
	ctx := context.Background()
	start := e.clock.Now()
	unmarked := alBTCOrder(e, 150_000, expires)
	marked := alBTCOrder(e, 160_000, expires) // marked paid: its grace ends after its expiry
	graceFirst := alBTCOrder(e, 170_000, grace+time.Hour)
	for _, o := range []*paywatch.Order{marked, graceFirst} {
		if _, err := e.store.MarkPaid(ctx, o.ID, "", "shop"); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(time.Second)
	txid := e.node.Pay(btctest.Output{Address: unmarked.PayAddress, Sats: 150_000},
		btctest.Output{Address: marked.PayAddress, Sats: 160_000}, btctest.Output{Address: graceFirst.PayAddress, Sats: 170_000})
	e.mempool()
	e.pass()
	for _, o := range []*paywatch.Order{unmarked, marked, graceFirst} {
		e.expect(o, paywatch.StatusConfirming, "")
	}

	e.clock.Advance(start.Add(expires + time.Minute).Sub(e.clock.Now()))
	e.mempool()
	e.pass()
	e.expect(unmarked, paywatch.StatusExpired, "")
	e.expect(marked, paywatch.StatusAwaitingPayment, "") // still unmined at expiry, within paid_grace
	e.expect(graceFirst, paywatch.StatusConfirming, "")  // its sighting holds it until its own expiry

	e.clock.Advance(start.Add(grace + time.Minute).Sub(e.clock.Now()))
	e.mempool()
	e.pass()
	e.expect(marked, paywatch.StatusDisputed, paywatch.ReasonNoPaymentFound)
	e.expect(graceFirst, paywatch.StatusConfirming, "") // past paid_grace, but not yet expired

	e.clock.Advance(start.Add(grace + time.Hour + time.Minute).Sub(e.clock.Now()))
	e.mempool()
	e.pass()
	e.expect(graceFirst, paywatch.StatusDisputed, paywatch.ReasonNoPaymentFound)

	if !e.node.InMempool(txid) {
		t.Fatal("the payment left the mempool: the orders did not move on a sighting still unmined")
	}
	want := map[*paywatch.Order][]string{
		unmarked:   {"awaiting_payment>confirming", "confirming>expired"},
		marked:     {"awaiting_payment>confirming", "confirming>awaiting_payment", "awaiting_payment>disputed/no_payment_found"},
		graceFirst: {"awaiting_payment>confirming", "confirming>disputed/no_payment_found"},
	}
	for o, moves := range want {
		if got := e.fixture.moves(o); !slices.Equal(got, moves) {
			t.Errorf("order %s moved %v, want %v", o.ExternalID, got, moves)
		}
	}
}

// README: "After three withdrawals sightings no longer move the order
// (replacing a payment back and forth does not flip it for ever; its
// payment shows once mined)". On btcd: the customer replaces (RBF) a
// payment to the order by one elsewhere, and back, again and again.
func TestAfterThreeWithdrawalsSightingsNoLongerMoveTheOrderItsPaymentShowsOnceMined(t *testing.T) {
	if reconcile.MaxWithdrawals != 3 {
		t.Errorf("MaxWithdrawals is %d, README says three withdrawals", reconcile.MaxWithdrawals)
	}
	e := newBTCEnv(t)
	o := e.order(150_000)
	coin := e.node.Coin(1_000_000)
	e.sync()
	elsewhere := "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"
	fee := int64(1_000)
	spend := func(to string) string {
		t.Helper()
		fee += 10_000 // each replacement pays more
		txid, err := e.node.Spend(coin, fee, btctest.Output{Address: to, Sats: 150_000})
		if err != nil {
			t.Fatalf("the node refused the transaction: %v", err)
		}
		e.mempool()
		e.pass()
		return txid
	}
	for i := 1; i <= 3; i++ {
		spend(o.PayAddress)
		e.expect(o, paywatch.StatusConfirming, "")
		spend(elsewhere)
		e.expect(o, paywatch.StatusAwaitingPayment, "")
		if n := strings.Count(strings.Join(e.events(o), " "), "payment_withdrawn"); n != i {
			t.Fatalf("after replacement %d the timeline holds %d withdrawals: %v", i, n, e.events(o))
		}
	}
	// The fourth payment to the order: seen, and it moves nothing.
	last := spend(o.PayAddress)
	got := e.get(o)
	if got.Status != paywatch.StatusAwaitingPayment || len(got.Transfers) != 0 {
		t.Fatalf("after three withdrawals a sighting moved the order: %s, transfers %+v", got.Status, got.Transfers)
	}
	if n := e.sightings(last, ""); n != 1 {
		t.Fatalf("the fourth payment has %d sightings tied to no order, want 1", n)
	}
	if n := strings.Count(strings.Join(e.events(o), " "), "payment_detected"); n != 3 {
		t.Fatalf("%d payments detected, want 3: timeline %v", n, e.events(o))
	}
	// Mined, it shows and pays.
	e.node.Mine(1)
	e.mempool()
	e.sync()
	got = e.get(o)
	if got.Status != paywatch.StatusConfirming || len(got.Transfers) != 1 || got.Transfers[0].TxHash != last ||
		got.Transfers[0].State != paywatch.TransferSeen || got.ReceivedAmount.Int64() != 150_000 {
		t.Fatalf("once mined: %s, received %s, transfers %+v; want confirming on %s", got.Status, got.ReceivedAmount, got.Transfers, last)
	}
	e.node.Mine(1)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
}

// README: "dropped (missing for a block and a minute ...)": a block passed
// but less than a minute missing withdraws nothing; a minute does.
func TestMempoolDroppedOnlyOnceABlockAndAMinuteHavePassed(t *testing.T) {
	if reconcile.DroppedAfter != time.Minute {
		t.Errorf("DroppedAfter is %s, README says a minute", reconcile.DroppedAfter)
	}
	f := newFixture(t)
	o := f.order(btc, 100_000)
	f.clock.Advance(time.Second)
	f.sight(o, o.PayAddress, 100_000, "vanishing")
	f.pass()
	f.expect(o, paywatch.StatusConfirming, "")
	f.gone("vanishing", "")
	f.scanned("bitcoin", 1) // a block passed
	f.clock.Advance(time.Minute - time.Second)
	f.pass()
	f.expect(o, paywatch.StatusConfirming, "")
	if evs := f.events(o); slices.Contains(evs, "payment_withdrawn") {
		t.Fatalf("withdrawn after a block but 59 s missing: timeline %v", evs)
	}
	f.clock.Advance(time.Second)
	f.pass()
	f.expect(o, paywatch.StatusAwaitingPayment, "")
	if why, _ := alWithdrawal(f, o); why != "dropped" {
		t.Fatalf("withdrawn as %q, want dropped: timeline %v", why, f.events(o))
	}
}

// alWithdrawal returns why the order's last payment_withdrawn says its
// payment left, and the replacement's txid ("" for none).
func alWithdrawal(f *fixture, o *paywatch.Order) (why, replacedBy string) {
	f.t.Helper()
	evs, err := f.store.Events(context.Background(), o.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Type == "payment_withdrawn" {
			var d struct {
				Why        string `json:"why"`
				ReplacedBy string `json:"replaced_by"`
			}
			_ = json.Unmarshal(ev.Detail, &d)
			why, replacedBy = d.Why, d.ReplacedBy
		}
	}
	return why, replacedBy
}

// README: "Any other replaced or dropped payment is withdrawn ... and the
// order goes back to `awaiting_payment` (or on to `expired`, or
// `no_payment_found` past `paid_grace`)". On btcd: the customer marked the
// order paid, its payment is replaced after paid_grace, before expiry.
func TestWithdrawnPaymentPastPaidGraceDisputesNoPaymentFound(t *testing.T) {
	e := newBTCEnv(t)
	o := alBTCOrder(e, 150_000, grace+time.Hour)
	coin := e.node.Coin(500_000)
	e.sync()
	if _, err := e.store.MarkPaid(context.Background(), o.ID, "", "shop"); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	if _, err := e.node.Spend(coin, 1_000, btctest.Output{Address: o.PayAddress, Sats: 150_000}); err != nil {
		t.Fatal(err)
	}
	e.mempool()
	e.pass()
	e.expect(o, paywatch.StatusConfirming, "")
	e.clock.Advance(grace + time.Minute)
	e.pass()
	e.expect(o, paywatch.StatusConfirming, "") // the sighting holds it until expiry
	replacement, err := e.node.Spend(coin, 20_000, btctest.Output{Address: "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080", Sats: 150_000})
	if err != nil {
		t.Fatalf("the node refused the replacement: %v", err)
	}
	e.mempool()
	e.pass()
	e.expect(o, paywatch.StatusDisputed, paywatch.ReasonNoPaymentFound)
	if why, by := alWithdrawal(e.fixture, o); why != "replaced" || by != replacement {
		t.Fatalf("withdrawn as %q by %q, want replaced by %s: timeline %v", why, by, replacement, e.events(o))
	}
	if moves := e.fixture.moves(o); !slices.Equal(moves, []string{"awaiting_payment>confirming", "confirming>disputed/no_payment_found"}) {
		t.Fatalf("moves %v", moves)
	}
}

// README: "A sighting **never pays anything**: no ledger entry, no
// `received_amount`, no settlement, no claim link; the order settles on the
// mined transfer after its confirmations like any other." On btcd, with
// the accounts the ledger really keeps (wallet:, suspense:, order:,
// settled:).
func TestASightingPaysNothingNoLedgerEntryNoReceivedAmountNoSettlementNoClaimLink(t *testing.T) {
	e := newBTCEnv(t)
	e.sync()
	o := e.order(150_000)
	e.clock.Advance(time.Second)
	txid := e.node.Pay(btctest.Output{Address: o.PayAddress, Sats: 150_000})
	e.mempool()
	if _, err := e.store.MarkPaid(context.Background(), o.ID, txid, "shop"); err != nil {
		t.Fatal(err)
	}
	e.pass()
	e.pass()
	accounts := []string{ledger.Wallet("btc", o.PayAddress), ledger.Suspense("btc", "BTC"), ledger.Order(o.ID),
		ledger.Settled("btc", "BTC")}
	balances := func() []string {
		t.Helper()
		var bs []string
		for _, a := range accounts {
			bs = append(bs, a+"="+e.balance(a))
		}
		return bs
	}
	zero := make([]string, len(accounts))
	for i, a := range accounts {
		zero[i] = a + "=0"
	}

	got := e.get(o)
	if got.Status != paywatch.StatusConfirming || len(got.Transfers) != 1 || got.Transfers[0].State != paywatch.TransferMempool {
		t.Fatalf("with its payment in the mempool the order is %s, transfers %+v; want confirming (payment detected) on a payment listed as mempool",
			got.Status, got.Transfers)
	}
	if got.ReceivedAmount.Sign() != 0 || got.SettledAt != nil {
		t.Errorf("a sighting shows received %s, settled at %v; want nothing received, no settlement", got.ReceivedAmount, got.SettledAt)
	}
	if bs := balances(); !slices.Equal(bs, zero) {
		t.Errorf("a sighting reached the ledger: %v", bs)
	}
	var entries int
	if err := e.db.Get(&entries, `SELECT count(*) FROM ledger_entries`); err != nil || entries != 0 {
		t.Errorf("%d ledger entries (%v) with only a sighting, want none", entries, err)
	}
	var hint string
	if err := e.db.Get(&hint, `SELECT hint_state FROM orders WHERE id = $1`, o.ID); err != nil || hint != "pending" {
		t.Errorf("the customer's claim of the sighted transaction is %q (%v), want pending: a sighting links nothing", hint, err)
	}
	if evs := e.events(o); slices.Contains(evs, "transfer_matched") || slices.Contains(evs, "hint_rejected") {
		t.Errorf("a sighting was matched or decided a claim: timeline %v", evs)
	}

	// Mined: received, not yet in the ledger (below its confirmations).
	e.node.Mine(1)
	e.mempool()
	e.sync()
	got = e.get(o)
	if got.Status != paywatch.StatusConfirming || got.ReceivedAmount.Int64() != 150_000 {
		t.Fatalf("once mined: %s, received %s", got.Status, got.ReceivedAmount)
	}
	if bs := balances(); !slices.Equal(bs, zero) {
		t.Errorf("a payment below its confirmations reached the ledger: %v", bs)
	}
	// Confirmed: it settles on the mined transfer.
	e.node.Mine(1)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
	want := []string{accounts[0] + "=150000", accounts[1] + "=0", accounts[2] + "=0", accounts[3] + "=150000"}
	if bs := balances(); !slices.Equal(bs, want) {
		t.Errorf("once settled the ledger holds %v, want %v", bs, want)
	}
}

// README: "a block reward to a watched address is flagged `coinbase` and
// pays no order": on btcd, a block whose coinbase pays an order's own
// address exactly its amount; the order is not paid, not by its address,
// not by its customer's claim of the coinbase's txid. An ordinary payment
// to another order, mined next, is.
func TestCoinbaseToAnOrdersOwnAddressNeverPaysIt(t *testing.T) {
	e := newBTCEnv(t)
	e.sync()
	o := e.order(150_000)
	control := e.order(150_000)
	e.clock.Advance(time.Second)
	addr, err := btcutil.DecodeAddress(o.PayAddress, btctest.Params)
	if err != nil {
		t.Fatal(err)
	}
	script, err := txscript.PayToAddrScript(addr)
	if err != nil {
		t.Fatal(err)
	}
	block, err := e.node.H.GenerateAndSubmitBlockWithCustomCoinbaseOutputs(nil, -1, time.Time{},
		[]wire.TxOut{{Value: 150_000, PkScript: script}})
	if err != nil {
		t.Fatal(err)
	}
	coinbase := block.Transactions()[0].Hash().String()
	e.node.Pay(btctest.Output{Address: control.PayAddress, Sats: 150_000})
	e.node.Mine(2)
	e.sync()

	var rec struct {
		Order *string        `db:"order_id"`
		State string         `db:"state"`
		Flags pq.StringArray `db:"flags"`
	}
	if err := e.db.Get(&rec, `SELECT order_id, state, flags FROM transfers WHERE tx_hash = $1`, coinbase); err != nil {
		t.Fatalf("the block reward to the order's address was not recorded: %v", err)
	}
	if rec.Order != nil || !slices.Equal(rec.Flags, []string{"coinbase"}) || rec.State != "confirmed" {
		t.Fatalf("the block reward is %s, flagged %v, on order %v; want confirmed, flagged coinbase, on none", rec.State, rec.Flags, rec.Order)
	}
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	e.expect(control, paywatch.StatusSettled, "")
	if got := e.balance(ledger.Suspense("btc", "BTC")); got != "150000" {
		t.Fatalf("suspense holds %s, want the block reward in the inbox", got)
	}
	if _, err := e.store.MarkPaid(context.Background(), o.ID, coinbase, "shop"); err != nil {
		t.Fatal(err)
	}
	e.sync()
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	if why := e.rejection(o); why != "it is flagged coinbase" {
		t.Fatalf("the claim of the block reward was rejected with %q, want that it is flagged coinbase", why)
	}
	// Marked paid, nothing found: the block reward is no payment.
	e.clock.Advance(grace)
	e.sync()
	e.expect(o, paywatch.StatusDisputed, paywatch.ReasonNoPaymentFound)
}

// README: "the reconciler checks every move it makes against it" (the
// lifecycle table, paywatch.Lifecycle): with the move from awaiting
// payment to expired taken out of the table, a pass that would make it
// fails, names the order and the move, and moves no order of its batch.
func TestReconcilerRefusesAMoveTheLifecycleTableDoesNotHold(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	due := f.order(usdt, 10_000_000)
	marked := f.order(usdt, 20_000_000)
	if _, err := f.store.MarkPaid(ctx, marked.ID, "", "shop"); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(grace + time.Minute) // due to expire; marked paid, past paid_grace

	table := refuseExpiry(t)
	if paywatch.CanMove(paywatch.StatusAwaitingPayment, paywatch.StatusExpired, "", paywatch.ActorReconciler) {
		t.Fatal("setup: the table still allows awaiting_payment to expired")
	}
	_, err := f.rec.Pass(ctx)
	want := fmt.Sprintf("order %s: decided awaiting_payment/ → expired/, which the lifecycle does not allow", due.ID)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("the pass returned %v, want an error saying %q", err, want)
	}
	f.expect(due, paywatch.StatusAwaitingPayment, "")
	// The allowed move of the same batch is made, the batch tried again in
	// halves.
	f.expect(marked, paywatch.StatusDisputed, paywatch.ReasonNoPaymentFound)
	var moved []string
	if err := f.db.Select(&moved, `SELECT order_id FROM order_events WHERE type = 'status_changed'`); err != nil ||
		len(moved) != 1 || moved[0] != marked.ID {
		t.Fatalf("status changes recorded for %v (%v), want only %s's", moved, err, marked.ID)
	}
	var hooks []string
	if err := f.db.Select(&hooks, `SELECT order_id || ' ' || type FROM webhook_outbox WHERE type IN ('order.expired', 'order.disputed')`); err != nil ||
		len(hooks) != 1 || hooks[0] != marked.ID+" order.disputed" {
		t.Fatalf("webhooks of moves enqueued: %v (%v), want only %s's order.disputed", hooks, err, marked.ID)
	}

	paywatch.Lifecycle = table
	f.pass()
	f.expect(due, paywatch.StatusExpired, "")
	f.expect(marked, paywatch.StatusDisputed, paywatch.ReasonNoPaymentFound)
}

// README: "a batch that fails writes nothing; ... the walk goes on past
// them, and the pass reports the orders that failed alone". With one order
// a batch, each move the lifecycle refuses fails its batch, and the pass
// reports them all; the other orders' batches, before or after, move them
// in the same pass.
func TestAFailingBatchHoldsBackOnlyItsOwnOrders(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.rec.Batch = 1
	var due, marked []*paywatch.Order
	for range 3 {
		due = append(due, f.order(usdt, int64(10_000_000+len(due))))
		m := f.order(usdt, int64(20_000_000+len(marked)))
		if _, err := f.store.MarkPaid(ctx, m.ID, "", "shop"); err != nil {
			t.Fatal(err)
		}
		marked = append(marked, m)
	}
	f.clock.Advance(grace + time.Minute) // due to expire; marked paid, past paid_grace

	table := refuseExpiry(t)
	_, err := f.rec.Pass(ctx)
	for _, o := range due {
		want := fmt.Sprintf("order %s: decided awaiting_payment/ → expired/, which the lifecycle does not allow", o.ID)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("the pass returned %v, want an error saying %q", err, want)
		}
	}
	for _, o := range due {
		f.expect(o, paywatch.StatusAwaitingPayment, "")
	}
	for _, o := range marked {
		f.expect(o, paywatch.StatusDisputed, paywatch.ReasonNoPaymentFound)
	}
	paywatch.Lifecycle = table
	f.pass()
	for _, o := range due {
		f.expect(o, paywatch.StatusExpired, "")
	}
}

// README: "they are tried again in halves ... down to single orders: one
// order whose move fails holds back no other"; "the pass reports the
// orders that failed alone (the first 10, and how many more)". Twelve
// orders whose moves are refused and six whose moves are allowed, in one
// batch: the six move in the same pass, and the pass reports ten refusals
// and two more.
func TestAFailedBatchIsTriedAgainInHalvesDownToSingleOrders(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var marked []*paywatch.Order
	for i := range 12 {
		f.order(usdt, int64(10_000_000+i)) // due to expire: its move is refused
		if i%2 == 0 {
			m := f.order(usdt, int64(20_000_000+i))
			if _, err := f.store.MarkPaid(ctx, m.ID, "", "shop"); err != nil {
				t.Fatal(err)
			}
			marked = append(marked, m)
		}
	}
	f.clock.Advance(grace + time.Minute)
	refuseExpiry(t)
	_, err := f.rec.Pass(ctx)
	if err == nil {
		t.Fatal("the pass reported no failure")
	}
	if n := strings.Count(err.Error(), "which the lifecycle does not allow"); n != 10 || !strings.HasSuffix(err.Error(), "and 2 more") {
		t.Fatalf("the pass reported %d refused moves, want 10 and 2 more:\n%v", n, err)
	}
	for _, o := range marked {
		f.expect(o, paywatch.StatusDisputed, paywatch.ReasonNoPaymentFound)
	}
}

// README: "unless 10 orders failed alone and none moved (the cause is then
// not theirs; the rest waits for the next pass)". Thirty orders whose
// moves are all refused, in one batch: the retry gives up after ten, and
// the pass reports those ten and no more.
func TestAFailedBatchWhoseOrdersAllFailIsGivenUpAfterTen(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for i := range 30 {
		f.order(usdt, int64(10_000_000+i)) // due to expire: its move is refused
	}
	f.clock.Advance(grace + time.Minute)
	refuseExpiry(t)
	_, err := f.rec.Pass(ctx)
	if err == nil {
		t.Fatal("the pass reported no failure")
	}
	// (Not "more" anywhere: an order id may hold those letters.)
	if n := strings.Count(err.Error(), "which the lifecycle does not allow"); n != 10 || regexp.MustCompile(`and \d+ more$`).MatchString(err.Error()) {
		t.Fatalf("the pass reported %d refused moves, want 10 and no more:\n%v", n, err)
	}
}

// README: "The tests also check, after each pass, that every order is where
// `paywatch.Decide` puts it (`Reconciler.CheckDecisions`)": it reports
// every order whose status is not what its facts call for, and nothing on
// a consistent state.
func TestCheckDecisionsReportsEveryMisplacedOrderAndNothingElse(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	paid := f.order(usdt, 10_000_000)
	f.pay(payment{asset: usdt, to: shop, amount: paid.PayAmount.Int64()})
	waiting := f.order(usdt, 20_000_000)
	misplaced := f.order(btc, 100_000)
	over := f.order(btc, 200_000)
	f.pay(payment{asset: btc, to: over.PayAddress, amount: 250_000})
	f.pass()
	f.expect(paid, paywatch.StatusSettled, "")
	f.expect(over, paywatch.StatusDisputed, paywatch.ReasonOverpaid)
	if err := f.rec.CheckDecisions(ctx); err != nil {
		t.Fatalf("CheckDecisions on a consistent state: %v", err)
	}
	report := func() []string {
		t.Helper()
		err := f.rec.CheckDecisions(ctx)
		if err == nil {
			return nil
		}
		lines := strings.Split(err.Error(), "\n")
		slices.Sort(lines)
		return lines
	}
	expectReport := func(want ...string) {
		t.Helper()
		got := report()
		ok := len(got) == len(want)
		for _, w := range want {
			ok = ok && slices.ContainsFunc(got, func(l string) bool { return strings.HasPrefix(l, w) })
		}
		if !ok {
			t.Fatalf("CheckDecisions reported\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}

	// An order moved to confirming with nothing to confirm, and one
	// disputed for a reason its payments do not give (their change missed,
	// its review queued).
	pgtest.Exec(t, f.db, `UPDATE orders SET status = 'confirming' WHERE id = $1`, misplaced.ID)
	pgtest.Exec(t, f.db, `UPDATE orders SET dispute_reason = 'underpaid' WHERE id = $1`, over.ID)
	pgtest.Exec(t, f.db, `INSERT INTO order_reviews (order_id, at) VALUES ($1, $2)`, over.ID, f.clock.Now())
	expectReport("order "+misplaced.ID+" is confirming/; its payments call for awaiting_payment/",
		"order "+over.ID+" is disputed/underpaid; its payments call for disputed/overpaid")
	// Past expiry, an order a pass has yet to expire.
	f.clock.Advance(expires + time.Minute)
	expectReport("order "+waiting.ID+" is awaiting_payment/; its payments call for expired/",
		"order "+misplaced.ID+" is confirming/; its payments call for expired/",
		"order "+over.ID+" is disputed/underpaid; its payments call for disputed/overpaid")
	f.pass()
	if err := f.rec.CheckDecisions(ctx); err != nil {
		t.Fatalf("CheckDecisions after a pass: %v", err)
	}
}

// README: "`paywatch check --config FILE` verifies the invariants ... and
// exits non-zero with every violation": CheckInvariants reports each
// violation of each invariant on a state that breaks two of them (one of
// them twice).
func TestCheckInvariantsReportsEveryViolation(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	if err := reconcile.CheckInvariants(ctx, db); err != nil {
		t.Fatalf("an empty database breaks: %v", err)
	}
	for _, o := range []struct{ id, status, address string }{
		{"ord_settled", "settled", "bc1qa"}, {"ord_moved1", "awaiting_payment", "bc1qb"}, {"ord_moved2", "expired", "bc1qc"},
	} {
		pgtest.Exec(t, db, `INSERT INTO orders (id, external_id, request_hash, network, asset, amount, pay_amount, pay_address,
			status, created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time)
			VALUES ($1, $1, '\x00', 'bitcoin', 'BTC', 100, 100, $3, $2, '2026-11-02 10:00Z', '2026-11-02 11:00Z',
				'2026-11-03 11:00Z', '2026-11-02 10:00Z', 10, '2026-11-02 08:00Z')`, o.id, o.status, o.address)
	}
	pgtest.Exec(t, db, `INSERT INTO order_events (order_id, at, type, from_status, to_status, actor) VALUES
		('ord_moved1', now(), 'status_changed', 'settled', 'awaiting_payment', 'reconciler'),
		('ord_moved2', now(), 'status_changed', 'cancelled', 'expired', 'reconciler')`)

	err := reconcile.CheckInvariants(ctx, db)
	if err == nil {
		t.Fatal("CheckInvariants found nothing on a state that breaks two invariants")
	}
	want := []string{
		"settled order without exact confirmed payment: ord_settled received 0 of 100, 0 waiting",
		"status change the lifecycle does not allow: ord_moved1 settled -> awaiting_payment by reconciler",
		"status change the lifecycle does not allow: ord_moved2 cancelled -> expired by reconciler",
	}
	got := strings.Split(err.Error(), "\n")
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("CheckInvariants reported\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) != len(want) {
		t.Fatalf("CheckInvariants returned %T, want one error per violation", err)
	}
}

// refuseExpiry takes the move awaiting_payment → expired out of the
// lifecycle table until the test ends, and returns the table as it was
// (put it back to allow the move again).
func refuseExpiry(t *testing.T) []paywatch.Transition {
	t.Helper()
	table := paywatch.Lifecycle
	t.Cleanup(func() { paywatch.Lifecycle = table })
	paywatch.Lifecycle = slices.DeleteFunc(slices.Clone(table), func(tr paywatch.Transition) bool {
		return tr.From == paywatch.StatusAwaitingPayment && tr.To == paywatch.StatusExpired
	})
	return table
}
