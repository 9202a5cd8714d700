package reconcile_test

import (
	"context"
	"fmt"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
)

// A customer who paid a settled order twice keeps the second payment: it is
// that order's exact amount, and no other customer's claim takes it.
func TestClaimCannotTakeAnotherOrdersExactPayment(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	attacker := f.order(usdt, 9_000_000)
	victim := f.order(usdt, 7_000_000)
	f.pay(payment{asset: usdt, to: shop, amount: victim.PayAmount.Int64()})
	f.pass()
	f.expect(victim, paywatch.StatusSettled, "")
	tx := hash(f, "twice")
	second := f.pay(payment{asset: usdt, to: shop, amount: victim.PayAmount.Int64(), tx: tx}) // paid twice
	f.pass()
	if got := f.transferOrder(second); got != "" {
		t.Fatalf("a payment to a settled order was matched to %s", got)
	}
	if _, err := f.store.MarkPaid(ctx, attacker.ID, tx, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass()
	if got := f.transferOrder(second); got != "" {
		t.Fatalf("the claim took the victim's second payment to %s", got)
	}
	if why := f.rejection(attacker); why != "it is the exact pay amount of another order" {
		t.Fatalf("rejection %q", why)
	}
}

// A reorg that mines a matched payment again in a block below its order's
// creation height takes it from the order: it goes to the inbox, the order
// is disputed, and the ledger follows.
func TestReorgMovingAPaymentBelowTheOrdersHeight(t *testing.T) {
	f := newFixture(t)
	o := f.order(btc, 100_000)
	tr := f.pay(payment{asset: btc, to: o.PayAddress, amount: 100_000})
	f.pass()
	f.expect(o, paywatch.StatusSettled, "")
	// What the scanner writes when a reorg mines the transaction again in
	// block 0, which the order's creation height (0) excludes.
	pgtest.Exec(t, f.db, `UPDATE transfers SET block_number = 0, block_hash = '0xnew', state = 'seen', ledger_dirty = true
		WHERE id = $1`, tr)
	f.pass()
	f.expect(o, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment)
	if got := f.transferOrder(tr); got != "" {
		t.Fatalf("the payment is still matched to %s", got)
	}
	types := f.events(o)
	if types[len(types)-2] != "transfer_unmatched" {
		t.Fatalf("timeline %v", types)
	}
	f.setState(tr, "confirmed")
	f.pass()
	if got := f.balance("suspense:bitcoin:BTC"); got != "100000" {
		t.Fatalf("suspense %s: the payment is not in the inbox's account", got)
	}
}

// recordingLookup is a node that knows no transaction, or the ones in
// found; it records what it was asked and how many asks ran at once.
type recordingLookup struct {
	mu              sync.Mutex
	asked           []string
	running, atOnce int
	found           map[string][]scan.Found
}

func (l *recordingLookup) LookupTx(ctx context.Context, hash string) ([]scan.Found, error) {
	l.mu.Lock()
	l.asked = append(l.asked, hash)
	l.running++
	l.atOnce = max(l.atOnce, l.running)
	l.mu.Unlock()
	time.Sleep(2 * time.Millisecond)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running--
	return l.found[hash], nil
}

func (l *recordingLookup) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.asked
	l.asked = nil
	return a
}

