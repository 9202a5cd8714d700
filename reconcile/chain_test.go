package reconcile_test

import (
	"context"
	"io"
	"log/slog"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/evm"
	"github.com/paywatch/paywatch/chains/evm/evmtest"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/ledger"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

// chainEnv is the whole pipeline on the simulated EVM chain: orders, the
// scanner, the reconciler and the operator, sharing one clock.
type chainEnv struct {
	*fixture
	chain   *evmtest.Chain
	token   *evmtest.Token
	network *paywatch.Network
	asset   *paywatch.Asset
	scanner *scan.Scanner
	shop    common.Address
}

func newChainEnv(t *testing.T) *chainEnv {
	t.Helper()
	c := evmtest.New(t)
	tok := c.DeployToken("Tether USD", "USDT", 6)
	db := pgtest.New(t)
	clk := reconciletest.NewClock(time.Now())
	shopAddr := common.HexToAddress(shop)
	asset := &paywatch.Asset{Network: "devnet", Symbol: "USDT", Contract: tok.Address.Hex(), Decimals: 6,
		Mode: paywatch.ModeShared, Addresses: []string{shopAddr.Hex()}, UniqueStep: big.NewInt(1), UniqueSlots: 100, Dust: new(big.Int)}
	n := &paywatch.Network{Name: "devnet", Family: paywatch.FamilyEVM, RPCURLs: []string{c.URL}, ChainID: evmtest.ChainID,
		Confirmations: 3, StartBlock: c.Head(), PollInterval: time.Second, Assets: []*paywatch.Asset{asset}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	src, err := evm.NewSource(n, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	f := &fixture{t: t, db: db, clock: clk, store: orders.NewStore(db, window, nil),
		rec: reconcile.New(db, log, grace, 8*24*time.Hour), op: reconcile.NewOperator(db)}
	f.store.Now, f.rec.Now, f.op.Now = clk.Now, clk.Now, clk.Now
	f.store.Rand = reconciletest.FirstSlot
	scans := scan.NewStore(db)
	e := &chainEnv{fixture: f, chain: c, token: tok, network: n, asset: asset,
		scanner: scan.NewScanner(n, src, scans, log), shop: shopAddr}
	f.rec.Lookups = map[string]reconcile.TxLookup{"devnet": src}
	f.rec.Record = scans.Record
	t.Cleanup(func() {
		e.sync()
		f.check()
	})
	return e
}

func (e *chainEnv) order(units int64) *paywatch.Order {
	e.t.Helper()
	e.n++
	o, _, err := e.store.Create(context.Background(), orders.CreateRequest{ExternalID: "chain-" + big.NewInt(int64(e.n)).String(),
		Network: e.network, Asset: e.asset, Amount: big.NewInt(units), ExpiresIn: expires, Actor: "shop"})
	if err != nil {
		e.t.Fatal(err)
	}
	return o
}

// payOnChain transfers units to the shop and mines the block.
func (e *chainEnv) payOnChain(units int64) common.Hash {
	h := e.token.Transfer(e.chain.Payer, e.shop, big.NewInt(units))
	e.chain.Mine(1)
	return h
}

// sync scans to the head, has the recorded transfers verified (as the
// scanner's Run does behind it) and runs a reconciler pass.
func (e *chainEnv) sync() {
	e.t.Helper()
	for i := 0; ; i++ {
		caughtUp, err := e.scanner.Step(context.Background())
		if err != nil {
			e.t.Fatal(err)
		}
		if caughtUp || i > 100 {
			break
		}
	}
	if _, err := e.scanner.VerifyPending(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.pass()
}

// later moves both the clock and the chain's block times forward.
func (e *chainEnv) later(d time.Duration) {
	e.clock.Advance(d)
	if err := e.chain.Backend.AdjustTime(d); err != nil {
		e.t.Fatal(err)
	}
}

func TestChainExactPaymentSettles(t *testing.T) {
	e := newChainEnv(t)
	o := e.order(12_500_000)
	e.payOnChain(12_500_000)
	e.sync()
	e.expect(o, paywatch.StatusConfirming, "")
	got, _ := e.store.Get(context.Background(), o.ID)
	if len(got.Transfers) != 1 || got.Transfers[0].Confirmations != 1 || got.ReceivedAmount.Int64() != 12_500_000 {
		t.Fatalf("order transfers %+v", got.Transfers)
	}
	e.chain.Mine(2)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
	if b := e.balance("settled:devnet:USDT"); b != "12500000" {
		t.Fatalf("settled %s", b)
	}
}

func TestChainUnderAndOverpaidByHint(t *testing.T) {
	e := newChainEnv(t)
	under := e.order(20_000_000)
	over := e.order(30_000_000)
	h1 := e.payOnChain(19_000_000) // an exchange took a fee: matches no amount
	h2 := e.payOnChain(31_000_000)
	e.chain.Mine(3)
	e.sync()
	e.expect(under, paywatch.StatusAwaitingPayment, "")
	ctx := context.Background()
	e.store.MarkPaid(ctx, under.ID, h1.Hex(), "shop")
	e.store.MarkPaid(ctx, over.ID, h2.Hex(), "shop")
	e.sync()
	e.expect(under, paywatch.StatusDisputed, paywatch.ReasonUnderpaid)
	e.expect(over, paywatch.StatusDisputed, paywatch.ReasonOverpaid)
}

func TestChainLatePaymentAndHeldSlot(t *testing.T) {
	e := newChainEnv(t)
	first := e.order(10_000_000)
	e.later(expires + time.Minute)
	e.sync()
	e.expect(first, paywatch.StatusExpired, "")
	// A newer order for the same amount must not draw the expired one's
	// amount: a late payer of the first would settle it.
	second := e.order(10_000_000)
	if second.PayAmount.Cmp(first.PayAmount) == 0 {
		t.Fatal("the expired order's slot was handed out again inside its monitoring window")
	}
	e.payOnChain(10_000_000) // the first customer pays late
	e.chain.Mine(3)
	e.sync()
	e.expect(first, paywatch.StatusDisputed, paywatch.ReasonLatePayment)
	e.expect(second, paywatch.StatusAwaitingPayment, "")
}

func TestChainNoPaymentFoundThenPaid(t *testing.T) {
	e := newChainEnv(t)
	o, _, err := e.store.Create(context.Background(), orders.CreateRequest{ExternalID: "chain-long",
		Network: e.network, Asset: e.asset, Amount: big.NewInt(5_000_000), ExpiresIn: grace + time.Hour, Actor: "shop"})
	if err != nil {
		t.Fatal(err)
	}
	e.store.MarkPaid(context.Background(), o.ID, "", "shop")
	e.later(grace + time.Minute)
	e.sync()
	e.expect(o, paywatch.StatusDisputed, paywatch.ReasonNoPaymentFound)
	e.payOnChain(5_000_000)
	e.chain.Mine(3)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
}

func TestChainReorgUndoesTheMatch(t *testing.T) {
	e := newChainEnv(t)
	o := e.order(7_000_000)
	e.payOnChain(7_000_000)
	e.chain.Mine(3)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
	e.chain.Reorg(5, 1, false, nil) // deeper than the confirmations: the payment is gone
	e.sync()
	e.expect(o, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment)
	events, _ := e.store.Events(context.Background(), o.ID)
	var types []string
	for _, ev := range events {
		types = append(types, ev.Type)
	}
	if !strings.Contains(strings.Join(types, ","), "transfer_orphaned,status_changed") {
		t.Fatalf("timeline after the reorg: %v", types)
	}
	for _, acct := range []string{"settled:devnet:USDT", "order:" + o.ID, "wallet:devnet:" + e.shop.Hex()} {
		if b := e.balance(acct); b != "0" {
			t.Fatalf("%s = %s after the reorg", acct, b)
		}
	}
	var reversals, unsettlements int
	_ = e.db.Get(&reversals, `SELECT count(*) FROM ledger_entries WHERE kind = 'reversal'`)
	_ = e.db.Get(&unsettlements, `SELECT count(*) FROM ledger_entries WHERE kind = 'unsettlement' AND order_id = $1`, o.ID)
	if reversals != 2 || unsettlements != 1 {
		t.Fatalf("%d reversing entries and %d unsettlements, want 2 (receipt, attribution) and 1 (the settlement)", reversals, unsettlements)
	}
}

func TestChainReorgWhileConfirming(t *testing.T) {
	e := newChainEnv(t)
	o := e.order(8_000_000)
	e.payOnChain(8_000_000)
	e.sync()
	e.expect(o, paywatch.StatusConfirming, "")
	e.chain.Reorg(1, 1, false, nil)
	e.sync()
	e.expect(o, paywatch.StatusDisputed, paywatch.ReasonOrphanedPayment)
	// The customer pays again; the dispute settles by itself.
	e.payOnChain(8_000_000)
	e.chain.Mine(3)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
}

func TestChainOperatorAttachAndResolve(t *testing.T) {
	e := newChainEnv(t)
	o := e.order(15_000_000)
	e.payOnChain(14_990_000)
	e.chain.Mine(3)
	e.sync()
	inbox, _, err := e.store.ListTransfers(context.Background(), orders.TransferFilter{Matched: new(bool), Limit: 10})
	if err != nil || len(inbox) != 1 {
		t.Fatalf("inbox %v %v", inbox, err)
	}
	if b := e.balance("suspense:devnet:USDT"); b != "14990000" {
		t.Fatalf("suspense %s, want the unmatched transfer", b)
	}
	if err := e.op.Attach(context.Background(), inbox[0].ID, o.ID, "fee taken by the customer's exchange", "alice"); err != nil {
		t.Fatal(err)
	}
	e.sync()
	e.expect(o, paywatch.StatusDisputed, paywatch.ReasonUnderpaid)
	if err := e.op.Resolve(context.Background(), o.ID, paywatch.StatusSettled, "accept 0.01 short", "alice"); err != nil {
		t.Fatal(err)
	}
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
	bs, _ := ledger.Balances(context.Background(), e.db, "suspense:")
	for _, b := range bs {
		if b.Amount.Sign() != 0 {
			t.Fatalf("suspense after the attach: %+v", b)
		}
	}
}

// A tx hash given with "I've paid" is read from the node at once, before the
// scanner reaches its block; the scanner later sees the same transfer.
func TestChainHintFoundBeforeTheScanner(t *testing.T) {
	e := newChainEnv(t)
	e.sync() // the cursor is at the head now
	o := e.order(2_000_000)
	h := e.payOnChain(2_000_000)
	e.store.MarkPaid(context.Background(), o.ID, h.Hex(), "shop")
	e.lookUpHints() // no scan step: only the look-up can have found it
	e.expect(o, paywatch.StatusConfirming, "")
	e.chain.Mine(3)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
	var n int
	if err := e.db.Get(&n, `SELECT count(*) FROM transfers`); err != nil || n != 1 {
		t.Fatalf("%d transfers recorded (%v), want 1", n, err)
	}
}

// A transfer that a hint look-up recorded ahead of the scanner is
// provisional: when its block is replaced before the scanner passes it, it
// is orphaned like any other and pays nothing.
func TestChainLookupAheadOfTheScannerIsProvisional(t *testing.T) {
	e := newChainEnv(t)
	e.sync() // the cursor is at the head now
	o := e.order(2_000_000)
	h := e.payOnChain(o.PayAmount.Int64())
	e.store.MarkPaid(context.Background(), o.ID, h.Hex(), "shop")
	e.lookUpHints()
	e.expect(o, paywatch.StatusConfirming, "")
	e.chain.Reorg(1, 3, false, nil) // the payment's block is replaced, the transaction dropped
	e.sync()
	e.chain.Mine(3)
	e.sync()
	got, err := e.store.Get(context.Background(), o.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status == paywatch.StatusSettled || got.ReceivedAmount.Sign() != 0 {
		t.Fatalf("an order was paid by a transfer on a replaced block: %s, received %s", got.Status, got.ReceivedAmount)
	}
	if len(got.Transfers) != 1 || got.Transfers[0].State != paywatch.TransferOrphaned {
		t.Fatalf("the looked-up transfer: %+v", got.Transfers)
	}
}

// lookUpHints reads customers' tx hashes from the node, as the daemon does
// beside the reconciler.
func (e *chainEnv) lookUpHints() {
	e.t.Helper()
	if _, err := e.rec.LookUpHints(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.pass()
}
