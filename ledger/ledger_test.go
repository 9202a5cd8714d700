package ledger_test

import (
	"context"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch/ledger"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

func post(t *testing.T, db *sqlx.DB, e ledger.Entry) (int64, bool, error) {
	t.Helper()
	tx := db.MustBegin()
	defer tx.Rollback()
	id, posted, err := ledger.Post(context.Background(), tx, time.Now(), e)
	if err != nil {
		return 0, false, err
	}
	return id, posted, tx.Commit()
}

func TestPostAndBalances(t *testing.T) {
	db := pgtest.New(t)
	a := big.NewInt(1_000_000)
	receipt := ledger.Move(ledger.KindReceipt, "trf_1", "eth", "USDT", ledger.Wallet("eth", "0xshop"), ledger.Suspense("eth", "USDT"), a)
	if _, posted, err := post(t, db, receipt); err != nil || !posted {
		t.Fatal(posted, err)
	}
	if _, posted, err := post(t, db, receipt); err != nil || posted {
		t.Fatalf("second post of the same entry: posted=%v %v", posted, err)
	}
	if _, _, err := post(t, db, ledger.Move(ledger.KindAttribution, "trf_1/ord_1", "eth", "USDT",
		ledger.Suspense("eth", "USDT"), ledger.Order("ord_1"), big.NewInt(400_000))); err != nil {
		t.Fatal(err)
	}
	got, err := ledger.Balances(context.Background(), db, "")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"order:ord_1": "400000", "suspense:eth:USDT": "600000", "wallet:eth:0xshop": "1000000"}
	if len(got) != len(want) {
		t.Fatalf("balances %+v", got)
	}
	for _, b := range got {
		if want[b.Account] != b.Amount.String() {
			t.Fatalf("%s = %s, want %s", b.Account, b.Amount, want[b.Account])
		}
	}
	susp, _ := ledger.Balances(context.Background(), db, "suspense:")
	if len(susp) != 1 || susp[0].Amount.Int64() != 600_000 {
		t.Fatalf("suspense balances %+v", susp)
	}
	if err := ledger.CheckBalanced(context.Background(), db); err != nil {
		t.Fatal(err)
	}
}

func TestUnbalancedRejectedInGoAndByTheDatabase(t *testing.T) {
	db := pgtest.New(t)
	bad := ledger.Entry{Kind: ledger.KindReceipt, Ref: "x", Postings: []ledger.Posting{
		{Account: "wallet:eth:0x1", Network: "eth", Asset: "USDT", Amount: big.NewInt(5)},
		{Account: "suspense:eth:USDT", Network: "eth", Asset: "USDT", Amount: big.NewInt(-4)},
	}}
	if _, _, err := post(t, db, bad); !errors.Is(err, ledger.ErrUnbalanced) {
		t.Fatalf("Go check: %v", err)
	}
	// Around the Go check, straight into the table: the database refuses.
	tx := db.MustBegin()
	var id int64
	if err := tx.Get(&id, `INSERT INTO ledger_entries (at, kind, ref) VALUES (now(), 'receipt', 'y') RETURNING id`); err != nil {
		t.Fatal(err)
	}
	_, err := tx.Exec(`INSERT INTO ledger_postings (entry_id, account, network, asset, amount)
		VALUES ($1, 'wallet:eth:0x1', 'eth', 'USDT', 5), ($1, 'suspense:eth:USDT', 'eth', 'USDT', -4)`, id)
	tx.Rollback()
	if err == nil || !strings.Contains(err.Error(), "does not balance") {
		t.Fatalf("database check: %v", err)
	}
	// Different assets never offset each other.
	mixed := ledger.Entry{Kind: ledger.KindReceipt, Ref: "z", Postings: []ledger.Posting{
		{Account: "a", Network: "eth", Asset: "USDT", Amount: big.NewInt(5)},
		{Account: "b", Network: "eth", Asset: "DAI", Amount: big.NewInt(-5)},
	}}
	if err := mixed.Validate(); !errors.Is(err, ledger.ErrUnbalanced) {
		t.Fatalf("mixed assets: %v", err)
	}
}

