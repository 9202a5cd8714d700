package reconcile_test

// The money-safety scenarios: each is an attack on a no-KYC shop, or a
// state that would leave a dossier or the ledger wrong.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
)

// transferOrder returns the order a transfer is matched to ("" for none).
func (f *fixture) transferOrder(id string) string {
	f.t.Helper()
	var o sql.NullString
	if err := f.db.Get(&o, `SELECT order_id FROM transfers WHERE id = $1`, id); err != nil {
		f.t.Fatal(err)
	}
	return o.String
}

// events returns the types of an order's timeline entries.
func (f *fixture) events(o *paywatch.Order) []string {
	f.t.Helper()
	evs, err := f.store.Events(context.Background(), o.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	var types []string
	for _, e := range evs {
		types = append(types, e.Type)
	}
	return types
}

// rejection returns why the order's tx hash hint was rejected, or "".
func (f *fixture) rejection(o *paywatch.Order) string {
	f.t.Helper()
	evs, err := f.store.Events(context.Background(), o.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, e := range evs {
		if e.Type == "hint_rejected" {
			var d struct {
				Why string `json:"why"`
			}
			_ = json.Unmarshal(e.Detail, &d)
			return d.Why
		}
	}
	return ""
}

// A victim's underpayment waits in the inbox; an attacker creates an order
// whose pay amount is exactly that sum (the smallest free slot gives it).
// The transfer was mined before the order existed: it must not pay it.
func TestPaymentMinedBeforeTheOrderNeverPaysIt(t *testing.T) {
	f := newFixture(t)
	victim := f.order(usdt, 10_000_000)
	stray := f.pay(payment{asset: usdt, to: shop, amount: 9_990_000}) // the victim's exchange took a fee
	f.pass()
	f.expect(victim, paywatch.StatusAwaitingPayment, "")
	f.clock.Advance(time.Minute)
	attacker := f.order(usdt, 9_990_000)
	if attacker.PayAmount.Int64() != 9_990_000 {
		t.Fatalf("attacker's pay amount %s", attacker.PayAmount)
	}
	f.pass()
	f.expect(attacker, paywatch.StatusAwaitingPayment, "")
	if got := f.transferOrder(stray); got != "" {
		t.Fatalf("the victim's payment, mined before the order, paid order %s", got)
	}
	// Even when the block's time is after the order's creation (clocks
	// drift; Bitcoin block times can be hours off), the height decides.
	early := f.pay(payment{asset: usdt, to: shop, amount: 4_440_000, blockAgo: -5 * time.Minute})
	late := f.order(usdt, 4_440_000)
	f.pass()
	f.expect(late, paywatch.StatusAwaitingPayment, "")
	if got := f.transferOrder(early); got != "" {
		t.Fatalf("a transfer in a block mined before the order paid order %s", got)
	}
}

// A customer's tx hash is an untrusted claim: it may only link a transfer
// the order could have matched anyway.
func TestHintIsAClaim(t *testing.T) {
	other := "0x2222222222222222222222222222222222222222"
	cases := []struct {
		name string
		// setup returns the hinted transfer's tx hash and the order to
		// mark paid with it.
		setup func(f *fixture) (tx string, o *paywatch.Order)
		why   string // expected rejection; "" means the claim is honest and links
	}{
		{"honest inexact payment links", func(f *fixture) (string, *paywatch.Order) {
			o := f.order(usdt, 10_000_000)
			tx := hash(f, "honest")
			f.pay(payment{asset: usdt, to: shop, amount: 9_000_000, tx: tx})
			return tx, o
		}, ""},
		{"mined before the order", func(f *fixture) (string, *paywatch.Order) {
			tx := hash(f, "before")
			f.pay(payment{asset: usdt, to: shop, amount: 9_000_000, tx: tx})
			return tx, f.order(usdt, 10_000_000)
		}, "mined before the order was created"},
		{"matched to another order", func(f *fixture) (string, *paywatch.Order) {
			o := f.order(usdt, 10_000_000)
			victim := f.order(usdt, 7_000_000)
			tx := hash(f, "victim")
			f.pay(payment{asset: usdt, to: shop, amount: victim.PayAmount.Int64(), tx: tx})
			f.pass()
			f.expect(victim, paywatch.StatusSettled, "")
			return tx, o
		}, "matched to another order"},
		{"exact amount of another open order", func(f *fixture) (string, *paywatch.Order) {
			o := f.order(usdt, 10_000_000)
			victim := f.order(usdt, 7_000_000)
			tx := hash(f, "victim")
			f.pay(payment{asset: usdt, to: shop, amount: victim.PayAmount.Int64(), tx: tx})
			return tx, o // marked paid before any pass has matched it: the match comes first
		}, "another order"},
		{"dust", func(f *fixture) (string, *paywatch.Order) {
			o := f.order(usdt, 10_000_000)
			tx := hash(f, "dust")
			f.pay(payment{asset: usdt, to: shop, amount: 9_000_000, tx: tx, flags: []string{"dust"}})
			return tx, o
		}, "flagged dust"},
		{"fake deposit", func(f *fixture) (string, *paywatch.Order) {
			o := f.order(usdt, 10_000_000)
			tx := hash(f, "fake")
			f.pay(payment{asset: usdt, to: shop, amount: 9_000_000, tx: tx, flags: []string{"balance_mismatch"}})
			return tx, o
		}, "flagged balance_mismatch"},
		{"after the monitoring window", func(f *fixture) (string, *paywatch.Order) {
			o := f.order(usdt, 10_000_000)
			f.clock.Advance(expires + window + time.Minute)
			tx := hash(f, "late")
			f.pay(payment{asset: usdt, to: shop, amount: 9_000_000, tx: tx})
			return tx, o
		}, "mined after the order's monitoring window"},
		{"another address", func(f *fixture) (string, *paywatch.Order) {
			o := f.order(usdt, 10_000_000)
			tx := hash(f, "elsewhere")
			f.pay(payment{asset: usdt, to: other, amount: 9_000_000, tx: tx})
			return tx, o
		}, "paid another address"},
		{"orphaned: waits while it may come back", func(f *fixture) (string, *paywatch.Order) {
			o := f.order(usdt, 10_000_000)
			tx := hash(f, "orphan")
			tr := f.pay(payment{asset: usdt, to: shop, amount: 9_000_000, tx: tx, state: "seen"})
			f.setState(tr, "orphaned")
			return tx, o
		}, "pending"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			tx, o := c.setup(f)
			if _, err := f.store.MarkPaid(context.Background(), o.ID, tx, "shop"); err != nil {
				t.Fatal(err)
			}
			f.pass()
			var linked bool
			if err := f.db.Get(&linked, `SELECT EXISTS (SELECT 1 FROM transfers WHERE tx_hash = $1 AND order_id = $2)`, tx, o.ID); err != nil {
				t.Fatal(err)
			}
			if c.why == "" {
				if !linked {
					t.Fatalf("an honest claim did not link: timeline %v", f.events(o))
				}
				return
			}
			if linked {
				t.Fatalf("a claim that should be rejected (%s) linked the transfer", c.why)
			}
			if c.why == "pending" {
				var state string
				if err := f.db.Get(&state, `SELECT hint_state FROM orders WHERE id = $1`, o.ID); err != nil || state != "pending" {
					t.Fatalf("claim %s (%v), want pending", state, err)
				}
				return
			}
			got, err := f.store.Get(context.Background(), o.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.ReceivedAmount.Sign() != 0 || got.Status == paywatch.StatusSettled {
				t.Fatalf("the rejected claim paid the order: %s received %s", got.Status, got.ReceivedAmount)
			}
			if why := f.rejection(o); !strings.Contains(why, c.why) {
				t.Fatalf("rejection %q, want one saying %q (timeline %v)", why, c.why, f.events(o))
			}
			if res := f.pass(); res.Matched != 0 || res.Transitions != 0 {
				t.Fatalf("a second pass changed something: %v", res)
			}
		})
	}
}

func hash(f *fixture, seed string) string {
	f.n++
	return fmt.Sprintf("0x%062x%02x", len(seed)*7919+f.n, f.n%256)
}

// Item 1: a payment made in time but matched after the monitoring window
// (the scanner lagged) must lead the order to a state that accounts for it.
func TestPaymentMatchedAfterTheWindow(t *testing.T) {
	f := newFixture(t)
	inTime := f.order(usdt, 10_000_000)
	late := f.order(usdt, 20_000_000)
	f.clock.Advance(expires + window + time.Hour)
	f.pass()
	f.expect(inTime, paywatch.StatusExpired, "")
	f.expect(late, paywatch.StatusExpired, "")
	// The scanner comes back and records both, their blocks mined long ago.
	ago := window + time.Hour
	f.pay(payment{asset: usdt, to: shop, amount: inTime.PayAmount.Int64(), blockAgo: ago + 30*time.Minute}) // before expiry
	f.pay(payment{asset: usdt, to: shop, amount: late.PayAmount.Int64(), blockAgo: ago - 2*time.Hour})      // after expiry, in the window
	f.pass()
	f.expect(inTime, paywatch.StatusSettled, "")
	f.expect(late, paywatch.StatusDisputed, paywatch.ReasonLatePayment)
	for o, want := range map[*paywatch.Order]string{inTime: "order.expired,order.settled", late: "order.disputed,order.expired"} {
		var hooks []string
		_ = f.db.Select(&hooks, `SELECT type FROM webhook_outbox WHERE order_id = $1 ORDER BY type`, o.ID)
		if strings.Join(hooks, ",") != want {
			t.Fatalf("webhooks of %s: %v, want %s", o.ExternalID, hooks, want)
		}
	}
}

// Item 2: "I've paid", nothing within the grace, then an exact payment a
// day after expiry: it is late like any other.
func TestNoPaymentFoundThenLatePayment(t *testing.T) {
	f := newFixture(t)
	o := f.order(usdt, 3_000_000)
	f.store.MarkPaid(context.Background(), o.ID, "", "shop")
	f.clock.Advance(grace + time.Minute)
	f.pass()
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonNoPaymentFound)
	f.clock.Advance(20 * time.Hour)
	f.pay(payment{asset: usdt, to: shop, amount: o.PayAmount.Int64()})
	f.pass()
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonLatePayment)
}

