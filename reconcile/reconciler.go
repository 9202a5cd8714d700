// Package reconcile ties transfers to order dossiers and moves the dossiers
// through their lifecycle (DESIGN.md): matching by exact amount or by
// per-order address, the scheduled reconciler pass, its ledger postings,
// and operators' attach and resolve actions.
//
// A pass is set-based SQL in batches. Every step is idempotent (a second
// pass right after the first changes nothing) and safe beside another
// instance: matching only claims unmatched transfers, ledger entries are
// unique by (kind, ref), and transitions lock their orders with FOR UPDATE
// SKIP LOCKED and apply only if the status is still the one decided on.
package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// DefaultBatch is how many orders one transition statement handles.
const DefaultBatch = 2000

// Reconciler runs reconciliation passes over the database.
type Reconciler struct {
	db  *sqlx.DB
	log *slog.Logger
	// Now is the clock; tests replace it.
	Now func() time.Time
	// PaidGrace is how long after "I've paid" a missing payment disputes.
	PaidGrace time.Duration
	// Lookback bounds how old an unmatched transfer may be to still match:
	// the longest expiry plus the monitoring window.
	Lookback time.Duration
	// Batch is the number of orders per transition statement.
	Batch int
	// Lookups read a transaction straight from a network's node, by
	// network name, for "I've paid" hints the scanner has not reached.
	Lookups map[string]TxLookup
	// Record stores what a lookup found.
	Record func(ctx context.Context, network string, found []scan.Found) error
}

// TxLookup reads one transaction's transfers to watched addresses.
type TxLookup interface {
	LookupTx(ctx context.Context, hash string) ([]scan.Found, error)
}

// New returns a Reconciler.
func New(db *sqlx.DB, log *slog.Logger, paidGrace, lookback time.Duration) *Reconciler {
	return &Reconciler{db: db, log: log, Now: time.Now, PaidGrace: paidGrace, Lookback: lookback, Batch: DefaultBatch}
}

// Result counts what a pass did.
type Result struct {
	Matched     int64 // transfers tied to orders
	Ambiguous   int64 // transfers with more than one candidate order
	Entries     int64 // ledger entries posted (receipts, attributions, reversals)
	Transitions int64 // order status changes
}

func (r Result) String() string {
	return fmt.Sprintf("matched=%d ambiguous=%d entries=%d transitions=%d", r.Matched, r.Ambiguous, r.Entries, r.Transitions)
}

// Pass runs one reconciliation: match, post ledger entries, move orders.
func (r *Reconciler) Pass(ctx context.Context) (Result, error) {
	now := r.Now().UTC().Truncate(time.Microsecond)
	var res Result
	var err error
	if res.Ambiguous, err = r.exec(ctx, flagAmbiguous, now); err != nil {
		return res, fmt.Errorf("flag ambiguous transfers: %w", err)
	}
	if res.Matched, err = r.exec(ctx, matchTransfers, now); err != nil {
		return res, fmt.Errorf("match transfers: %w", err)
	}
	if n, err := r.checkHints(ctx, now); err != nil {
		return res, fmt.Errorf("check tx hash hints: %w", err)
	} else {
		res.Matched += n
	}
	if res.Entries, err = r.postLedger(ctx, now); err != nil {
		return res, err
	}
	n, err := r.transitions(ctx, now)
	res.Transitions = n
	if err != nil {
		return res, err
	}
	if res != (Result{}) {
		r.log.Info("reconciled", "matched", res.Matched, "ambiguous", res.Ambiguous, "entries", res.Entries, "transitions", res.Transitions)
	}
	return res, nil
}

// PostLedger brings the ledger up to date with the transfers: reversals of
// what reorgs undid, receipts of confirmed transfers, attributions of
// matched ones. Pass does it too; it returns the entries posted.
func (r *Reconciler) PostLedger(ctx context.Context) (int64, error) {
	return r.postLedger(ctx, r.Now().UTC().Truncate(time.Microsecond))
}

func (r *Reconciler) postLedger(ctx context.Context, now time.Time) (int64, error) {
	var total int64
	err := orders.Tx(ctx, r.db, func(tx *sqlx.Tx) error {
		var err error
		total, err = postLedgerTx(ctx, tx, now, now.Add(-r.Lookback))
		return err
	})
	return total, err
}

// ledgerLock serialises the ledger statements of concurrent passes (and of
// operators' resolutions): each sees what the previous one posted.
const ledgerLock = `SELECT pg_advisory_xact_lock(hashtextextended('paywatch:ledger', 0))`

// postLedgerTx runs the ledger statements inside tx, under the ledger lock.
func postLedgerTx(ctx context.Context, tx *sqlx.Tx, now, since time.Time) (int64, error) {
	if _, err := tx.ExecContext(ctx, ledgerLock); err != nil {
		return 0, fmt.Errorf("lock the ledger: %w", err)
	}
	var total int64
	for _, step := range []struct {
		name, sql string
	}{
		{"reverse entries of orphaned transfers", reverseOrphaned},
		{"post receipts", postReceipts},
		{"post attributions", postAttributions},
	} {
		var n int64
		if err := tx.GetContext(ctx, &n, step.sql, now, since); err != nil {
			return total, fmt.Errorf("%s: %w", step.name, err)
		}
		total += n
	}
	return total, nil
}

// exec runs one set-based statement with the pass's parameters: $1 now,
// $2 the oldest first_seen_at that may still match.
func (r *Reconciler) exec(ctx context.Context, query string, now time.Time) (int64, error) {
	var n int64
	if err := r.db.GetContext(ctx, &n, query, now, now.Add(-r.Lookback)); err != nil {
		return 0, err
	}
	return n, nil
}

// transitions moves orders in batches of r.Batch, walking the open orders
// by id.
func (r *Reconciler) transitions(ctx context.Context, now time.Time) (int64, error) {
	var total int64
	after := ""
	for {
		var row struct {
			Candidates int64   `db:"candidates"`
			Last       *string `db:"last_id"`
			Moved      int64   `db:"moved"`
		}
		if err := r.db.GetContext(ctx, &row, transitionBatch, now, r.PaidGrace.Seconds(), after, r.Batch); err != nil {
			return total, fmt.Errorf("move orders: %w", err)
		}
		total += row.Moved
		if row.Candidates < int64(r.Batch) || row.Last == nil {
			return total, nil
		}
		after = *row.Last
	}
}
