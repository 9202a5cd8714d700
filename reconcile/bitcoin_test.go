package reconcile_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math/big"
	"slices"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

// btcEnv is the whole pipeline on a real btcd regtest node: orders with an
// address each, the scanner, the reconciler and the operator.
type btcEnv struct {
	*fixture
	node    *btctest.Node
	network *paywatch.Network
	asset   *paywatch.Asset
	scanner *scan.Scanner
	source  *bitcoin.Source
	memp    *bitcoin.Mempool
}

func newBTCEnv(t *testing.T) *btcEnv {
	t.Helper()
	return newBTCEnvOn(t, btctest.New(t))
}

// newBTCEnvOn is newBTCEnv on a node the test started.
func newBTCEnvOn(t *testing.T, node *btctest.Node) *btcEnv {
	t.Helper()
	db := pgtest.New(t)
	clk := reconciletest.NewClock(time.Now())
	asset := &paywatch.Asset{Network: "btc", Symbol: "BTC", Native: true, Decimals: 8, Mode: paywatch.ModePerOrder,
		XPub: reconciletest.VPub, ScriptType: bitcoin.P2WPKH, Dust: big.NewInt(546), GapLimit: 20}
	n := &paywatch.Network{Name: "btc", Family: paywatch.FamilyBitcoin, Chain: "regtest", RPCURLs: []string{node.URL},
		Confirmations: 2, PollInterval: 50 * time.Millisecond, StartBlock: node.Height(), Assets: []*paywatch.Asset{asset}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	wallets := reconciletest.Wallets(t)
	store := orders.NewStore(db, window, wallets)
	watch, err := bitcoin.NewWatchSet("regtest", nil, map[string]*bitcoin.Deriver{reconciletest.VPub: wallets[reconciletest.VPub]}, store)
	if err != nil {
		t.Fatal(err)
	}
	src, err := bitcoin.NewSource(n, node.Credentials, watch, log)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, db: db, clock: clk, store: store, rec: reconcile.New(db, log, grace, 8*24*time.Hour),
		op: reconcile.NewOperator(db)}
	f.store.Now, f.rec.Now, f.op.Now = clk.Now, clk.Now, clk.Now
	scans := scan.NewStore(db)
	scans.Now = clk.Now
	f.rec.Lookups = map[string]reconcile.TxLookup{"btc": src}
	f.rec.Record = scans.Record
	memp := bitcoin.NewMempool(src, db, log)
	memp.Now = clk.Now
	e := &btcEnv{fixture: f, node: node, network: n, asset: asset, scanner: scan.NewScanner(n, src, scans, log), source: src, memp: memp}
	t.Cleanup(func() {
		e.sync()
		f.check()
	})
	return e
}

func (e *btcEnv) order(sats int64) *paywatch.Order {
	e.t.Helper()
	e.n++
	o, _, err := e.store.Create(context.Background(), orders.CreateRequest{ExternalID: "btc-" + big.NewInt(int64(e.n)).String(),
		Network: e.network, Asset: e.asset, Amount: big.NewInt(sats), ExpiresIn: expires, Actor: "shop"})
	if err != nil {
		e.t.Fatal(err)
	}
	return o
}

// sync scans to the head and runs a reconciler pass.
func (e *btcEnv) sync() {
	e.t.Helper()
	for i := 0; ; i++ {
		caughtUp, err := e.scanner.Step(context.Background())
		if err != nil {
			e.t.Fatal(err)
		}
		if caughtUp || i > 1000 {
			break
		}
	}
	e.pass()
}

// mempool reads the node's mempool once.
func (e *btcEnv) mempool() {
	e.t.Helper()
	if _, err := e.memp.Step(context.Background()); err != nil {
		e.t.Fatal(err)
	}
}

// get reads an order as the API shows it.
func (e *btcEnv) get(o *paywatch.Order) *paywatch.Order {
	e.t.Helper()
	got, err := e.store.Get(context.Background(), o.ID)
	if err != nil {
		e.t.Fatal(err)
	}
	return got
}