// Item 3: partial reorgs of an order paid in several transfers are decided
// by the same rules as if the transfers had arrived in their final form.
func TestPartialReorgOfASplitPayment(t *testing.T) {
	f := newFixture(t)
	o := f.order(btc, 100_000)
	a := f.pay(payment{asset: btc, to: o.PayAddress, amount: 60_000})
	b := f.pay(payment{asset: btc, to: o.PayAddress, amount: 40_000})
	f.pass()
	f.expect(o, paywatch.StatusSettled, "")
	f.setState(b, "orphaned") // a reorg takes the top-up away
	f.pass()
	got, _ := f.store.Get(context.Background(), o.ID)
	if got.Status == paywatch.StatusSettled {
		t.Fatalf("the order stayed settled with %s of %s received", got.ReceivedAmount, got.PayAmount)
	}
	if err := reconcile.CheckInvariants(context.Background(), f.db); err != nil {
		t.Fatalf("after the partial reorg: %v", err)
	}
	// The top-up is mined again in the new chain: settled again.
	f.setState(b, "seen")
	f.pass()
	f.setState(b, "confirmed")
	f.pass()
	f.expect(o, paywatch.StatusSettled, "")
	_ = a
}

func TestOrphanedPartsAllComeBack(t *testing.T) {
	f := newFixture(t)
	o := f.order(btc, 100_000)
	a := f.pay(payment{asset: btc, to: o.PayAddress, amount: 60_000})
	b := f.pay(payment{asset: btc, to: o.PayAddress, amount: 40_000})
	f.pass()
	f.expect(o, paywatch.StatusSettled, "")
	f.setState(a, "orphaned")
	f.setState(b, "orphaned")
	f.pass()
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment)
	f.clock.Advance(expires + time.Minute)
	for _, tr := range []string{a, b} { // mined again, one at a time
		f.setState(tr, "seen")
		f.pass()
		f.setState(tr, "confirmed")
		f.pass()
	}
	f.expect(o, paywatch.StatusSettled, "")
}

