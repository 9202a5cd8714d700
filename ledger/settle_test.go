package ledger_test

import (
	"context"
	"math/big"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch/ledger"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// inTx runs fn in a transaction of db and commits it.
func inTx(t *testing.T, db *sqlx.DB, fn func(tx *sqlx.Tx) error) {
	t.Helper()
	tx := db.MustBegin()
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// balances returns every account's balance per asset, keyed
// "account/network/asset".
func balances(t *testing.T, db *sqlx.DB) map[string]string {
	t.Helper()
	got, err := ledger.Balances(context.Background(), db, "")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, b := range got {
		if b.Amount.Sign() != 0 {
			out[b.Account+"/"+b.Network+"/"+b.Asset] = b.Amount.String()
		}
	}
	return out
}

func attribute(t *testing.T, db *sqlx.DB, order, network, asset string, amount int64) {
	t.Helper()
	if _, _, err := post(t, db, ledger.Move(ledger.KindAttribution, "trf/"+order+"/"+asset, network, asset,
		ledger.Suspense(network, asset), ledger.Order(order), big.NewInt(amount))); err != nil {
		t.Fatal(err)
	}
}

// A batch of orders settles in one entry, each order on a posting of its
// own; a reorg that takes one order's payment moves back that order's share
// and nothing else, once however often it is asked.
func TestSettleBatchAndUnsettleOneOrder(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	attribute(t, db, "ord_a", "eth", "USDT", 1_000_000)
	attribute(t, db, "ord_b", "eth", "USDT", 2_500_000)
	attribute(t, db, "ord_c", "btc", "BTC", 70_000)
	now := time.Now()
	inTx(t, db, func(tx *sqlx.Tx) error {
		return ledger.Settle(ctx, tx, now, []ledger.OrderAmount{
			{OrderID: "ord_a", Network: "eth", Asset: "USDT", Amount: big.NewInt(1_000_000)},
			{OrderID: "ord_b", Network: "eth", Asset: "USDT", Amount: big.NewInt(2_500_000)},
			{OrderID: "ord_c", Network: "btc", Asset: "BTC", Amount: big.NewInt(70_000)},
			{OrderID: "ord_d", Network: "eth", Asset: "USDT", Amount: big.NewInt(0)}, // nothing received: no posting
		})
	})
	var entries, postings int
	_ = db.Get(&entries, `SELECT count(*) FROM ledger_entries WHERE kind = 'settlement'`)
	_ = db.Get(&postings, `SELECT count(*) FROM ledger_postings p JOIN ledger_entries e ON e.id = p.entry_id WHERE e.kind = 'settlement'`)
	if entries != 1 || postings != 5 { // three orders, revenue in two assets
		t.Fatalf("%d settlement entries with %d postings, want 1 with 5", entries, postings)
	}
	want := map[string]string{
		"settled:eth:USDT/eth/USDT": "3500000", "settled:btc:BTC/btc/BTC": "70000",
		"suspense:eth:USDT/eth/USDT": "-3500000", "suspense:btc:BTC/btc/BTC": "-70000",
	}
	check := func(when string) {
		t.Helper()
		got := balances(t, db)
		if len(got) != len(want) {
			t.Fatalf("%s: balances %v, want %v", when, got, want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("%s: %s = %s, want %s (all: %v)", when, k, got[k], v, got)
			}
		}
		if err := ledger.CheckBalanced(ctx, db); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}
	check("settled")

	for range 2 { // the second time finds nothing left to move back
		inTx(t, db, func(tx *sqlx.Tx) error { return ledger.Unsettle(ctx, tx, now, []string{"ord_b"}) })
		want["settled:eth:USDT/eth/USDT"] = "1000000"
		want["order:ord_b/eth/USDT"] = "2500000"
		check("ord_b unsettled")
	}
	var unsettlements int
	_ = db.Get(&unsettlements, `SELECT count(*) FROM ledger_entries WHERE kind = 'unsettlement' AND order_id = 'ord_b'`)
	if unsettlements != 1 {
		t.Fatalf("%d unsettlements of ord_b, want 1", unsettlements)
	}

	// Settled again (a reorg gave the payment back), then taken again.
	inTx(t, db, func(tx *sqlx.Tx) error {
		return ledger.Settle(ctx, tx, now, []ledger.OrderAmount{{OrderID: "ord_b", Network: "eth", Asset: "USDT", Amount: big.NewInt(2_500_000)}})
	})
	delete(want, "order:ord_b/eth/USDT")
	want["settled:eth:USDT/eth/USDT"] = "3500000"
	check("ord_b settled again")
	inTx(t, db, func(tx *sqlx.Tx) error { return ledger.Unsettle(ctx, tx, now, []string{"ord_b", "ord_c"}) })
	want["settled:eth:USDT/eth/USDT"] = "1000000"
	want["order:ord_b/eth/USDT"] = "2500000"
	delete(want, "settled:btc:BTC/btc/BTC")
	want["order:ord_c/btc/BTC"] = "70000"
	check("ord_b and ord_c unsettled")
}

// Orders moving opposite amounts of one asset in one batch leave revenue
// without a posting of zero (which the journal refuses): the orders'
// postings balance by themselves.
func TestSettleBatchSummingToZero(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	inTx(t, db, func(tx *sqlx.Tx) error {
		return ledger.Settle(ctx, tx, time.Now(), []ledger.OrderAmount{
			{OrderID: "ord_a", Network: "eth", Asset: "USDT", Amount: big.NewInt(5)},
			{OrderID: "ord_b", Network: "eth", Asset: "USDT", Amount: big.NewInt(-5)},
		})
	})
	if err := ledger.CheckBalanced(ctx, db); err != nil {
		t.Fatal(err)
	}
	var revenue int
	_ = db.Get(&revenue, `SELECT count(*) FROM ledger_postings WHERE account LIKE 'settled:%'`)
	if revenue != 0 {
		t.Fatalf("%d revenue postings, want none", revenue)
	}
}

// A settlement written one entry per order (as before batches) and undone
// by a reversal counts as moved back: the order's share of a later batch is
// all an unsettlement takes.
func TestUnsettleAfterAnEarlierReversedSettlement(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	attribute(t, db, "ord_a", "eth", "USDT", 1_000_000)
	id, _, err := post(t, db, ledger.Move(ledger.KindSettlement, "ord_a#old", "eth", "USDT",
		ledger.Order("ord_a"), ledger.Settled("eth", "USDT"), big.NewInt(1_000_000)))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	inTx(t, db, func(tx *sqlx.Tx) error {
		_, err := ledger.Reverse(ctx, tx, now, `SELECT $2::bigint`, id)
		return err
	})
	inTx(t, db, func(tx *sqlx.Tx) error {
		return ledger.Settle(ctx, tx, now, []ledger.OrderAmount{{OrderID: "ord_a", Network: "eth", Asset: "USDT", Amount: big.NewInt(1_000_000)}})
	})
	inTx(t, db, func(tx *sqlx.Tx) error { return ledger.Unsettle(ctx, tx, now, []string{"ord_a"}) })
	got := balances(t, db)
	if got["settled:eth:USDT/eth/USDT"] != "" || got["order:ord_a/eth/USDT"] != "1000000" {
		t.Fatalf("balances %v: want nothing settled, 1000000 back on the order", got)
	}
}

// One order's share comes back once: an id given twice counts once, and of
// two transactions moving it back at once, the second is refused (the
// first's ref stands in its way).
func TestUnsettleMovesAShareBackOnce(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	attribute(t, db, "ord_a", "eth", "USDT", 100)
	attribute(t, db, "ord_b", "eth", "USDT", 100)
	inTx(t, db, func(tx *sqlx.Tx) error {
		return ledger.Settle(ctx, tx, time.Now(), []ledger.OrderAmount{
			{OrderID: "ord_a", Network: "eth", Asset: "USDT", Amount: big.NewInt(100)},
			{OrderID: "ord_b", Network: "eth", Asset: "USDT", Amount: big.NewInt(100)}})
	})
	inTx(t, db, func(tx *sqlx.Tx) error { return ledger.Unsettle(ctx, tx, time.Now(), []string{"ord_a", "ord_a"}) })
	if got := balances(t, db); got["order:ord_a/eth/USDT"] != "100" || got["settled:eth:USDT/eth/USDT"] != "100" {
		t.Fatalf("after moving ord_a back, given twice: %v; want 100 on ord_a, 100 in revenue", got)
	}

	tx1, tx2 := db.MustBegin(), db.MustBegin()
	defer tx1.Rollback()
	defer tx2.Rollback()
	if err := ledger.Unsettle(ctx, tx1, time.Now(), []string{"ord_b"}); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		err := ledger.Unsettle(ctx, tx2, time.Now(), []string{"ord_b"})
		if err == nil {
			err = tx2.Commit()
		}
		second <- err
	}()
	time.Sleep(100 * time.Millisecond) // the second waits on the first's ref
	if err := tx1.Commit(); err != nil {
		t.Fatal(err)
	}
	// Refused when it waited on the first; finding nothing left to move when
	// it came after. Either way, the share came back once.
	<-second
	if got := balances(t, db); got["order:ord_b/eth/USDT"] != "100" || got["settled:eth:USDT/eth/USDT"] != "" {
		t.Fatalf("after two transactions moved ord_b back: %v; want 100 on ord_b, nothing in revenue", got)
	}
}
