package ledger_test

import (
	"testing"

	. "github.com/paywatch/paywatch/ledger"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// The set-based statements name accounts in SQL; they must name them as
// the Go functions do, or balances would split.
func TestAccountNamesInSQLAreTheGoNames(t *testing.T) {
	db := pgtest.New(t)
	lit := func(s string) string { return "'" + s + "'" }
	for _, c := range []struct{ sql, want string }{
		{WalletSQL(lit("ethereum"), lit("0xAbC")), Wallet("ethereum", "0xAbC")},
		{SuspenseSQL(lit("bitcoin"), lit("BTC")), Suspense("bitcoin", "BTC")},
		{OrderSQL(lit("ord_x")), Order("ord_x")},
		{SettledSQL(lit("base"), lit("USDC")), Settled("base", "USDC")},
	} {
		var got string
		if err := db.Get(&got, "SELECT "+c.sql); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("SQL names %q, Go %q", got, c.want)
		}
	}
}
