package scan

import (
	"context"
	"strings"
	"testing"

	"github.com/paywatch/paywatch/migrations/pgtest"
)

// README ("Reorgs"): on a mismatch the scanner "walks back to the highest
// kept block still canonical, marks the transfers above it `orphaned`
// (never deletes them), records the reorg, and rescans, in one
// transaction". A walk-back whose record of the reorg fails writes
// nothing: no transfer is orphaned, the new chain's payment is not
// recorded, and the cursor stays where it was. Once the record can be
// written, the next step walks back in full.
func TestReorgWalkBackIsOneTransaction(t *testing.T) {
	ctx := context.Background()
	c, s, store := caughtUp(t, 50, 40)
	before := live(t, store)
	cursor, _, err := store.Cursor(ctx, "fake")
	if err != nil {
		t.Fatal(err)
	}

	c.mu.Lock()
	c.reorg(4, "b") // blocks 46 to 49 replaced
	c.payments[48] = 2
	c.mu.Unlock()
	pgtest.Exec(t, store.db, `CREATE FUNCTION reorg_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'reorgs cannot be recorded now'; END $$`)
	pgtest.Exec(t, store.db, `CREATE TRIGGER reorg_refuse BEFORE INSERT ON chain_reorgs
		FOR EACH ROW EXECUTE FUNCTION reorg_refuse()`)
	if _, err := s.Step(ctx); err == nil || !strings.Contains(err.Error(), "reorgs cannot be recorded now") {
		t.Fatalf("the walk-back's step returned %v, want the failed record of the reorg", err)
	}
	after := live(t, store)
	for h, state := range after {
		if before[h] != state {
			t.Fatalf("transfer %s is %s after a failed walk-back, was %q: %v", h, state, before[h], after)
		}
	}
	if len(after) != len(before) {
		t.Fatalf("%d transfers after a failed walk-back, %d before: %v", len(after), len(before), after)
	}
	if got, _, err := store.Cursor(ctx, "fake"); err != nil || *got != *cursor {
		t.Fatalf("the cursor is %+v (%v) after a failed walk-back, was %+v", got, err, cursor)
	}
	var reorgs int
	if err := store.db.Get(&reorgs, `SELECT count(*) FROM chain_reorgs`); err != nil || reorgs != 0 {
		t.Fatalf("%d reorgs recorded (%v), want none", reorgs, err)
	}

	pgtest.Exec(t, store.db, `DROP TRIGGER reorg_refuse ON chain_reorgs`)
	drain(t, s)
	if orphaned, seen := afterFork(t, store, "0xt46"); orphaned != 4 || seen != 7 {
		t.Fatalf("%d orphaned, %d live after the walk-back; want 4 and 7", orphaned, seen)
	}
	var fork, old int64
	if err := store.db.QueryRow(`SELECT fork_block, old_cursor FROM chain_reorgs`).Scan(&fork, &old); err != nil {
		t.Fatalf("the reorg's record: %v", err)
	}
	if fork != 45 || old != 49 {
		t.Fatalf("the reorg is recorded at fork block %d from cursor %d, want 45 from 49", fork, old)
	}
	if got, _, err := store.Cursor(ctx, "fake"); err != nil || got.Number != 49 || got.Hash != "0xb49" {
		t.Fatalf("the cursor is %+v (%v) after the walk-back, want block 49 of the new chain", got, err)
	}
}
