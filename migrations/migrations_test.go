package migrations_test

import (
	"context"
	"path/filepath"
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
	// Every SQL file of this directory is applied: the latest version is
	// the number of the last of them (they are numbered 1, 2, 3, …).
	sqlFiles, err := filepath.Glob("*.sql")
	if err != nil || len(sqlFiles) == 0 {
		t.Fatalf("no migrations found (%v)", err)
	}
	if current != latest || latest != int64(len(sqlFiles)) {
		t.Fatalf("version %d of %d, with %d migration files", current, latest, len(sqlFiles))
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
