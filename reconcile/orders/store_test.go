package orders_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

var (
	fx     = ordersFixtures()
	eth    = fx.Ethereum
	usdt   = fx.USDT
	btcNet = fx.Bitcoin
	btc    = fx.BTC
)

// ordersFixtures are the shared fixtures with room for many unique amounts.
func ordersFixtures() *reconciletest.Fixtures {
	f := reconciletest.NewFixtures()
	f.USDT.UniqueSlots = 10000
	return f
}

func newStore(t *testing.T, db *sqlx.DB) (*orders.Store, *reconciletest.Clock) {
	t.Helper()
	s := orders.NewStore(db, 24*time.Hour, reconciletest.Wallets(t))
	c := reconciletest.NewClock(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	s.Now = c.Now
	s.Rand = reconciletest.FirstSlot
	return s, c
}

func req(ext string, a *paywatch.Asset, units int64) orders.CreateRequest {
	n := eth
	if a == btc {
		n = btcNet
	}
	return orders.CreateRequest{ExternalID: ext, Network: n, Asset: a, Amount: big.NewInt(units),
		ExpiresIn: time.Hour, Actor: "storefront"}
}

func count(t *testing.T, db *sqlx.DB, table string) int {
	t.Helper()
	var n int
	if err := db.Get(&n, "SELECT count(*) FROM "+table); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestCreateSharedAddress(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	ctx := context.Background()
	o, created, err := s.Create(ctx, req("a", usdt, 1_234_000_000))
	if err != nil || !created {
		t.Fatal(created, err)
	}
	if o.Status != paywatch.StatusAwaitingPayment || o.PayAmount.String() != "1234000000" ||
		o.PayAddress != usdt.Addresses[0] || o.AssetContract != usdt.Contract || !strings.HasPrefix(o.ID, "ord_") {
		t.Fatalf("order %+v", o)
	}
	if !o.ExpiresAt.Equal(o.CreatedAt.Add(time.Hour)) || !o.MonitorUntil.Equal(o.ExpiresAt.Add(24*time.Hour)) {
		t.Fatalf("times %v %v %v", o.CreatedAt, o.ExpiresAt, o.MonitorUntil)
	}
	o2, _, err := s.Create(ctx, req("b", usdt, 1_234_000_000))
	if err != nil || o2.PayAmount.String() != "1234000001" {
		t.Fatalf("second order pays %v (%v), want 1234000001", o2.PayAmount, err)
	}
	// an order whose base amount is the first one's pay amount + 1 must not collide
	o3, _, err := s.Create(ctx, req("c", usdt, 1_234_000_001))
	if err != nil || o3.PayAmount.String() != "1234000002" {
		t.Fatalf("third order pays %v (%v), want 1234000002", o3.PayAmount, err)
	}
	events, err := s.Events(ctx, o.ID)
	if err != nil || len(events) != 1 || events[0].Type != orders.EventCreated || events[0].ToStatus != paywatch.StatusAwaitingPayment || events[0].Actor != "storefront" {
		t.Fatalf("events %+v %v", events, err)
	}
}

func TestConcurrentCreatesGetDistinctAmounts(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	const n = 200
	var wg sync.WaitGroup
	results := make(chan string, n)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			o, _, err := s.Create(context.Background(), req(fmt.Sprintf("ext-%d", i), usdt, 50_000_000))
			if err != nil {
				errs <- err
				return
			}
			results <- o.PayAmount.String()
		}(i)
	}
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for p := range results {
		if seen[p] {
			t.Fatalf("pay amount %s handed out twice", p)
		}
		seen[p] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct pay amounts, want %d", len(seen), n)
	}
	// the smallest free k was taken each time: exactly 0..199
	var max string
	if err := db.Get(&max, "SELECT max(pay_amount)::text FROM orders"); err != nil || max != "50000199" {
		t.Fatalf("max pay amount %s (%v), want 50000199", max, err)
	}
}

