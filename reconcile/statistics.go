package reconcile

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch/migrations/pg"
)

// analyzedTables are the tables whose open rows (orders waiting for
// payment, transfers and sightings still unmatched, webhook events still
// pending) are a small, fast-moving part of a large history. PostgreSQL's
// autovacuum analyzes a table only once a tenth of it changed (and not at
// all where it is turned off), so a burst of open rows (a sale's checkouts,
// a flood of dust outputs, a receiver's outage) can stay invisible to the
// planner for hours: it then believes the open part empty and reads it
// whole once per row of the other side of a join. 30,000 checkouts after
// the statistics, and 1,000 sightings, made the mempool step read 13
// million pages.
var analyzedTables = []string{"orders", "transfers", "mempool_transfers", "webhook_outbox"}

// AnalyzeAfter is how many rows of one of those tables may change (inserted,
// updated, deleted) before RefreshStatistics analyzes it again.
const AnalyzeAfter = 500

// RefreshStatistics analyzes each of analyzedTables that changed by
// AnalyzeAfter rows or more since it was last analyzed (by anyone), and
// returns the tables it analyzed. An ANALYZE that would wait for a lock
// (autovacuum working on the table) is left for the next call.
func (r *Reconciler) RefreshStatistics(ctx context.Context) ([]string, error) {
	var stale []string
	if err := r.db.SelectContext(ctx, &stale, `SELECT relname FROM pg_stat_user_tables
		WHERE schemaname = current_schema() AND relname = ANY ($1) AND n_mod_since_analyze >= $2 ORDER BY relname`,
		pq.Array(analyzedTables), AnalyzeAfter); err != nil {
		return nil, fmt.Errorf("read table statistics: %w", err)
	}
	var done []string
	for _, table := range stale {
		err := pg.Tx(ctx, r.db, func(tx *sqlx.Tx) error {
			if _, err := tx.ExecContext(ctx, `SET LOCAL lock_timeout = '1s'`); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `ANALYZE `+table)
			return err
		})
		var pqErr *pq.Error
		switch {
		case errors.As(err, &pqErr) && pqErr.Code == "55P03":
			// Autovacuum (or another instance) is at it: next time.
		case err != nil:
			return done, fmt.Errorf("analyze %s: %w", table, err)
		default:
			done = append(done, table)
		}
	}
	return done, nil
}
