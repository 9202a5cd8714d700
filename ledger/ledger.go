// Package ledger is paywatch's double-entry journal: append-only entries of
// postings (account, asset, amount) that sum to zero per asset — checked
// here before writing and by the database when writing. Mistakes and
// reorgs are undone by reversing entries, never by changing a row.
//
// Accounts:
//
//	wallet:<network>:<address>   what arrived at a receiving address (debit-normal)
//	suspense:<network>:<asset>   arrived, not yet attributed to an order
//	order:<order id>             attributed to a dossier that is not settled
//	settled:<network>:<asset>    the shop's revenue
//	refunds_owed:<network>:<asset> owed back to customers after a refund resolution
//
// Amounts are signed base units: debits positive, credits negative.
package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch/migrations/pg"
)

// Entry kinds.
const (
	KindReceipt     = "receipt"     // a confirmed transfer: wallet → suspense
	KindAttribution = "attribution" // matched to an order: suspense → order
	KindSettlement  = "settlement"  // orders settled: order → settled, a posting per order
	// An unsettlement moves one order's share of a settlement back when a
	// reorg takes its payment away: settled → order.
	KindUnsettlement = "unsettlement"
	KindRefund       = "refund"   // resolved as refunded: order → refunds_owed
	KindRelease      = "release"  // detached from a cancelled order: order → suspense
	KindReversal     = "reversal" // undoes another entry (reorgs)
	// A refund adjustment follows a reorg after a refund resolution: what is
	// owed back moves with the money that arrived.
	KindRefundAdjustment = "refund_adjustment"
)

// Posting is one line of an entry.
type Posting struct {
	Account string
	Network string
	Asset   string
	Amount  *big.Int // debit positive, credit negative, never zero
}

// Entry is a balanced set of postings.
type Entry struct {
	Kind     string
	Ref      string // with Kind, makes posting idempotent
	Memo     string
	OrderID  string // what the entry concerns, when it concerns an order
	Postings []Posting
}

// OrderBalances returns what an order's account holds per asset (credit
// balances as positive numbers), read inside tx.
func OrderBalances(ctx context.Context, tx sqlx.QueryerContext, orderID string) ([]Balance, error) {
	var rows []struct {
		Network string `db:"network"`
		Asset   string `db:"asset"`
		Sum     string `db:"total"`
	}
	account := Order(orderID)
	if err := sqlx.SelectContext(ctx, tx, &rows, `SELECT network, asset, sum(amount)::text AS total
		FROM ledger_postings WHERE account = $1 GROUP BY network, asset ORDER BY network, asset`, account); err != nil {
		return nil, fmt.Errorf("read the account of %s: %w", orderID, err)
	}
	out := make([]Balance, 0, len(rows))
	for _, r := range rows {
		v, ok := new(big.Int).SetString(r.Sum, 10)
		if !ok {
			return nil, fmt.Errorf("balance of %s is %q, not an integer", account, r.Sum)
		}
		out = append(out, Balance{Account: account, Network: r.Network, Asset: r.Asset, Amount: v.Neg(v)})
	}
	return out, nil
}

// Move returns a two-posting entry that debits one account and credits
// another by amount. A receipt debits the wallet and credits suspense; an
// attribution debits suspense and credits the order; a settlement debits the
// order and credits settled.
func Move(kind, ref, network, asset, debit, credit string, amount *big.Int) Entry {
	return Entry{Kind: kind, Ref: ref, Postings: []Posting{
		{Account: debit, Network: network, Asset: asset, Amount: new(big.Int).Set(amount)},
		{Account: credit, Network: network, Asset: asset, Amount: new(big.Int).Neg(amount)},
	}}
}

// ErrUnbalanced reports an entry whose postings do not sum to zero.
var ErrUnbalanced = errors.New("ledger entry does not balance")

// Validate checks an entry before it is written.
func (e Entry) Validate() error {
	if e.Kind == "" || e.Ref == "" {
		return errors.New("ledger entry needs a kind and a ref")
	}
	if len(e.Postings) < 2 {
		return fmt.Errorf("ledger entry %s/%s has %d postings; at least two are needed", e.Kind, e.Ref, len(e.Postings))
	}
	sums := map[string]*big.Int{}
	for _, p := range e.Postings {
		if p.Account == "" || p.Network == "" || p.Asset == "" || p.Amount == nil || p.Amount.Sign() == 0 {
			return fmt.Errorf("ledger entry %s/%s has an incomplete or zero posting", e.Kind, e.Ref)
		}
		k := p.Network + "/" + p.Asset
		if sums[k] == nil {
			sums[k] = new(big.Int)
		}
		sums[k].Add(sums[k], p.Amount)
	}
	for k, s := range sums {
		if s.Sign() != 0 {
			return fmt.Errorf("%w: %s/%s sums to %s in %s", ErrUnbalanced, e.Kind, e.Ref, s, k)
		}
	}
	return nil
}

