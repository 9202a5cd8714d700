package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/lib/pq"
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

// RefreshStatistics analyzes each of analyzedTables (as the search path
// finds them) that changed by AnalyzeAfter rows or more since it was last
// analyzed, by anyone, and returns those it analyzed. A table someone else
// is vacuuming or analyzing (autovacuum) is skipped, not waited for, and
// so is one the database user may not analyze (not its owner): both are
// tried again next time. One table's failure does not keep the others
// from being analyzed.
func (r *Reconciler) RefreshStatistics(ctx context.Context) ([]string, error) {
	const stale = `SELECT c.relname FROM unnest($1::text[]) AS t(name)
		JOIN pg_stat_user_tables c ON c.relid = to_regclass(t.name)
		WHERE c.n_mod_since_analyze >= $2 ORDER BY c.relname`
	var tables []string
	if err := r.db.SelectContext(ctx, &tables, stale, pq.Array(analyzedTables), AnalyzeAfter); err != nil {
		return nil, fmt.Errorf("read table statistics: %w", err)
	}
	if len(tables) == 0 {
		return nil, nil
	}
	var errs []error
	for _, table := range tables {
		// SKIP_LOCKED: a warning, not a wait, when the table's lock is
		// taken (waiting, it could also cancel autovacuum's work).
		if _, err := r.db.ExecContext(ctx, `ANALYZE (SKIP_LOCKED) `+pq.QuoteIdentifier(table)); err != nil {
			errs = append(errs, fmt.Errorf("analyze %s: %w", table, err))
		}
	}
	// What was analyzed is what no longer counts as changed (a table
	// skipped, or not the user's to analyze, still does).
	var left []string
	if err := r.db.SelectContext(ctx, &left, stale, pq.Array(tables), AnalyzeAfter); err != nil {
		return nil, errors.Join(append(errs, fmt.Errorf("read table statistics: %w", err))...)
	}
	var done []string
	for _, table := range tables {
		if !slices.Contains(left, table) {
			done = append(done, table)
		}
	}
	return done, errors.Join(errs...)
}