func TestSlotExhaustionWritesNothing(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	ctx := context.Background()
	small := *usdt
	small.UniqueSlots = 3
	for i := 0; i < 3; i++ {
		if _, _, err := s.Create(ctx, req(fmt.Sprint(i), &small, 10)); err != nil {
			t.Fatal(err)
		}
	}
	before := [3]int{count(t, db, "orders"), count(t, db, "order_events"), count(t, db, "amount_slots")}
	_, _, err := s.Create(ctx, req("x", &small, 10))
	if paywatch.ErrorCode(err) != paywatch.CodeNoUniqueAmount {
		t.Fatalf("err = %v, want no_unique_amount", err)
	}
	after := [3]int{count(t, db, "orders"), count(t, db, "order_events"), count(t, db, "amount_slots")}
	if before != after {
		t.Fatalf("rows before %v, after %v", before, after)
	}
	// A retry of an order that holds one of the slots is still answered.
	if o, created, err := s.Create(ctx, req("2", &small, 10)); err != nil || created || o.ExternalID != "2" {
		t.Fatalf("replay with every slot held: %v %v %v", o, created, err)
	}
	if _, _, err := s.Create(ctx, req("2", &small, 11)); paywatch.ErrorCode(err) != paywatch.CodeConflict {
		t.Fatalf("conflicting replay with every slot held: %v", err)
	}
	// Another amount still works; a second address adds capacity.
	if _, _, err := s.Create(ctx, req("y", &small, 20)); err != nil {
		t.Fatal(err)
	}
	two := small
	two.Addresses = []string{usdt.Addresses[0], "0x3333333333333333333333333333333333333333"}
	o, _, err := s.Create(ctx, req("z", &two, 10))
	if err != nil || o.PayAddress != two.Addresses[1] || o.PayAmount.Int64() != 10 {
		t.Fatalf("second address: %+v %v", o, err)
	}
}

func TestSlotHeldUntilMonitoringWindowEnds(t *testing.T) {
	db := pgtest.New(t)
	s, clk := newStore(t, db)
	ctx := context.Background()
	one := *usdt
	one.UniqueSlots = 1
	first, _, err := s.Create(ctx, req("first", &one, 10))
	if err != nil {
		t.Fatal(err)
	}
	// Expired but inside the monitoring window: a late payer of the first
	// order must not be able to settle a newer one, so the slot is held.
	clk.Advance(2 * time.Hour)
	if _, _, err := s.Create(ctx, req("second", &one, 10)); paywatch.ErrorCode(err) != paywatch.CodeNoUniqueAmount {
		t.Fatalf("slot reused inside the monitoring window: %v", err)
	}
	clk.Advance(24 * time.Hour)
	second, _, err := s.Create(ctx, req("second", &one, 10))
	if err != nil || second.PayAmount.Cmp(first.PayAmount) != 0 {
		t.Fatalf("slot not taken over after the window: %+v %v", second, err)
	}
	var holder string
	if err := db.Get(&holder, "SELECT order_id FROM amount_slots"); err != nil || holder != second.ID {
		t.Fatalf("slot holder %s (%v), want %s", holder, err, second.ID)
	}
}

func TestPerOrderAddresses(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	ctx := context.Background()
	wallets := reconciletest.Wallets(t)
	var seen []string
	for i := 0; i < 3; i++ {
		o, _, err := s.Create(ctx, req(fmt.Sprint("btc-", i), btc, 150_000))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := wallets.Address(reconciletest.VPub, uint32(i))
		if o.PayAddress != want || o.PayAmount.Int64() != 150_000 {
			t.Fatalf("order %d: %s %s, want %s", i, o.PayAddress, o.PayAmount, want)
		}
		seen = append(seen, o.PayAddress)
	}
	// A restart (a new Store over the same database) continues the index.
	s2, _ := newStore(t, db)
	o, _, err := s2.Create(ctx, req("btc-after-restart", btc, 1))
	want, _ := wallets.Address(reconciletest.VPub, 3)
	if err != nil || o.PayAddress != want {
		t.Fatalf("after restart: %s (%v), want index 3 %s", o.PayAddress, err, want)
	}
	// A failed creation does not burn an index.
	if _, _, err := s2.Create(ctx, req("btc-after-restart", btc, 2)); paywatch.ErrorCode(err) != paywatch.CodeConflict {
		t.Fatalf("conflict expected, got %v", err)
	}
	o, _, _ = s2.Create(ctx, req("btc-5", btc, 2))
	if want, _ = wallets.Address(reconciletest.VPub, 4); o.PayAddress != want {
		t.Fatalf("index after conflict: %s, want %s", o.PayAddress, want)
	}
}

func TestConcurrentPerOrderIndexes(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if _, _, err := s.Create(context.Background(), req(fmt.Sprint("b", i), btc, 1000)); err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	var distinct, maxIdx int
	if err := db.QueryRow("SELECT count(DISTINCT pay_address), max(derivation_index) FROM orders").Scan(&distinct, &maxIdx); err != nil {
		t.Fatal(err)
	}
	if distinct != 50 || maxIdx != 49 {
		t.Fatalf("%d distinct addresses, max index %d; want 50 and 49", distinct, maxIdx)
	}
}

