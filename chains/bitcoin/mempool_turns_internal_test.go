package bitcoin

import (
	"context"
	"io"
	"log/slog"
	"math/big"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
)

// The mempool watcher and the reconciler's mempool step both write several
// sightings, each in an order of its own; they take turns, and never
// deadlock. Here the reconciler waits for sighting a (another transaction
// holds it) with the pass's writes under way, while the watcher records b
// and then a: in turns, both go through once a is free. Without the turns,
// the reconciler takes a, then waits for b, which the watcher holds while
// it waits for a: a deadlock, one of them aborted.
func TestMempoolWatcherAndReconcilerTakeTurnsWithoutDeadlock(t *testing.T) {
	first, url := pgtest.NewWithURL(t)
	// Deadlocks are detected after 100 ms in the sessions opened below.
	pgtest.Exec(t, first, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET deadlock_timeout = %L', current_database(), '100ms'); END $$`)
	first.Close()
	db, err := sqlx.Open("postgres", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	now := time.Now().UTC().Truncate(time.Microsecond)
	// Two sightings waiting for the reconciler's review (dirty), a before b.
	for _, tx := range []string{"aa", "bb"} {
		pgtest.Exec(t, db, `INSERT INTO mempool_transfers (id, network, asset, tx_hash, tx_key, idx, to_address, amount,
			first_seen_at, updated_at, dirty) VALUES ('mpt_'||$1, 'bitcoin', 'BTC', $1, 'vout:0', 0, 'bcrt1qshop', 1000, $2, $2, true)`,
			tx, now)
	}

	holder, err := db.BeginTxx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	if _, err := holder.Exec(`SELECT 1 FROM mempool_transfers WHERE tx_hash = 'aa' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	rec := reconcile.New(db, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Hour, 48*time.Hour)
	passed := make(chan error, 1)
	go func() { _, err := rec.Pass(context.Background()); passed <- err }()
	pgtest.WaitForLockWaits(t, db, 1) // the pass, at a

	m := &Mempool{src: &Source{asset: &paywatch.Asset{Network: "bitcoin", Symbol: "BTC"}}, db: db, Now: time.Now}
	recorded := make(chan error, 1)
	go func() {
		// b is seen again, a is gone from the mempool: b, then a.
		recorded <- m.record(context.Background(), "bitcoin", 100,
			[]sighting{{txid: "bb", vout: 0, to: "bcrt1qshop", amount: big.NewInt(1000), flags: []string{}, spends: []string{}}},
			[]string{"aa"}, nil)
	}()
	pgtest.WaitForLockWaits(t, db, 2) // the watcher too
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	for what, done := range map[string]chan error{"the reconciler's pass": passed, "the watcher's record": recorded} {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not end", what)
		}
	}
	var missing int
	if err := db.Get(&missing, `SELECT count(*) FROM mempool_transfers WHERE tx_hash = 'aa' AND missing_at_height IS NOT NULL`); err != nil || missing != 1 {
		t.Fatalf("the watcher's record of a as missing: %d rows (%v)", missing, err)
	}
}