// A posting must belong to an entry that exists: the database checks it
// once per statement, over every row the statement added, among them rows
// of entries that do exist.
func TestPostingOfAMissingEntryIsRefusedByTheDatabase(t *testing.T) {
	db := pgtest.New(t)
	id, _, err := post(t, db, ledger.Move(ledger.KindReceipt, "r", "eth", "ETH", "wallet:eth:0x1", "suspense:eth:ETH", big.NewInt(9)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(`INSERT INTO ledger_postings (entry_id, account, network, asset, amount)
		VALUES ($1, 'wallet:eth:0x1', 'eth', 'ETH', 3), ($1, 'suspense:eth:ETH', 'eth', 'ETH', -3),
		       ($1 + 1000, 'wallet:eth:0x1', 'eth', 'ETH', 3), ($1 + 1000, 'suspense:eth:ETH', 'eth', 'ETH', -3)`, id)
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("postings of a missing entry: %v", err)
	}
	var n int
	if err := db.Get(&n, `SELECT count(*) FROM ledger_postings`); err != nil || n != 2 {
		t.Fatalf("%d postings stored (%v), want the entry's 2 alone", n, err)
	}
}

// The check finds the ledger's own entries, whatever a session puts first
// on its search path: a temporary table named ledger_entries vouches for
// nothing.
func TestATemporaryTableCannotVouchForAMissingEntry(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	conn, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{`CREATE TEMP TABLE ledger_entries (id bigint)`, `INSERT INTO pg_temp.ledger_entries VALUES (424242)`} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	_, err = conn.ExecContext(ctx, `INSERT INTO public.ledger_postings (entry_id, account, network, asset, amount)
		VALUES (424242, 'order:x', 'eth', 'ETH', -5), (424242, 'settled:eth:ETH', 'eth', 'ETH', 5)`)
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("postings vouched for by a temporary table: %v", err)
	}
}

func TestAppendOnly(t *testing.T) {
	db := pgtest.New(t)
	id, _, err := post(t, db, ledger.Move(ledger.KindReceipt, "r", "eth", "ETH", "wallet:eth:0x1", "suspense:eth:ETH", big.NewInt(9)))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE ledger_postings SET amount = 10 WHERE entry_id = $1`,
		`DELETE FROM ledger_postings WHERE entry_id = $1`,
		`DELETE FROM ledger_entries WHERE id = $1`,
	} {
		if _, err := db.Exec(q, id); err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Emptying the entries would leave their postings to whatever entries
	// take their ids next.
	for _, q := range []string{
		`TRUNCATE ledger_entries, ledger_postings`,
		`TRUNCATE ledger_postings`,
		`TRUNCATE ledger_entries RESTART IDENTITY CASCADE`,
	} {
		if _, err := db.Exec(q); err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// A sweep whose ref was used before moves nothing and says so: the caller
// must never believe money moved when the entry was dropped as a
// duplicate.
func TestSweepUnderAUsedRefFails(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	attribute := func(ref string, units int64) {
		t.Helper()
		if _, posted, err := post(t, db, ledger.Move(ledger.KindAttribution, ref, "eth", "USDT",
			ledger.Suspense("eth", "USDT"), ledger.Order("ord_1"), big.NewInt(units))); err != nil || !posted {
			t.Fatal(posted, err)
		}
	}
	sweep := func() ([]ledger.Balance, error) {
		t.Helper()
		tx := db.MustBegin()
		defer tx.Rollback()
		moved, err := ledger.Sweep(ctx, tx, time.Now(), "ord_1", ledger.KindRefund, "ord_1@same", ledger.RefundsOwed)
		if err != nil {
			return nil, err
		}
		return moved, tx.Commit()
	}
	attribute("trf_1/ord_1", 400_000)
	if moved, err := sweep(); err != nil || len(moved) != 1 || moved[0].Amount.Int64() != 400_000 {
		t.Fatalf("first sweep: moved %+v, %v; want 400000 moved", moved, err)
	}
	attribute("trf_2/ord_1", 100_000)
	if moved, err := sweep(); err == nil {
		t.Fatalf("a second sweep under the same ref reported %+v moved; want an error", moved)
	}
	got, err := ledger.Balances(ctx, db, "order:")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Amount.Int64() != 100_000 {
		t.Fatalf("order balances %+v after the refused sweep, want 100000 still on the order", got)
	}
}
