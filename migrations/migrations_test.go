package migrations_test

import (
	"context"
	"testing"

	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

func TestUpIsIdempotent(t *testing.T) {
	db := pgtest.New(t) // applies everything once
	ctx := context.Background()
	applied, err := migrations.Up(ctx, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 0 {
		t.Fatalf("second Up applied %v, want nothing", applied)
	}
	current, latest, err := migrations.Version(ctx, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	if current != latest || latest < 2 {
		t.Fatalf("version %d of %d", current, latest)
	}
	for _, table := range []string{"orders", "order_events", "amount_slots", "derivation_counters",
		"webhook_outbox", "transfers", "chain_cursors"} {
		var n int
		if err := db.Get(&n, "SELECT count(*) FROM "+table); err != nil {
			t.Errorf("table %s: %v", table, err)
		}
	}
}

func TestConcurrentUp(t *testing.T) {
	u := pgtest.NewURL(t)
	errs := make(chan error, 3)
	for i := 0; i < 3; i++ {
		go func() {
			db, err := openDB(u)
			if err != nil {
				errs <- err
				return
			}
			defer db.Close()
			_, err = migrations.Up(context.Background(), db)
			errs <- err
		}()
	}
	for i := 0; i < 3; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent Up: %v", err)
		}
	}
}
