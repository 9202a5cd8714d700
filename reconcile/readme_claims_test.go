package reconcile_test

// Tests of README's rules on which payment may pay which order, claims,
// held payments and refunds, each named for the rule it holds.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

// README: "a block whose own time is more than 5 minutes (EVM) or 2 hours
// (Bitcoin) before the order's creation never pays it, however late its
// height was recorded."
func TestBlockTimeMoreThan5MinutesEVMOr2HoursBitcoinBeforeTheOrderNeverPays(t *testing.T) {
	if got := paywatch.FamilyEVM.BlockTimeSlack(); got != 5*time.Minute {
		t.Errorf("EVM block time slack %v, want 5m", got)
	}
	if got := paywatch.FamilyBitcoin.BlockTimeSlack(); got != 2*time.Hour {
		t.Errorf("Bitcoin block time slack %v, want 2h", got)
	}
	cases := []struct {
		name   string
		asset  *paywatch.Asset
		before time.Duration // the block's time, before the order's creation
		slack  time.Duration
		pays   bool
	}{
		{"EVM block 4m59s before", usdt, 4*time.Minute + 59*time.Second, 5 * time.Minute, true},
		{"EVM block 5m01s before", usdt, 5*time.Minute + time.Second, 5 * time.Minute, false},
		{"Bitcoin block 1h59m before", btc, time.Hour + 59*time.Minute, 2 * time.Hour, true},
		{"Bitcoin block 2h01m before", btc, 2*time.Hour + time.Minute, 2 * time.Hour, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			o := f.order(c.asset, 100_000)
			var slack float64
			if err := f.db.Get(&slack, `SELECT extract(epoch FROM created_at - earliest_block_time) FROM orders WHERE id = $1`,
				o.ID); err != nil || time.Duration(slack)*time.Second != c.slack {
				t.Fatalf("the order's earliest block time is %vs before its creation (%v), want %v", slack, err, c.slack)
			}
			// The head was recorded late: the block is above the height the
			// order was created at, and paywatch records it after the order.
			f.clock.Advance(time.Second)
			tr := f.pay(payment{asset: c.asset, to: o.PayAddress, amount: o.PayAmount.Int64(), blockAgo: c.before + time.Second})
			var above bool
			if err := f.db.Get(&above, `SELECT t.block_number > o.created_height AND t.first_seen_at > o.created_at
				FROM transfers t, orders o WHERE t.id = $1 AND o.id = $2`, tr, o.ID); err != nil || !above {
				t.Fatalf("setup: the block is not above the order's creation height, or was recorded before it (%v)", err)
			}
			f.pass()
			got := f.transferOrder(tr)
			switch {
			case c.pays && got != o.ID:
				t.Fatalf("a block %v before the order's creation did not pay it: transfer on %q, order %s", c.before, got, statusOf(f, o))
			case !c.pays && got != "":
				t.Fatalf("a block %v before the order's creation paid order %s (%s)", c.before, got, statusOf(f, o))
			case c.pays:
				f.expect(o, paywatch.StatusSettled, "")
			default:
				f.expect(o, paywatch.StatusAwaitingPayment, "")
				account := "suspense:" + c.asset.Network + ":" + c.asset.Symbol
				if b := f.balance(account); b != o.PayAmount.String() {
					t.Fatalf("%s = %s: the payment is not in the inbox", account, b)
				}
			}
		})
	}
}

// README: "(A payment broadcast before an order exists and mined after it
// can pay it ...)" — on an EVM chain: sent to the shop's address before the
// order is created, mined in the next block.
func TestPaymentBroadcastBeforeTheOrderAndMinedAfterItPaysIt(t *testing.T) {
	e := newChainEnv(t)
	ctx := context.Background()
	e.sync()
	h := e.token.Transfer(e.chain.Payer, e.shop, big.NewInt(12_340_000)) // in the node's pool, no block yet
	o := e.order(12_340_000)
	if o.PayAmount.Int64() != 12_340_000 {
		t.Fatalf("setup: pay amount %s", o.PayAmount)
	}
	if _, err := e.chain.Client.TransactionReceipt(ctx, h); err == nil {
		t.Fatal("setup: the payment was mined before the order was created")
	}
	e.chain.Mine(1)
	e.sync()
	if got := e.transferOf(h.Hex()); got.Order == nil || *got.Order != o.ID {
		t.Fatalf("the payment broadcast before the order and mined after it is on order %s, want %s", orderOf(got), o.ID)
	}
	e.expect(o, paywatch.StatusConfirming, "")
	e.chain.Mine(2)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
}