func TestIdempotentCreate(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	ctx := context.Background()
	r := req("k1", usdt, 5_000_000)
	r.Metadata = json.RawMessage(`{"plan":"L40S-7d","n":1}`)
	first, created, err := s.Create(ctx, r)
	if err != nil || !created {
		t.Fatal(err)
	}
	// same external_id, same content (metadata keys in another order)
	r.Metadata = json.RawMessage(`{"n":1, "plan":"L40S-7d"}`)
	again, created, err := s.Create(ctx, r)
	if err != nil || created || again.ID != first.ID || again.PayAmount.Cmp(first.PayAmount) != 0 {
		t.Fatalf("replay: %+v created=%v %v", again, created, err)
	}
	// same external_id, different amount
	r2 := r
	r2.Amount = big.NewInt(6_000_000)
	if _, _, err := s.Create(ctx, r2); paywatch.ErrorCode(err) != paywatch.CodeConflict {
		t.Fatalf("different body: %v", err)
	}
	// Idempotency-Key: same key, same body → same order; other body → conflict
	k := req("k2", usdt, 7_000_000)
	k.IdempotencyScope, k.IdempotencyKey = "storefront", "idem-1"
	a, _, err := s.Create(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	b, created, err := s.Create(ctx, k)
	if err != nil || created || b.ID != a.ID {
		t.Fatalf("idempotent replay: %v %v", created, err)
	}
	k.ExternalID = "k3"
	if _, _, err := s.Create(ctx, k); paywatch.ErrorCode(err) != paywatch.CodeConflict {
		t.Fatalf("reused Idempotency-Key: %v", err)
	}
	if n := count(t, db, "orders"); n != 2 {
		t.Fatalf("%d orders, want 2", n)
	}
}

func TestConcurrentSameExternalID(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	var wg sync.WaitGroup
	ids := make(chan string, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, _, err := s.Create(context.Background(), req("same", usdt, 1_000_000))
			if err != nil {
				t.Error(err)
				return
			}
			ids <- o.ID
		}()
	}
	wg.Wait()
	close(ids)
	first := ""
	for id := range ids {
		if first == "" {
			first = id
		}
		if id != first {
			t.Fatalf("two orders for one external_id: %s, %s", first, id)
		}
	}
	if n := count(t, db, "orders"); n != 1 {
		t.Fatalf("%d orders", n)
	}
	if n := count(t, db, "amount_slots"); n != 1 {
		t.Fatalf("%d amount slots", n)
	}
}

func TestMarkPaidAndCancel(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	ctx := context.Background()
	o, _, _ := s.Create(ctx, req("p", usdt, 1))
	hash := "0x" + strings.Repeat("ab", 32)
	paid, err := s.MarkPaid(ctx, o.ID, hash, "storefront")
	if err != nil || paid.CustomerMarkedPaidAt == nil || paid.TxHashHint != hash {
		t.Fatalf("mark paid: %+v %v", paid, err)
	}
	again, err := s.MarkPaid(ctx, o.ID, "", "storefront")
	if err != nil || !again.CustomerMarkedPaidAt.Equal(*paid.CustomerMarkedPaidAt) || again.TxHashHint != hash {
		t.Fatalf("second mark paid changed the order: %+v %v", again, err)
	}
	var hooks []string
	if err := db.Select(&hooks, "SELECT type FROM webhook_outbox WHERE order_id = $1", o.ID); err != nil || len(hooks) != 1 || hooks[0] != orders.WebhookCustomerMarkedPaid {
		t.Fatalf("outbox %v %v", hooks, err)
	}
	c, err := s.Cancel(ctx, o.ID, "storefront")
	if err != nil || c.Status != paywatch.StatusCancelled {
		t.Fatalf("cancel: %v %v", c, err)
	}
	if _, err := s.Cancel(ctx, o.ID, "storefront"); paywatch.ErrorCode(err) != paywatch.CodeInvalidState {
		t.Fatalf("second cancel: %v", err)
	}
	if _, err := s.MarkPaid(ctx, o.ID, "", "storefront"); paywatch.ErrorCode(err) != paywatch.CodeInvalidState {
		t.Fatalf("mark paid on cancelled: %v", err)
	}
	events, _ := s.Events(ctx, o.ID)
	if len(events) != 3 || events[2].FromStatus != paywatch.StatusAwaitingPayment || events[2].ToStatus != paywatch.StatusCancelled {
		t.Fatalf("timeline %+v", events)
	}
	if _, err := s.Cancel(ctx, "ord_nope", "x"); paywatch.ErrorCode(err) != paywatch.CodeNotFound {
		t.Fatalf("missing order: %v", err)
	}
}

