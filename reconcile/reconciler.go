// Package reconcile ties transfers to order dossiers and moves the dossiers
// through their lifecycle: matching by exact amount or by per-order
// address, customers' tx hash claims, the scheduled reconciler pass, its
// ledger postings, and operators' attach and resolve actions.
//
// Which payment may pay which order is decided in one place (eligibility);
// which status an order's payments call for is paywatch.Decide, a pure
// function checked against paywatch.Lifecycle. A pass is set-based SQL in
// batches; every step is idempotent (a second pass right after the first
// changes nothing) and safe beside another instance: matching only claims
// unmatched transfers of locked orders, ledger entries are unique by (kind,
// ref), and transitions lock their orders with FOR NO KEY UPDATE SKIP LOCKED
// and apply only if the status is still the one decided on.
//
// Locks are always taken order before transfer, so that no two paths wait
// on each other.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/ledger"
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
	// Lookback bounds how old (first seen) an unmatched transfer may be to
	// still match: the longest expiry plus the monitoring window.
	Lookback time.Duration
	// Batch is the number of orders per transition statement.
	Batch int
	// Lookups read a transaction straight from a network's node, by
	// network name, for customers' tx hashes no watcher has recorded yet.
	// They run beside the passes (LookUpHints), never inside one.
	Lookups map[string]TxLookup
	// Record stores what a look-up found, as provisional transfers.
	Record func(ctx context.Context, network string, found []scan.Found) error
	// Sealer writes the bodies of the webhooks a pass enqueues, in the
	// pass's transactions.
	Sealer *orders.Sealer
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
	Matched     int64 // transfers tied to orders, by amount, address or claim
	Ambiguous   int64 // transfers with more than one candidate order
	Claims      int64 // customers' tx hash claims decided (linked or rejected)
	Entries     int64 // ledger entries posted (receipts, attributions, reversals)
	Transitions int64 // order status changes
	Mempool     int64 // mempool sightings tied to orders or ended
}

func (r Result) String() string {
	return fmt.Sprintf("matched=%d ambiguous=%d claims=%d entries=%d transitions=%d mempool=%d",
		r.Matched, r.Ambiguous, r.Claims, r.Entries, r.Transitions, r.Mempool)
}

func (r *Reconciler) now() time.Time { return r.Now().UTC().Truncate(time.Microsecond) }

// Pass runs one reconciliation: follow mempool sightings, match, follow
// claims, post ledger entries, move orders.
//
// A step can give the one before it work: a transfer the ledger step takes
// from an order it no longer pays may be another order's exact payment, an
// order a reorg moved back to confirming takes top-ups again. So the steps
// run in rounds until a round changes nothing (at most maxRounds): a pass
// right after another changes nothing.
func (r *Reconciler) Pass(ctx context.Context) (Result, error) {
	now := r.now()
	var total Result
	claims := newClaimBudget() // the claims this pass may still decide
	var sightings error        // the mempool step's failures: they stop no round
	for round := 0; round < maxRounds; round++ {
		res, serr, err := r.round(ctx, now, &claims)
		if sightings == nil {
			sightings = serr // the first round's says it
		}
		total.Matched += res.Matched
		total.Ambiguous += res.Ambiguous
		total.Claims += res.Claims
		total.Entries += res.Entries
		total.Transitions += res.Transitions
		total.Mempool += res.Mempool
		if err != nil {
			return total, errors.Join(sightings, err)
		}
		if res == (Result{}) {
			break
		}
	}
	if total != (Result{}) {
		r.log.Info("reconciled", "matched", total.Matched, "ambiguous", total.Ambiguous, "claims", total.Claims,
			"entries", total.Entries, "transitions", total.Transitions, "mempool", total.Mempool)
	}
	return total, sightings
}

// maxRounds bounds the rounds of a pass; what is left waits for the next.
const maxRounds = 4