// README: "(A payment broadcast before an order exists and mined after it
// can pay it ...)" — on Bitcoin, where paywatch saw it in the mempool
// before the order existed (paid to the next address to be handed out):
// the sighting moves nothing, the mined payment pays the order.
func TestPaymentSeenInTheMempoolBeforeTheOrderAndMinedAfterItPaysIt(t *testing.T) {
	e := newBTCEnv(t)
	e.sync()
	next, err := e.store.Addresses.Address(reconciletest.VPub, 0) // the address the next order gets
	if err != nil {
		t.Fatal(err)
	}
	txid := e.node.Pay(btctest.Output{Address: next, Sats: 150_000})
	e.mempool()
	var sighted int
	if err := e.db.Get(&sighted, `SELECT count(*) FROM mempool_transfers WHERE tx_hash = $1`, txid); err != nil || sighted != 1 {
		t.Fatalf("setup: the payment was sighted %d times (%v) before the order, want 1", sighted, err)
	}
	e.clock.Advance(time.Second)
	o := e.order(150_000)
	if o.PayAddress != next {
		t.Fatalf("setup: the order got %s, not the address paid ahead %s", o.PayAddress, next)
	}
	e.mempool()
	e.pass()
	e.expect(o, paywatch.StatusAwaitingPayment, "") // a sighting from before the order moves nothing
	e.node.Mine(1)
	e.mempool()
	e.sync()
	var on sql.NullString
	if err := e.db.Get(&on, `SELECT order_id FROM transfers WHERE tx_hash = $1`, txid); err != nil || on.String != o.ID {
		t.Fatalf("the payment seen before the order and mined after it is on order %q (%v), want %s", on.String, err, o.ID)
	}
	e.expect(o, paywatch.StatusConfirming, "")
	e.node.Mine(1)
	e.mempool()
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
}

// README: "A pass decides the claims whose transaction is recorded, oldest
// first, at most 200."
func TestAPassDecidesAtMost200RecordedClaimsOldestFirst(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	other := "0x2222222222222222222222222222222222222222"
	// Older than all: claims of transactions nothing recorded, which a pass
	// does not take up.
	var unrecorded []*paywatch.Order
	for i := 0; i < 5; i++ {
		o := f.order(usdt, int64(90_000_000+i*1_000_000))
		f.clock.Advance(time.Second)
		if _, err := f.store.MarkPaid(ctx, o.ID, fmt.Sprintf("0x%064x", 0xdead0+i), "shop"); err != nil {
			t.Fatal(err)
		}
		unrecorded = append(unrecorded, o)
	}
	// 201 claims of recorded transactions (payments to another address: each
	// claim is decided, as rejected), claimed in an order that is neither
	// that of creation nor that of ids.
	const n = 201
	var created []*paywatch.Order
	var hashes []string
	for i := 0; i < n; i++ {
		created = append(created, f.order(usdt, int64(1_000_000+i*10_000)))
		h := hash(f, "recorded")
		hashes = append(hashes, h)
		f.pay(payment{asset: usdt, to: other, amount: 500_000, tx: h})
	}
	var byAge []string // order ids, oldest claim first
	for i := 0; i < n; i++ {
		k := i * 10 % n
		f.clock.Advance(time.Second)
		if _, err := f.store.MarkPaid(ctx, created[k].ID, hashes[k], "shop"); err != nil {
			t.Fatal(err)
		}
		byAge = append(byAge, created[k].ID)
	}
	pending := func() []string {
		t.Helper()
		var ids []string
		if err := f.db.Select(&ids, `SELECT id FROM orders WHERE hint_state = 'pending' ORDER BY customer_marked_paid_at`); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	res := f.pass()
	left := pending()
	want := []string{unrecorded[0].ID, unrecorded[1].ID, unrecorded[2].ID, unrecorded[3].ID, unrecorded[4].ID, byAge[n-1]}
	if res.Claims != 200 || !slices.Equal(left, want) {
		t.Fatalf("the first pass decided %d claims and left %d pending; want 200 decided, the newest recorded one and the 5 unrecorded left (%v, want %v)",
			res.Claims, len(left), left, want)
	}
	if why := f.rejection(created[0]); why != "it paid another address" {
		t.Fatalf("setup: a claim was decided as %q", why)
	}
	res = f.pass()
	if left := pending(); res.Claims != 1 || len(left) != 5 {
		t.Fatalf("the second pass decided %d claims, %d left pending; want the last one decided, the 5 unrecorded pending", res.Claims, len(left))
	}
}

// gatedLookup is a node whose look-ups find nothing, each waiting until the
// test lets it finish; it records what it was asked, how many ran at once,
// and the time each had left before its context's deadline as it started.
type gatedLookup struct {
	mu         sync.Mutex
	asked      []string
	running    int
	most       int
	left       []time.Duration
	noDeadline int
	release    chan struct{}
}

func (l *gatedLookup) LookupTx(ctx context.Context, hash string) ([]scan.Found, error) {
	l.mu.Lock()
	l.asked = append(l.asked, hash)
	l.running++
	l.most = max(l.most, l.running)
	if deadline, ok := ctx.Deadline(); ok {
		l.left = append(l.left, time.Until(deadline))
	} else {
		l.noDeadline++
	}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.running--
		l.mu.Unlock()
	}()
	select {
	case <-l.release:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *gatedLookup) started() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.asked)
}