// statusChanges lists an order's status changes as "from>to".
func (e *btcEnv) statusChanges(o *paywatch.Order) []string {
	e.t.Helper()
	evs, err := e.store.Events(context.Background(), o.ID)
	if err != nil {
		e.t.Fatal(err)
	}
	var moves []string
	for _, ev := range evs {
		if ev.Type == "status_changed" {
			moves = append(moves, string(ev.FromStatus)+">"+string(ev.ToStatus))
		}
	}
	return moves
}

// An order paid to its own address: confirming once mined, settled after
// the confirmations; a short payment is disputed once the order expires.
func TestBitcoinPaymentSettles(t *testing.T) {
	e := newBTCEnv(t)
	e.sync()
	paid := e.order(150_000)
	short := e.order(200_000)
	e.node.Pay(btctest.Output{Address: paid.PayAddress, Sats: 150_000}, btctest.Output{Address: short.PayAddress, Sats: 199_000})
	e.node.Mine(1)
	e.sync()
	e.expect(paid, paywatch.StatusConfirming, "")
	e.expect(short, paywatch.StatusConfirming, "") // an address of its own: a top-up may come until expiry
	e.node.Mine(1)
	e.sync()
	e.expect(paid, paywatch.StatusSettled, "")
	e.clock.Advance(expires + time.Minute)
	e.sync()
	e.expect(short, paywatch.StatusDisputed, paywatch.ReasonUnderpaid)
	if got := e.balance("settled:btc:BTC"); got != "150000" {
		t.Fatalf("settled %s", got)
	}
}

// A short payment topped up before expiry settles: outputs of one
// transaction, and of two, to one order's address are summed.
func TestBitcoinTopUp(t *testing.T) {
	e := newBTCEnv(t)
	e.sync()
	o := e.order(300_000)
	e.node.Pay(btctest.Output{Address: o.PayAddress, Sats: 100_000}, btctest.Output{Address: o.PayAddress, Sats: 50_000})
	e.node.Mine(2)
	e.sync()
	e.expect(o, paywatch.StatusConfirming, "")
	e.node.Pay(btctest.Output{Address: o.PayAddress, Sats: 150_000})
	e.node.Mine(2)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
	got, _ := e.store.Get(context.Background(), o.ID)
	if len(got.Transfers) != 3 || got.ReceivedAmount.Int64() != 300_000 {
		t.Fatalf("transfers %+v", got.Transfers)
	}
}

// A customer's txid given with "I've paid" is looked up on the node and
// recorded before the scanner reaches its block; the scanner then sees the
// same outputs, recorded once.
func TestBitcoinClaimFoundBeforeTheScanner(t *testing.T) {
	e := newBTCEnv(t)
	e.sync()
	o := e.order(120_000)
	txid := e.node.Pay(btctest.Output{Address: o.PayAddress, Sats: 120_000})
	e.node.Mine(1)
	if _, err := e.store.MarkPaid(context.Background(), o.ID, txid, "shop"); err != nil {
		t.Fatal(err)
	}
	if n, err := e.rec.LookUpHints(context.Background()); err != nil || n != 1 {
		t.Fatalf("look-ups found %d (%v)", n, err)
	}
	e.pass()
	e.expect(o, paywatch.StatusConfirming, "")
	e.node.Mine(1)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
	var n int
	if err := e.db.Get(&n, `SELECT count(*) FROM transfers`); err != nil || n != 1 {
		t.Fatalf("%d transfers (%v)", n, err)
	}
}