// Post writes an entry inside tx. An entry with the same kind and ref
// already written makes it a no-op (posted=false).
func Post(ctx context.Context, tx *sqlx.Tx, at time.Time, e Entry) (id int64, posted bool, err error) {
	if err := e.Validate(); err != nil {
		return 0, false, err
	}
	err = tx.GetContext(ctx, &id, `INSERT INTO ledger_entries (at, kind, ref, memo, order_id)
		VALUES ($1, $2, $3, NULLIF($4, ''), NULLIF($5, ''))
		ON CONFLICT (kind, ref) DO NOTHING RETURNING id`, at, e.Kind, e.Ref, e.Memo, e.OrderID)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("post %s/%s: %w", e.Kind, e.Ref, err)
	}
	n := len(e.Postings)
	accounts, networks, assets, amounts := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i, p := range e.Postings {
		accounts[i], networks[i], assets[i], amounts[i] = p.Account, p.Network, p.Asset, p.Amount.String()
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO ledger_postings (entry_id, account, network, asset, amount)
		SELECT $1, a, n, s, m::numeric FROM unnest($2::text[], $3::text[], $4::text[], $5::text[]) AS u(a, n, s, m)`,
		id, pq.Array(accounts), pq.Array(networks), pq.Array(assets), pq.Array(amounts)); err != nil {
		return 0, false, fmt.Errorf("post %s/%s: %w", e.Kind, e.Ref, err)
	}
	return id, true, nil
}

// Balance is an account's balance in one asset.
type Balance struct {
	Account string
	Network string
	Asset   string
	// Amount is shown the way the account is read: what a wallet holds,
	// what suspense, an order, settled or refunds_owed are owed (credit
	// balances as positive numbers).
	Amount *big.Int
}

// CreditNormal reports whether an account's natural balance is a credit.
func CreditNormal(account string) bool { return !strings.HasPrefix(account, WalletPrefix) }

// Balances sums postings per account and asset for accounts starting with
// prefix ("" for all), sorted by account, network and asset in byte order
// (the ledger's text columns compare so, whatever the database's default).
func Balances(ctx context.Context, db sqlx.QueryerContext, prefix string) ([]Balance, error) {
	var rows []struct {
		Account string `db:"account"`
		Network string `db:"network"`
		Asset   string `db:"asset"`
		Sum     string `db:"total"`
	}
	if err := sqlx.SelectContext(ctx, db, &rows, `SELECT account, network, asset, sum(amount)::text AS total
		FROM ledger_postings WHERE account LIKE $1 || '%' GROUP BY account, network, asset
		ORDER BY account, network, asset`, escapeLike(prefix)); err != nil {
		return nil, fmt.Errorf("read balances: %w", err)
	}
	out := make([]Balance, 0, len(rows))
	for _, r := range rows {
		v, ok := new(big.Int).SetString(r.Sum, 10)
		if !ok {
			return nil, fmt.Errorf("balance of %s is %q, not an integer", r.Account, r.Sum)
		}
		if CreditNormal(r.Account) {
			v.Neg(v)
		}
		out = append(out, Balance{Account: r.Account, Network: r.Network, Asset: r.Asset, Amount: v})
	}
	return out, nil
}

func escapeLike(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

// CheckBalanced verifies that every entry in the journal sums to zero per
// asset; it returns the first that does not.
func CheckBalanced(ctx context.Context, db sqlx.QueryerContext) error {
	var bad []struct {
		Entry int64  `db:"entry_id"`
		Total string `db:"total"`
	}
	if err := sqlx.SelectContext(ctx, db, &bad, `SELECT entry_id, sum(amount)::text AS total FROM ledger_postings
		GROUP BY entry_id, network, asset HAVING sum(amount) <> 0 LIMIT 1`); err != nil {
		return fmt.Errorf("check ledger: %w", err)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: entry %d sums to %s", ErrUnbalanced, bad[0].Entry, bad[0].Total)
	}
	return nil
}

// Book reads the journal.
type Book struct{ db *sqlx.DB }

// NewBook returns a Book over db.
func NewBook(db *sqlx.DB) *Book { return &Book{db: db} }

// Balances is Balances over the Book's database, read again on another
// connection if its connection died (pg.Read).
func (b *Book) Balances(ctx context.Context, prefix string) ([]Balance, error) {
	var out []Balance
	err := pg.Read(ctx, b.db, func() (err error) {
		out, err = Balances(ctx, b.db, prefix)
		return err
	})
	return out, err
}
