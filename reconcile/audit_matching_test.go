package reconcile_test

// Tests of README's rules on which payment may pay which order: the details
// each rule states (its bounds, its exceptions, what it leaves alone),
// each test named for the rule it holds.

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"math/big"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

// The reasons a rejected claim gives, as the reconciler words them.
const (
	amWhyRecordedBefore = "paywatch had recorded it before the order was created"
	amWhyOtherAsset     = "it paid another network or asset"
	amWhyWaiting        = "another order waiting for a payment of about this amount may be owed it: an operator decides"
	amWhyContested      = "another order claims the same payment: an operator decides"
)

// amUnmatched returns the why of each transfer_unmatched event on an
// order's timeline.
func amUnmatched(f *fixture, o *paywatch.Order) []string {
	f.t.Helper()
	evs, err := f.store.Events(context.Background(), o.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	var whys []string
	for _, ev := range evs {
		if ev.Type != "transfer_unmatched" {
			continue
		}
		var d struct {
			Why string `json:"why"`
		}
		if err := json.Unmarshal(ev.Detail, &d); err != nil {
			f.t.Fatalf("transfer_unmatched detail %s: %v", ev.Detail, err)
		}
		whys = append(whys, d.Why)
	}
	return whys
}

// amHintState returns the state of an order's tx hash claim ("" for none).
func amHintState(f *fixture, o *paywatch.Order) string {
	f.t.Helper()
	var s sql.NullString
	if err := f.db.Get(&s, `SELECT hint_state FROM orders WHERE id = $1`, o.ID); err != nil {
		f.t.Fatal(err)
	}
	return s.String
}

// README: "A transfer can pay an order only if it ... was **first
// recorded by paywatch after the order was created** — so a payment already
// on chain or in the inbox (say a victim's short payment) never pays an
// order created after it, even one created for exactly that amount".
//
// A look-up records the victim's short payment ahead of the scanner, in a
// block above the recorded head (a look-up does not move the height orders
// are created at); an order is then created for exactly that amount; the
// scanner confirms the payment. Only the recorded-after rule stands between
// the payment and the new order: it does not pay it, and a claim of it
// from the new order is rejected, saying why.
func TestPaymentRecordedBeforeTheOrderWasCreatedNeverPaysIt(t *testing.T) {
	e := newChainEnv(t)
	ctx := context.Background()
	lookups := scan.NewStore(e.db) // what look-ups record, on the test's clock
	lookups.Now = e.clock.Now
	e.rec.Record = lookups.Record
	e.sync()
	victim := e.order(10_000_000)
	h := e.payOnChain(9_990_000) // the victim's exchange took a fee
	if _, err := e.store.MarkPaid(ctx, victim.ID, h.Hex(), "shop"); err != nil {
		t.Fatal(err)
	}
	if n, err := e.rec.LookUpHints(ctx); err != nil || n != 1 {
		t.Fatalf("setup: the look-up of the victim's payment found %d (%v), want 1", n, err)
	}
	e.clock.Advance(time.Second)
	later := e.order(9_990_000)
	if later.PayAmount.Int64() != 9_990_000 {
		t.Fatalf("setup: the later order pays %s, not exactly the victim's 9990000", later.PayAmount)
	}
	var setup struct {
		Provisional    bool `db:"provisional"`
		Above          bool `db:"above"`
		BlockTimeOK    bool `db:"block_time_ok"`
		RecordedBefore bool `db:"recorded_before"`
	}
	if err := e.db.Get(&setup, `SELECT t.provisional, t.block_number > o.created_height AS above,
			t.block_time >= o.earliest_block_time AS block_time_ok, t.first_seen_at < o.created_at AS recorded_before
		FROM transfers t, orders o WHERE lower(t.tx_hash) = lower($1) AND o.id = $2`, h.Hex(), later.ID); err != nil {
		t.Fatal(err)
	}
	if !setup.Provisional || !setup.Above || !setup.BlockTimeOK || !setup.RecordedBefore {
		t.Fatalf("setup: want a provisional record, in a block above the later order's creation height and time bound, "+
			"recorded before the order; got %+v", setup)
	}
	e.chain.Mine(3)
	e.sync() // the scanner confirms the payment; the pass matches what it may
	got := e.transferOf(h.Hex())
	if got.State != string(paywatch.TransferConfirmed) {
		t.Fatalf("setup: the scanner left the payment %s", got.State)
	}
	if got.Order != nil && *got.Order == later.ID {
		t.Fatalf("the victim's payment, recorded before the later order was created, pays it: %s", statusOf(e.fixture, later))
	}
	if got.Order == nil || *got.Order != victim.ID {
		t.Fatalf("the victim's claimed payment is on order %s, want the victim's %s", orderOf(got), victim.ID)
	}
	e.expect(later, paywatch.StatusAwaitingPayment, "")
	// The later order's customer claims it.
	if _, err := e.store.MarkPaid(ctx, later.ID, h.Hex(), "shop"); err != nil {
		t.Fatal(err)
	}
	e.sync()
	if why := e.rejection(later); why != amWhyRecordedBefore {
		t.Fatalf("the later order's claim of a payment recorded before it: rejection %q, want %q (timeline %v)",
			why, amWhyRecordedBefore, e.events(later))
	}
	if got := e.transferOf(h.Hex()); got.Order == nil || *got.Order != victim.ID {
		t.Fatalf("after the later order's claim the payment is on order %s, want the victim's %s", orderOf(got), victim.ID)
	}
	e.expect(later, paywatch.StatusAwaitingPayment, "")
}

// README: "A transfer with two candidates pays neither: it is flagged
// `ambiguous` and stays in the inbox, and the candidates that hold no
// payment yet are disputed `ambiguous`." A candidate that already holds a
// payment (confirming on it) is left alone: it keeps its payment and
// status, and settles on it.
func TestAmbiguousTransferDisputesOnlyTheCandidatesHoldingNoPayment(t *testing.T) {
	f := newFixture(t)
	holder := f.order(usdt, 6_000_000)
	bare := f.order(usdt, 5_999_999)
	own := f.pay(payment{asset: usdt, to: shop, amount: holder.PayAmount.Int64(), state: "seen"})
	f.pass()
	f.expect(holder, paywatch.StatusConfirming, "")
	// Both ask for the same amount now, as a misconfiguration could make
	// them: a second payment of it has two candidates, one of them holding
	// a payment already.
	pgtest.Exec(t, f.db, `UPDATE orders SET pay_amount = $2 WHERE id = $1`, bare.ID, holder.PayAmount.Int64())
	pgtest.Exec(t, f.db, `DELETE FROM amount_slots`)
	second := f.pay(payment{asset: usdt, to: shop, amount: holder.PayAmount.Int64()})
	f.pass()
	if got, flags := f.transferOrder(second), f.flags(second); got != "" || !slices.Equal(flags, []string{paywatch.FlagAmbiguous}) {
		t.Fatalf("setup: the payment with two candidates is on order %q, flags %v; want in the inbox, flagged ambiguous", got, flags)
	}
	f.expect(bare, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
	got, err := f.store.Get(context.Background(), holder.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != paywatch.StatusConfirming || got.DisputeReason != "" {
		t.Fatalf("the candidate holding a payment was moved to %s/%s by an ambiguous transfer (status changes %v); want it left confirming",
			got.Status, got.DisputeReason, f.moves(holder))
	}
	if on := f.transferOrder(own); on != holder.ID {
		t.Fatalf("the candidate's own payment is on %q now, want %s", on, holder.ID)
	}
	if moves := f.moves(holder); !slices.Equal(moves, []string{"awaiting_payment>confirming"}) {
		t.Fatalf("the candidate holding a payment moved %v, want only awaiting_payment>confirming", moves)
	}
	f.setState(own, "confirmed")
	f.pass()
	f.expect(holder, paywatch.StatusSettled, "")
	// An operator decides the other candidate: two open orders of one pay
	// amount must not outlive the test.
	if err := f.op.Resolve(context.Background(), bare.ID, paywatch.StatusCancelled, "its customer never paid", "alice"); err != nil {
		t.Fatal(err)
	}
}

// README: "A claim that could have linked a payment another customer's
// claim already linked **contests** it: ... each order left without a
// payment is disputed `ambiguous`." The first claimant's order still holds
// another payment: it is not disputed, and settles on that payment; the
// second claimant's, holding none, is.
func TestContestDisputesOnlyTheOrdersLeftWithoutAPayment(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	holder := f.order(usdt, 10_000_000)
	rival := f.order(usdt, 20_000_000)
	exact := f.pay(payment{asset: usdt, to: shop, amount: holder.PayAmount.Int64(), state: "seen"})
	h := hash(f, "extra")
	extra := f.pay(payment{asset: usdt, to: shop, amount: 3_000_000, tx: h}) // matches no amount
	if _, err := f.store.MarkPaid(ctx, holder.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	if on := f.transferOrder(extra); on != holder.ID {
		t.Fatalf("setup: the first claim did not link the extra payment (on %q; rejection %q)", on, f.rejection(holder))
	}
	f.expect(holder, paywatch.StatusConfirming, "")
	if _, err := f.store.MarkPaid(ctx, rival.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	if on, flags := f.transferOrder(extra), f.flags(extra); on != "" || !slices.Equal(flags, []string{paywatch.FlagAmbiguous}) {
		t.Fatalf("the contested payment is on %q, flags %v; want in the inbox, flagged ambiguous", on, flags)
	}
	if why := f.rejection(rival); why != amWhyContested {
		t.Fatalf("setup: the second claim was decided as %q, want a contest", why)
	}
	for _, o := range []*paywatch.Order{holder, rival} {
		if evs := f.events(o); !slices.Contains(evs, "hint_contested") {
			t.Fatalf("order %s's timeline does not say hint_contested: %v", o.ExternalID, evs)
		}
	}
	f.expect(rival, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
	got, err := f.store.Get(ctx, holder.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != paywatch.StatusConfirming {
		t.Fatalf("the contested order that still holds a payment is %s/%s (status changes %v), want confirming",
			got.Status, got.DisputeReason, f.moves(holder))
	}
	f.setState(exact, "confirmed")
	f.pass()
	f.expect(holder, paywatch.StatusSettled, "")
}

// README: "A claim whose transaction paid the shop in another asset
// disputes an order that holds no payment yet as `wrong_asset`." An order
// that holds a payment is not disputed by such a claim, whether it was
// confirming on it already or its payment was matched in the very pass that
// decides the claim: the claim is rejected and the order goes on.
func TestWrongAssetClaimDisputesOnlyAnOrderHoldingNoPayment(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	holder := f.order(usdt, 9_000_000)   // confirming on its payment when its claim comes
	together := f.order(usdt, 7_000_000) // its payment and its claim come in one pass
	bare := f.order(usdt, 8_000_000)
	paid := []string{f.pay(payment{asset: usdt, to: shop, amount: holder.PayAmount.Int64(), state: "seen"})}
	f.pass()
	f.expect(holder, paywatch.StatusConfirming, "")
	paid = append(paid, f.pay(payment{asset: usdt, to: shop, amount: together.PayAmount.Int64(), state: "seen"}))
	for _, o := range []*paywatch.Order{holder, together, bare} {
		tx := hash(f, "dai-"+o.ExternalID)
		f.pay(payment{asset: dai, to: shop, amount: o.PayAmount.Int64(), tx: tx})
		if _, err := f.store.MarkPaid(ctx, o.ID, tx, "shop"); err != nil {
			t.Fatal(err)
		}
	}
	f.pass()
	for _, o := range []*paywatch.Order{holder, together, bare} {
		if why := f.rejection(o); why != amWhyOtherAsset {
			t.Fatalf("order %s's claim of a DAI payment: rejection %q, want %q", o.ExternalID, why, amWhyOtherAsset)
		}
	}
	f.expect(bare, paywatch.StatusDisputed, paywatch.ReasonWrongAsset)
	for _, o := range []*paywatch.Order{holder, together} {
		got, err := f.store.Get(ctx, o.ID)
		if err != nil {
			t.Fatal(err)
		}
		if moves := f.moves(o); got.Status != paywatch.StatusConfirming || !slices.Equal(moves, []string{"awaiting_payment>confirming"}) {
			t.Fatalf("order %s, holding a payment, whose claim paid in another asset, is %s/%s after moves %v; "+
				"want it confirming, moved only awaiting_payment>confirming", o.ExternalID, got.Status, got.DisputeReason, moves)
		}
	}
	for _, tr := range paid {
		f.setState(tr, "confirmed")
	}
	f.pass()
	f.expect(holder, paywatch.StatusSettled, "")
	f.expect(together, paywatch.StatusSettled, "")
}

// README: "a claim rejected because another order may be owed the
// payment also disputes its order `ambiguous`, for an operator" — an order
// that holds no payment yet: one that holds a payment (confirming on it)
// has its claim rejected all the same, and is decided by its payments.
func TestClaimAnotherOrderMayBeOwedDisputesOnlyAnOrderHoldingNoPayment(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	holder := f.order(usdt, 10_000_000)
	bare := f.order(usdt, 1_000_000)
	waiting := f.order(usdt, 5_000_000) // waits with nothing received
	paid := f.pay(payment{asset: usdt, to: shop, amount: holder.PayAmount.Int64(), state: "seen"})
	f.pass()
	f.expect(holder, paywatch.StatusConfirming, "")
	claimed := map[string]string{}
	for _, o := range []*paywatch.Order{holder, bare} {
		tx := hash(f, "about-5-"+o.ExternalID)
		claimed[o.ID] = f.pay(payment{asset: usdt, to: shop, amount: 4_900_000, tx: tx}) // 4.90 of waiting's 5.00
		if _, err := f.store.MarkPaid(ctx, o.ID, tx, "shop"); err != nil {
			t.Fatal(err)
		}
	}
	f.pass()
	for _, o := range []*paywatch.Order{holder, bare} {
		if why := f.rejection(o); why != amWhyWaiting {
			t.Fatalf("order %s's claim of a payment of about another waiting order's amount: rejection %q, want %q",
				o.ExternalID, why, amWhyWaiting)
		}
		if on := f.transferOrder(claimed[o.ID]); on != "" {
			t.Fatalf("order %s's rejected claim linked its payment to %s", o.ExternalID, on)
		}
	}
	f.expect(bare, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
	f.expect(waiting, paywatch.StatusAwaitingPayment, "")
	got, err := f.store.Get(ctx, holder.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != paywatch.StatusConfirming {
		t.Fatalf("an order holding a payment, whose claim another order may be owed, is %s/%s (status changes %v); want it left confirming",
			got.Status, got.DisputeReason, f.moves(holder))
	}
	f.setState(paid, "confirmed")
	f.pass()
	f.expect(holder, paywatch.StatusSettled, "")
}

// README: "A matched transfer that changes so that it no longer meets
// the rule it was matched by (a reorg mining it again ... after its window
// ...) leaves that order, `transfer_unmatched` on its timeline, and is
// matched again like any inbox transfer." On the simulated chain: a late
// payment mined minutes before the order's monitoring window ends; a reorg
// mines it again in a block whose time is after the window.
func TestReorgMiningAPaymentAgainAfterItsWindowUnmatchesIt(t *testing.T) {
	e := newChainEnv(t)
	ctx := context.Background()
	e.sync()
	o := e.order(7_000_000)
	e.later(expires + window - 3*time.Minute)
	h := e.payOnChain(o.PayAmount.Int64())
	e.sync()
	paid := e.transferOf(h.Hex())
	if paid.Order == nil || *paid.Order != o.ID {
		t.Fatalf("setup: the payment mined before the window ended is on order %s, want %s", orderOf(paid), o.ID)
	}
	e.expect(o, paywatch.StatusConfirming, "")
	inWindow := func() bool {
		t.Helper()
		var ok bool
		if err := e.db.Get(&ok, `SELECT t.block_time <= o.monitor_until FROM transfers t, orders o WHERE t.id = $1 AND o.id = $2`,
			paid.ID, o.ID); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !inWindow() {
		t.Fatal("setup: the payment's first block is after the order's window")
	}
	signed, _, err := e.chain.Client.TransactionByHash(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	// The chain's clock runs past the window's end (an empty block), then a
	// reorg replaces the payment's block and that one, and mines the
	// payment again in the new chain's first block, after both.
	if err := e.chain.Backend.AdjustTime(10 * time.Minute); err != nil {
		t.Fatal(err)
	}
	e.chain.Reorg(2, 1, false, func() {
		if err := e.chain.Client.SendTransaction(ctx, signed); err != nil {
			t.Fatal(err)
		}
	})
	e.sync()
	again := e.transferOf(h.Hex())
	if again.ID != paid.ID || again.State == string(paywatch.TransferOrphaned) || inWindow() {
		t.Fatalf("setup: after the reorg the payment is %s %s, in the window: %v; want the same transfer, live, mined after the window",
			again.ID, again.State, inWindow())
	}
	if again.Order != nil {
		t.Fatalf("the payment mined again after the order's window still pays order %s (%s)", *again.Order, statusOf(e.fixture, o))
	}
	whys := amUnmatched(e.fixture, o)
	if len(whys) != 1 || !strings.Contains(whys[0], "it was mined after the order's monitoring window ended") {
		t.Fatalf("the order's transfer_unmatched events say %q; want one, saying it was mined after the window", whys)
	}
	e.expect(o, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment)
	if got := e.balance("suspense:devnet:USDT"); got != "7000000" {
		t.Fatalf("suspense %s: the unmatched payment is not in the inbox's account", got)
	}
}

// README: "A matched transfer that changes so that it no longer meets
// the rule it was matched by (... the scanner correcting a look-up's ...
// flags ...) leaves that order, `transfer_unmatched` on its timeline". A
// token event that moved no money (a fake deposit), claimed by tx hash: the
// look-up records it unflagged (it cannot run the balance check) and it
// matches; the scanner's check flags it balance_mismatch and it leaves the
// order.
func TestScannerFlaggingALookedUpPaymentUnmatchesIt(t *testing.T) {
	e := newChainEnv(t)
	ctx := context.Background()
	e.sync()
	o := e.order(5_000_000)
	fake := e.token.FakeTransfer(e.chain.Payer, e.shop, big.NewInt(o.PayAmount.Int64()))
	e.chain.Mine(1)
	if _, err := e.store.MarkPaid(ctx, o.ID, fake.Hex(), "shop"); err != nil {
		t.Fatal(err)
	}
	e.lookUpHints()
	looked := e.transferOf(fake.Hex())
	if looked.Order == nil || *looked.Order != o.ID || len(looked.Flags) != 0 {
		t.Fatalf("setup: the looked-up transfer is on order %s, flags %v; want on %s, unflagged", orderOf(looked), looked.Flags, o.ID)
	}
	e.expect(o, paywatch.StatusConfirming, "")
	e.chain.Mine(3)
	e.sync() // the scanner reaches the block, and its balance check runs
	got := e.transferOf(fake.Hex())
	if !slices.Equal([]string(got.Flags), []string{"balance_mismatch"}) {
		t.Fatalf("setup: the scanner's record of the fake deposit has flags %v, want [balance_mismatch]", got.Flags)
	}
	if got.Order != nil {
		t.Fatalf("the transfer the scanner flagged balance_mismatch still pays order %s (%s)", *got.Order, statusOf(e.fixture, o))
	}
	whys := amUnmatched(e.fixture, o)
	if len(whys) != 1 || !strings.Contains(whys[0], "it is flagged") {
		t.Fatalf("the order's transfer_unmatched events say %q; want one, saying it is flagged", whys)
	}
	e.expect(o, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment)
	if got := e.balance("settled:devnet:USDT"); got != "0" {
		t.Fatalf("settled %s on a fake deposit", got)
	}
}

// README lifecycle: "| confirming | disputed `ambiguous` | reconciler |
// two orders' customers claimed its only payment: it goes back to the
// inbox |". On the simulated chain: the first claim links a payment still
// waiting for its confirmations (confirming); a second customer's claim
// contests it.
func TestContestedClaimMovesAConfirmingOrderToDisputedAmbiguous(t *testing.T) {
	e := newChainEnv(t)
	ctx := context.Background()
	e.sync()
	first := e.order(10_000_000)
	second := e.order(20_000_000)
	h := e.payOnChain(9_900_000) // 9.90 of first's 10.00: no exact match
	e.sync()
	if _, err := e.store.MarkPaid(ctx, first.ID, h.Hex(), "shop"); err != nil {
		t.Fatal(err)
	}
	e.sync()
	if got := e.transferOf(h.Hex()); got.Order == nil || *got.Order != first.ID || got.State != string(paywatch.TransferSeen) {
		t.Fatalf("setup: the claimed payment is %s on order %s; want seen, on %s", got.State, orderOf(got), first.ID)
	}
	e.expect(first, paywatch.StatusConfirming, "")
	if _, err := e.store.MarkPaid(ctx, second.ID, h.Hex(), "shop"); err != nil {
		t.Fatal(err)
	}
	e.sync()
	if got := e.transferOf(h.Hex()); got.Order != nil || !slices.Contains(got.Flags, paywatch.FlagAmbiguous) {
		t.Fatalf("the contested payment is on order %s, flags %v; want in the inbox, flagged ambiguous", orderOf(got), got.Flags)
	}
	e.expect(first, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
	moves := e.fixture.moves(first)
	if !slices.Equal(moves, []string{"awaiting_payment>confirming", "confirming>disputed/ambiguous"}) {
		t.Fatalf("the first claimant's order moved %v; want awaiting_payment>confirming, confirming>disputed/ambiguous", moves)
	}
	e.expect(second, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
}

// README: "A sighting **never pays anything**: no ledger entry, no
// `received_amount`, no settlement, no claim link". On a real btcd: a
// customer claims a payment that is only in the mempool; it shows the order
// confirming, the claim links nothing and stays pending (it is looked up,
// and found unmined); once mined, the claim is decided and the payment
// linked.
func TestClaimOfAPaymentSeenOnlyInTheMempoolLinksNothingUntilMined(t *testing.T) {
	e := newBTCEnv(t)
	ctx := context.Background()
	e.sync()
	o := e.order(150_000)
	e.clock.Advance(time.Second)
	txid := e.node.Pay(btctest.Output{Address: o.PayAddress, Sats: 150_000})
	if _, err := e.store.MarkPaid(ctx, o.ID, txid, "shop"); err != nil {
		t.Fatal(err)
	}
	e.mempool()
	if _, err := e.rec.LookUpHints(ctx); err != nil {
		t.Fatal(err)
	}
	e.pass()
	e.pass()
	got := e.get(o)
	if got.Status != paywatch.StatusConfirming || len(got.Transfers) != 1 || got.Transfers[0].State != paywatch.TransferMempool {
		t.Fatalf("setup: the order is %s with transfers %+v; want confirming on one mempool sighting", got.Status, got.Transfers)
	}
	var lookups int
	if err := e.db.Get(&lookups, `SELECT hint_lookups FROM orders WHERE id = $1`, o.ID); err != nil || lookups != 1 {
		t.Fatalf("setup: the claim was looked up %d times (%v), want once", lookups, err)
	}
	if state := amHintState(e.fixture, o); state != "pending" {
		t.Fatalf("the claim of a payment seen only in the mempool is %q (rejection %q), want pending", state, e.rejection(o))
	}
	var recorded int
	if err := e.db.Get(&recorded, `SELECT count(*) FROM transfers WHERE tx_hash = $1`, txid); err != nil || recorded != 0 {
		t.Fatalf("%d transfers recorded (%v) for a transaction in no block, want none", recorded, err)
	}
	if got.ReceivedAmount.Sign() != 0 {
		t.Fatalf("the order received %s on a mempool sighting, want 0", got.ReceivedAmount)
	}
	if b := e.balance("order:" + o.ID); b != "0" {
		t.Fatalf("the order's account holds %s on a mempool sighting, want 0", b)
	}
	if evs := e.events(o); slices.Contains(evs, "transfer_matched") || slices.Contains(evs, "hint_rejected") {
		t.Fatalf("the claim of a payment seen only in the mempool was decided: timeline %v", evs)
	}
	e.node.Mine(1)
	e.mempool()
	e.sync()
	if state := amHintState(e.fixture, o); state != "linked" {
		t.Fatalf("the claim of the mined payment is %q (rejection %q), want linked", state, e.rejection(o))
	}
	var on sql.NullString
	if err := e.db.Get(&on, `SELECT order_id FROM transfers WHERE tx_hash = $1`, txid); err != nil || on.String != o.ID {
		t.Fatalf("the mined payment is on order %q (%v), want %s", on.String, err, o.ID)
	}
	if got := e.get(o); got.ReceivedAmount.Int64() != 150_000 {
		t.Fatalf("the order received %s once its payment was mined, want 150000", got.ReceivedAmount)
	}
}

// amFixtureWithURL is newFixture on a database whose URL a listener can
// reach.
func amFixtureWithURL(t *testing.T) (*fixture, string) {
	t.Helper()
	db, dbURL := pgtest.NewWithURL(t)
	c := reconciletest.NewClock(time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC))
	f := &fixture{t: t, db: db, clock: c, store: orders.NewStore(db, window, reconciletest.Wallets(t)),
		rec: reconcile.New(db, slog.New(slog.NewTextHandler(io.Discard, nil)), grace, 8*24*time.Hour),
		op:  reconcile.NewOperator(db)}
	f.store.Now, f.rec.Now, f.op.Now = c.Now, c.Now, c.Now
	f.store.Rand = reconciletest.FirstSlot
	pgtest.Exec(t, db, `INSERT INTO chain_cursors (network, head, updated_at) VALUES ('ethereum', 0, $1), ('bitcoin', 0, $1)`, c.Now())
	t.Cleanup(func() { f.check() })
	return f, dbURL
}

// README: "A pass runs on `reconciler.schedule`, at once when a scanner
// commits or a customer claims a payment (PostgreSQL `NOTIFY`)". With a
// schedule that never fires during the test, a customer's "I've paid" with
// the tx hash of a recorded payment is decided within about a second: the
// claim's own notification runs the pass.
func TestCustomerClaimRunsAPassAtOnceByNotify(t *testing.T) {
	f, dbURL := amFixtureWithURL(t)
	ctx := context.Background()
	o := f.order(usdt, 10_000_000)
	h := hash(f, "claimed")
	tr := f.pay(payment{asset: usdt, to: shop, amount: 9_900_000, tx: h}) // inexact: only the claim can link it
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := reconcile.NewRunner(f.rec, "@every 1h", dbURL, pg.NotifyChannel, log)
	var passes atomic.Int64
	r.Observe = func(time.Duration, error) { passes.Add(1) }
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(runCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done }) // before the fixture's final check
	// The runner listens before its first pass, so the claim's notification
	// reaches it once that pass is done.
	for deadline := time.Now().Add(10 * time.Second); passes.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the runner made no pass at start")
		}
	}
	if got := f.transferOrder(tr); got != "" {
		t.Fatalf("setup: the payment matched %s before any claim", got)
	}
	start := time.Now()
	if _, err := f.store.MarkPaid(ctx, o.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	for deadline := start.Add(1500 * time.Millisecond); amHintState(f, o) == "pending"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the claim is still pending %v after it was made, with %d passes run: its notification ran no pass",
				time.Since(start).Round(time.Millisecond), passes.Load())
		}
	}
	took := time.Since(start)
	if state, got := amHintState(f, o), f.transferOrder(tr); state != "linked" || got != o.ID {
		t.Fatalf("the claim was decided as %q (rejection %q), the payment is on %q; want linked to %s", state, f.rejection(o), got, o.ID)
	}
	t.Logf("the claim was decided %v after it was made", took.Round(time.Millisecond))
}

// README: "not a payment that another order on the address, waiting
// with nothing received for about that amount (within 10% of its pay
// amount), may be owed": a payment exactly 10% away from the waiting
// order's pay amount is guarded (the claim is rejected and its order
// disputed ambiguous), one base unit further is not (the claim links it).
func TestClaimGuardCoversPaymentsWithin10PercentOfAWaitingOrder(t *testing.T) {
	if reconcile.ClaimTolerance != 0.10 {
		t.Errorf("the claim guard's tolerance is %v, want 0.10", reconcile.ClaimTolerance)
	}
	cases := []struct {
		name    string
		amount  int64 // the claimed payment; the waiting order asks 10.000000 USDT
		guarded bool
	}{
		{"10% below", 9_000_000, true},
		{"10% and a unit below", 8_999_999, false},
		{"10% above", 11_000_000, true},
		{"10% and a unit above", 11_000_001, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			claimant := f.order(usdt, 1_000_000)
			waiting := f.order(usdt, 10_000_000)
			if waiting.PayAmount.Int64() != 10_000_000 {
				t.Fatalf("setup: the waiting order pays %s", waiting.PayAmount)
			}
			h := hash(f, "near")
			tr := f.pay(payment{asset: usdt, to: shop, amount: c.amount, tx: h})
			if _, err := f.store.MarkPaid(ctx, claimant.ID, h, "shop"); err != nil {
				t.Fatal(err)
			}
			f.pass()
			on, why := f.transferOrder(tr), f.rejection(claimant)
			if c.guarded {
				if on != "" || why != amWhyWaiting {
					t.Fatalf("a claim of %d units, 10%% or less from a waiting order's 10000000: the payment is on %q, rejection %q; "+
						"want it unlinked, rejected as %q", c.amount, on, why, amWhyWaiting)
				}
				f.expect(claimant, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
			} else if on != claimant.ID || why != "" {
				t.Fatalf("a claim of %d units, more than 10%% from a waiting order's 10000000: the payment is on %q, rejection %q; "+
					"want it linked to the claimant", c.amount, on, why)
			}
			f.expect(waiting, paywatch.StatusAwaitingPayment, "")
		})
	}
}

// README: "A look-up answering from more than 1,000 blocks beyond the
// recorded head is ignored." On the simulated chain, with the scanner's
// recorded head left behind: a claimed payment mined 1,000 blocks beyond it
// is recorded by the look-up, one mined 1,001 blocks beyond it is not (the
// scanner finds it when it reaches its block).
func TestLookUpFromMoreThan1000BlocksBeyondTheHeadIsIgnored(t *testing.T) {
	if scan.MaxLookupLead != 1000 {
		t.Errorf("a look-up may answer from %d blocks beyond the head, want 1000", scan.MaxLookupLead)
	}
	e := newChainEnv(t)
	ctx := context.Background()
	e.sync()
	head := e.chain.Head()
	var recordedHead int64
	if err := e.db.Get(&recordedHead, `SELECT head FROM chain_cursors WHERE network = 'devnet'`); err != nil || uint64(recordedHead) != head {
		t.Fatalf("setup: the recorded head is %d (%v), want the chain's %d", recordedHead, err, head)
	}
	within, beyond := e.order(3_000_000), e.order(4_000_000)
	e.chain.Mine(999)
	hWithin := e.payOnChain(2_900_000)
	hBeyond := e.payOnChain(3_900_000)
	for _, c := range []struct {
		h    common.Hash
		lead uint64
	}{{hWithin, 1000}, {hBeyond, 1001}} {
		if got := e.chain.Receipt(c.h).BlockNumber.Uint64(); got != head+c.lead {
			t.Fatalf("setup: a payment was mined in block %d, want %d", got, head+c.lead)
		}
	}
	for o, h := range map[*paywatch.Order]string{within: hWithin.Hex(), beyond: hBeyond.Hex()} {
		if _, err := e.store.MarkPaid(ctx, o.ID, h, "shop"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.rec.LookUpHints(ctx); err != nil {
		t.Fatal(err)
	}
	recorded := func(h string) bool {
		t.Helper()
		var n int
		if err := e.db.Get(&n, `SELECT count(*) FROM transfers WHERE lower(tx_hash) = lower($1)`, h); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	if !recorded(hWithin.Hex()) {
		t.Fatal("a look-up answering from 1,000 blocks beyond the recorded head was ignored")
	}
	if recorded(hBeyond.Hex()) {
		t.Fatal("a look-up answering from 1,001 blocks beyond the recorded head was recorded")
	}
	e.chain.Mine(3)
	e.sync() // the scanner reaches both blocks
	for o, h := range map[*paywatch.Order]string{within: hWithin.Hex(), beyond: hBeyond.Hex()} {
		if got := e.transferOf(h); got.Order == nil || *got.Order != o.ID {
			t.Fatalf("once scanned, the claimed payment %s is on order %s, want %s", h, orderOf(got), o.ID)
		}
	}
}

// README: "A transfer can pay an order only if it went to the order's
// network, asset (by contract, never by symbol) and address". A transfer
// of a token with the order's symbol but another contract, of exactly the
// order's pay amount to its address, matches nothing; a claim of it is
// rejected (and disputes the order wrong_asset).
func TestTransferOfASameSymbolTokenAtAnotherContractNeverPays(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	lookalike := &paywatch.Asset{Network: usdt.Network, Symbol: usdt.Symbol, Contract: "0x00000000000000000000000000000000000000ff",
		Decimals: usdt.Decimals}
	if lookalike.Contract == usdt.Contract {
		t.Fatal("setup: the lookalike token has the order's contract")
	}
	o := f.order(usdt, 4_000_000)
	h := hash(f, "lookalike")
	tr := f.pay(payment{asset: lookalike, to: shop, amount: o.PayAmount.Int64(), tx: h})
	f.pass()
	if on := f.transferOrder(tr); on != "" {
		t.Fatalf("a %s transfer of another contract paid order %s (%s)", usdt.Symbol, on, statusOf(f, o))
	}
	f.expect(o, paywatch.StatusAwaitingPayment, "")
	if _, err := f.store.MarkPaid(ctx, o.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	if on := f.transferOrder(tr); on != "" {
		t.Fatalf("a claim linked a %s transfer of another contract to order %s", usdt.Symbol, on)
	}
	if why := f.rejection(o); why != amWhyOtherAsset {
		t.Fatalf("the claim of a same-symbol transfer of another contract: rejection %q, want %q", why, amWhyOtherAsset)
	}
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonWrongAsset)
}

// README: "carries no flag but `balance_unchecked` (... `ambiguous`,
// `held` never pay by themselves)" and "`held` and `ambiguous` are
// decisions about the money": under the exact-amount rule too. Two orders
// ask the same amount (the first's slot is handed out again once its
// window is over); a payment of it mined in the first's window and recorded
// after the second was created is ambiguous. Once the first order is gone
// (cancelled by an operator), the second, created before the payment and
// asking exactly its amount, is its only candidate: the payment, ambiguous,
// or held after an operator's cancel, still does not pay it, and no claim
// of it does.
func TestHeldOrAmbiguousPaymentOfAnOrdersExactAmountNeverPaysIt(t *testing.T) {
	for _, flag := range []string{paywatch.FlagAmbiguous, paywatch.FlagHeld} {
		t.Run(flag, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			first := f.order(usdt, 10_000_000)
			f.clock.Advance(expires + window + time.Minute) // first's slot is free again
			f.pass()
			second := f.order(usdt, 10_000_000)
			if second.PayAmount.Cmp(first.PayAmount) != 0 {
				t.Fatalf("setup: the second order pays %s, not the first's freed %s", second.PayAmount, first.PayAmount)
			}
			// Mined in the last minutes of first's window, recorded after
			// second was created: a candidate of both.
			h := hash(f, "both")
			tr := f.pay(payment{asset: usdt, to: shop, amount: second.PayAmount.Int64(), blockAgo: 2 * time.Minute, tx: h})
			f.pass()
			if on, flags := f.transferOrder(tr), f.flags(tr); on != "" || !slices.Contains(flags, paywatch.FlagAmbiguous) {
				t.Fatalf("setup: the payment with two candidates is on %q, flags %v", on, flags)
			}
			f.expect(first, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
			f.expect(second, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
			if flag == paywatch.FlagHeld {
				// The operator gives the payment to the first order, then
				// cancels it: the money goes back to the inbox, held.
				if err := f.op.Attach(ctx, tr, first.ID, "the first customer's late payment", "alice"); err != nil {
					t.Fatal(err)
				}
				f.pass()
				f.expect(first, paywatch.StatusDisputed, paywatch.ReasonLatePayment)
			}
			if err := f.op.Resolve(ctx, first.ID, paywatch.StatusCancelled, "customer cancelled; refund by hand", "alice"); err != nil {
				t.Fatal(err)
			}
			if flags := f.flags(tr); !slices.Contains(flags, flag) || slices.ContainsFunc(flags, func(g string) bool { return g != flag }) {
				t.Fatalf("setup: the payment's flags are %v, want %s alone", flags, flag)
			}
			var candidate bool
			if err := f.db.Get(&candidate, `SELECT t.amount = o.pay_amount AND t.first_seen_at >= o.created_at
					AND t.block_number > o.created_height AND o.status = 'disputed'
				FROM transfers t, orders o WHERE t.id = $1 AND o.id = $2`, tr, second.ID); err != nil || !candidate {
				t.Fatalf("setup: the second order is not an open order asking exactly the payment's amount, created before it (%v)", err)
			}
			f.pass()
			if on := f.transferOrder(tr); on != "" {
				t.Fatalf("a payment flagged %s paid order %s, the only open order of its exact amount (%s)", flag, on, statusOf(f, second))
			}
			f.expect(second, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
			// Nor does the second order's customer's claim place it.
			if _, err := f.store.MarkPaid(ctx, second.ID, h, "shop"); err != nil {
				t.Fatal(err)
			}
			f.pass()
			if on := f.transferOrder(tr); on != "" {
				t.Fatalf("a claim placed a payment flagged %s on order %s", flag, on)
			}
			if why, want := f.rejection(second), "it is flagged "+flag; why != want {
				t.Fatalf("the claim of a payment flagged %s: rejection %q, want %q", flag, why, want)
			}
			if got := f.balance("suspense:ethereum:USDT"); got != second.PayAmount.String() {
				t.Fatalf("suspense %s: the %s payment is not in the inbox's account", got, flag)
			}
		})
	}
}

// README: "the candidates that hold no payment yet are disputed `ambiguous`
// (one already disputed keeps its reason)". A candidate disputed
// no_payment_found stays so when a payment with two candidates comes; the
// other, awaiting payment, is disputed ambiguous; the payment pays neither.
func TestAmbiguousTransferLeavesADisputedCandidateItsReason(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	disputed := f.orderExpiring(usdt, 7_000_000, grace+time.Hour)
	if _, err := f.store.MarkPaid(ctx, disputed.ID, "", "shop"); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(grace + time.Minute)
	f.pass()
	f.expect(disputed, paywatch.StatusDisputed, paywatch.ReasonNoPaymentFound)
	waiting := f.order(usdt, 6_999_999)
	// Both ask for the same amount now, as a misconfiguration could make
	// them.
	pgtest.Exec(t, f.db, `UPDATE orders SET pay_amount = $2 WHERE id = $1`, waiting.ID, disputed.PayAmount.Int64())
	pgtest.Exec(t, f.db, `DELETE FROM amount_slots`)
	p := f.pay(payment{asset: usdt, to: shop, amount: disputed.PayAmount.Int64()})
	f.pass()
	if got, flags := f.transferOrder(p), f.flags(p); got != "" || !slices.Equal(flags, []string{paywatch.FlagAmbiguous}) {
		t.Fatalf("the payment with two candidates is on order %q, flags %v; want in the inbox, flagged ambiguous", got, flags)
	}
	f.expect(waiting, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
	f.expect(disputed, paywatch.StatusDisputed, paywatch.ReasonNoPaymentFound)
	for _, o := range []*paywatch.Order{disputed, waiting} {
		if err := f.op.Resolve(ctx, o.ID, paywatch.StatusCancelled, "two orders of one pay amount", "alice"); err != nil {
			t.Fatal(err)
		}
	}
}
