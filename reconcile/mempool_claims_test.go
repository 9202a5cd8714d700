package reconcile_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/btcsuite/btcd/chaincfg/chainhash"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
	"github.com/paywatch/paywatch/reconcile"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

// README: "A reconciler pass ties each sighting to the one order it could be
// meant for (... seen after the order was created and before it expired;
// never dust)": a payment seen in the mempool before its order was created,
// and a dust output completing an order's amount, move no order to
// confirming; the same amount in outputs that are not dust does.
func TestMempoolSightingBeforeTheOrderOrDustMovesNoOrder(t *testing.T) {
	e := newBTCEnv(t)
	e.sync()

	// Paid to the address the next order gets, seen before that order exists.
	next, err := e.store.Addresses.Address(reconciletest.VPub, 0)
	if err != nil {
		t.Fatal(err)
	}
	early := e.node.Pay(btctest.Output{Address: next, Sats: 150_000})
	e.mempool()
	e.pass()
	e.clock.Advance(time.Second)
	o := e.order(150_000)
	if o.PayAddress != next {
		t.Fatalf("the order got %s, not the address paid ahead %s", o.PayAddress, next)
	}
	e.mempool()
	e.pass()
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	if evs := e.events(o); slices.Contains(evs, "payment_detected") {
		t.Fatalf("a payment seen before the order was created was detected for it: timeline %v", evs)
	}
	if n := e.sightings(early, ""); n != 1 {
		t.Fatalf("the early payment was not recorded as seen (%d sightings): the test tests nothing", n)
	}

	// The whole amount, part of it in a dust output (under 546 sats).
	dusty := e.order(100_000)
	whole := e.order(100_000)
	e.clock.Advance(time.Second)
	dust := e.node.Pay(btctest.Output{Address: dusty.PayAddress, Sats: 99_700}, btctest.Output{Address: dusty.PayAddress, Sats: 300})
	e.node.Pay(btctest.Output{Address: whole.PayAddress, Sats: 99_000}, btctest.Output{Address: whole.PayAddress, Sats: 1_000})
	e.mempool()
	e.pass()
	e.expect(whole, paywatch.StatusConfirming, "") // the same sum without dust is detected
	e.expect(dusty, paywatch.StatusAwaitingPayment, "")
	var flags pq.StringArray
	var orderID *string
	if err := e.db.QueryRow(`SELECT flags, order_id FROM mempool_transfers WHERE tx_hash = $1 AND amount = 300`, dust).Scan(&flags, &orderID); err != nil {
		t.Fatalf("the dust output was not recorded: %v", err)
	}
	if !slices.Equal(flags, []string{"dust"}) || orderID != nil {
		t.Fatalf("the dust output is recorded flagged %v and tied to order %v, want flagged dust and tied to none", flags, orderID)
	}
}

