package bitcoin_test

import (
	"context"
	"testing"
	"time"

	"github.com/btcsuite/btcd/btcutil"
	"github.com/btcsuite/btcd/txscript"
	"github.com/btcsuite/btcd/wire"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
)

// shopAddress is a shared address the tests watch.
func shopAddress(t *testing.T, seed byte) string {
	t.Helper()
	a, err := btcutil.NewAddressPubKeyHash(append(make([]byte, 19), seed), btctest.Params)
	if err != nil {
		t.Fatal(err)
	}
	return a.EncodeAddress()
}

// waitFor polls cond for up to 30 seconds.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A reorg made by two nodes that mine apart and join again: the payment
// in the losing branch is orphaned, goes back to the mempool, and once
// mined again in the winning chain is the same transfer, counted once, in
// its new block.
func TestReorgByTwoNodesMiningApart(t *testing.T) {
	shop := shopAddress(t, 1)
	e := newEnv(t, []string{shop}, nil)
	peer := btctest.NewPeer(t, e.node)
	s := e.scanner()
	e.sync(s)

	peer.Disconnect(e.node)
	txid := e.node.Pay(btctest.Output{Address: shop, Sats: 250_000})
	e.node.Mine(1)
	e.sync(s)
	before := e.transfers()
	if len(before) != 1 || before[0].TxHash != txid || before[0].State != "seen" {
		t.Fatalf("before the split heals: %+v", before)
	}
	peer.Mine(3) // the other side mines a longer branch without the payment
	peer.Connect(e.node)
	if e.node.Height() != peer.Height() {
		t.Fatal("the nodes did not agree")
	}
	e.sync(s)
	after := e.transfers()
	if len(after) != 1 || after[0].State != "orphaned" {
		t.Fatalf("after the reorg: %+v", after)
	}
	if !e.node.InMempool(txid) {
		t.Fatal("the orphaned payment is not back in the mempool")
	}
	e.node.Mine(1)
	e.sync(s)
	again := e.transfers()
	if len(again) != 1 || again[0].State == "orphaned" || again[0].Hash == before[0].Hash || again[0].TxHash != txid {
		t.Fatalf("mined again: %+v (first in %s)", again, before[0].Hash)
	}
	hash, err := e.node.H.Client.GetBlockHash(int64(again[0].Block))
	if err != nil || hash.String() != again[0].Hash {
		t.Fatalf("the transfer's block %s is not canonical (%v, %v)", again[0].Hash, hash, err)
	}
	var reorgs int
	if err := e.db.Get(&reorgs, `SELECT count(*) FROM chain_reorgs`); err != nil || reorgs != 1 {
		t.Fatalf("%d reorgs recorded (%v)", reorgs, err)
	}
}

// After 300 blocks of downtime every payment inside them is found, once.
func TestDowntime300Blocks(t *testing.T) {
	shop := shopAddress(t, 2)
	e := newEnv(t, []string{shop}, nil)
	s := e.scanner()
	e.sync(s)
	want := map[string]bool{}
	for i := 0; i < 300; i++ {
		if i%25 == 0 {
			want[e.node.Pay(btctest.Output{Address: shop, Sats: int64(100_000 + i)})] = true
		}
		e.node.Mine(1)
	}
	e.sync(e.scanner()) // a restarted daemon: state only in the database
	got := e.transfers()
	if len(got) != len(want) {
		t.Fatalf("%d transfers, want %d", len(got), len(want))
	}
	for _, r := range got {
		if !want[r.TxHash] {
			t.Fatalf("unexpected transfer %+v", r)
		}
		delete(want, r.TxHash)
	}
	var cursor uint64
	if err := e.db.Get(&cursor, `SELECT block_number FROM chain_cursors WHERE network = 'btc'`); err != nil || cursor != e.node.Height() {
		t.Fatalf("cursor %d, head %d (%v)", cursor, e.node.Height(), err)
	}
}

// A node that goes down shows in the status and the scanner resumes when
// it is back; a node that hangs is left for the next URL in time.
func TestNodeDownThenBack(t *testing.T) {
	shop := shopAddress(t, 3)
	e := newEnv(t, []string{shop}, nil)
	proxy := btctest.NewProxy(t, e.node)
	e.network.RPCURLs = []string{proxy.URL}
	s := e.scanner()
	s.RetryMin, s.RetryMax = 10*time.Millisecond, 50*time.Millisecond
	e.sync(s)

	proxy.Down.Store(true)
	proxy.Drop()
	txid := e.node.Pay(btctest.Output{Address: shop, Sats: 300_000})
	e.node.Mine(1)
	if _, err := s.Step(t.Context()); err == nil {
		t.Fatal("step succeeded with the node down")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	lastError := func() string {
		var msg *string
		_ = e.db.Get(&msg, `SELECT last_error FROM chain_cursors WHERE network = 'btc'`)
		if msg == nil {
			return ""
		}
		return *msg
	}
	waitFor(t, func() bool { return lastError() != "" }, "last_error recorded")
	proxy.Down.Store(false)
	waitFor(t, func() bool { return len(e.transfers()) == 1 }, "the catch-up once the node is back")
	waitFor(t, func() bool { return lastError() == "" }, "last_error cleared")
	cancel()
	<-done
	if got := e.transfers(); got[0].TxHash != txid {
		t.Fatalf("transfers %+v", got)
	}

	// A hung first node: the call times out and the second node answers.
	proxy.Hung.Store(true)
	proxy.Drop()
	e.network.RPCURLs = []string{proxy.URL, e.node.URL}
	more := e.node.Pay(btctest.Output{Address: shop, Sats: 310_000})
	e.node.Mine(1)
	hung := e.scanner()
	hung.Source.(interface{ SetCallTimeout(time.Duration) }).SetCallTimeout(300 * time.Millisecond)
	start := time.Now()
	e.sync(hung)
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the failover took %s", took)
	}
	if got := e.transfers(); len(got) != 2 || got[1].TxHash != more {
		t.Fatalf("transfers %+v", got)
	}
}

// A block reward paid to a watched address is recorded flagged coinbase:
// it pays no order (an operator decides), spendable only after 100 blocks.
func TestCoinbaseToAWatchedAddressIsFlagged(t *testing.T) {
	shop := shopAddress(t, 6)
	e := newEnv(t, []string{shop}, nil)
	s := e.scanner()
	e.sync(s)
	addr, err := btcutil.DecodeAddress(shop, btctest.Params)
	if err != nil {
		t.Fatal(err)
	}
	script, err := txscript.PayToAddrScript(addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.node.H.GenerateAndSubmitBlockWithCustomCoinbaseOutputs(nil, -1, time.Time{},
		[]wire.TxOut{{Value: 5_000_000_000, PkScript: script}}); err != nil {
		t.Fatal(err)
	}
	e.sync(s)
	var flags []string
	for _, r := range e.transfers() {
		var f pq.StringArray
		if err := e.db.Get(&f, `SELECT flags FROM transfers WHERE tx_hash = $1`, r.TxHash); err != nil {
			t.Fatal(err)
		}
		flags = append(flags, f...)
	}
	if len(flags) != 1 || flags[0] != "coinbase" {
		t.Fatalf("flags %v", flags)
	}
}