// Node look-ups of claims are bounded per round, oldest first, at most
// LookupConcurrency at a time, backed off per claim, given up after
// MaxLookups, and not made past the order's window.
func TestClaimLookUpsAreBoundedAndFair(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	node := &recordingLookup{}
	var recorded []scan.Found
	f.rec.Lookups = map[string]reconcile.TxLookup{"ethereum": node}
	f.rec.Record = func(_ context.Context, _ string, found []scan.Found) error {
		recorded = append(recorded, found...)
		return nil
	}
	const claims = reconcile.LookupsPerRound + 8
	var hashes []string
	for i := 0; i < claims; i++ {
		o := f.order(usdt, int64(1_000_000+i))
		h := fmt.Sprintf("0x%064x", 0xc1a1+i)
		hashes = append(hashes, h)
		if _, err := f.store.MarkPaid(ctx, o.ID, h, "shop"); err != nil {
			t.Fatal(err)
		}
		f.clock.Advance(time.Second) // the first claimed is the oldest
	}
	round := func() []string {
		t.Helper()
		if _, err := f.rec.LookUpHints(ctx); err != nil {
			t.Fatal(err)
		}
		return node.take()
	}
	first := round()
	if len(first) != reconcile.LookupsPerRound {
		t.Fatalf("first round asked %d, want %d", len(first), reconcile.LookupsPerRound)
	}
	for _, h := range hashes[:reconcile.LookupsPerRound] {
		if !contains(first, h) {
			t.Fatalf("the first round skipped %s, one of the oldest", h)
		}
	}
	if node.atOnce > reconcile.LookupConcurrency {
		t.Fatalf("%d look-ups at once", node.atOnce)
	}
	if second := round(); len(second) != 8 {
		t.Fatalf("the second round asked %d, want the 8 left", len(second))
	}
	if third := round(); len(third) != 0 {
		t.Fatalf("a claim was asked again before its backoff: %v", third)
	}
	// Until given up: MaxLookups each, whatever the time.
	for i := 0; i < 3*reconcile.MaxLookups; i++ {
		f.clock.Advance(reconcile.MaxLookupRetry) // 9 hours in all: inside every window
		round()
	}
	var most int
	if err := f.db.Get(&most, `SELECT max(hint_lookups) FROM orders`); err != nil || most != reconcile.MaxLookups {
		t.Fatalf("a claim was looked up %d times (%v), want %d at most and reached", most, err, reconcile.MaxLookups)
	}
	// A claim of an order whose window ended is not looked up: the pass
	// rejects it.
	late := f.order(usdt, 3_000_000)
	if _, err := f.store.MarkPaid(ctx, late.ID, fmt.Sprintf("0x%064x", 0x1a7e), "shop"); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(expires + window + time.Minute)
	if asked := round(); contains(asked, fmt.Sprintf("0x%064x", 0x1a7e)) {
		t.Fatal("a claim was looked up after its order's window")
	}
	f.pass()
	if why := f.rejection(late); why == "" {
		t.Fatalf("the claim of an order past its window is still pending: %v", f.events(late))
	}
	if len(recorded) != 0 {
		t.Fatalf("recorded %v from a node that knows nothing", recorded)
	}
}

// What a look-up finds is recorded, and the next pass decides the claim.
func TestClaimFoundByLookUpLinks(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	o := f.order(usdt, 5_000_000)
	h := fmt.Sprintf("0x%064x", 0xf00d)
	node := &recordingLookup{found: map[string][]scan.Found{h: {{Asset: usdt, TxHash: h, TxKey: "k", To: shop,
		Amount: big.NewInt(4_900_000), BlockNumber: 7, BlockHash: "0xb7", BlockTime: f.clock.Now()}}}}
	f.rec.Lookups = map[string]reconcile.TxLookup{"ethereum": node}
	f.rec.Record = scan.NewStore(f.db).Record
	if _, err := f.store.MarkPaid(ctx, o.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	f.pass() // nothing recorded yet: the claim waits
	f.expect(o, paywatch.StatusAwaitingPayment, "")
	if n, err := f.rec.LookUpHints(ctx); err != nil || n != 1 {
		t.Fatalf("look-ups found %d (%v)", n, err)
	}
	f.pass()
	f.expect(o, paywatch.StatusConfirming, "") // detected; it confirms once the scanner has seen it
	var provisional bool
	if err := f.db.Get(&provisional, `SELECT provisional FROM transfers WHERE tx_hash = $1`, h); err != nil || !provisional {
		t.Fatalf("the looked-up transfer is not provisional (%v)", err)
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
