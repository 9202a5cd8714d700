package bitcoin_test

import (
	"context"
	"testing"
	"time"

	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
)

// A mempool watcher that gets its lease back after another instance held
// it reads what that instance recorded: a payment the other saw, replaced
// meanwhile, is recorded as gone and replaced.
func TestMempoolLeaseRegained(t *testing.T) {
	shop := shopAddress(t, 4)
	e := newEnv(t, []string{shop}, nil)
	newMempool := func() *bitcoin.Mempool {
		src, err := bitcoin.NewSource(e.network, e.node.Credentials, e.watch, testLog())
		if err != nil {
			t.Fatal(err)
		}
		m := bitcoin.NewMempool(src, e.db, testLog())
		m.Interval = 20 * time.Millisecond
		return m
	}
	x, y := newMempool(), newMempool()
	if _, err := x.Step(t.Context()); err != nil { // x holds the lease first
		t.Fatal(err)
	}
	coin := e.node.Coin(500_000)
	paid, err := e.node.Spend(coin, 1_000, btctest.Output{Address: shop, Sats: 100_000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := y.Step(t.Context()); err != nil { // y took over and saw it
		t.Fatal(err)
	}
	replacement, err := e.node.Spend(coin, 20_000, btctest.Output{Address: shopAddress(t, 5), Sats: 100_000})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_ = x.Run(ctx) // x has the lease again
	var row struct {
		Missing    *int64  `db:"missing_at_height"`
		ReplacedBy *string `db:"replaced_by"`
	}
	if err := e.db.Get(&row, `SELECT missing_at_height, replaced_by FROM mempool_transfers WHERE tx_hash = $1`, paid); err != nil {
		t.Fatal(err)
	}
	if row.Missing == nil || row.ReplacedBy == nil || *row.ReplacedBy != replacement {
		t.Fatalf("the replaced payment as recorded: missing at %v, replaced by %v", row.Missing, row.ReplacedBy)
	}
}
