package reconcile_test

// Attacks on the money path, each as the attacker would run it. Each test
// asserts what README's rules promise.

import (
	"context"
	"database/sql"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
)

// R1. A victim pays an inexact amount to the shared address (an exchange
// deducted a fee). An attacker with an older open order watches the
// mempool and claims the victim's tx hash on their own order before it is
// even mined. Claiming first must win nothing: when the victim claims it
// too, neither order gets it, and an operator decides.
func TestAttackPreClaimTakesAnotherCustomersPayment(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	attacker := f.order(usdt, 1_000_000) // 1 USDT, created before the victim pays
	victim := f.order(usdt, 1_000_000_000)
	h := hash(f, "victim-pending")
	// The attacker sees the victim's transaction in the mempool and claims it.
	if _, err := f.store.MarkPaid(ctx, attacker.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Second)
	tr := f.pay(payment{asset: usdt, to: shop, amount: 999_000_000, tx: h}) // mined: 999 of 1000
	if _, err := f.store.MarkPaid(ctx, victim.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	// The victim's order waits for about 999 with nothing received: the
	// attacker's claim links nothing (an operator looks at it), and the
	// victim's own claim links the payment.
	if got := f.transferOrder(tr); got != victim.ID {
		t.Fatalf("the victim's 999 USDT payment is with %q", got)
	}
	f.expect(attacker, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
	if why := f.rejection(attacker); why != "another order waiting for a payment of about this amount may be owed it: an operator decides" {
		t.Fatalf("the attacker's claim: %q", why)
	}
	f.expect(victim, paywatch.StatusDisputed, paywatch.ReasonUnderpaid)
}

// R1, after the link: a claim on a payment another customer's claim linked
// wins nothing either, and takes nothing: the payment goes back to the
// inbox flagged ambiguous, both orders are disputed ambiguous, and an
// operator decides.
func TestAttackContestedClaimGoesToAnOperator(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	attacker := f.order(usdt, 1_000_000) // far from the victim's amount: no rival of the victim's claim
	victim := f.order(usdt, 10_000_000)
	h := hash(f, "contested")
	tr := f.pay(payment{asset: usdt, to: shop, amount: 9_900_000, tx: h}) // 9.90 of 10.00
	if _, err := f.store.MarkPaid(ctx, victim.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	f.expect(victim, paywatch.StatusDisputed, paywatch.ReasonUnderpaid)
	if _, err := f.store.MarkPaid(ctx, attacker.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	if got := f.transferOrder(tr); got != "" {
		t.Fatalf("the contested payment is with %s", got)
	}
	f.expect(attacker, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
	f.expect(victim, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
	if why := f.rejection(attacker); why != "another order claims the same payment: an operator decides" {
		t.Fatalf("the second claim: %q", why)
	}
	var flags pq.StringArray
	if err := f.db.Get(&flags, `SELECT flags FROM transfers WHERE id = $1`, tr); err != nil || len(flags) != 1 || flags[0] != "ambiguous" {
		t.Fatalf("the contested payment's flags %v (%v)", flags, err)
	}
	if got := f.balance("suspense:ethereum:USDT"); got != "9900000" {
		t.Fatalf("suspense %s: the contested payment is not back in the inbox's account", got)
	}
	for _, o := range []*paywatch.Order{victim, attacker} {
		if evs := f.events(o); !slices.Contains(evs, "hint_contested") {
			t.Fatalf("order %s's timeline does not say the payment is contested: %v", o.ExternalID, evs)
		}
	}
}

// R2. Mempool front-running by order creation. The victim's inexact payment
// (9.99 for a 10.00 order) is visible in the mempool. The attacker creates
// an order for 9.99, hoping for the pay amount 9.99 exactly: the payment
// would be mined after the attacker's order exists (the height bound cannot
// help) and settle it. The unique increment is drawn at random, so the
// attacker cannot choose it.
func TestAttackFrontRunOrderForPendingPayment(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	victim := f.order(usdt, 10_000_000)
	f.clock.Advance(time.Minute)
	// Victim broadcasts 9.99; the attacker sees it pending and orders 9.99.
	// The unique increment is drawn at random, not the smallest free one
	// (a draw of 37 stands for any draw but 0, 99 chances in 100 here).
	f.store.Rand = func(int) int { return 37 }
	attacker := f.order(usdt, 9_990_000)
	if attacker.PayAmount.Int64() == 9_990_000 {
		t.Fatalf("the attacker chose its pay amount: %s", attacker.PayAmount)
	}
	h := hash(f, "victim")
	tr := f.pay(payment{asset: usdt, to: shop, amount: 9_990_000, tx: h})
	if _, err := f.store.MarkPaid(ctx, victim.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	if f.transferOrder(tr) == attacker.ID {
		t.Fatalf("front-run: the victim's 9.99 settled the attacker's order (%s); victim's claim: %q",
			statusOf(f, attacker), f.rejection(victim))
	}
}

// lyingLookup answers every look-up with what it was told to.
type lyingLookup struct{ found map[string][]scan.Found }

func (l lyingLookup) LookupTx(_ context.Context, h string) ([]scan.Found, error) {
	return l.found[h], nil
}

// R3. What a look-up records is provisional: when the scanner sees the same
// transfer, what it sees replaces everything the look-up said (amount,
// recipient, asset, flags). A lying or buggy node answering one look-up
// must not settle an order on money that never arrived.
func TestAttackScannerKeepsWhatALookupSaid(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	o := f.order(usdt, 5_000_000)
	h := hash(f, "tiny")
	scans := scan.NewStore(f.db)
	scans.Now = f.clock.Now
	real := scan.Found{Asset: usdt, TxHash: h, TxKey: "log:0", To: shop, From: "0xattacker",
		Amount: big.NewInt(1), BlockNumber: 5, BlockHash: "0xb5", BlockTime: f.clock.Now()}
	lie := real
	lie.Amount = big.NewInt(5_000_000) // the node inflates the amount
	f.rec.Lookups = map[string]reconcile.TxLookup{"ethereum": lyingLookup{map[string][]scan.Found{h: {lie}}}}
	f.rec.Record = scans.Record
	if _, err := f.store.MarkPaid(ctx, o.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.rec.LookUpHints(ctx); err != nil {
		t.Fatal(err)
	}
	f.pass()
	f.expect(o, paywatch.StatusConfirming, "") // fine so far: provisional
	// The honest scanner reaches block 5 and sees the real transfer of 1 unit.
	scannerSees(t, scans, 1, 5, 8, real)
	f.pass()
	var amount string
	if err := f.db.Get(&amount, `SELECT amount::text FROM transfers WHERE tx_hash = $1`, h); err != nil {
		t.Fatal(err)
	}
	if amount != "1" {
		t.Fatalf("the scanner saw 1 unit, the stored transfer says %s; order is %s, settled balance %s",
			amount, statusOf(f, o), f.balance("settled:ethereum:USDT"))
	}
	// The look-up's 5 USDT matched the order by amount; the scanner's 1 unit
	// does not: the transfer goes back to the inbox and the order says why.
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment)
	if types := f.events(o); !contains(types, "transfer_unmatched") {
		t.Fatalf("timeline %v", types)
	}
	if got := f.balance("settled:ethereum:USDT"); got != "0" {
		t.Fatalf("settled %s on money that never arrived", got)
	}
}

// R4. A look-up sees one transaction, not the block: it cannot check that
// the balance moved (another transfer to the shop in the same block would
// make an honest payment look fake). It records no such flag; the scanner,
// which reads the whole block, decides. An attacker who claims a victim's
// tx hash on their own order must not make the victim's payment unusable.
func TestAttackLookupFlagsHonestPaymentForever(t *testing.T) {
	e := newChainEnv(t)
	ctx := context.Background()
	e.sync() // the scanner has a cursor
	victim := e.order(5_000_000)
	attacker := e.order(1_000_000)
	vh := e.token.Transfer(e.chain.Payer, e.shop, big.NewInt(5_000_000)) // the victim's exact payment
	e.token.Transfer(e.chain.Keys[1], e.shop, big.NewInt(2_000_000))     // someone else, same block
	e.chain.Mine(1)
	if _, err := e.store.MarkPaid(ctx, attacker.ID, vh.Hex(), "shop"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rec.LookUpHints(ctx); err != nil {
		t.Fatal(err)
	}
	e.chain.Mine(4)
	e.sync()
	e.sync()
	var flags pq.StringArray
	var provisional bool
	if err := e.db.QueryRow(`SELECT flags, provisional FROM transfers WHERE tx_hash = $1`, strings.ToLower(vh.Hex())).
		Scan(&flags, &provisional); err != nil {
		t.Fatal(err)
	}
	var all []string
	_ = e.db.Select(&all, `SELECT amount::text || ' ' || flags::text || ' provisional=' || provisional FROM transfers ORDER BY amount`)
	t.Logf("stored: %v (the other transfer in the block, which only the scanner recorded, is unflagged)", all)
	got, _ := e.store.Get(ctx, victim.ID)
	t.Logf("victim's transfer flags %v provisional=%v; victim order %s; attacker's claim: %q", flags, provisional, got.Status, e.rejection(attacker))
	if got.Status != paywatch.StatusSettled || len(flags) != 0 || provisional {
		t.Fatalf("the victim's exact, real, scanned payment does not pay its order (%s): flags %v, provisional %v", got.Status, flags, provisional)
	}
}

// R5. A scanner commit landing while the ledger step waits for its lock:
// the transfers it changed are checked against their matches before their
// entries are reversed, never after.
func TestAttackReorgBetweenUnmatchAndLedgerPost(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	o := f.order(btc, 100_000)
	tr := f.pay(payment{asset: btc, to: o.PayAddress, amount: 100_000, state: "seen"})
	f.pass()
	f.expect(o, paywatch.StatusConfirming, "")
	// Something else holds the ledger lock for a moment (another pass, an
	// operator's resolve).
	holder, err := f.db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(`SELECT pg_advisory_xact_lock(hashtextextended('paywatch:ledger', 0))`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := f.rec.PostLedger(ctx); done <- err }()
	f.waitForLockWait()
	// The scanner commits a reorg that mined the payment again in block 0,
	// below the order's creation height (what TestReorgMovingAPaymentBelow
	// TheOrdersHeight writes).
	pgtest.Exec(t, f.db, `UPDATE transfers SET block_number = 0, block_hash = '0xnew', state = 'seen', ledger_dirty = true
		WHERE id = $1`, tr)
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f.setState(tr, "confirmed")
	f.pass()
	f.pass()
	if got := f.transferOrder(tr); got == o.ID {
		t.Fatalf("a payment in block 0 still pays an order created at height 0: order is %s", statusOf(f, o))
	}
}

// R6. Lock order: flagging an ambiguous transfer locks its candidate orders
// before the transfer, as every path does; an operator attaching at the
// same moment (order, then transfer) waits, never deadlocks.
func TestAttackFlagAmbiguousLockOrder(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	first := f.order(usdt, 10_000_000)
	f.clock.Advance(expires + window + time.Minute) // first's slot is free again
	f.pass()
	second := f.order(usdt, 10_000_000)
	if second.PayAmount.Cmp(first.PayAmount) != 0 {
		t.Fatalf("setup: the second order pays %s, not the first's freed %s", second.PayAmount, first.PayAmount)
	}
	// Mined in the last minutes of first's window, recorded after second
	// was created: a candidate of both.
	tr := f.pay(payment{asset: usdt, to: shop, amount: 10_000_000, blockAgo: 2 * time.Minute})
	op, err := f.db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Rollback()
	// Attach, step 1: lock the order.
	if _, err := op.Exec(`SELECT 1 FROM orders WHERE id = $1 FOR NO KEY UPDATE`, second.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := f.rec.Pass(ctx); done <- err }()
	f.waitForLockWait()
	// Attach, step 2: lock the transfer.
	_, attachErr := op.Exec(`SELECT 1 FROM transfers WHERE id = $1 FOR UPDATE`, tr)
	if attachErr == nil {
		_ = op.Commit()
	} else {
		_ = op.Rollback()
	}
	passErr := <-done
	if attachErr != nil || passErr != nil {
		t.Fatalf("attach: %v; pass: %v", attachErr, passErr)
	}
}

// R7. A look-up's block number is bounded by the recorded head: one bogus
// answer (a lying node, a node on another chain) must not raise the height
// later orders are created at and make them unpayable.
func TestAttackLookupAheadOfTheHeadBricksNewOrders(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	claimant := f.order(usdt, 1_000_000)
	h := hash(f, "far")
	scans := scan.NewStore(f.db)
	f.rec.Lookups = map[string]reconcile.TxLookup{"ethereum": lyingLookup{map[string][]scan.Found{h: {{Asset: usdt,
		TxHash: h, TxKey: "log:0", To: shop, Amount: big.NewInt(3), BlockNumber: 1 << 40, BlockHash: "0xfar", BlockTime: f.clock.Now()}}}}}
	f.rec.Record = scans.Record
	if _, err := f.store.MarkPaid(ctx, claimant.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.rec.LookUpHints(ctx); err != nil {
		t.Fatal(err)
	}
	var recorded int
	if err := f.db.Get(&recorded, `SELECT count(*) FROM transfers WHERE tx_hash = $1`, h); err != nil || recorded != 0 {
		t.Fatalf("a look-up from block 2^40 was recorded (%d, %v)", recorded, err)
	}
	later := f.order(usdt, 7_000_000)
	f.pay(payment{asset: usdt, to: shop, amount: later.PayAmount.Int64()})
	f.pass()
	got, _ := f.store.Get(ctx, later.ID)
	if got.Status == paywatch.StatusAwaitingPayment {
		var height sql.NullInt64
		_ = f.db.Get(&height, `SELECT created_height FROM orders WHERE id = $1`, later.ID)
		t.Fatalf("an exact, real payment does not pay an order created after a bogus look-up: created_height %d", height.Int64)
	}
}

func statusOf(f *fixture, o *paywatch.Order) string {
	got, err := f.store.Get(context.Background(), o.ID)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%s/%s received %s", got.Status, got.DisputeReason, got.ReceivedAmount)
}

// scannerSees commits what the scanner reads of the ethereum network's
// blocks first to cursor, the head at head: the transfers found, each
// block's hash "0xb<number>", confirmed up to the cursor.
func scannerSees(t *testing.T, scans *scan.Store, first, cursor, head uint64, found ...scan.Found) {
	t.Helper()
	b := &scan.Batch{Transfers: found}
	for _, f := range found {
		b.Blocks = append(b.Blocks, scan.Block{Number: f.BlockNumber, Hash: f.BlockHash})
	}
	if _, err := scans.Commit(context.Background(), scan.Commit{Network: "ethereum", Batch: b,
		Cursor: &scan.Block{Number: cursor, Hash: fmt.Sprintf("0xb%d", cursor)}, Head: scan.Head{Number: head},
		ConfirmedAtOrBelow: cursor, Window: 128, First: first}); err != nil {
		t.Fatal(err)
	}
}

// R8. A customer who clicks "I've paid" while their transaction sits in a
// block a reorg just replaced is not rejected for good: the claim waits
// while its transfers are orphaned, and links when the scanner finds the
// transaction again.
func TestAttackClaimRejectedForGoodDuringAReorg(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	o := f.order(usdt, 10_000_000)
	h := hash(f, "reorged")
	tr := f.pay(payment{asset: usdt, to: shop, amount: 9_990_000, tx: h, state: "seen"})
	f.setState(tr, "orphaned") // a reorg; the transaction is mined again above the cursor
	if _, err := f.store.MarkPaid(ctx, o.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	// The scanner reaches the new block and sees the transaction again.
	pgtest.Exec(t, f.db, `UPDATE transfers SET state = 'confirmed', block_number = block_number + 1, block_hash = '0xagain',
		ledger_dirty = true, orphaned_at = NULL WHERE id = $1`, tr)
	f.pass()
	f.pass()
	if got := f.transferOrder(tr); got != o.ID {
		t.Fatalf("the customer's own payment, back in the canonical chain, is not linked (claim: %q); order %s",
			f.rejection(o), statusOf(f, o))
	}
}

// Attacks found by a second review, after the first fixes.

// V1. Only a claim that could itself have linked a payment contests it: an
// attacker who opens an order after a victim's short payment was mined and
// claims its tx hash takes nothing from the victim's linked claim.
func TestAttackIneligibleClaimContestsAVictimsLinkedPayment(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	victim := f.order(usdt, 10_000_000)
	h := hash(f, "victim-short")
	tr := f.pay(payment{asset: usdt, to: shop, amount: 9_990_000, tx: h}) // 9.99 of 10: an exchange took a fee
	if _, err := f.store.MarkPaid(ctx, victim.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	if got := f.transferOrder(tr); got != victim.ID {
		t.Fatalf("the victim's honest claim did not link (%q)", f.rejection(victim))
	}
	f.expect(victim, paywatch.StatusDisputed, paywatch.ReasonUnderpaid)
	// The attacker reads the shop's address on a block explorer and opens an
	// order now: the payment was mined before it existed.
	attacker := f.order(usdt, 1_000_000)
	if _, err := f.store.MarkPaid(ctx, attacker.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	if got := f.transferOrder(tr); got != victim.ID {
		t.Fatalf("a claim that could never have linked the payment (it was mined before the claiming order existed) "+
			"took it from the victim: transfer now on %q; victim %s; attacker's claim: %q",
			got, statusOf(f, victim), f.rejection(attacker))
	}
}

// V2. A pre-claim wins nothing even when the victim does not claim: the
// attacker orders about the victim's inexact amount, seen in the mempool,
// and claims its hash; the victim's order, waiting for about that amount
// with nothing received, may be owed it, so the claim links nothing.
func TestAttackUncontestedPreClaimTakesAVictimsShortPayment(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	victim := f.order(usdt, 10_000_000)
	if _, err := f.store.MarkPaid(ctx, victim.ID, "", "shop"); err != nil { // "I've paid", no hash
		t.Fatal(err)
	}
	h := hash(f, "victim-pending")
	// In the mempool: 9.99 to the shop. The attacker orders 9.99 and claims.
	f.store.Rand = func(int) int { return 3 } // any draw: the pay amount is 9.99 + k units
	attacker := f.order(usdt, 9_990_000)
	if _, err := f.store.MarkPaid(ctx, attacker.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	tr := f.pay(payment{asset: usdt, to: shop, amount: 9_990_000, tx: h}) // mined
	f.pass()
	f.clock.Advance(grace + time.Minute)
	f.pass()
	if got := f.transferOrder(tr); got == attacker.ID {
		t.Fatalf("the victim's payment pays the attacker's order (%s; short by %d units of %s); victim's order %s",
			statusOf(f, attacker), attacker.PayAmount.Int64()-9_990_000, attacker.PayAmount, statusOf(f, victim))
	}
}

// V3. Money an operator releases (a dispute resolved as cancelled) is held
// in the inbox for an operator to place: no customer's claim takes it.
func TestAttackReleasedPaymentIsTakenByTheNextClaim(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	attacker := f.order(usdt, 5_000_000) // open, created before the payment
	victim := f.order(usdt, 10_000_000)
	h := hash(f, "victim-short")
	tr := f.pay(payment{asset: usdt, to: shop, amount: 9_990_000, tx: h})
	if _, err := f.store.MarkPaid(ctx, victim.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	f.expect(victim, paywatch.StatusDisputed, paywatch.ReasonUnderpaid)
	if got := f.balance("order:" + victim.ID); got != "9990000" {
		t.Fatalf("setup: the order's account holds %s", got)
	}
	// The customer gives up; the operator cancels and will refund by hand.
	if err := f.op.Resolve(ctx, victim.ID, paywatch.StatusCancelled, "customer cancelled; refund from the inbox", "op"); err != nil {
		t.Fatal(err)
	}
	// Cancelling returns the money to suspense and the transfer to the
	// inbox, held for an operator.
	if got, order := f.balance("suspense:ethereum:USDT"), f.balance("order:"+victim.ID); got != "9990000" || order != "0" {
		t.Fatalf("after the cancel: suspense %s, the order's account %s", got, order)
	}
	if got, _ := f.store.GetTransfer(ctx, tr); got.OrderID != "" || !slices.Contains(got.Flags, paywatch.FlagHeld) {
		t.Fatalf("after the cancel the transfer is %+v", got)
	}
	if _, err := f.store.MarkPaid(ctx, attacker.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	if got := f.transferOrder(tr); got == attacker.ID {
		t.Fatalf("money an operator released to the inbox was taken by a customer's claim: attacker %s", statusOf(f, attacker))
	}
}

// V4. A look-up's answer never moves the height orders are created at, even
// before any head is recorded: a lying node cannot make later orders
// unpayable.
func TestAttackLookupBeforeAnyHeadBricksNewOrdersForever(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// The scanner's first step failed: the row exists, no head yet.
	pgtest.Exec(t, f.db, `UPDATE chain_cursors SET head = NULL, block_number = NULL WHERE network = 'ethereum'`)
	claimant := f.order(usdt, 1_000_000)
	h := hash(f, "far")
	scans := scan.NewStore(f.db)
	f.rec.Lookups = map[string]reconcile.TxLookup{"ethereum": lyingLookup{map[string][]scan.Found{h: {{Asset: usdt,
		TxHash: h, TxKey: "log:0", To: shop, Amount: big.NewInt(3), BlockNumber: 1 << 40, BlockHash: "0xfar", BlockTime: f.clock.Now()}}}}}
	f.rec.Record = scans.Record
	if _, err := f.store.MarkPaid(ctx, claimant.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.rec.LookUpHints(ctx); err != nil {
		t.Fatal(err)
	}
	// The node recovers; the scanner records its head.
	pgtest.Exec(t, f.db, `UPDATE chain_cursors SET head = 0 WHERE network = 'ethereum'`)
	later := f.order(usdt, 7_000_000)
	tr := f.pay(payment{asset: usdt, to: shop, amount: later.PayAmount.Int64()})
	f.pass()
	if got := f.transferOrder(tr); got != later.ID {
		var height int64
		_ = f.db.Get(&height, `SELECT created_height FROM orders WHERE id = $1`, later.ID)
		t.Fatalf("an exact, real payment does not pay an order created after a bogus look-up (no head recorded yet): "+
			"created_height %d; order %s", height, statusOf(f, later))
	}
}

// V5. Nor does one from within MaxLookupLead of the head.
func TestAttackLookupWithinTheLeadBricksNewOrders(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	claimant := f.order(usdt, 1_000_000)
	h := hash(f, "ahead")
	scans := scan.NewStore(f.db)
	f.rec.Lookups = map[string]reconcile.TxLookup{"ethereum": lyingLookup{map[string][]scan.Found{h: {{Asset: usdt,
		TxHash: h, TxKey: "log:0", To: shop, Amount: big.NewInt(3), BlockNumber: scan.MaxLookupLead, BlockHash: "0xahead",
		BlockTime: f.clock.Now()}}}}}
	f.rec.Record = scans.Record
	if _, err := f.store.MarkPaid(ctx, claimant.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.rec.LookUpHints(ctx); err != nil {
		t.Fatal(err)
	}
	later := f.order(usdt, 7_000_000)
	tr := f.pay(payment{asset: usdt, to: shop, amount: later.PayAmount.Int64()}) // mined in the next block
	f.pass()
	if got := f.transferOrder(tr); got != later.ID {
		var height int64
		_ = f.db.Get(&height, `SELECT created_height FROM orders WHERE id = $1`, later.ID)
		t.Fatalf("an exact payment mined right after the order does not pay it: created_height %d (head was 0); order %s",
			height, statusOf(f, later))
	}
}

// V6. An exact match wins over a claim in the payment's final form too: a
// lying look-up shows a victim's exact payment with another amount, the
// attacker's claim links it; when the scanner records the real amount, the
// payment goes to the victim's order.
func TestAttackScannerCorrectionKeepsAClaimOnAnotherOrdersExactPayment(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	attacker := f.order(usdt, 1_000_000)
	victim := f.order(usdt, 5_000_000)
	h := hash(f, "victim-exact")
	scans := scan.NewStore(f.db)
	scans.Now = f.clock.Now
	real := scan.Found{Asset: usdt, TxHash: h, TxKey: "log:0", To: shop, From: "0xvictim",
		Amount: new(big.Int).Set(victim.PayAmount), BlockNumber: 5, BlockHash: "0xb5", BlockTime: f.clock.Now()}
	lie := real
	lie.Amount = big.NewInt(4_000_000)
	f.rec.Lookups = map[string]reconcile.TxLookup{"ethereum": lyingLookup{map[string][]scan.Found{h: {lie}}}}
	f.rec.Record = scans.Record
	if _, err := f.store.MarkPaid(ctx, attacker.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.rec.LookUpHints(ctx); err != nil {
		t.Fatal(err)
	}
	f.pass()
	scannerSees(t, scans, 1, 5, 8, real)
	f.pass()
	f.pass()
	var tr string
	if err := f.db.Get(&tr, `SELECT id FROM transfers WHERE tx_hash = $1`, h); err != nil {
		t.Fatal(err)
	}
	if got := f.transferOrder(tr); got != victim.ID {
		t.Fatalf("the victim's exact payment (as the scanner sees it) is on %q, not the victim's order: attacker %s, victim %s",
			got, statusOf(f, attacker), statusOf(f, victim))
	}
}

// V7. Matching locks every order it will pay before any transfer, so an
// operator's attach (order, then transfer) at that moment waits, never
// deadlocks.
func TestAttackMatchLocksATransferBeforeItsOrders(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a, b := f.order(usdt, 5_000_000), f.order(usdt, 6_000_000)
	lo, hi := a, b
	if hi.ID < lo.ID {
		lo, hi = hi, lo
	}
	ta := f.pay(payment{asset: usdt, to: shop, amount: lo.PayAmount.Int64()}) // read first, pays the first order locked
	f.pay(payment{asset: usdt, to: shop, amount: hi.PayAmount.Int64()})
	op := f.holdOrder(hi.ID) // an operator's action, step 1: lock its order (hi)
	done := make(chan error, 1)
	go func() { _, err := f.rec.Pass(ctx); done <- err }()
	f.waitForLockWait()
	// Step 2: the transfer (Attach's FOR UPDATE; Resolve's receipt UPDATE).
	_, opErr := op.Exec(`SELECT 1 FROM transfers WHERE id = $1 FOR UPDATE`, ta)
	if opErr == nil {
		_ = op.Commit()
	} else {
		_ = op.Rollback()
	}
	passErr := <-done
	if opErr != nil || passErr != nil {
		t.Fatalf("operator: %v; pass: %v", opErr, passErr)
	}
}

// V8. A claim on an order whose network's height is not known yet waits
// for the scanner to record it, instead of being rejected for good.
func TestAttackClaimRejectedBeforeTheHeightIsKnown(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	pgtest.Exec(t, f.db, `UPDATE chain_cursors SET head = NULL, block_number = NULL WHERE network = 'ethereum'`)
	o := f.order(usdt, 10_000_000)
	h := hash(f, "honest-short")
	scans := scan.NewStore(f.db)
	scans.Now = f.clock.Now
	found := scan.Found{Asset: usdt, TxHash: h, TxKey: "log:0", To: shop, From: "0xcustomer",
		Amount: big.NewInt(9_990_000), BlockNumber: 7, BlockHash: "0xb7", BlockTime: f.clock.Now()}
	f.rec.Lookups = map[string]reconcile.TxLookup{"ethereum": lyingLookup{map[string][]scan.Found{h: {found}}}} // an honest node
	f.rec.Record = scans.Record
	if _, err := f.store.MarkPaid(ctx, o.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.rec.LookUpHints(ctx); err != nil {
		t.Fatal(err)
	}
	f.pass()
	// The scanner starts at block 5 and sees the same transfer in block 7.
	scannerSees(t, scans, 5, 10, 12, found)
	f.pass()
	var height int64
	_ = f.db.Get(&height, `SELECT created_height FROM orders WHERE id = $1`, o.ID)
	var linked bool
	_ = f.db.Get(&linked, `SELECT EXISTS (SELECT 1 FROM transfers WHERE tx_hash = $1 AND order_id = $2)`, h, o.ID)
	if !linked {
		t.Fatalf("the customer's own payment (block 7, order created at height %d once known) is not linked: claim %q; order %s",
			height, f.rejection(o), statusOf(f, o))
	}
}

// V9. The unique increment is drawn uniformly among the free ones: a free k
// right after a run of held ones is no likelier than any other.
func TestAttackUniqueIncrementIsUniformAmongTheFreeOnes(t *testing.T) {
	f := newFixture(t)
	const amount = 20_000_000
	for k := 1; k <= 50; k++ {
		f.store.Rand = func(int) int { return 1 } // the second free slot: k, once 1 … k-1 are held
		if o := f.order(usdt, amount); o.PayAmount.Int64() != amount+int64(k) {
			t.Fatalf("setup: drew %d", o.PayAmount.Int64()-amount)
		}
	}
	drawn := map[int64]int{}
	for s := 0; s < usdt.UniqueSlots; s++ {
		f.store.Rand = func(n int) int { return s % n }
		o := f.order(usdt, amount)
		drawn[o.PayAmount.Int64()-amount]++
		for _, q := range []string{`DELETE FROM amount_slots WHERE order_id = $1`, `DELETE FROM webhook_outbox WHERE order_id = $1`,
			`DELETE FROM order_events WHERE order_id = $1`, `DELETE FROM orders WHERE id = $1`} {
			pgtest.Exec(t, f.db, q, o.ID)
		}
	}
	free := usdt.UniqueSlots - 50
	for k, n := range drawn {
		if n > 2*usdt.UniqueSlots/free {
			t.Fatalf("k=%d is drawn by %d of %d equally likely draws; %d slots are free (uniform: %d each)",
				k, n, usdt.UniqueSlots, free, usdt.UniqueSlots/free)
		}
	}
}

// V10. An order created while its network's first scan commit is in flight
// reads no height, and commits after that commit filled in the heights of
// the orders it could see: the next commit gives it one, and an exact
// payment mined after it still pays it (it was left without a height, and
// so without any payment, for good).
func TestOrderCreatedDuringTheFirstCommitStillGetsPaid(t *testing.T) {
	f := newFixture(t)
	pgtest.Exec(t, f.db, `DELETE FROM chain_cursors WHERE network = 'ethereum'`)
	scans := scan.NewStore(f.db)
	scans.Now = f.clock.Now
	scannerSees(t, scans, 5, 10, 10) // the first commit...
	o := f.order(usdt, 10_000_000)
	// ...raced with the order's creation, which read no height.
	pgtest.Exec(t, f.db, `UPDATE orders SET created_height = NULL WHERE id = $1`, o.ID)
	h := hash(f, "after")
	found := scan.Found{Asset: usdt, TxHash: h, TxKey: "log:0", To: shop, From: "0xcustomer",
		Amount: o.PayAmount, BlockNumber: 11, BlockHash: "0xb11", BlockTime: f.clock.Now()}
	if _, err := scans.Commit(context.Background(), scan.Commit{Network: "ethereum",
		Batch: &scan.Batch{Transfers: []scan.Found{found}, Blocks: []scan.Block{{Number: 11, Hash: "0xb11"}}},
		Prev:  &scan.Block{Number: 10, Hash: "0xb10"}, Cursor: &scan.Block{Number: 11, Hash: "0xb11"},
		Head: scan.Head{Number: 11}, ConfirmedAtOrBelow: 11, Window: 128, First: 11}); err != nil {
		t.Fatal(err)
	}
	f.pass()
	var height int64
	_ = f.db.Get(&height, `SELECT created_height FROM orders WHERE id = $1`, o.ID)
	var paid bool
	_ = f.db.Get(&paid, `SELECT EXISTS (SELECT 1 FROM transfers WHERE tx_hash = $1 AND order_id = $2)`, h, o.ID)
	if height != 10 || !paid {
		t.Fatalf("created_height %d (want 10, the cursor the second commit found); paid %v; order %s", height, paid, statusOf(f, o))
	}
}

// V11. An order that raced a commit gets what it would have read a moment
// later (the greater of head and cursor, as order creation reads), not the
// cursor alone. During a
// catch-up the cursor is far below the recorded head, so a payment mined
// before the order existed (within earliest_block_time's slack, 5 min on
// EVM, 2 h on Bitcoin) and recorded after it pays it, while an order
// created a moment later is (correctly) bounded by the head.
func TestAttackRacedOrderPaidByABlockBeforeIt(t *testing.T) {
	f := newFixture(t)
	pgtest.Exec(t, f.db, `DELETE FROM chain_cursors WHERE network = 'ethereum'`)
	scans := scan.NewStore(f.db)
	scans.Now = f.clock.Now
	// First commit of a catch-up: blocks 5..10 scanned, node head at 100.
	scannerSees(t, scans, 5, 10, 100)
	raced := f.order(usdt, 10_000_000)
	pgtest.Exec(t, f.db, `UPDATE orders SET created_height = NULL WHERE id = $1`, raced.ID) // raced with the commit
	control := f.order(usdt, 20_000_000)                                                    // created a moment later
	f.clock.Advance(time.Second)
	// A payment of exactly the raced order's amount, mined in block 50, one
	// minute BEFORE either order was created; the scanner reaches it now.
	h := hash(f, "before")
	found := scan.Found{Asset: usdt, TxHash: h, TxKey: "log:0", To: shop, From: "0xsomeone",
		Amount: raced.PayAmount, BlockNumber: 50, BlockHash: "0xb50", BlockTime: raced.CreatedAt.Add(-time.Minute)}
	if _, err := scans.Commit(context.Background(), scan.Commit{Network: "ethereum",
		Batch: &scan.Batch{Transfers: []scan.Found{found}, Blocks: []scan.Block{{Number: 50, Hash: "0xb50"}}},
		Prev:  &scan.Block{Number: 10, Hash: "0xb10"}, Cursor: &scan.Block{Number: 60, Hash: "0xb60"},
		Head: scan.Head{Number: 100}, ConfirmedAtOrBelow: 57, Window: 128, First: 11}); err != nil {
		t.Fatal(err)
	}
	f.pass()
	var rh, ch int64
	_ = f.db.Get(&rh, `SELECT created_height FROM orders WHERE id = $1`, raced.ID)
	_ = f.db.Get(&ch, `SELECT created_height FROM orders WHERE id = $1`, control.ID)
	var paid bool
	_ = f.db.Get(&paid, `SELECT EXISTS (SELECT 1 FROM transfers WHERE tx_hash = $1 AND order_id = $2)`, h, raced.ID)
	if paid {
		t.Fatalf("a payment mined in block 50, before the order existed, paid it: raced order created_height %d, "+
			"control order (created right after) %d; order %s", rh, ch, statusOf(f, raced))
	}
}