// Item 4: a reorg after a refund takes back what is owed.
func TestReorgAfterRefund(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	o := f.order(btc, 100_000)
	tr := f.pay(payment{asset: btc, to: o.PayAddress, amount: 250_000})
	f.pass()
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOverpaid)
	if err := f.op.Resolve(ctx, o.ID, paywatch.StatusRefunded, "customer asked for the money back", "bob"); err != nil {
		t.Fatal(err)
	}
	if got := f.balance("refunds_owed:bitcoin:BTC"); got != "250000" {
		t.Fatalf("refunds owed %s", got)
	}
	f.setState(tr, "orphaned")
	f.pass()
	if got := f.balance("refunds_owed:bitcoin:BTC"); got != "0" {
		t.Fatalf("refunds owed %s for money that never arrived", got)
	}
	if got := f.balance("order:" + o.ID); got != "0" {
		t.Fatalf("the refunded order's account holds %s", got)
	}
}

// Item 4: resolving while a matched transfer is unconfirmed would strand
// its later attribution in a closed order's account.
func TestResolveWaitsForConfirmations(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	o := f.order(btc, 100_000)
	tr := f.pay(payment{asset: btc, to: o.PayAddress, amount: 250_000, state: "seen"})
	f.pass()
	f.expect(o, paywatch.StatusConfirming, "")
	// Disputed while a payment still waits, as an ambiguous transfer or a
	// rejected claim can leave an order.
	pgtest.Exec(t, f.db, `UPDATE orders SET status = 'disputed', dispute_reason = 'wrong_asset' WHERE id = $1`, o.ID)
	for _, outcome := range []paywatch.Status{paywatch.StatusRefunded, paywatch.StatusSettled} {
		err := f.op.Resolve(ctx, o.ID, outcome, "decided early", "bob")
		if paywatch.ErrorCode(err) != paywatch.CodeInvalidState {
			t.Fatalf("resolve %s with an unconfirmed payment: %v", outcome, err)
		}
	}
	f.setState(tr, "confirmed")
	f.pass()
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOverpaid)
	if err := f.op.Resolve(ctx, o.ID, paywatch.StatusRefunded, "refund it", "bob"); err != nil {
		t.Fatal(err)
	}
	if got := f.balance("refunds_owed:bitcoin:BTC"); got != "250000" {
		t.Fatalf("refunds owed %s", got)
	}
}

