package reconcile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/ledger"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

const (
	shop    = reconciletest.Shop
	usdtSC  = reconciletest.USDTContract
	grace   = 2 * time.Hour
	window  = 24 * time.Hour
	expires = time.Hour
)

var (
	fx     = reconciletest.NewFixtures()
	eth    = fx.Ethereum
	usdt   = fx.USDT
	dai    = fx.DAI
	btcNet = fx.Bitcoin
	btc    = fx.BTC
)

type fixture struct {
	t     *testing.T
	db    *sqlx.DB
	clock *reconciletest.Clock
	store *orders.Store
	rec   *reconcile.Reconciler
	op    *reconcile.Operator
	n     int
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db := pgtest.New(t)
	c := reconciletest.NewClock(time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC))
	f := &fixture{t: t, db: db, clock: c, store: orders.NewStore(db, window, reconciletest.Wallets(t)),
		rec: reconcile.New(db, slog.New(slog.NewTextHandler(io.Discard, nil)), grace, 8*24*time.Hour),
		op:  reconcile.NewOperator(db)}
	f.store.Now, f.rec.Now, f.op.Now = c.Now, c.Now, c.Now
	f.store.Rand = reconciletest.FirstSlot
	// Both networks have been scanned up to block 0: orders are created at
	// height 0, and each payment is mined in a block of its own above.
	pgtest.Exec(t, db, `INSERT INTO chain_cursors (network, head, updated_at) VALUES ('ethereum', 0, $1), ('bitcoin', 0, $1)`, c.Now())
	t.Cleanup(func() { f.check() })
	return f
}

// check runs a pass, then asserts every invariant and that every order is
// where its payments say.
func (f *fixture) check() {
	f.t.Helper()
	if _, err := f.rec.Pass(context.Background()); err != nil {
		f.t.Errorf("pass: %v", err)
	}
	if err := reconcile.CheckInvariants(context.Background(), f.db); err != nil {
		f.t.Errorf("invariants after the scenario:\n%v", err)
	}
	if err := f.rec.CheckDecisions(context.Background()); err != nil {
		f.t.Errorf("orders not where their payments say:\n%v", err)
	}
}

func (f *fixture) order(a *paywatch.Asset, units int64) *paywatch.Order {
	f.t.Helper()
	return f.orderExpiring(a, units, expires)
}

// orderExpiring creates an order that expires after the given time.
func (f *fixture) orderExpiring(a *paywatch.Asset, units int64, expiresIn time.Duration) *paywatch.Order {
	f.t.Helper()
	f.n++
	o, _, err := f.store.Create(context.Background(), orders.CreateRequest{ExternalID: fmt.Sprintf("ext-%d", f.n),
		Network: fx.Network(a), Asset: a, Amount: big.NewInt(units), ExpiresIn: expiresIn, Actor: "shop"})
	if err != nil {
		f.t.Fatal(err)
	}
	return o
}

// pay records a transfer as the scanner would: to the order's address,
// seen now, with the block time given relative to now.
type payment struct {
	asset    *paywatch.Asset
	to       string
	amount   int64
	state    string
	blockAgo time.Duration // block time = now - blockAgo
	tx       string
	flags    []string
}