// A payment is "detected" as soon as it is in the node's mempool: the order
// is confirming with 0 confirmations and the payment listed as in the
// mempool, nothing received or settled; once mined it is the same payment,
// listed once, and the order settles after its confirmations with no
// step back on its timeline.
func TestBitcoinPaymentDetected(t *testing.T) {
	e := newBTCEnv(t)
	e.sync()
	o := e.order(150_000)
	txid := e.node.Pay(btctest.Output{Address: o.PayAddress, Sats: 150_000})
	e.mempool()
	e.pass()
	got := e.get(o)
	if got.Status != paywatch.StatusConfirming || got.ReceivedAmount.Sign() != 0 || len(got.Transfers) != 1 ||
		got.Transfers[0].State != paywatch.TransferMempool || got.Transfers[0].TxHash != txid || got.Transfers[0].Confirmations != 0 {
		t.Fatalf("after the mempool read: %s, received %s, transfers %+v", got.Status, got.ReceivedAmount, got.Transfers)
	}
	if evs := e.events(o); !slices.Contains(evs, "payment_detected") {
		t.Fatalf("timeline %v", evs)
	}
	if got := e.balance("receivable:btc:BTC") + e.balance("settled:btc:BTC"); got != "00" {
		t.Fatalf("a mempool payment reached the ledger: %s", got)
	}

	// Mined: the mempool read sees it gone before the scanner has the
	// block; the order does not step back meanwhile.
	e.node.Mine(1)
	e.mempool()
	e.pass()
	e.expect(o, paywatch.StatusConfirming, "")
	e.sync()
	got = e.get(o)
	if len(got.Transfers) != 1 || got.Transfers[0].State != paywatch.TransferSeen || got.Transfers[0].Confirmations != 1 ||
		got.ReceivedAmount.Int64() != 150_000 {
		t.Fatalf("once mined: transfers %+v, received %s", got.Transfers, got.ReceivedAmount)
	}
	e.node.Mine(1)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
	if moves := e.statusChanges(o); !slices.Equal(moves, []string{"awaiting_payment>confirming", "confirming>settled"}) {
		t.Fatalf("status changes %v", moves)
	}
	var reason string
	if err := e.db.Get(&reason, `SELECT left_reason FROM mempool_transfers WHERE tx_hash = $1`, txid); err != nil || reason != "mined" {
		t.Fatalf("mempool sighting ended as %q (%v)", reason, err)
	}
}

// A payment spending several coins is tracked by every one of them, across
// a restart of the watcher (which reads what it tracks from the database):
// a replacement spending only its second coin still withdraws it as
// replaced.
func TestBitcoinReplacementOfOneOfSeveralInputsWithdrawsThePayment(t *testing.T) {
	e := newBTCEnv(t)
	o := e.order(150_000)
	a, b := e.node.Coin(100_000), e.node.Coin(100_000)
	e.sync()
	first, err := e.node.SpendCoins([]*btctest.Coin{a, b}, 1_000, btctest.Output{Address: o.PayAddress, Sats: 150_000})
	if err != nil {
		t.Fatal(err)
	}
	e.mempool()
	e.pass()
	e.expect(o, paywatch.StatusConfirming, "")
	var spends []string
	if err := e.db.Select(&spends, `SELECT unnest(spends) FROM mempool_transfers WHERE tx_hash = $1`, first); err != nil {
		t.Fatal(err)
	}
	want := []string{a.OutPoint.String(), b.OutPoint.String()}
	slices.Sort(spends)
	slices.Sort(want)
	if !slices.Equal(spends, want) {
		t.Fatalf("the sighting stored spends %q, want each input's outpoint %q", spends, want)
	}

	// The watcher restarts, then the customer spends the second coin
	// elsewhere with a higher fee.
	e.memp = bitcoin.NewMempool(e.source, e.db, slog.New(slog.NewTextHandler(io.Discard, nil)))
	e.memp.Now = e.clock.Now
	replacement, err := e.node.Spend(b, 30_000, btctest.Output{Address: "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080", Sats: 60_000})
	if err != nil {
		t.Fatalf("the node refused the replacement: %v", err)
	}
	if e.node.InMempool(first) {
		t.Fatal("the payment is still in the mempool: the test tests nothing")
	}
	e.mempool()
	e.pass()
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	var why, by string
	if err := e.db.QueryRow(`SELECT detail->>'why', coalesce(detail->>'replaced_by', '') FROM order_events
		WHERE order_id = $1 AND type = 'payment_withdrawn'`, o.ID).Scan(&why, &by); err != nil {
		t.Fatal(err)
	}
	if why != "replaced" || by != replacement {
		t.Fatalf("withdrawn as %q by %q, want replaced by %s", why, by, replacement)
	}
}