// waitForLockWait waits until a session of this database waits on a lock,
// and fails the test when none does within 10 s.
func (f *fixture) waitForLockWait() {
	f.t.Helper()
	f.waitForLockWaits(1)
}

// waitForLockWaits waits until n sessions of this database wait on locks,
// and fails the test when they do not within 10 s.
func (f *fixture) waitForLockWaits(n int) {
	f.t.Helper()
	pgtest.WaitForLockWaits(f.t, f.db, n)
}

// holdOrder begins a transaction that holds the order's row lock, as an
// action on it (a cancel, an attach) does, and detects deadlocks after
// 100 ms; it is rolled back when the test ends unless committed first.
func (f *fixture) holdOrder(id string) *sqlx.Tx {
	f.t.Helper()
	tx, err := f.db.BeginTxx(context.Background(), nil)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = tx.Rollback() })
	if _, err := tx.Exec(`SET LOCAL deadlock_timeout = '100ms'`); err != nil {
		f.t.Fatal(err)
	}
	if _, err := tx.Exec(`SELECT 1 FROM orders WHERE id = $1 FOR NO KEY UPDATE`, id); err != nil {
		f.t.Fatal(err)
	}
	return tx
}

// Item 5: a cancel in flight and a match: the match must see the cancel.
func TestCancelRacingAMatch(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	o := f.order(usdt, 5_000_000)
	tr := f.pay(payment{asset: usdt, to: shop, amount: o.PayAmount.Int64()})
	// The storefront's cancel, as Store.Cancel runs it, holds the order.
	tx, err := f.db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(`SELECT status FROM orders WHERE id = $1 FOR UPDATE`, o.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`UPDATE orders SET status = 'cancelled', updated_at = now() WHERE id = $1`, o.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var passErr error
	go func() {
		defer close(done)
		_, passErr = f.rec.Pass(ctx)
	}()
	f.waitForLockWait()
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	<-done
	if passErr != nil {
		t.Fatal(passErr)
	}
	if got := f.transferOrder(tr); got != "" {
		t.Fatalf("the payment was matched to the cancelled order %s", got)
	}
}

// Item 5: an operator's attach and the reconciler following a hint lock
// the order before the transfer, both: no deadlock.
func TestAttachAndHintTakeLocksInOneOrder(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	o := f.order(usdt, 5_000_000)
	tr := f.pay(payment{asset: usdt, to: shop, amount: 4_000_000})
	// The hint follower's transaction: the order, then the transfer.
	tx := f.holdOrder(o.ID)
	done := make(chan struct{})
	var attachErr error
	go func() {
		defer close(done)
		attachErr = f.op.Attach(ctx, tr, o.ID, "customer's receipt", "alice")
	}()
	f.waitForLockWait()
	_, lockErr := tx.Exec(`SELECT 1 FROM transfers WHERE id = $1 FOR UPDATE`, tr)
	if err := tx.Commit(); err != nil && lockErr == nil {
		t.Fatal(err)
	}
	<-done
	var pqErr *pq.Error
	for _, err := range []error{lockErr, attachErr} {
		if errors.As(err, &pqErr) && pqErr.Code == "40P01" {
			t.Fatalf("deadlock: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

type reconcileFound = scan.Found

// countingLookup counts node look-ups and finds nothing.
type countingLookup struct{ calls int }

func (c *countingLookup) LookupTx(ctx context.Context, hash string) ([]reconcileFound, error) {
	c.calls++
	return nil, nil
}

// Item 6: a flood of "I've paid" with random hashes must neither stall nor
// starve the pass: node look-ups are off its path and an honest claim whose
// transfer is recorded links in the first pass.
func TestHintFloodNeitherStallsNorStarves(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const flood = 1500
	// Orders whose ids sort before any other, marked paid with hashes of
	// nothing.
	pgtest.Exec(t, f.db, `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
		pay_address, unique_k, status, customer_marked_paid_at, tx_hash_hint, hint_state, hint_next_lookup_at,
		created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time)
		SELECT 'ord_0' || lpad(g::text, 8, '0'), 'flood-' || g, '\x00', 'ethereum', 'USDT', $1, 50000000 + g, 50000000 + g, $2, g,
			'awaiting_payment', $3::timestamptz, '0x' || lpad(to_hex(g), 64, 'f'), 'pending', $3::timestamptz,
			$3::timestamptz, $3::timestamptz + interval '1 hour', $3::timestamptz + interval '25 hours', $3::timestamptz,
			0, $3::timestamptz - interval '5 minutes'
		FROM generate_series(1, $4) g`, usdtSC, shop, f.clock.Now(), flood)
	o := f.order(usdt, 10_000_000)
	tx := hash(f, "honest")
	f.pay(payment{asset: usdt, to: shop, amount: 9_500_000, tx: tx})
	if _, err := f.store.MarkPaid(ctx, o.ID, tx, "shop"); err != nil {
		t.Fatal(err)
	}
	lookups := &countingLookup{}
	f.rec.Lookups = map[string]reconcile.TxLookup{"ethereum": lookups}
	f.rec.Record = func(context.Context, string, []reconcileFound) error { return nil }
	f.pass()
	if lookups.calls != 0 {
		t.Fatalf("the pass looked up %d hashes on the node", lookups.calls)
	}
	var linked bool
	_ = f.db.Get(&linked, `SELECT EXISTS (SELECT 1 FROM transfers WHERE tx_hash = $1 AND order_id = $2)`, tx, o.ID)
	if !linked {
		t.Fatal("the honest claim did not link in the first pass")
	}
}

// Orders are locked by id, the scanner's too: a scan commit notes the
// height of orders created before the network's first commit, and takes
// their locks in id order. A transaction locking orders by id as paywatch's
// do (a pass matching payments, an operator's action), holding the lowest
// of three orders and waiting for the middle one (held by a storefront),
// and a scan commit that must note the lowest and the highest, both go
// through once the storefront lets go: neither holds what the other waits
// for.
func TestScanCommitLocksOrdersWithoutAHeightByID(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var os []*paywatch.Order
	for i := range 3 {
		os = append(os, f.order(btc, int64(100_000*(i+1))))
	}
	slices.SortFunc(os, func(a, b *paywatch.Order) int { return strings.Compare(a.ID, b.ID) })
	lo, mid, hi := os[0], os[1], os[2]
	f.clock.Advance(time.Second)
	// No height yet, the highest order's row version first in the table.
	pgtest.Exec(t, f.db, `UPDATE orders SET created_height = NULL WHERE id = $1`, hi.ID)
	pgtest.Exec(t, f.db, `UPDATE orders SET created_height = NULL WHERE id = $1`, lo.ID)
	var prev struct {
		Number *int64  `db:"block_number"`
		Hash   *string `db:"block_hash"`
		Head   *int64  `db:"head"`
	}
	if err := f.db.Get(&prev, `SELECT block_number, block_hash, head FROM chain_cursors WHERE network = 'bitcoin'`); err != nil {
		t.Fatal(err)
	}
	commit := scan.Commit{Network: "bitcoin", Batch: &scan.Batch{}, Head: scan.Head{Number: 100}, Window: 128}
	next := uint64(1)
	if prev.Number != nil {
		commit.Prev = &scan.Block{Number: uint64(*prev.Number), Hash: *prev.Hash}
		next = uint64(*prev.Number) + 1
	}
	commit.First, commit.Cursor = next, &scan.Block{Number: next, Hash: "0xnext"}

	holder := f.holdOrder(mid.ID) // a storefront's action on the middle order
	locker := f.holdOrder(lo.ID)  // the lowest first, by id
	locked := make(chan error, 1)
	go func() {
		if _, err := locker.Exec(`SELECT 1 FROM orders WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE`,
			pq.Array([]string{mid.ID, hi.ID})); err != nil {
			locked <- err
			return
		}
		locked <- locker.Commit()
	}()
	f.waitForLockWait() // it holds the lowest, waits for the middle
	scanned := make(chan error, 1)
	go func() { _, err := scan.NewStore(f.db).Commit(ctx, commit); scanned <- err }()
	f.waitForLockWaits(2) // and the scan commit waits too
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; err != nil {
		t.Fatalf("the transaction locking orders by id: %v", err)
	}
	if err := <-scanned; err != nil {
		t.Fatalf("the scan commit: %v", err)
	}
	for _, o := range []*paywatch.Order{lo, hi} {
		var h *int64
		if err := f.db.Get(&h, `SELECT created_height FROM orders WHERE id = $1`, o.ID); err != nil || h == nil {
			t.Fatalf("order %s: created_height %v (%v), want noted by the scan commit", o.ID, h, err)
		}
	}
}