func (f *fixture) pay(p payment) string {
	f.t.Helper()
	f.n++
	id := fmt.Sprintf("trf_%04d", f.n)
	if p.state == "" {
		p.state = "confirmed"
	}
	if p.tx == "" {
		p.tx = fmt.Sprintf("0x%064x", f.n)
	}
	if p.flags == nil {
		p.flags = []string{}
	}
	now := f.clock.Now()
	// Each payment is mined in a new block, which becomes the network's head.
	pgtest.Exec(f.t, f.db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, from_address,
		to_address, amount, block_number, block_hash, state, first_seen_at, updated_at, block_time, flags)
		VALUES ($1, $2, $3, $4, $5, 'k', 0, '0xfrom', $6, $7, $8, $9, $10, $11, $11, $12, $13)`,
		id, p.asset.Network, p.asset.Symbol, p.asset.Contract, p.tx, p.to, p.amount, f.n, fmt.Sprintf("0xb%d", f.n),
		p.state, now, now.Add(-p.blockAgo), pq.Array(p.flags))
	pgtest.Exec(f.t, f.db, `INSERT INTO chain_cursors (network, head, updated_at) VALUES ($1, $2, $3)
		ON CONFLICT (network) DO UPDATE SET head = greatest(chain_cursors.head, EXCLUDED.head)`, p.asset.Network, f.n, now)
	return id
}

// moves lists an order's status changes as "from>to", with "/reason" when
// the move gives one (into disputed).
func (f *fixture) moves(o *paywatch.Order) []string {
	f.t.Helper()
	evs, err := f.store.Events(context.Background(), o.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	var moves []string
	for _, ev := range evs {
		if ev.Type != "status_changed" {
			continue
		}
		var d struct {
			Reason string `json:"reason"`
		}
		_ = json.Unmarshal(ev.Detail, &d)
		m := string(ev.FromStatus) + ">" + string(ev.ToStatus)
		if d.Reason != "" {
			m += "/" + d.Reason
		}
		moves = append(moves, m)
	}
	return moves
}

// flags returns a transfer's flags.
func (f *fixture) flags(transfer string) []string {
	f.t.Helper()
	var flags pq.StringArray
	if err := f.db.Get(&flags, `SELECT flags FROM transfers WHERE id = $1`, transfer); err != nil {
		f.t.Fatal(err)
	}
	return flags
}

func (f *fixture) pass() reconcile.Result {
	f.t.Helper()
	res, err := f.rec.Pass(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return res
}

func (f *fixture) expect(o *paywatch.Order, status paywatch.Status, reason paywatch.Reason) {
	f.t.Helper()
	got, err := f.store.Get(context.Background(), o.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	if got.Status != status || got.DisputeReason != reason {
		f.t.Fatalf("order %s is %s/%s, want %s/%s", o.ExternalID, got.Status, got.DisputeReason, status, reason)
	}
}

func (f *fixture) balance(account string) string {
	f.t.Helper()
	bs, err := ledger.Balances(context.Background(), f.db, account)
	if err != nil {
		f.t.Fatal(err)
	}
	total := new(big.Int)
	for _, b := range bs {
		if b.Account == account {
			total.Add(total, b.Amount)
		}
	}
	return total.String()
}

// setState changes a transfer's state as the scanner does (which marks an
// orphaned transfer for the ledger to reverse).
func (f *fixture) setState(transfer, state string) {
	pgtest.Exec(f.t, f.db, `UPDATE transfers SET state = $2, ledger_dirty = ledger_dirty OR $2 = 'orphaned' WHERE id = $1`, transfer, state)
}

func TestExactPaymentSettles(t *testing.T) {
	f := newFixture(t)
	o := f.order(usdt, 1_234_000_000)
	tr := f.pay(payment{asset: usdt, to: shop, amount: 1_234_000_000, state: "seen"})
	f.pass()
	f.expect(o, paywatch.StatusConfirming, "")
	f.setState(tr, "confirmed")
	f.pass()
	f.expect(o, paywatch.StatusSettled, "")
	if got := f.balance("settled:ethereum:USDT"); got != "1234000000" {
		t.Fatalf("settled balance %s", got)
	}
	if got := f.balance("order:" + o.ID); got != "0" {
		t.Fatalf("order account %s", got)
	}
	if res := f.pass(); res != (reconcile.Result{}) {
		t.Fatalf("a second pass changed something: %v", res)
	}
	events, _ := f.store.Events(context.Background(), o.ID)
	var types []string
	for _, e := range events {
		types = append(types, e.Type+":"+string(e.ToStatus))
	}
	if strings.Join(types, ",") != "created:awaiting_payment,transfer_matched:,status_changed:confirming,status_changed:settled" {
		t.Fatalf("timeline %v", types)
	}
	var hooks []string
	_ = f.db.Select(&hooks, `SELECT type FROM webhook_outbox WHERE order_id = $1 ORDER BY created_at, type`, o.ID)
	if strings.Join(hooks, ",") != "order.confirming,order.settled" {
		t.Fatalf("webhooks %v", hooks)
	}
}

func TestTransitionsAndReasons(t *testing.T) {
	cases := []struct {
		name   string
		run    func(f *fixture) *paywatch.Order
		status paywatch.Status
		reason paywatch.Reason
	}{
		{"expired", func(f *fixture) *paywatch.Order {
			o := f.order(usdt, 10_000_000)
			f.clock.Advance(expires + time.Minute)
			return o
		}, paywatch.StatusExpired, ""},
		{"marked paid, nothing within grace: still awaiting", func(f *fixture) *paywatch.Order {
			o := f.order(usdt, 10_000_000)
			f.store.MarkPaid(context.Background(), o.ID, "", "shop")
			f.clock.Advance(grace - time.Minute)
			return o
		}, paywatch.StatusAwaitingPayment, ""},
		{"no payment found", func(f *fixture) *paywatch.Order {
			o := f.order(usdt, 10_000_000)
			f.store.MarkPaid(context.Background(), o.ID, "", "shop")
			f.clock.Advance(grace + time.Minute)
			return o
		}, paywatch.StatusDisputed, paywatch.ReasonNoPaymentFound},
		{"underpaid (address per order, after expiry)", func(f *fixture) *paywatch.Order {
			o := f.order(btc, 100_000)
			f.pay(payment{asset: btc, to: o.PayAddress, amount: 99_999})
			f.clock.Advance(expires + time.Minute)
			return o
		}, paywatch.StatusDisputed, paywatch.ReasonUnderpaid},
		{"partial payment before expiry waits for a top-up", func(f *fixture) *paywatch.Order {
			o := f.order(btc, 100_000)
			f.pay(payment{asset: btc, to: o.PayAddress, amount: 60_000})
			return o
		}, paywatch.StatusConfirming, ""},
		{"top-ups summing exactly settle", func(f *fixture) *paywatch.Order {
			o := f.order(btc, 100_000)
			f.pay(payment{asset: btc, to: o.PayAddress, amount: 60_000})
			f.pay(payment{asset: btc, to: o.PayAddress, amount: 40_000})
			return o
		}, paywatch.StatusSettled, ""},
		{"overpaid", func(f *fixture) *paywatch.Order {
			o := f.order(btc, 100_000)
			f.pay(payment{asset: btc, to: o.PayAddress, amount: 150_000})
			return o
		}, paywatch.StatusDisputed, paywatch.ReasonOverpaid},
		{"multiple payments to a shared address", func(f *fixture) *paywatch.Order {
			o := f.order(usdt, 5_000_000)
			f.pay(payment{asset: usdt, to: shop, amount: 5_000_000})
			f.pay(payment{asset: usdt, to: shop, amount: 5_000_000})
			return o
		}, paywatch.StatusDisputed, paywatch.ReasonMultiplePayments},
		{"late payment", func(f *fixture) *paywatch.Order {
			o := f.order(usdt, 7_000_000)
			f.clock.Advance(3 * time.Hour)
			f.rec.Pass(context.Background()) // expires it
			f.pay(payment{asset: usdt, to: shop, amount: 7_000_000})
			return o
		}, paywatch.StatusDisputed, paywatch.ReasonLatePayment},
		{"payment after the monitoring window stays unmatched", func(f *fixture) *paywatch.Order {
			o := f.order(usdt, 7_000_000)
			f.clock.Advance(expires + window + time.Hour)
			f.pay(payment{asset: usdt, to: shop, amount: 7_000_000})
			return o
		}, paywatch.StatusExpired, ""},
		{"dust is never matched", func(f *fixture) *paywatch.Order {
			o := f.order(usdt, 7)
			tr := f.pay(payment{asset: usdt, to: shop, amount: 7})
			pgtest.Exec(f.t, f.db, `UPDATE transfers SET flags = '{dust}' WHERE id = $1`, tr)
			return o
		}, paywatch.StatusAwaitingPayment, ""},
		{"a payment in another asset matches nothing", func(f *fixture) *paywatch.Order {
			o := f.order(usdt, 9_000_000)
			f.pay(payment{asset: dai, to: shop, amount: 9_000_000})
			return o
		}, paywatch.StatusAwaitingPayment, ""},
		{"wrong asset by tx hash hint", func(f *fixture) *paywatch.Order {
			o := f.order(usdt, 9_000_000)
			tx := "0x" + strings.Repeat("d", 64)
			f.pay(payment{asset: dai, to: shop, amount: 9_000_000, tx: tx})
			f.store.MarkPaid(context.Background(), o.ID, tx, "shop")
			return o
		}, paywatch.StatusDisputed, paywatch.ReasonWrongAsset},
		{"tx hash hint attaches an inexact payment", func(f *fixture) *paywatch.Order {
			o := f.order(usdt, 9_000_000)
			tx := "0x" + strings.Repeat("e", 64)
			f.pay(payment{asset: usdt, to: shop, amount: 8_000_000, tx: tx})
			// Given in upper case, as a wallet may show it: the same hash.
			if _, err := f.store.MarkPaid(context.Background(), o.ID, "0x"+strings.ToUpper(tx[2:]), "shop"); err != nil {
				f.t.Fatal(err)
			}
			f.clock.Advance(expires + time.Minute)
			return o
		}, paywatch.StatusDisputed, paywatch.ReasonUnderpaid},
		{"no payment found, then an exact payment settles by itself", func(f *fixture) *paywatch.Order {
			o := f.orderExpiring(usdt, 3_000_000, grace+time.Hour) // paid before expiry
			f.store.MarkPaid(context.Background(), o.ID, "", "shop")
			f.clock.Advance(grace + time.Minute)
			f.rec.Pass(context.Background())
			f.expect(o, paywatch.StatusDisputed, paywatch.ReasonNoPaymentFound)
			f.pay(payment{asset: usdt, to: shop, amount: 3_000_000})
			return o
		}, paywatch.StatusSettled, ""},
		{"orphaned while confirming", func(f *fixture) *paywatch.Order {
			o := f.order(usdt, 4_000_000)
			tr := f.pay(payment{asset: usdt, to: shop, amount: 4_000_000, state: "seen"})
			f.rec.Pass(context.Background())
			f.expect(o, paywatch.StatusConfirming, "")
			f.setState(tr, "orphaned")
			return o
		}, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment},
		{"orphaned after settlement: the settlement is reversed", func(f *fixture) *paywatch.Order {
			o := f.order(usdt, 4_000_000)
			tr := f.pay(payment{asset: usdt, to: shop, amount: 4_000_000})
			f.rec.Pass(context.Background())
			f.expect(o, paywatch.StatusSettled, "")
			f.setState(tr, "orphaned")
			return o
		}, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			o := c.run(f)
			f.pass()
			f.expect(o, c.status, c.reason)
			if res := f.pass(); res != (reconcile.Result{}) {
				t.Fatalf("second pass changed something: %v", res)
			}
		})
	}
}

func TestReorgReversesLedger(t *testing.T) {
	f := newFixture(t)
	o := f.order(usdt, 4_000_000)
	tr := f.pay(payment{asset: usdt, to: shop, amount: 4_000_000})
	f.pass()
	if f.balance("settled:ethereum:USDT") != "4000000" {
		t.Fatal("not settled in the ledger")
	}
	f.setState(tr, "orphaned")
	f.pass()
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment)
	for _, acct := range []string{"settled:ethereum:USDT", "order:" + o.ID, "suspense:ethereum:USDT", "wallet:ethereum:" + shop} {
		if got := f.balance(acct); got != "0" {
			t.Errorf("%s = %s after the reorg, want 0", acct, got)
		}
	}
	var reversals, unsettlements int
	_ = f.db.Get(&reversals, `SELECT count(*) FROM ledger_entries WHERE kind = 'reversal'`)
	_ = f.db.Get(&unsettlements, `SELECT count(*) FROM ledger_entries WHERE kind = 'unsettlement' AND order_id = $1`, o.ID)
	if reversals != 2 || unsettlements != 1 { // receipt and attribution reversed; the order's settlement moved back
		t.Fatalf("%d reversals and %d unsettlements, want 2 and 1", reversals, unsettlements)
	}
}

// An order that leaves settled takes its share of revenue with it, or its
// transaction does not commit: a writer that moves the status alone (a
// daemon of a release that undid settlements by reversing the order's own
// entries, which a batch's settlement is not) is refused, not believed.
func TestLeavingSettledWithoutUnsettlingIsRefused(t *testing.T) {
	f := newFixture(t)
	o := f.order(usdt, 4_000_000)
	f.pay(payment{asset: usdt, to: shop, amount: 4_000_000})
	f.pass()
	f.expect(o, paywatch.StatusSettled, "")
	ctx := context.Background()
	leave := func(unsettle bool) error {
		tx, err := f.db.BeginTxx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.Exec(`UPDATE orders SET status = 'confirming', settled_at = NULL WHERE id = $1`, o.ID); err != nil {
			t.Fatal(err)
		}
		if unsettle {
			if err := ledger.Unsettle(ctx, tx, f.clock.Now(), []string{o.ID}); err != nil {
				t.Fatal(err)
			}
		}
		return tx.Commit()
	}
	if err := leave(false); err == nil || !strings.Contains(err.Error(), "still in revenue") {
		t.Fatalf("left settled with its money in revenue: %v, want the commit refused", err)
	}
	if got := f.balance("settled:ethereum:USDT"); got != "4000000" {
		t.Fatalf("settled = %s after the refused commit, want 4000000", got)
	}
	if err := leave(true); err != nil {
		t.Fatalf("left settled with its share moved back: %v", err)
	}
	if got := f.balance("settled:ethereum:USDT"); got != "0" {
		t.Fatalf("settled = %s, want 0", got)
	}
	if got := f.balance("order:" + o.ID); got != "4000000" {
		t.Fatalf("the order's account holds %s, want 4000000", got)
	}
	// Its payment stands: the next pass to look at it settles it again.
	pgtest.Exec(t, f.db, `INSERT INTO order_reviews (order_id, at) VALUES ($1, now())`, o.ID)
	f.pass()
	f.expect(o, paywatch.StatusSettled, "")
	if got := f.balance("settled:ethereum:USDT"); got != "4000000" {
		t.Fatalf("settled = %s after settling again, want 4000000", got)
	}
}

func TestSuspenseIsUnmatchedTransfers(t *testing.T) {
	f := newFixture(t)
	f.order(usdt, 1_000_000)
	f.pay(payment{asset: usdt, to: shop, amount: 1_000_000})
	f.pay(payment{asset: usdt, to: shop, amount: 2_500_000}) // matches nothing
	f.pay(payment{asset: usdt, to: shop, amount: 700_000, state: "seen"})
	f.pass()
	if got := f.balance("suspense:ethereum:USDT"); got != "2500000" {
		t.Fatalf("suspense %s, want 2500000 (confirmed unmatched only)", got)
	}
}

func TestAmbiguousNeverGuesses(t *testing.T) {
	f := newFixture(t)
	a := f.order(usdt, 6_000_000)
	b := f.order(usdt, 6_000_001)
	// Force both to the same pay amount, as a misconfiguration could.
	pgtest.Exec(t, f.db, `UPDATE orders SET pay_amount = 6000001 WHERE id = $1`, a.ID)
	pgtest.Exec(t, f.db, `DELETE FROM amount_slots`)
	tr := f.pay(payment{asset: usdt, to: shop, amount: 6_000_001})
	f.pass()
	f.expect(a, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
	f.expect(b, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
	got, _ := f.store.GetTransfer(context.Background(), tr)
	if got.OrderID != "" || len(got.Flags) != 1 || got.Flags[0] != "ambiguous" {
		t.Fatalf("ambiguous transfer %+v", got)
	}
	// Their webhook events, written by the statement that flags the
	// payment, have ids of the form every other event has (README, HTTP
	// API), one each.
	var ids []string
	if err := f.db.Select(&ids, `SELECT id FROM webhook_outbox WHERE type = 'order.disputed'`); err != nil || len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("dispute events %v (%v), want 2", ids, err)
	}
	for _, id := range ids {
		if !regexp.MustCompile(`^evt_[a-z2-7]{24}$`).MatchString(id) {
			t.Errorf("webhook event id %q is not evt_ and 24 characters of a-z2-7", id)
		}
	}
	// An operator decides.
	if err := f.op.Attach(context.Background(), tr, b.ID, "customer sent the receipt by mail", "alice"); err != nil {
		t.Fatal(err)
	}
	if err := f.op.Resolve(context.Background(), b.ID, paywatch.StatusSettled, "paid per receipt", "alice"); err != nil {
		t.Fatal(err)
	}
	if err := f.op.Resolve(context.Background(), a.ID, paywatch.StatusCancelled, "not this one", "alice"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	f.expect(b, paywatch.StatusSettled, "")
	f.expect(a, paywatch.StatusCancelled, "")
}

func TestOperatorAttachAndResolve(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	o := f.order(usdt, 10_000_000)
	stray := f.pay(payment{asset: usdt, to: shop, amount: 9_990_000}) // an exchange took a fee
	f.pass()
	f.expect(o, paywatch.StatusAwaitingPayment, "")
	if err := f.op.Attach(ctx, stray, o.ID, "", "alice"); paywatch.ErrorCode(err) != paywatch.CodeInvalidRequest {
		t.Fatalf("attach without a note: %v", err)
	}
	if err := f.op.Attach(ctx, stray, o.ID, "exchange withdrawal fee", "alice"); err != nil {
		t.Fatal(err)
	}
	if err := f.op.Attach(ctx, stray, o.ID, "again", "alice"); paywatch.ErrorCode(err) != paywatch.CodeInvalidState {
		t.Fatalf("second attach: %v", err)
	}
	f.clock.Advance(expires + time.Minute)
	f.pass()
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonUnderpaid)
	if err := f.op.Resolve(ctx, o.ID, "paid", "x", "alice"); paywatch.ErrorCode(err) != paywatch.CodeInvalidRequest {
		t.Fatalf("bad outcome: %v", err)
	}
	if err := f.op.Resolve(ctx, o.ID, paywatch.StatusSettled, "", "alice"); paywatch.ErrorCode(err) != paywatch.CodeInvalidRequest {
		t.Fatalf("no note: %v", err)
	}
	if err := f.op.Resolve(ctx, o.ID, paywatch.StatusSettled, "accept the 0.01 shortfall", "alice"); err != nil {
		t.Fatal(err)
	}
	f.expect(o, paywatch.StatusSettled, "")
	if err := f.op.Resolve(ctx, o.ID, paywatch.StatusRefunded, "x", "alice"); paywatch.ErrorCode(err) != paywatch.CodeInvalidState {
		t.Fatalf("resolve a settled order: %v", err)
	}
	if got := f.balance("settled:ethereum:USDT"); got != "9990000" {
		t.Fatalf("settled %s", got)
	}
	events, _ := f.store.Events(ctx, o.ID)
	last := events[len(events)-1]
	if last.Type != "resolved" || last.Actor != "alice" || !strings.Contains(string(last.Detail), "shortfall") {
		t.Fatalf("audit %+v", last)
	}
	// Refund: the money becomes owed back.
	p := f.order(btc, 100_000)
	f.pay(payment{asset: btc, to: p.PayAddress, amount: 250_000})
	f.pass()
	f.expect(p, paywatch.StatusDisputed, paywatch.ReasonOverpaid)
	if err := f.op.Resolve(ctx, p.ID, paywatch.StatusRefunded, "customer asked for the money back", "bob"); err != nil {
		t.Fatal(err)
	}
	if got := f.balance("refunds_owed:bitcoin:BTC"); got != "250000" {
		t.Fatalf("refunds owed %s", got)
	}
}

// Two reconcilers at once over 10,000 orders: each order moves exactly
// once and the ledger balances.
func TestTwoReconcilersAtOnce(t *testing.T) {
	f := newFixture(t)
	const n = 10_000
	pgtest.Exec(t, f.db, `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
		pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time)
		SELECT 'ord_' || lpad(g::text, 8, '0'), 'bulk-' || g, '\x00', 'ethereum', 'USDT', $1, 1000000 + g, 1000000 + g, $2, g,
			'awaiting_payment', $3::timestamptz, $3::timestamptz + interval '1 hour', $3::timestamptz + interval '25 hours', $3::timestamptz,
			0, $3::timestamptz - interval '5 minutes'
		FROM generate_series(1, $4) g`, usdtSC, shop, f.clock.Now(), n)
	pgtest.Exec(t, f.db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address, amount,
		block_number, block_hash, state, first_seen_at, updated_at)
		SELECT 'trf_' || lpad(g::text, 8, '0'), 'ethereum', 'USDT', $1, '0x' || lpad(to_hex(g), 64, '0'), 'k', 0, $2,
			1000000 + g, g, '0xb' || g, 'confirmed', $3, $3
		FROM generate_series(1, $4) g`, usdtSC, shop, f.clock.Now(), n)
	a := reconcile.New(f.db, slog.New(slog.NewTextHandler(io.Discard, nil)), grace, 8*24*time.Hour)
	b := reconcile.New(f.db, slog.New(slog.NewTextHandler(io.Discard, nil)), grace, 8*24*time.Hour)
	a.Now, b.Now = f.clock.Now, f.clock.Now
	a.Batch, b.Batch = 500, 700
	var wg sync.WaitGroup
	for _, r := range []*reconcile.Reconciler{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 3; i++ {
				if _, err := r.Pass(context.Background()); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	var settled, events, entries int
	_ = f.db.Get(&settled, `SELECT count(*) FROM orders WHERE status = 'settled'`)
	_ = f.db.Get(&events, `SELECT count(*) FROM order_events WHERE to_status = 'settled'`)
	// Each order's settlement is one posting to its account, in its batch's
	// entry.
	_ = f.db.Get(&entries, `SELECT count(*) FROM ledger_postings p JOIN ledger_entries e ON e.id = p.entry_id
		WHERE e.kind = 'settlement' AND p.account LIKE 'order:%'`)
	if settled != n || events != n || entries != n {
		t.Fatalf("settled %d, settle events %d, settlement postings to orders %d; want %d each", settled, events, entries, n)
	}
	if got := f.balance("settled:ethereum:USDT"); got != fmt.Sprint(n*1_000_000+n*(n+1)/2) {
		t.Fatalf("settled balance %s", got)
	}
}
