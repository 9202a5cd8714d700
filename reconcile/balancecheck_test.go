package reconcile_test

import (
	"context"
	"io"
	"log/slog"
	"math/big"
	"slices"
	"strings"
	"testing"

	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/evm"
	"github.com/paywatch/paywatch/chains/evm/evmtest"
	"github.com/paywatch/paywatch/chains/scan"
)

// The fake-deposit balance check runs after the scanner records a token
// transfer (balance_pending until then). These tests attack that gap: a
// transfer whose check has not run, or cannot run, must never match,
// confirm, be counted in the ledger or settle an order, however deep its
// block; nor can a customer's claim or an operator's attach take it early.

// scanOnly steps the scanner to the head without verifying anything (the
// verifier lagging behind, or down) and runs a reconciler pass.
func (e *chainEnv) scanOnly() {
	e.t.Helper()
	for i := 0; i < 100; i++ {
		caughtUp, err := e.scanner.Step(context.Background())
		if err != nil {
			e.t.Fatal(err)
		}
		if caughtUp {
			break
		}
	}
	e.pass()
}

// viaProxy points the scanner at the chain through a proxy that can
// misbehave.
func (e *chainEnv) viaProxy() *evmtest.Proxy {
	e.t.Helper()
	p := evmtest.NewProxy(e.t, e.chain.URL)
	e.network.RPCURLs = []string{p.URL}
	src, err := evm.NewSource(e.network, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		e.t.Fatal(err)
	}
	direct, lookup := e.scanner.Source, e.rec.Lookups["devnet"]
	e.scanner.Source = src
	e.rec.Lookups["devnet"] = src
	e.t.Cleanup(func() { // before the proxy stops: the env's last sync goes direct
		src.Close()
		e.scanner.Source, e.rec.Lookups["devnet"] = direct, lookup
	})
	return p
}

type checked struct {
	ID    string         `db:"id"`
	State string         `db:"state"`
	Flags pq.StringArray `db:"flags"`
	Order *string        `db:"order_id"`
}

func (e *chainEnv) transferOf(tx string) checked {
	e.t.Helper()
	var c checked
	if err := e.db.Get(&c, `SELECT id, state, flags, order_id FROM transfers WHERE lower(tx_hash) = lower($1)`, tx); err != nil {
		e.t.Fatal(err)
	}
	return c
}

// A token emits a Transfer event of exactly an order's amount without
// moving any balance. Before its check runs it pays nothing, however deep;
// the verdict flags it for good, and the customer's real payment settles
// the order.
func TestChainFakeDepositNeverSettlesBeforeItsCheck(t *testing.T) {
	e := newChainEnv(t)
	o := e.order(5_000_000)
	fake := e.token.FakeTransfer(e.chain.Payer, e.shop, big.NewInt(o.PayAmount.Int64()))
	e.chain.Mine(10) // far deeper than the 3 confirmations
	e.scanOnly()
	got := e.transferOf(fake.Hex())
	if got.State != "seen" || !slices.Equal(got.Flags, []string{scan.FlagBalancePending}) {
		t.Fatalf("an unverified transfer 10 blocks deep: %s %v", got.State, got.Flags)
	}
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	e.chain.Mine(10)
	e.scanOnly()
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	if got := e.transferOf(fake.Hex()); got.Order != nil || got.State != "seen" {
		t.Fatalf("an unverified transfer 20 blocks deep: %s, matched to %v", got.State, got.Order)
	}
	// Neither a customer's claim nor an operator's attach takes it early.
	if _, err := e.store.MarkPaid(context.Background(), o.ID, fake.Hex(), "storefront"); err != nil {
		t.Fatal(err)
	}
	e.pass()
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	if r := e.rejection(o); r != "" {
		t.Fatalf("a claim on a transfer waiting for its check was decided: %s", r)
	}
	err := e.op.Attach(context.Background(), e.transferOf(fake.Hex()).ID, o.ID, "the customer says so", "ops")
	if err == nil || !strings.Contains(err.Error(), "balance check") {
		t.Fatalf("attach of a transfer waiting for its check: %v", err)
	}
	for _, acct := range []string{"settled:devnet:USDT", "order:" + o.ID, "wallet:devnet:" + e.shop.Hex()} {
		if b := e.balance(acct); b != "0" {
			t.Fatalf("%s = %s from a transfer not yet checked", acct, b)
		}
	}
	// The check runs: the balance never moved.
	if _, err := e.scanner.VerifyPending(context.Background()); err != nil {
		t.Fatal(err)
	}
	got = e.transferOf(fake.Hex())
	if !slices.Equal(got.Flags, []string{evm.FlagBalanceMismatch}) {
		t.Fatalf("after its check the fake transfer is %s %v", got.State, got.Flags)
	}
	e.pass()
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	if got = e.transferOf(fake.Hex()); got.Order != nil {
		t.Fatalf("the fake transfer pays %s", *got.Order)
	}
	if r := e.rejection(o); !strings.Contains(r, evm.FlagBalanceMismatch) {
		t.Fatalf("the claim on the fake transfer, once checked: %q", r)
	}
	// The customer's real payment of the same amount settles the order.
	e.payOnChain(o.PayAmount.Int64())
	e.chain.Mine(3)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
	if b := e.balance("settled:devnet:USDT"); b != o.PayAmount.String() {
		t.Fatalf("settled %s, want %s", b, o.PayAmount)
	}
}