// round runs each step of a pass once; claims is what is left of the
// pass's budget of claims (followHints). Mempool sightings stand apart
// from the transfers: the mempool step's failure (a connection lost, a
// statement timed out) holds back no payment. It is returned apart
// (sightings), and the round goes on.
func (r *Reconciler) round(ctx context.Context, now time.Time, claims *claimBudget) (res Result, sightings, err error) {
	if res.Mempool, sightings = r.mempool(ctx, now); sightings != nil {
		r.log.Warn("mempool step failed; the rest of the pass goes on", "err", sightings)
	}
	if res.Ambiguous, err = r.flagAmbiguous(ctx, now); err != nil {
		return res, sightings, fmt.Errorf("flag ambiguous transfers: %w", err)
	}
	if res.Matched, err = r.match(ctx, now); err != nil {
		return res, sightings, fmt.Errorf("match transfers: %w", err)
	}
	linked, decided, err := r.followHints(ctx, now, claims)
	if err != nil {
		return res, sightings, fmt.Errorf("check tx hash claims: %w", err)
	}
	res.Matched += linked
	res.Claims = decided
	if res.Entries, err = r.postLedger(ctx, now); err != nil {
		return res, sightings, err
	}
	res.Transitions, err = r.transitions(ctx, now)
	return res, sightings, err
}

// PostLedger brings the ledger up to date with the transfers: reversals of
// what reorgs undid, receipts of confirmed transfers, attributions of
// matched ones. Pass does it too; it returns the entries posted.
func (r *Reconciler) PostLedger(ctx context.Context) (int64, error) {
	return r.postLedger(ctx, r.now())
}

func (r *Reconciler) postLedger(ctx context.Context, now time.Time) (int64, error) {
	var n int64
	err := r.Sealer.SealTx(ctx, r.db, func(tx *sqlx.Tx) error {
		var err error
		n, err = postLedgerTx(ctx, tx, now)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("post ledger entries: %w", err)
	}
	return n, nil
}

// postLedgerTx posts the transfers' ledger entries inside tx and queues a
// review of every order whose account they changed. Matched transfers that
// changed so that they can no longer pay their order are detached first.
func postLedgerTx(ctx context.Context, tx *sqlx.Tx, now time.Time) (int64, error) {
	p, err := ledger.PostTransfers(ctx, tx, now, func(dirty []string) error {
		if _, err := tx.ExecContext(ctx, recheckMatches, now, pq.Array(dirty)); err != nil {
			return fmt.Errorf("check the matches of changed transfers: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if err := queueReviews(ctx, tx, now, p.Orders); err != nil {
		return 0, err
	}
	return p.Entries, nil
}

// queueReviews asks the next transitions step to decide these orders again.
func queueReviews(ctx context.Context, ex sqlx.ExecerContext, now time.Time, orderIDs []string) error {
	if len(orderIDs) == 0 {
		return nil
	}
	if _, err := ex.ExecContext(ctx, reviewSQL(`SELECT unnest($2::text[])`), now, pq.Array(orderIDs)); err != nil {
		return fmt.Errorf("queue order reviews: %w", err)
	}
	return nil
}

// flagAmbiguous locks the orders that ambiguous transfers could pay, then
// flags the transfers and disputes the orders, in one transaction.
func (r *Reconciler) flagAmbiguous(ctx context.Context, now time.Time) (int64, error) {
	// $4: an id for the webhook event of each order it may dispute.
	return r.lockThen(ctx, now, ambiguousOrders, flagAmbiguous, func(locked []string) []any {
		made := time.Now()
		ids := make([]string, len(locked))
		for i := range ids {
			ids[i] = paywatch.NewSortableID("evt", made)
		}
		return []any{pq.Array(ids)}
	})
}

// match locks the orders transfers would pay, then ties the transfers to
// them, in one transaction.
func (r *Reconciler) match(ctx context.Context, now time.Time) (int64, error) {
	return r.lockThen(ctx, now, matchOrders, matchTransfers, nil)
}

// lockThen runs lock (a SELECT … FOR NO KEY UPDATE of order ids) and then
// apply over the orders it locked ($3), in one transaction; both take the
// pass's parameters: $1 now, $2 the oldest first_seen_at that may still
// match.
func (r *Reconciler) lockThen(ctx context.Context, now time.Time, lock, apply string, extra func(locked []string) []any) (int64, error) {
	var n int64
	err := r.Sealer.SealTx(ctx, r.db, func(tx *sqlx.Tx) error {
		var locked []string
		if err := tx.SelectContext(ctx, &locked, lock, now, now.Add(-r.Lookback)); err != nil || len(locked) == 0 {
			return err
		}
		args := []any{now, now.Add(-r.Lookback), pq.Array(locked)}
		if extra != nil {
			args = append(args, extra(locked)...)
		}
		return tx.GetContext(ctx, &n, apply, args...)
	})
	return n, err
}