// A replaced (RBF) payment leaves the "detected" view: the order goes back
// to awaiting payment and its timeline says the payment was replaced, and
// by what. A replacement that still pays the order (a fee bump) keeps it
// confirming.
func TestBitcoinReplacedPaymentWithdrawn(t *testing.T) {
	e := newBTCEnv(t)
	o := e.order(150_000)
	bumped := e.order(90_000)
	coin, coin2 := e.node.Coin(500_000), e.node.Coin(500_000)
	e.sync()
	first, err := e.node.Spend(coin, 1_000, btctest.Output{Address: o.PayAddress, Sats: 150_000})
	if err != nil {
		t.Fatal(err)
	}
	slow, err := e.node.Spend(coin2, 1_000, btctest.Output{Address: bumped.PayAddress, Sats: 90_000})
	if err != nil {
		t.Fatal(err)
	}
	e.mempool()
	e.pass()
	e.expect(o, paywatch.StatusConfirming, "")
	e.expect(bumped, paywatch.StatusConfirming, "")

	// The customer replaces the payment with one to themselves, and the
	// other bumps the fee of theirs.
	elsewhere := "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"
	replacement, err := e.node.Spend(coin, 20_000, btctest.Output{Address: elsewhere, Sats: 150_000})
	if err != nil {
		t.Fatalf("the node refused the replacement: %v", err)
	}
	fast, err := e.node.Spend(coin2, 20_000, btctest.Output{Address: bumped.PayAddress, Sats: 90_000})
	if err != nil {
		t.Fatalf("the node refused the fee bump: %v", err)
	}
	if e.node.InMempool(first) || e.node.InMempool(slow) {
		t.Fatal("the replaced transactions are still in the mempool: the test tests nothing")
	}
	e.mempool()
	e.pass()
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	e.expect(bumped, paywatch.StatusConfirming, "")
	var detail struct {
		TxHash     string `json:"tx_hash"`
		Why        string `json:"why"`
		ReplacedBy string `json:"replaced_by"`
	}
	evs, err := e.store.Events(context.Background(), o.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Type == "payment_withdrawn" {
			_ = json.Unmarshal(ev.Detail, &detail)
		}
	}
	if detail.TxHash != first || detail.Why != "replaced" || detail.ReplacedBy != replacement {
		t.Fatalf("withdrawal on the timeline: %+v", detail)
	}
	if got := e.get(o); len(got.Transfers) != 0 {
		t.Fatalf("the replaced payment is still listed: %+v", got.Transfers)
	}
	if got := e.get(bumped); len(got.Transfers) != 1 || got.Transfers[0].TxHash != fast {
		t.Fatalf("the fee bump is not the payment listed: %+v", got.Transfers)
	}
	if moves := e.statusChanges(bumped); !slices.Equal(moves, []string{"awaiting_payment>confirming"}) {
		t.Fatalf("the fee-bumped order moved: %v", moves)
	}

	// Mined: the replacement pays nothing watched; the bump settles.
	e.node.Mine(2)
	e.mempool()
	e.sync()
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	e.expect(bumped, paywatch.StatusSettled, "")
	e.clock.Advance(expires + time.Minute)
	e.sync()
	e.expect(o, paywatch.StatusExpired, "")
}