// README: "Claims of transactions no watcher has recorded are looked up on
// the node beside the passes ...: at most 32 per round, 4 at a time, 10 s
// each".
func TestClaimLookUpRoundAsks32Claims4AtATime10sEach(t *testing.T) {
	if reconcile.LookupsPerRound != 32 || reconcile.LookupConcurrency != 4 || reconcile.LookupTimeout != 10*time.Second {
		t.Fatalf("look-ups: %d a round, %d at a time, %v each; want 32, 4, 10s",
			reconcile.LookupsPerRound, reconcile.LookupConcurrency, reconcile.LookupTimeout)
	}
	f := newFixture(t)
	ctx := context.Background()
	node := &gatedLookup{release: make(chan struct{})}
	f.rec.Lookups = map[string]reconcile.TxLookup{"ethereum": node}
	f.rec.Record = func(context.Context, string, []scan.Found) error { return nil }
	const claims = 40
	var hashes []string
	for i := 0; i < claims; i++ {
		o := f.order(usdt, int64(1_000_000+i*100_000))
		h := fmt.Sprintf("0x%064x", 0x10c0+i)
		if _, err := f.store.MarkPaid(ctx, o.ID, h, "shop"); err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, h)
		f.clock.Advance(time.Second)
	}
	done := make(chan error, 1)
	go func() {
		_, err := f.rec.LookUpHints(ctx)
		done <- err
	}()
	// Let the look-ups finish one at a time, each once as many as may run
	// at once have started.
	for finished := 0; finished < 32; finished++ {
		want := finished + min(4, 32-finished)
		for deadline := time.Now().Add(10 * time.Second); node.started() < want; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after %d look-ups finished only %d had started, want %d", finished, node.started(), want)
			}
		}
		node.release <- struct{}{}
	}
	close(node.release) // any look-up past the bound finishes at once
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	node.mu.Lock()
	defer node.mu.Unlock()
	if len(node.asked) != 32 || !slices.Equal(sorted(node.asked), sorted(hashes[:32])) {
		t.Fatalf("the round asked %d claims, want the 32 oldest of %d", len(node.asked), claims)
	}
	if node.most != 4 {
		t.Fatalf("%d look-ups ran at once, want 4", node.most)
	}
	if node.noDeadline > 0 {
		t.Fatalf("%d look-ups had no deadline", node.noDeadline)
	}
	for _, left := range node.left {
		if left <= 9*time.Second || left > 10*time.Second {
			t.Fatalf("a look-up started with %v before its deadline, want 10s", left)
		}
	}
}

func sorted(xs []string) []string {
	ys := slices.Clone(xs)
	slices.Sort(ys)
	return ys
}

// failingLookup is a node whose every look-up fails.
type failingLookup struct{ asked int }

func (l *failingLookup) LookupTx(context.Context, string) ([]scan.Found, error) {
	l.asked++
	return nil, errors.New("connection refused")
}

