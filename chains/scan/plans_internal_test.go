package scan

import (
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch/migrations/pgtest"
)

// A scan commit's confirmation step reads what it may confirm, not the
// transfers waiting for a balance check's verdict: during a catch-up the
// verifier runs at each poll interval, and 50,000 transfers may wait
// meanwhile. With one index of every unconfirmed transfer, each commit
// read them all (about 1,200 pages here) to confirm none of them.
func TestConfirmingReadsNoTransferWaitingForAVerdict(t *testing.T) {
	db := pgtest.New(t)
	now := time.Now().UTC()
	// 50,000 waiting for a verdict, 100 that wait for nothing else.
	pgtest.Exec(t, db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address,
			amount, block_number, block_hash, state, flags, first_seen_at, updated_at)
		SELECT 'trf_' || g, 'ethereum', 'USDT', 'c', 'tx' || g, 'k', 0, 'to' || g % 1000, 1000, g, 'h' || g, 'seen',
			CASE WHEN g % 501 = 0 THEN '{}'::text[] ELSE '{`+FlagBalancePending+`}' END, $1, $1
		FROM generate_series(1, 50100) g`, now)
	pgtest.Exec(t, db, `ANALYZE transfers`)

	tx := db.MustBegin()
	defer tx.Rollback()
	// The 100 rows and their index entries: about 100 pages.
	if pages, out := updateReads(t, tx, confirmTransfers, "ethereum", 60000, now); pages > 200 {
		t.Fatalf("confirming 100 transfers among 50,000 waiting for a verdict read %.0f pages:\n%s", pages, out)
	}
	var confirmed, waiting int
	if err := tx.Get(&confirmed, `SELECT count(*) FROM transfers WHERE state = 'confirmed'`); err != nil || confirmed != 100 {
		t.Fatalf("%d confirmed (%v), want 100", confirmed, err)
	}
	if err := tx.Get(&waiting, `SELECT count(*) FROM transfers WHERE state = 'seen'`); err != nil || waiting != 50000 {
		t.Fatalf("%d still waiting (%v), want 50,000", waiting, err)
	}
}

// A scan commit orphans the look-ups it passed without seeing; those
// orphaned before (a reorg's, a lying node's answers: they stay
// provisional) are not read again by every commit after.
func TestOrphaningLookUpsReadsNoneOrphanedBefore(t *testing.T) {
	db := pgtest.New(t)
	now := time.Now().UTC()
	// 20,000 look-ups orphaned long ago, 10 live ones below the cursor.
	pgtest.Exec(t, db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address,
			amount, block_number, block_hash, state, provisional, orphaned_at, first_seen_at, updated_at)
		SELECT 'trf_' || g, 'ethereum', 'USDT', 'c', 'tx' || g, 'k', 0, 'to', 1000, g, 'h' || g,
			CASE WHEN g <= 20000 THEN 'orphaned' ELSE 'seen' END, true, CASE WHEN g <= 20000 THEN $1::timestamptz END, $1, $1
		FROM generate_series(1, 20010) g`, now)
	pgtest.Exec(t, db, `ANALYZE transfers`)

	tx := db.MustBegin()
	defer tx.Rollback()
	// The 10 live look-ups: a few pages. (Reading the 20,000 orphaned
	// before them: about 400.)
	if pages, out := updateReads(t, tx, orphanLookupsAt("$2"), "ethereum", 30000, now); pages > 30 {
		t.Fatalf("orphaning 10 look-ups among 20,000 orphaned before read %.0f pages:\n%s", pages, out)
	}
	var orphaned int
	if err := tx.Get(&orphaned, `SELECT count(*) FROM transfers WHERE state = 'orphaned'`); err != nil || orphaned != 20010 {
		t.Fatalf("%d orphaned (%v), want 20,010", orphaned, err)
	}
}

// updateReads runs update (one UPDATE) in tx under EXPLAIN and returns the
// pages it read to find its rows, with the plan: writing them, into every
// index, is the update node's own.
func updateReads(t *testing.T, tx *sqlx.Tx, update string, args ...any) (float64, string) {
	t.Helper()
	plan, out := pgtest.Explain(t, tx, update, args...)
	if len(plan.Plans) != 1 {
		t.Fatalf("plan %s", out)
	}
	return plan.Plans[0].Pages(), out
}
