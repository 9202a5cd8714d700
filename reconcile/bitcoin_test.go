package reconcile_test

import (
	"context"
	"io"
	"log/slog"
	"math/big"
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
}

func newBTCEnv(t *testing.T) *btcEnv {
	t.Helper()
	node := btctest.New(t)
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
	e := &btcEnv{fixture: f, node: node, network: n, asset: asset, scanner: scan.NewScanner(n, src, scans, log), source: src}
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