// sightings counts the mempool sightings of a transaction tied to an order
// ("" for none).
func (e *btcEnv) sightings(txid, orderID string) int {
	e.t.Helper()
	var n int
	if err := e.db.Get(&n, `SELECT count(*) FROM mempool_transfers WHERE tx_hash = $1
		AND coalesce(order_id, '') = $2`, txid, orderID); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// README: "dropped (missing for a block and a minute: a node restarting or a
// failover withdraws nothing; the wait is counted from the scanner's height
// when a failover lands on a node behind)": the mempool watcher fails over
// to a node two blocks behind the scanner, which has not seen the payment;
// the payment is not withdrawn when a minute has passed, only once the
// scanner has passed a block beyond its own height then.
func TestMempoolDropAfterFailoverToANodeBehindWaitsFromTheScannerHeight(t *testing.T) {
	if reconcile.DroppedAfter != time.Minute {
		t.Fatalf("DroppedAfter is %s, the README says a minute", reconcile.DroppedAfter)
	}
	e := newBTCEnv(t)
	behind := btctest.NewPeer(t, e.node)
	behind.Disconnect(e.node)
	e.node.Mine(2)
	e.sync()
	scanned := e.node.Height()
	if behind.Height() != scanned-2 {
		t.Fatalf("the second node is at %d, the first at %d: want it 2 blocks behind", behind.Height(), scanned)
	}

	// A mempool watcher with the two nodes, the first through a proxy that
	// can play it down. One certificate file trusts both nodes.
	proxy := btctest.NewProxy(t, e.node)
	var pem []byte
	for _, n := range []*btctest.Node{e.node, behind} {
		b, err := os.ReadFile(n.Credentials.CertFile)
		if err != nil {
			t.Fatal(err)
		}
		pem = append(pem, b...)
	}
	cred := e.node.Credentials
	cred.CertFile = filepath.Join(t.TempDir(), "nodes.pem")
	if err := os.WriteFile(cred.CertFile, pem, 0o600); err != nil {
		t.Fatal(err)
	}
	network := *e.network
	network.RPCURLs = []string{proxy.URL, behind.URL}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	watch, err := bitcoin.NewWatchSet("regtest", nil, reconciletest.Wallets(t), e.store)
	if err != nil {
		t.Fatal(err)
	}
	src, err := bitcoin.NewSource(&network, cred, watch, log)
	if err != nil {
		t.Fatal(err)
	}
	memp := bitcoin.NewMempool(src, e.db, log)
	memp.Now = e.clock.Now
	step := func() {
		t.Helper()
		if _, err := memp.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
	}

	o := e.order(150_000)
	e.clock.Advance(time.Second)
	txid := e.node.Pay(btctest.Output{Address: o.PayAddress, Sats: 150_000})
	step()
	e.pass()
	e.expect(o, paywatch.StatusConfirming, "")

	// The first node goes down: the watcher fails over to the node behind,
	// whose mempool does not hold the payment.
	proxy.Down.Store(true)
	proxy.Drop()
	step()
	var missingAt *int64
	if err := e.db.Get(&missingAt, `SELECT missing_at_height FROM mempool_transfers WHERE tx_hash = $1`, txid); err != nil {
		t.Fatal(err)
	}
	if missingAt == nil {
		t.Fatal("the watcher on the node behind did not record the payment as missing: the test tests nothing")
	}
	if uint64(*missingAt) != scanned {
		t.Errorf("the payment is recorded missing at height %d, want the scanner's %d (the node read is at %d)",
			*missingAt, scanned, behind.Height())
	}
	e.clock.Advance(2 * reconcile.DroppedAfter)
	e.pass()
	e.expect(o, paywatch.StatusConfirming, "")
	if evs := e.events(o); slices.Contains(evs, "payment_withdrawn") {
		t.Fatalf("the payment was withdrawn before the scanner passed a block: timeline %v", evs)
	}

	// A block without the payment, scanned: now it is dropped.
	if _, err := e.node.H.GenerateAndSubmitBlock(nil, -1, time.Time{}); err != nil {
		t.Fatal(err)
	}
	e.sync()
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	evs, err := e.store.Events(context.Background(), o.ID)
	if err != nil {
		t.Fatal(err)
	}
	why := ""
	for _, ev := range evs {
		if ev.Type == "payment_withdrawn" {
			var d struct {
				Why string `json:"why"`
			}
			_ = json.Unmarshal(ev.Detail, &d)
			why = d.Why
		}
	}
	if why != "dropped" {
		t.Fatalf("once a block passed the payment was withdrawn as %q, want dropped: timeline %v", why, e.events(o))
	}
}

// README: "A node keeps no index of transactions unless it runs with
// `txindex` (btcd `--txindex`, Core `-txindex=1`): without it a customer's
// txid is found when the scanner reaches its block rather than at once": on
// a btcd without --txindex, the look-up of a customer's mined txid finds
// nothing (and is no error, and rejects nothing); once the scanner reaches
// the block the payment is matched and the claim linked.
func TestBitcoinClaimWithoutTxindexFoundWhenTheScannerReachesItsBlock(t *testing.T) {
	e := newBTCEnvOn(t, btctest.NewWithoutTxIndex(t))
	e.sync()
	o := e.order(120_000)
	txid := e.node.Pay(btctest.Output{Address: o.PayAddress, Sats: 120_000})
	e.node.Mine(1)
	hash, err := chainhash.NewHashFromStr(txid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.node.H.Client.GetRawTransaction(hash); err == nil {
		t.Fatal("the node finds a mined transaction by its txid: it keeps an index of transactions, the test tests nothing")
	}

	if found, err := e.source.LookupTx(context.Background(), txid); err != nil || len(found) != 0 {
		t.Fatalf("the look-up on a node without txindex: %+v, %v; want nothing found and no error", found, err)
	}
	if _, err := e.store.MarkPaid(context.Background(), o.ID, txid, "shop"); err != nil {
		t.Fatal(err)
	}
	if n, err := e.rec.LookUpHints(context.Background()); err != nil || n != 0 {
		t.Fatalf("the claim's look-up found %d (%v), want nothing at once without txindex", n, err)
	}
	e.pass()
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	hintState := func() string {
		t.Helper()
		var s string
		if err := e.db.Get(&s, `SELECT hint_state FROM orders WHERE id = $1`, o.ID); err != nil {
			t.Fatal(err)
		}
		return s
	}
	var recorded int
	if err := e.db.Get(&recorded, `SELECT count(*) FROM transfers`); err != nil || recorded != 0 {
		t.Fatalf("%d transfers recorded before the scanner reached the block (%v)", recorded, err)
	}
	if s := hintState(); s != "pending" {
		t.Fatalf("the claim is %s before the scanner reached its block, want pending", s)
	}

	e.sync()
	got := e.get(o)
	if got.Status != paywatch.StatusConfirming || len(got.Transfers) != 1 || got.Transfers[0].TxHash != txid {
		t.Fatalf("once the scanner reached the block: %s, transfers %+v; want confirming on %s", got.Status, got.Transfers, txid)
	}
	if s := hintState(); s != "linked" {
		t.Fatalf("the claim is %s once the scanner reached its block, want linked", s)
	}
}

// Orders are locked before what is tied to them, here as everywhere:
// tying a mempool sighting marks its order (has_transfers), so the mempool
// step locks the orders first. It holds the sightings' turn meanwhile, so
// it waits for no order: one another transaction holds keeps its sighting
// for the next pass. That transaction, holding the lower order and then
// taking the higher one the pass tied a sighting to, goes through.
func TestMempoolMatchLocksOrdersFirstSkippingThoseHeldElsewhere(t *testing.T) {
	f := newFixture(t)
	lo, hi := f.order(btc, 100_000), f.order(btc, 200_000)
	if hi.ID < lo.ID {
		lo, hi = hi, lo
	}
	f.clock.Advance(time.Second)
	f.sight(hi, hi.PayAddress, hi.PayAmount.Int64(), "c-hi")
	f.sight(lo, lo.PayAddress, lo.PayAmount.Int64(), "c-lo")
	other := f.holdOrder(lo.ID)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.rec.Pass(ctx); err != nil {
		t.Fatalf("a pass while another transaction holds an order with a sighting: %v", err)
	}
	f.expect(hi, paywatch.StatusConfirming, "")
	f.expect(lo, paywatch.StatusAwaitingPayment, "")
	if _, err := other.Exec(`SELECT 1 FROM orders WHERE id = $1 FOR NO KEY UPDATE`, hi.ID); err != nil {
		t.Fatalf("the other transaction, taking the higher order after the lower: %v", err)
	}
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	f.pass()
	f.expect(lo, paywatch.StatusConfirming, "")
}