// README: "... and per claim after 5 s, 10 s, 20 s, … up to 15 minutes
// apart, 12 times in all ...; after that the scanner finds the transaction
// when it reaches its block."
func TestClaimLookUpsBackOff5sDoublingTo15MinutesTwelveTimesThenTheScanner(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	node := &failingLookup{}
	f.rec.Lookups = map[string]reconcile.TxLookup{"ethereum": node}
	f.rec.Record = func(context.Context, string, []scan.Found) error { return nil }
	o := f.order(usdt, 10_000_000)
	h := fmt.Sprintf("0x%064x", 0xbac0ff)
	if _, err := f.store.MarkPaid(ctx, o.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	round := func() int {
		t.Helper()
		before := node.asked
		if _, err := f.rec.LookUpHints(ctx); err != nil {
			t.Fatal(err)
		}
		return node.asked - before
	}
	next := func() (lookups int, wait *time.Duration) {
		t.Helper()
		var row struct {
			Lookups int      `db:"hint_lookups"`
			Wait    *float64 `db:"wait"`
		}
		if err := f.db.Get(&row, `SELECT hint_lookups, extract(epoch FROM hint_next_lookup_at - $2::timestamptz) AS wait
			FROM orders WHERE id = $1`, o.ID, f.clock.Now()); err != nil {
			t.Fatal(err)
		}
		if row.Wait == nil {
			return row.Lookups, nil
		}
		d := time.Duration(*row.Wait * float64(time.Second))
		return row.Lookups, &d
	}
	if n := round(); n != 1 {
		t.Fatalf("a new claim was looked up %d times at once, want 1", n)
	}
	gaps := []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second,
		160 * time.Second, 320 * time.Second, 640 * time.Second, 15 * time.Minute, 15 * time.Minute, 15 * time.Minute}
	var total time.Duration
	for i, gap := range gaps {
		lookups, wait := next()
		if lookups != i+1 || wait == nil || *wait != gap {
			t.Fatalf("after failed look-up %d: %d counted, next in %v; want %d, next in %v", i+1, lookups, wait, i+1, gap)
		}
		f.clock.Advance(gap - time.Second)
		if n := round(); n != 0 {
			t.Fatalf("look-up %d came %v early", i+2, time.Second)
		}
		f.clock.Advance(time.Second)
		if n := round(); n != 1 {
			t.Fatalf("look-up %d did not come %v after the one before (%d asks)", i+2, gap, n)
		}
		total += gap
	}
	if lookups, wait := next(); lookups != 12 || wait != nil {
		t.Fatalf("after 12 failed look-ups: %d counted, next in %v; want 12 and none", lookups, wait)
	}
	if total != 66*time.Minute+15*time.Second {
		t.Fatalf("the look-ups span %v, want 66m15s", total)
	}
	f.clock.Advance(2 * time.Hour)
	if n := round(); n != 0 {
		t.Fatalf("a claim was looked up %d more times after 12", n)
	}
	var state string
	if err := f.db.Get(&state, `SELECT hint_state FROM orders WHERE id = $1`, o.ID); err != nil || state != "pending" {
		t.Fatalf("after its look-ups the claim is %q (%v), want pending", state, err)
	}
	// The scanner reaches the transaction's block.
	tr := f.pay(payment{asset: usdt, to: shop, amount: 9_500_000, tx: h})
	f.pass()
	if got := f.transferOrder(tr); got != o.ID {
		t.Fatalf("the claimed payment the scanner found is on %q, want the claiming order %s", got, o.ID)
	}
}