func TestCancelRefusedWithMatchedTransfer(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	ctx := context.Background()
	o, _, _ := s.Create(ctx, req("m", usdt, 1))
	pgtest.Exec(t, db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address,
		amount, block_number, block_hash, state, order_id, first_seen_at, updated_at)
		VALUES ('trf_1', 'ethereum', 'USDT', $2, '0xaa', 'log', 0, $3, 1, 10, '0xbb', 'seen', $1, now(), now())`,
		o.ID, usdt.Contract, usdt.Addresses[0])
	if _, err := s.Cancel(ctx, o.ID, "storefront"); paywatch.ErrorCode(err) != paywatch.CodeInvalidState {
		t.Fatalf("cancel with a matched transfer: %v", err)
	}
	got, _ := s.Get(ctx, o.ID)
	if len(got.Transfers) != 1 || got.ReceivedAmount.Int64() != 1 || got.Transfers[0].Confirmations != 0 {
		t.Fatalf("transfers %+v", got.Transfers)
	}
}

func TestListPagination(t *testing.T) {
	db := pgtest.New(t)
	s, clk := newStore(t, db)
	ctx := context.Background()
	for i := 0; i < 7; i++ {
		clk.Advance(time.Second)
		if _, _, err := s.Create(ctx, req(fmt.Sprint("l", i), usdt, 100)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		page, next, err := s.List(ctx, orders.Filter{Limit: 3, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range page {
			got = append(got, o.ExternalID)
		}
		if next == "" {
			break
		}
		cursor = next
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
	}
	if strings.Join(got, ",") != "l6,l5,l4,l3,l2,l1,l0" {
		t.Fatalf("pages gave %v", got)
	}
	one, _, err := s.List(ctx, orders.Filter{ExternalID: "l3", Limit: 50})
	if err != nil || len(one) != 1 || one[0].ExternalID != "l3" {
		t.Fatalf("by external id: %v %v", one, err)
	}
	none, _, err := s.List(ctx, orders.Filter{Status: paywatch.StatusSettled, Limit: 50})
	if err != nil || len(none) != 0 {
		t.Fatalf("settled: %v %v", none, err)
	}
	if _, _, err := s.List(ctx, orders.Filter{Limit: 5, Cursor: "garbage!"}); paywatch.ErrorCode(err) != paywatch.CodeInvalidRequest {
		t.Fatalf("bad cursor: %v", err)
	}
}

// Unique increments are drawn at random among the free ones: nobody can
// choose a pay amount equal to someone else's payment waiting to be mined.
func TestPayAmountsAreDrawnAtRandom(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	s.Rand = nil // the store's own, cryptographic randomness
	ctx := context.Background()
	seen := map[int64]bool{}
	smallest := 0
	for i := 0; i < 40; i++ {
		o, _, err := s.Create(ctx, req(fmt.Sprint("rand-", i), usdt, 7_000_000))
		if err != nil {
			t.Fatal(err)
		}
		k := o.PayAmount.Int64() - 7_000_000
		if k < 0 || k >= int64(usdt.UniqueSlots) || seen[k] {
			t.Fatalf("order %d drew k=%d (seen before: %v)", i, k, seen[k])
		}
		seen[k] = true
		if k < 40 {
			smallest++
		}
	}
	// 40 draws among 10,000 slots: the first 40 slots all drawn would be a
	// 1 in 10^100 chance.
	if smallest == 40 {
		t.Fatal("the increments are the smallest free ones, in order")
	}
}

// Several shared addresses spread concurrent creations: 300 at once, with
// real random draws over 4 addresses and few slots, never hand out one
// (address, pay amount) twice, never deadlock, and use every address.
func TestConcurrentCreatesOverSeveralAddresses(t *testing.T) {
	db := pgtest.New(t)
	f := reconciletest.NewFixtures()
	f.USDT.Addresses = []string{reconciletest.Shop, "0x2222222222222222222222222222222222222222",
		"0x3333333333333333333333333333333333333333", "0x4444444444444444444444444444444444444444"}
	f.USDT.UniqueSlots = 100
	s := orders.NewStore(db, 24*time.Hour, reconciletest.Wallets(t))
	const n = 300
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := s.Create(context.Background(), orders.CreateRequest{ExternalID: fmt.Sprintf("spread-%d", i),
				Network: f.Ethereum, Asset: f.USDT, Amount: big.NewInt(7_000_000), ExpiresIn: time.Hour, Actor: "shop"})
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var rows []struct {
		Address string `db:"pay_address"`
		N       int    `db:"n"`
		Amounts int    `db:"amounts"`
	}
	if err := db.Select(&rows, `SELECT pay_address, count(*) AS n, count(DISTINCT pay_amount) AS amounts
		FROM orders GROUP BY pay_address`); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, r := range rows {
		if r.N != r.Amounts {
			t.Fatalf("address %s: %d orders but %d distinct pay amounts", r.Address, r.N, r.Amounts)
		}
		total += r.N
	}
	if len(rows) != 4 || total != n {
		t.Fatalf("orders per address %+v, want %d over 4 addresses", rows, n)
	}
}

// Creations on one shared address run side by side: one that is slow
// inside its transaction (here a trigger makes its timeline write sleep)
// holds back no other creation of the same amount on the same address,
// and the two get different pay amounts.
func TestCreationsOnOneAddressDoNotWaitForEachOther(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	slowCreations(t, db, "slow", 2)
	slow := startCreate(t, s, req("slow", usdt, 9_000_000))
	waitForSleep(t, db) // the slow creation holds its slot
	start := time.Now()
	fast, _, err := s.Create(context.Background(), req("fast", usdt, 9_000_000))
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if took > time.Second {
		t.Fatalf("a creation on the same address waited %v for one in flight", took)
	}
	o := <-slow
	if o == nil {
		t.Fatal("the slow creation failed")
	}
	if o.PayAddress != fast.PayAddress || o.PayAmount.Cmp(fast.PayAmount) == 0 {
		t.Fatalf("slow pays %s at %s, fast pays %s at %s: want one address, two amounts",
			o.PayAmount, o.PayAddress, fast.PayAmount, fast.PayAddress)
	}
	// The smallest free slot was the slow one's; the fast one took the next.
	if o.PayAmount.Int64() != 9_000_000 || fast.PayAmount.Int64() != 9_000_001 {
		t.Fatalf("pay amounts %s and %s, want 9000000 (slow) and 9000001 (fast)", o.PayAmount, fast.PayAmount)
	}
}

// A slot whose lock a creation in flight holds is never handed out again:
// with one slot held and the other's lock held elsewhere, a creation
// answers no_unique_amount at once and writes nothing.
func TestASlotBeingTakenIsNotHandedOut(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	ctx := context.Background()
	two := *usdt
	two.UniqueSlots = 2
	if _, _, err := s.Create(ctx, req("held", &two, 10)); err != nil { // k = 0
		t.Fatal(err)
	}
	// Another session takes slot k = 1's lock, as a creation does.
	conn, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tx, err := conn.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	key := "paywatch:slot:" + two.Network + ":" + two.Symbol + ":" + two.Addresses[0] + ":11"
	if _, err := tx.Exec(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, key); err != nil {
		t.Fatal(err)
	}
	before := [3]int{count(t, db, "orders"), count(t, db, "order_events"), count(t, db, "amount_slots")}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, _, err := s.Create(wctx, req("next", &two, 10)); paywatch.ErrorCode(err) != paywatch.CodeNoUniqueAmount {
		t.Fatalf("err = %v, want no_unique_amount", err)
	}
	if after := [3]int{count(t, db, "orders"), count(t, db, "order_events"), count(t, db, "amount_slots")}; after != before {
		t.Fatalf("rows before %v, after %v", before, after)
	}
	// Once the lock is let go without the slot taken, it is free again.
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	o, _, err := s.Create(ctx, req("next", &two, 10))
	if err != nil || o.PayAmount.Int64() != 11 {
		t.Fatalf("after the lock was let go: %+v %v, want pay amount 11", o, err)
	}
}

// Many creations at once on one address, with real random draws over few
// slots and expired slots taken over: no (address, pay amount) is ever
// held by two orders, every creation either gets a slot or answers
// no_unique_amount, and those that got one hold it.
func TestConcurrentCreatesNeverShareASlot(t *testing.T) {
	db := pgtest.New(t)
	s, clk := newStore(t, db)
	s.Rand = nil
	few := *usdt
	few.UniqueSlots = 40
	ctx := context.Background()
	// 20 slots held by orders whose monitoring ended: free to take over.
	for i := range 20 {
		if _, _, err := s.Create(ctx, req(fmt.Sprint("old-", i), &few, 5_000)); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(48 * time.Hour)
	const n = 60
	var wg sync.WaitGroup
	var mu sync.Mutex
	got, refused := 0, 0
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := s.Create(ctx, req(fmt.Sprint("new-", i), &few, 5_000))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				got++
			case paywatch.ErrorCode(err) == paywatch.CodeNoUniqueAmount:
				refused++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if got != few.UniqueSlots || refused != n-few.UniqueSlots {
		t.Fatalf("%d got a slot and %d were refused, want %d and %d", got, refused, few.UniqueSlots, n-few.UniqueSlots)
	}
	var dup int
	if err := db.Get(&dup, `SELECT count(*) FROM (SELECT pay_address, pay_amount FROM orders
		WHERE external_id LIKE 'new-%' GROUP BY 1, 2 HAVING count(*) > 1) d`); err != nil || dup != 0 {
		t.Fatalf("%d pay amounts handed to two new orders (%v)", dup, err)
	}
	var unheld int
	if err := db.Get(&unheld, `SELECT count(*) FROM orders o WHERE external_id LIKE 'new-%' AND NOT EXISTS (
		SELECT 1 FROM amount_slots s WHERE s.order_id = o.id AND s.address = o.pay_address AND s.pay_amount = o.pay_amount)`); err != nil || unheld != 0 {
		t.Fatalf("%d new orders do not hold their slot (%v)", unheld, err)
	}
}

// waitForSleep waits (up to 5 s) until a session of db's database sleeps
// in pg_sleep: a slow creation of these tests is in its transaction, its
// slot taken.
func waitForSleep(t *testing.T, db *sqlx.DB) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var n int
		if err := db.Get(&n, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event = 'PgSleep'`); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow creation never reached its sleep")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startCreate creates r in the background; the order (nil on failure,