// A reorg made with invalidateblock takes the payment's block away before
// it is confirmed: nothing settles on the orphaned block, the payment
// goes back to the mempool (detected again) and, mined again in the new
// chain, is the same payment counted once.
func TestBitcoinReorgBeforeSettlement(t *testing.T) {
	e := newBTCEnv(t)
	e.sync()
	o := e.order(150_000)
	txid := e.node.Pay(btctest.Output{Address: o.PayAddress, Sats: 150_000})
	e.node.Mine(1)
	e.mempool()
	e.sync()
	e.expect(o, paywatch.StatusConfirming, "")
	var oldHash string
	if err := e.db.Get(&oldHash, `SELECT block_hash FROM transfers WHERE tx_hash = $1`, txid); err != nil {
		t.Fatal(err)
	}
	e.node.Invalidate(e.node.Height())
	if !e.node.InMempool(txid) {
		t.Fatal("the payment did not go back to the mempool")
	}
	e.mempool()
	e.node.Mine(1) // the fork: as long as the old chain, no confirmation yet
	e.sync()
	e.expect(o, paywatch.StatusConfirming, "")
	if got := e.balance("settled:btc:BTC"); got != "0" {
		t.Fatalf("settled %s", got)
	}
	e.node.Mine(1)
	e.mempool()
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
	var rows []struct {
		Hash  string `db:"block_hash"`
		Block uint64 `db:"block_number"`
		State string `db:"state"`
	}
	if err := e.db.Select(&rows, `SELECT block_hash, block_number, state FROM transfers WHERE tx_hash = $1`, txid); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Hash == oldHash || rows[0].State != "confirmed" {
		t.Fatalf("the payment after the reorg: %+v (orphaned block %s)", rows, oldHash)
	}
	if canonical, err := e.node.H.Client.GetBlockHash(int64(rows[0].Block)); err != nil || canonical.String() != rows[0].Hash {
		t.Fatalf("settled on block %s, the node's is %v (%v)", rows[0].Hash, canonical, err)
	}
	if got := e.balance("settled:btc:BTC"); got != "150000" {
		t.Fatalf("settled %s", got)
	}
}

// The money-safety rules hold on Bitcoin: a payment mined before an order
// existed never pays it — not by its address (the next address to be
// handed out, paid ahead), not by a claim of its txid — and waits in the
// inbox; a payment broadcast in time and mined after the order was created
// does pay it.
func TestBitcoinPaymentMinedBeforeTheOrder(t *testing.T) {
	e := newBTCEnv(t)
	e.sync()
	next, err := e.store.Addresses.Address(reconciletest.VPub, 0) // the address the next order gets
	if err != nil {
		t.Fatal(err)
	}
	early := e.node.Pay(btctest.Output{Address: next, Sats: 150_000})
	e.node.Mine(1)
	e.mempool()
	e.sync()
	e.clock.Advance(time.Second)
	o := e.order(150_000)
	if o.PayAddress != next {
		t.Fatalf("the order got %s, not the address paid ahead %s", o.PayAddress, next)
	}
	e.node.Mine(2)
	e.mempool()
	e.sync()
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	if _, err := e.store.MarkPaid(context.Background(), o.ID, early, "shop"); err != nil {
		t.Fatal(err)
	}
	e.sync()
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	if why := e.rejection(o); why == "" {
		t.Fatalf("the claim of a payment mined before the order was not rejected: %v", e.events(o))
	}
	var inbox int
	if err := e.db.Get(&inbox, `SELECT count(*) FROM transfers WHERE tx_hash = $1 AND order_id IS NULL`, early); err != nil || inbox != 1 {
		t.Fatalf("the early payment is not in the inbox (%d, %v)", inbox, err)
	}

	// Paid now, in time: it pays.
	e.node.Pay(btctest.Output{Address: o.PayAddress, Sats: 150_000})
	e.mempool()
	e.sync()
	e.expect(o, paywatch.StatusConfirming, "")
	e.node.Mine(2)
	e.mempool()
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
}