// README: "an order confirming on a sighting alone still counts as waiting
// with nothing received for the claim guard and for ambiguity" — the
// ambiguity: a transfer that could pay it or another order pays neither, and
// both are disputed `ambiguous`, as "candidates that hold no payment yet".
func TestOrderConfirmingOnASightingAloneIsDisputedAmbiguous(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	sighted := f.order(usdt, 6_000_000)
	other := f.order(usdt, 5_999_999)
	f.clock.Advance(time.Second)
	f.sight(sighted, shop, sighted.PayAmount.Int64(), "stuck") // its customer's payment, unmined
	f.pass()
	f.expect(sighted, paywatch.StatusConfirming, "")
	// Both ask for the same amount now, as a misconfiguration could make
	// them: a payment of it has two candidates.
	pgtest.Exec(t, f.db, `UPDATE orders SET pay_amount = $2 WHERE id = $1`, other.ID, sighted.PayAmount.Int64())
	pgtest.Exec(t, f.db, `DELETE FROM amount_slots`)
	tr := f.pay(payment{asset: usdt, to: shop, amount: sighted.PayAmount.Int64()})
	f.pass()
	got, err := f.store.GetTransfer(ctx, tr)
	if err != nil {
		t.Fatal(err)
	}
	if got.OrderID != "" || !slices.Equal(got.Flags, []string{paywatch.FlagAmbiguous}) {
		t.Fatalf("the payment with two candidates is on order %q, flags %v; want in the inbox, flagged ambiguous", got.OrderID, got.Flags)
	}
	f.expect(sighted, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
	f.expect(other, paywatch.StatusDisputed, paywatch.ReasonAmbiguous)
	evs, err := f.store.Events(ctx, sighted.ID)
	if err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1]
	if last.Type != "status_changed" || last.FromStatus != paywatch.StatusConfirming || last.ToStatus != paywatch.StatusDisputed {
		t.Fatalf("the sighted order's last event is %s %s→%s, want status_changed confirming→disputed", last.Type, last.FromStatus, last.ToStatus)
	}
	// An operator decides.
	if err := f.op.Attach(ctx, tr, other.ID, "the customer sent the receipt", "alice"); err != nil {
		t.Fatal(err)
	}
	if err := f.op.Resolve(ctx, other.ID, paywatch.StatusSettled, "paid per receipt", "alice"); err != nil {
		t.Fatal(err)
	}
	if err := f.op.Resolve(ctx, sighted.ID, paywatch.StatusCancelled, "its payment never came", "alice"); err != nil {
		t.Fatal(err)
	}
}