// which fails the test) comes on the channel.
func startCreate(t *testing.T, s *orders.Store, r orders.CreateRequest) <-chan *paywatch.Order {
	done := make(chan *paywatch.Order, 1)
	go func() {
		o, _, err := s.Create(context.Background(), r)
		if err != nil {
			t.Error(err)
		}
		done <- o
	}()
	return done
}

// slowCreations makes the creations of orders whose external_id is LIKE
// pattern sleep for secs inside their transactions, after they took their
// slots.
func slowCreations(t *testing.T, db *sqlx.DB, pattern string, secs float64) {
	t.Helper()
	if _, err := db.Exec(fmt.Sprintf(`CREATE FUNCTION slow_creation() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT external_id FROM orders WHERE id = NEW.order_id) LIKE %s THEN PERFORM pg_sleep(%g); END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER slow_creation BEFORE INSERT ON order_events FOR EACH ROW EXECUTE FUNCTION slow_creation()`,
		pq.QuoteLiteral(pattern), secs)); err != nil {
		t.Fatal(err)
	}
}

// A replay sent while its original is still in its transaction waits for
// it and answers the original, even when the original took the last slot:
// it neither takes nor counts a slot of its own.
func TestReplayOfAnOriginalInFlightOnTheLastSlot(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	one := *usdt
	one.UniqueSlots = 1
	slowCreations(t, db, "slow%", 1)
	original := startCreate(t, s, req("slow", &one, 10))
	waitForSleep(t, db)
	o, created, err := s.Create(context.Background(), req("slow", &one, 10))
	first := <-original
	if err != nil || created || first == nil || o.ID != first.ID {
		t.Fatalf("replay of an original in flight: %+v created=%v err=%v, want the original %+v", o, created, err, first)
	}
	// The same with a second slot free: the replay leaves it free.
	two := *usdt
	two.UniqueSlots = 2
	original = startCreate(t, s, req("slow-2", &two, 20))
	waitForSleep(t, db)
	replayed := make(chan error, 1)
	go func() {
		_, _, err := s.Create(context.Background(), req("slow-2", &two, 20))
		replayed <- err
	}()
	time.Sleep(200 * time.Millisecond) // the replay waits for its original
	other, _, err := s.Create(context.Background(), req("other", &two, 20))
	if err != nil {
		t.Fatalf("a creation beside a replay in flight: %v", err)
	}
	if <-original == nil || <-replayed != nil {
		t.Fatal("the original or its replay failed")
	}
	if other.PayAmount.Int64() != 21 {
		t.Fatalf("the other order pays %s, want 21 (20 is the original's)", other.PayAmount)
	}
	// A retry by Idempotency-Key, on the last slot.
	keyed := req("slow-3", &one, 30)
	keyed.IdempotencyScope, keyed.IdempotencyKey = "shop", "key-3"
	original = startCreate(t, s, keyed)
	waitForSleep(t, db)
	o, created, err = s.Create(context.Background(), keyed)
	if first := <-original; err != nil || created || first == nil || o.ID != first.ID {
		t.Fatalf("retry by Idempotency-Key of an original in flight: %+v created=%v err=%v, want %+v", o, created, err, first)
	}
}