// A node that serves logs but cannot run eth_call leaves payments
// unverified: they wait, unconfirmed and unsettled, and settle once the
// node answers again. A failing check is never taken for a pass.
func TestChainBalanceCheckFailingKeepsPaymentsUnconfirmed(t *testing.T) {
	e := newChainEnv(t)
	proxy := e.viaProxy()
	o := e.order(6_000_000)
	pay := e.payOnChain(o.PayAmount.Int64())
	e.chain.Mine(5)
	proxy.FailCalls.Store(true)
	e.scanOnly()
	// The failing calls decide nothing (and stall no other key).
	if n, err := e.scanner.VerifyPending(context.Background()); err != nil || n != 0 {
		t.Fatalf("verifying through a node that fails eth_call decided %d (%v)", n, err)
	}
	e.pass()
	e.expect(o, paywatch.StatusAwaitingPayment, "")
	if got := e.transferOf(pay.Hex()); got.State != "seen" || !slices.Equal(got.Flags, []string{scan.FlagBalancePending}) {
		t.Fatalf("a payment whose check failed: %s %v", got.State, got.Flags)
	}
	proxy.FailCalls.Store(false)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
	if got := e.transferOf(pay.Hex()); got.State != "confirmed" || len(got.Flags) != 0 {
		t.Fatalf("the payment once checked: %s %v", got.State, got.Flags)
	}
}

// The verdict confirms a transfer whose block is deep enough by itself: a
// shop does not wait for another block after the check.
func TestChainVerdictConfirmsADeepTransfer(t *testing.T) {
	e := newChainEnv(t)
	o := e.order(4_000_000)
	pay := e.payOnChain(o.PayAmount.Int64())
	e.chain.Mine(5)
	e.scanOnly()
	if got := e.transferOf(pay.Hex()); got.State != "seen" {
		t.Fatalf("before its check: %s", got.State)
	}
	if n, err := e.scanner.VerifyPending(context.Background()); err != nil || n != 1 {
		t.Fatalf("verified %d (%v)", n, err)
	}
	if got := e.transferOf(pay.Hex()); got.State != "confirmed" || len(got.Flags) != 0 {
		t.Fatalf("after its check: %s %v", got.State, got.Flags)
	}
	e.pass()
	e.expect(o, paywatch.StatusSettled, "")
}

// A verdict is for the block the transfer was checked in: recorded against
// a block that was replaced meanwhile, it changes nothing, and the transfer
// mined again elsewhere is checked again.
func TestChainVerdictForAReplacedBlockIsIgnored(t *testing.T) {
	e := newChainEnv(t)
	o := e.order(3_000_000)
	pay := e.payOnChain(o.PayAmount.Int64())
	e.scanOnly()
	stale := e.transferOf(pay.Hex())
	var oldHash string
	if err := e.db.Get(&oldHash, `SELECT block_hash FROM transfers WHERE id = $1`, stale.ID); err != nil {
		t.Fatal(err)
	}
	e.chain.Reorg(1, 2, true, nil) // the payment is mined again in another block
	e.scanOnly()
	got := e.transferOf(pay.Hex())
	if got.State != "seen" || !slices.Equal(got.Flags, []string{scan.FlagBalancePending}) {
		t.Fatalf("the payment mined again: %s %v", got.State, got.Flags)
	}
	// A verdict reached in the replaced block (a verifier that read the old
	// chain) is refused by the block hash.
	n, err := scan.NewStore(e.db).RecordVerdicts(context.Background(), "devnet",
		[]scan.Verdict{{ID: stale.ID, BlockHash: oldHash}})
	if err != nil || n != 0 {
		t.Fatalf("a verdict for the replaced block changed %d transfers (%v)", n, err)
	}
	if got := e.transferOf(pay.Hex()); !slices.Equal(got.Flags, []string{scan.FlagBalancePending}) {
		t.Fatalf("after a stale verdict: %v", got.Flags)
	}
	e.chain.Mine(3)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
}

// An operator's rescan finds the same transfers in the same blocks: their
// verdicts stand, so settled orders stay settled and nothing waits for a
// new check.
func TestChainRescanKeepsVerdicts(t *testing.T) {
	e := newChainEnv(t)
	o := e.order(9_000_000)
	pay := e.payOnChain(o.PayAmount.Int64())
	e.chain.Mine(3)
	e.sync()
	e.expect(o, paywatch.StatusSettled, "")
	start := e.network.StartBlock
	if _, err := scan.NewStore(e.db).Rewind(context.Background(), "devnet", scan.Block{Number: start, Hash: e.chain.HashAt(start).Hex()}); err != nil {
		t.Fatal(err)
	}
	e.scanOnly() // no verification: a rescan needs none
	if got := e.transferOf(pay.Hex()); got.State != "confirmed" || len(got.Flags) != 0 {
		t.Fatalf("after the rescan: %s %v", got.State, got.Flags)
	}
	e.expect(o, paywatch.StatusSettled, "")
}

// At match time: balance_mismatch never pays, balance_unchecked (a pruned
// node could not check a block already old when recorded) does, and
// balance_pending waits for its verdict.
func TestBalanceFlagsAtMatchTime(t *testing.T) {
	for _, c := range []struct {
		flag string
		want paywatch.Status
	}{
		{"balance_unchecked", paywatch.StatusSettled},
		{"balance_mismatch", paywatch.StatusAwaitingPayment},
		{"balance_pending", paywatch.StatusAwaitingPayment},
		{"", paywatch.StatusSettled},
	} {
		t.Run(c.flag, func(t *testing.T) {
			f := newFixture(t)
			o := f.order(usdt, 10_000_000)
			var flags []string
			if c.flag != "" {
				flags = []string{c.flag}
			}
			p := payment{asset: usdt, to: shop, amount: o.PayAmount.Int64(), flags: flags}
			if c.flag == "balance_pending" {
				p.state = "seen" // a pending transfer never confirms
			}
			f.pay(p)
			f.pass()
			f.expect(o, c.want, "")
		})
	}
}