// README: "Money sent back to the inbox is held. ... those a reorg took from
// an order the storefront then cancelled, are flagged `held`: no rule and
// no claim places them again; an operator's attach does."
func TestPaymentAReorgTookFromAnOrderTheStorefrontCancelledComesBackHeld(t *testing.T) {
	e := newChainEnv(t)
	ctx := context.Background()
	e.sync()
	cancelled := e.order(10_000_000)
	claimant := e.order(20_000_000) // open from before the payment: a claim could take it
	h := e.payOnChain(9_900_000)    // 9.90 of 10.00: in the inbox
	e.sync()
	paid := e.transferOf(h.Hex())
	if paid.Order != nil {
		t.Fatalf("setup: the inexact payment matched %s", orderOf(paid))
	}
	// The operator attaches it; before any pass decides the order, a reorg
	// takes the payment's block away and drops the transaction.
	if err := e.op.Attach(ctx, paid.ID, cancelled.ID, "customer paid 9.90 from an exchange", "alice"); err != nil {
		t.Fatal(err)
	}
	signed, _, err := e.chain.Client.TransactionByHash(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	e.chain.Reorg(1, 1, false, nil)
	e.sync()
	if got := e.transferOf(h.Hex()); got.State != string(paywatch.TransferOrphaned) || got.Order == nil || *got.Order != cancelled.ID {
		t.Fatalf("after the reorg the payment is %s, on order %s; want orphaned, still the order's", got.State, orderOf(got))
	}
	e.expect(cancelled, paywatch.StatusAwaitingPayment, "")
	if _, err := e.store.Cancel(ctx, cancelled.ID, "shop"); err != nil {
		t.Fatalf("the storefront cannot cancel an order whose only payment a reorg took: %v", err)
	}

	// The transaction is broadcast again and mined in the new chain.
	if err := e.chain.Client.SendTransaction(ctx, signed); err != nil {
		t.Fatal(err)
	}
	e.chain.Mine(3)
	e.sync()
	back := e.transferOf(h.Hex())
	if back.State != string(paywatch.TransferConfirmed) || back.Order != nil || !slices.Contains(back.Flags, paywatch.FlagHeld) {
		t.Fatalf("the payment mined again is %s, on order %s, flags %v; want confirmed, in the inbox, flagged held",
			back.State, orderOf(back), back.Flags)
	}
	if got := e.balance("suspense:devnet:USDT"); got != "9900000" {
		t.Fatalf("suspense %s: the held payment is not in the inbox's account", got)
	}
	// No claim places it.
	if _, err := e.store.MarkPaid(ctx, claimant.ID, h.Hex(), "shop"); err != nil {
		t.Fatal(err)
	}
	e.sync()
	if got := e.transferOf(h.Hex()); got.Order != nil {
		t.Fatalf("a customer's claim placed the held payment on order %s", orderOf(got))
	}
	if why := e.rejection(claimant); why != "it is flagged held" {
		t.Fatalf("the claim of the held payment: rejection %q, want %q (timeline %v)", why, "it is flagged held", e.events(claimant))
	}
	e.expect(claimant, paywatch.StatusAwaitingPayment, "")
	// An operator's attach does.
	if err := e.op.Attach(ctx, back.ID, claimant.ID, "customer asked to move the 9.90 to this order", "alice"); err != nil {
		t.Fatalf("an operator cannot attach the held payment: %v", err)
	}
	e.sync()
	placed := e.transferOf(h.Hex())
	if placed.Order == nil || *placed.Order != claimant.ID || slices.Contains(placed.Flags, paywatch.FlagHeld) {
		t.Fatalf("after the attach the payment is on order %s, flags %v; want %s, not held", orderOf(placed), placed.Flags, claimant.ID)
	}
	e.expect(claimant, paywatch.StatusDisputed, paywatch.ReasonUnderpaid)
	if got := e.balance("order:" + claimant.ID); got != "9900000" {
		t.Fatalf("the order's account holds %s after the attach, want 9900000", got)
	}
}

// refundAdjustments returns the details of an order's refund_adjusted
// events.
func (f *fixture) refundAdjustments(o *paywatch.Order) []map[string]string {
	f.t.Helper()
	evs, err := f.store.Events(context.Background(), o.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []map[string]string
	for _, e := range evs {
		if e.Type != "refund_adjusted" {
			continue
		}
		var d map[string]string
		if err := json.Unmarshal(e.Detail, &d); err != nil {
			f.t.Fatalf("refund_adjusted detail %s: %v", e.Detail, err)
		}
		out = append(out, d)
	}
	return out
}

// README: "A refunded order stays refunded and what is owed back follows its
// payments (a reorg that takes one away takes its refund back:
// `refund_adjusted` on the timeline)."
func TestReorgTakingARefundedPaymentTakesItsRefundBack(t *testing.T) {
	e := newChainEnv(t)
	ctx := context.Background()
	e.sync()
	o := e.order(5_000_000)
	e.payOnChain(5_000_000)
	twice := e.payOnChain(5_000_000) // paid twice, in the next block
	e.chain.Mine(3)
	e.sync()
	e.expect(o, paywatch.StatusDisputed, paywatch.ReasonMultiplePayments)
	if err := e.op.Resolve(ctx, o.ID, paywatch.StatusRefunded, "both payments sent back", "bob"); err != nil {
		t.Fatal(err)
	}
	if got := e.balance("refunds_owed:devnet:USDT"); got != "10000000" {
		t.Fatalf("refunds owed %s after the refund, want 10000000", got)
	}
	signed, _, err := e.chain.Client.TransactionByHash(ctx, twice)
	if err != nil {
		t.Fatal(err)
	}
	// A reorg replaces the second payment's block and those after it; the
	// transaction is dropped.
	e.chain.Reorg(4, 1, false, nil)
	e.sync()
	if got := e.transferOf(twice.Hex()); got.State != string(paywatch.TransferOrphaned) {
		t.Fatalf("setup: the second payment is %s after the reorg", got.State)
	}
	e.expect(o, paywatch.StatusRefunded, "")
	if got := e.balance("refunds_owed:devnet:USDT"); got != "5000000" {
		t.Fatalf("refunds owed %s after a reorg took one of two 5 USDT payments, want 5000000", got)
	}
	if got := e.balance("order:" + o.ID); got != "0" {
		t.Fatalf("the refunded order's account holds %s, want 0", got)
	}
	adj := e.refundAdjustments(o)
	if len(adj) != 1 || len(adj[0]) != 1 || adj[0]["owed_change_units:devnet:USDT"] != "-5000000" {
		t.Fatalf("refund_adjusted events %v; want one, owed_change_units:devnet:USDT -5000000", adj)
	}
	// Mined again, it is owed again.
	if err := e.chain.Client.SendTransaction(ctx, signed); err != nil {
		t.Fatal(err)
	}
	e.chain.Mine(3)
	e.sync()
	e.expect(o, paywatch.StatusRefunded, "")
	if got := e.balance("refunds_owed:devnet:USDT"); got != "10000000" {
		t.Fatalf("refunds owed %s once the payment is mined again, want 10000000", got)
	}
	if adj := e.refundAdjustments(o); len(adj) != 2 || adj[1]["owed_change_units:devnet:USDT"] != "5000000" {
		t.Fatalf("refund_adjusted events %v; want a second, owed_change_units:devnet:USDT 5000000", adj)
	}
}

// README ("A halted network"): "`paywatch rescan` ... In one transaction it
// marks the transfers above `BLOCK - 1` orphaned (each returns when the
// rescan sees it again), notes it on the affected dossiers' timelines".
// scan.Store.Rewind is what the command runs.
func TestRescanNotesOrphanedPaymentsOnTheAffectedTimelines(t *testing.T) {
	e := newChainEnv(t)
	ctx := context.Background()
	e.sync()
	below := e.order(3_000_000)
	above := e.order(4_000_000)
	e.payOnChain(3_000_000)
	from := e.chain.Head() + 1 // paywatch rescan --from BLOCK: the next payment's block
	h := e.payOnChain(4_000_000)
	e.chain.Mine(3)
	e.sync()
	e.expect(below, paywatch.StatusSettled, "")
	e.expect(above, paywatch.StatusSettled, "")
	paid := e.transferOf(h.Hex())
	orphaned, err := scan.NewStore(e.db).Rewind(ctx, "devnet", scan.Block{Number: from - 1, Hash: e.chain.HashAt(from - 1).Hex()})
	if err != nil || orphaned != 1 {
		t.Fatalf("the rescan orphaned %d transfers (%v), want 1", orphaned, err)
	}
	evs, err := e.store.Events(ctx, above.ID)
	if err != nil {
		t.Fatal(err)
	}
	var notes []paywatch.Event
	for _, ev := range evs {
		if ev.Type == "transfer_orphaned" {
			notes = append(notes, ev)
		}
	}
	if len(notes) != 1 {
		t.Fatalf("the affected order's timeline has %d transfer_orphaned notes, want 1: %v", len(notes), e.events(above))
	}
	note := notes[0]
	var detail struct {
		TransferID  string `json:"transfer_id"`
		TxHash      string `json:"tx_hash"`
		BlockNumber uint64 `json:"block_number"`
		Reason      string `json:"reason"`
	}
	if err := json.Unmarshal(note.Detail, &detail); err != nil {
		t.Fatalf("the note's detail %s: %v", note.Detail, err)
	}
	if note.Actor != "operator" || detail.Reason != "rescan" || detail.TransferID != paid.ID || detail.TxHash != h.Hex() ||
		detail.BlockNumber != from {
		t.Fatalf("the rescan's note is by %s: %s; want by operator, reason rescan, transfer %s, tx %s, block %d",
			note.Actor, note.Detail, paid.ID, h.Hex(), from)
	}
	if evs := e.events(below); slices.Contains(evs, "transfer_orphaned") {
		t.Fatalf("the order paid below the rescan got a note: %v", evs)
	}
	e.sync() // the rescan sees the payment again
	if got := e.transferOf(h.Hex()); got.State != string(paywatch.TransferConfirmed) || got.Order == nil || *got.Order != above.ID {
		t.Fatalf("after the rescan the payment is %s on order %s, want confirmed on %s", got.State, orderOf(got), above.ID)
	}
	e.expect(above, paywatch.StatusSettled, "")
}

// orderOf returns the order a transfer is on, or "none".
func orderOf(c checked) string {
	if c.Order == nil {
		return "none"
	}
	return *c.Order
}

// Claims that must wait anyway do not take up a pass's 200: claims whose
// transfers still wait for their balance check (a node that cannot run it
// keeps them waiting for good) never hold back a newer claim that can be
// decided.
func TestClaimsWaitingForABalanceCheckDoNotHoldBackNewerOnes(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const waiting = reconcile.HintsPerPass + 10
	for i := 0; i < waiting; i++ {
		o := f.order(usdt, int64(1_000_000+i*10_000))
		h := hash(f, "pending-check")
		f.pay(payment{asset: usdt, to: shop, amount: int64(1_000_000 + i*10_000), tx: h, state: "seen",
			flags: []string{paywatch.FlagBalancePending}})
		f.clock.Advance(time.Second)
		if _, err := f.store.MarkPaid(ctx, o.ID, h, "shop"); err != nil {
			t.Fatal(err)
		}
	}
	newest := f.order(usdt, 90_000_000)
	h := hash(f, "decidable")
	f.pay(payment{asset: usdt, to: "0x2222222222222222222222222222222222222222", amount: 500_000, tx: h})
	f.clock.Advance(time.Second)
	if _, err := f.store.MarkPaid(ctx, newest.ID, h, "shop"); err != nil {
		t.Fatal(err)
	}
	res := f.pass()
	if why := f.rejection(newest); res.Claims != 1 || why != "it paid another address" {
		t.Fatalf("a pass with %d older claims waiting for balance checks decided %d claims, the newest as %q; want it decided (rejected: it paid another address)",
			waiting, res.Claims, why)
	}
	var still int
	if err := f.db.Get(&still, `SELECT count(*) FROM orders WHERE hint_state = 'pending'`); err != nil {
		t.Fatal(err)
	}
	if still != waiting {
		t.Fatalf("%d claims pending after the pass, want the %d waiting for their balance checks", still, waiting)
	}
}

// A payment two customers' claims contested (a's claim linked it, b's could
// have) goes back to the inbox flagged ambiguous; mined again in another block after a reorg it stays so: a
// third customer's claim, made once the contest is forgotten, takes
// nothing.
func TestContestedPaymentMinedAgainStaysAmbiguous(t *testing.T) {
	e := newChainEnv(t)
	ctx := context.Background()
	e.sync()
	a := e.order(10_000_000)
	b := e.order(20_000_000)
	third := e.order(30_000_000) // open from before the payment: a claim could take it
	h := e.payOnChain(9_900_000) // 9.90 of a's 10.00: no exact match, in the inbox
	e.sync()
	for _, o := range []*paywatch.Order{a, b} {
		if _, err := e.store.MarkPaid(ctx, o.ID, h.Hex(), "shop"); err != nil {
			t.Fatal(err)
		}
		e.sync()
	}
	contested := e.transferOf(h.Hex())
	if contested.Order != nil || !slices.Contains(contested.Flags, paywatch.FlagAmbiguous) {
		t.Fatalf("setup: the contested payment is on order %s, flags %v; want in the inbox, flagged ambiguous", orderOf(contested), contested.Flags)
	}
	signed, _, err := e.chain.Client.TransactionByHash(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	e.chain.Reorg(1, 1, false, nil)
	e.sync()
	if err := e.chain.Client.SendTransaction(ctx, signed); err != nil {
		t.Fatal(err)
	}
	e.chain.Mine(3)
	e.sync()
	back := e.transferOf(h.Hex())
	if back.State != string(paywatch.TransferConfirmed) || !slices.Contains(back.Flags, paywatch.FlagAmbiguous) {
		t.Fatalf("the contested payment mined again is %s, flags %v; want confirmed and still flagged ambiguous", back.State, back.Flags)
	}
	if _, err := e.store.MarkPaid(ctx, third.ID, h.Hex(), "shop"); err != nil {
		t.Fatal(err)
	}
	e.sync()
	if got := e.transferOf(h.Hex()); got.Order != nil {
		t.Fatalf("after a reorg a third customer's claim took the contested payment: on order %s", orderOf(got))
	}
}

// Claims given up at the end of their order's window (nothing recorded for
// their hash) are decided at most HintsPerPass a pass too, not that many a
// round: a flood of "I've paid" with random hashes costs a bounded pass.
func TestAPassGivesUpAtMost200ClaimsAtTheirWindowsEnd(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const n = reconcile.HintsPerPass + 50
	for i := 0; i < n; i++ {
		o := f.order(usdt, int64(1_000_000+i*10_000))
		if _, err := f.store.MarkPaid(ctx, o.ID, hash(f, "never-mined"), "shop"); err != nil {
			t.Fatal(err)
		}
	}
	f.clock.Advance(expires + window + time.Minute) // every window has ended
	if res := f.pass(); res.Claims != reconcile.HintsPerPass {
		t.Fatalf("one pass gave up %d claims at their window's end; want %d", res.Claims, reconcile.HintsPerPass)
	}
	if res := f.pass(); res.Claims != n-reconcile.HintsPerPass {
		t.Fatalf("the next pass gave up %d claims; want the %d left", res.Claims, n-reconcile.HintsPerPass)
	}
}