// A daemon of an earlier release locks a shared address exclusively for
// each creation; creations of this release hold the address's lock in
// shared mode, so the two take turns: neither writes a slot the other is
// writing.
func TestCreationsTakeTurnsWithAnEarlierReleasesLock(t *testing.T) {
	db := pgtest.New(t)
	s, clk := newStore(t, db)
	ctx := context.Background()
	key := "paywatch:slot:" + usdt.Network + ":" + usdt.Symbol + ":" + usdt.Addresses[0]
	// The earlier release's creation, in flight: the address locked, the
	// order and the slot written, not committed.
	now := clk.Now()
	old, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Rollback()
	old.MustExec(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, key)
	old.MustExec(`INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount, pay_address,
		unique_k, status, created_at, expires_at, monitor_until, updated_at, earliest_block_time)
		VALUES ('ord_old', 'old', '\x00', $1, $2, $3, 10, 10, $4, 0, 'awaiting_payment', $5, $6, $6, $5, $5)`,
		usdt.Network, usdt.Symbol, usdt.Contract, usdt.Addresses[0], now, now.Add(25*time.Hour))
	old.MustExec(`INSERT INTO amount_slots VALUES ($1, $2, $3, 10, 'ord_old', $4)`, usdt.Network, usdt.Symbol, usdt.Addresses[0],
		now.Add(25*time.Hour))
	created := make(chan *paywatch.Order, 1)
	go func() {
		o, _, err := s.Create(ctx, req("new", usdt, 10))
		if err != nil {
			t.Error(err)
		}
		created <- o
	}()
	select {
	case <-created:
		t.Fatal("a creation went ahead while an earlier release's creation held the address")
	case <-time.After(300 * time.Millisecond):
	}
	if err := old.Commit(); err != nil {
		t.Fatal(err)
	}
	if o := <-created; o == nil || o.PayAmount.Int64() != 11 {
		t.Fatalf("after the earlier release's commit: %+v, want pay amount 11", o)
	}
	// The other way round: while a creation of this release is in flight,
	// the earlier release's lock is not to be had.
	slowCreations(t, db, "slow%", 1)
	done := make(chan error, 1)
	go func() {
		_, _, err := s.Create(ctx, req("slow", usdt, 10))
		done <- err
	}()
	waitForSleep(t, db)
	var got bool
	if err := db.Get(&got, `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`, key); err != nil || got {
		t.Fatalf("the earlier release's lock was to be had during a creation (%v)", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Two addresses, which the earlier release lists the other way round:
	// it holds the second and waits for the first (a daemon of that
	// release took each address in its configured order), while a
	// creation of this release passes over the second, busy, and takes
	// the first without waiting. Neither deadlocks.
	two := *usdt
	two.Addresses = []string{usdt.Addresses[0], "0x2222222222222222222222222222222222222222"}
	keyOf := func(addr string) string { return "paywatch:slot:" + two.Network + ":" + two.Symbol + ":" + addr }
	old2, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer old2.Rollback()
	old2.MustExec(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, keyOf(two.Addresses[1]))
	s.Rand = func(n int) int { return n - 1 } // start at the second address
	slow := startCreate(t, s, req("slow-two", &two, 10))
	waitForSleep(t, db) // it holds the first address, shared
	oldDone := make(chan error, 1)
	go func() {
		_, err := old2.Exec(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, keyOf(two.Addresses[0]))
		oldDone <- err
	}()
	if o := <-slow; o == nil || o.PayAddress != two.Addresses[0] {
		t.Fatalf("with the second address busy: %+v, want an order at the first", o)
	}
	if err := <-oldDone; err != nil {
		t.Fatalf("the earlier release's creation: %v", err)
	}
}

// However many shared addresses an asset lists, a creation locks only
// those it visits: 2,000 addresses (more than a statement's target list
// holds) create as one does.
func TestCreationsOnManyAddresses(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	many := *usdt
	many.Addresses = make([]string, 2000)
	for i := range many.Addresses {
		many.Addresses[i] = fmt.Sprintf("0x%040x", i+1)
	}
	s.Rand = func(n int) int { return n - 1 }
	o, _, err := s.Create(context.Background(), req("many", &many, 10))
	if err != nil || o.PayAddress != many.Addresses[len(many.Addresses)-1] {
		t.Fatalf("%+v %v", o, err)
	}
}

// A slot committed by another creation between a creation's look-up and
// its write (here a trigger on orders writes it in the moment before)
// sends the creation round again with a fresh draw; after five such races in a row
// it answers no_unique_amount and has written nothing.
func TestASlotTakenUnderACreationSendsItRoundAgain(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	pgtest.Exec(t, db, `CREATE SEQUENCE races`)
	pgtest.Exec(t, db, `CREATE FUNCTION take_first() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF pg_trigger_depth() = 1 THEN
				PERFORM nextval('races');
				INSERT INTO amount_slots (network, asset, address, pay_amount, order_id, held_until)
				VALUES (NEW.network, NEW.asset, NEW.pay_address, NEW.pay_amount, NEW.id, 'infinity');
			END IF;
			RETURN NULL;
		END $$`)
	pgtest.Exec(t, db, `CREATE TRIGGER take_first AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION take_first()`)
	_, _, err := s.Create(context.Background(), req("raced", usdt, 10))
	if paywatch.ErrorCode(err) != paywatch.CodeNoUniqueAmount || !strings.Contains(err.Error(), "at the same moment, 5 times") {
		t.Fatalf("err = %v, want no_unique_amount after five races", err)
	}
	var races int64
	if err := db.Get(&races, `SELECT last_value FROM races`); err != nil || races != 5 {
		t.Fatalf("%d races (%v), want 5", races, err)
	}
	if n := count(t, db, "orders") + count(t, db, "amount_slots") + count(t, db, "order_events"); n != 0 {
		t.Fatalf("%d rows written", n)
	}
	// One race, then the slot is free: the second draw creates the order.
	pgtest.Exec(t, db, `CREATE OR REPLACE FUNCTION take_first() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF pg_trigger_depth() = 1 AND nextval('races') = 6 THEN
				INSERT INTO amount_slots (network, asset, address, pay_amount, order_id, held_until)
				VALUES (NEW.network, NEW.asset, NEW.pay_address, NEW.pay_amount, NEW.id, 'infinity');
			END IF;
			RETURN NULL;
		END $$`)
	o, created, err := s.Create(context.Background(), req("raced", usdt, 10))
	if err != nil || !created || o.PayAmount.Int64() != 10 {
		t.Fatalf("after one race: %+v %v %v", o, created, err)
	}
}

// A creation holds the locks of its identity, of one address and of one
// slot, however many of the asset's addresses are full: the lock table is
// the whole server's.
func TestACreationLocksOneAddressWhenOthersAreFull(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	ctx := context.Background()
	many := *usdt
	many.UniqueSlots = 1
	many.Addresses = make([]string, 300)
	for i := range many.Addresses {
		many.Addresses[i] = fmt.Sprintf("0x%040x", i+1)
	}
	for i, addr := range many.Addresses[1:] { // all full but the first
		one := many
		one.Addresses = []string{addr}
		if _, _, err := s.Create(ctx, req(fmt.Sprint("full-", i), &one, 10)); err != nil {
			t.Fatal(err)
		}
	}
	slowCreations(t, db, "slow", 1)
	s.Rand = func(n int) int { return min(n-1, 1) } // start at the second address: the first, with room, comes last
	slow := startCreate(t, s, req("slow", &many, 10))
	waitForSleep(t, db)
	var locks int
	if err := db.Get(&locks, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = (
		SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep')`); err != nil {
		t.Fatal(err)
	}
	if o := <-slow; o == nil || o.PayAddress != many.Addresses[0] {
		t.Fatalf("%+v, want an order at the only address with room", o)
	}
	if locks != 3 {
		t.Fatalf("the creation held %d advisory locks, want 3 (its external_id, one address, one slot)", locks)
	}
}
