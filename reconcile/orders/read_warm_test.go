package orders_test

import (
	"context"
	"testing"

	"github.com/paywatch/paywatch/migrations/pgtest"
)

// Warm leaves the connections it opened idle in the pool, each having
// read the orders table once, so that the first requests after a start
// find them open; a context that ends first is an error, and the pool
// still serves reads.
func TestWarmOpensTheConnectionsAheadOfRequests(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	ctx := context.Background()
	db.SetConnMaxIdleTime(0) // nothing closes them during the test
	if err := s.Warm(ctx, 6); err != nil {
		t.Fatal(err)
	}
	if st := db.Stats(); st.OpenConnections < 6 || st.Idle < 6 || st.InUse != 0 {
		t.Fatalf("after Warm(6): %d open, %d idle, %d in use; want 6 idle", st.OpenConnections, st.Idle, st.InUse)
	}
	// Each of them has read the orders table (its session's first read of
	// orders is behind it).
	var sessions int
	if err := db.Get(&sessions, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND query LIKE '%FROM orders o WHERE o.id = $1%'`); err != nil || sessions < 5 {
		// (the one that ran this query has just replaced its own)
		t.Fatalf("%d sessions read the orders (%v), want at least 5", sessions, err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Warm(done, 3); err == nil {
		t.Fatal("Warm with an ended context reported no error")
	}
	if _, _, err := s.Create(ctx, req("after-warm", usdt, 1_000_000)); err != nil {
		t.Fatalf("a creation after a failed Warm: %v", err)
	}
}
