package migrations_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
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

// Upgrading a database that holds webhook events written before delivery
// existed (before migration 7): those not delivered are marked failed, "not
// sent on upgrade" (they would carry today's order long after the fact),
// those delivered stay delivered; nothing else changes.
func TestUpgradeMarksOldUndeliveredWebhooksFailed(t *testing.T) {
	ctx := context.Background()
	dbURL, name := pgtest.UnusedURL(t)
	admin, err := sql.Open("postgres", pgtest.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("postgres", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := migrations.UpTo(ctx, db, 6); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount, pay_address,
			status, created_at, expires_at, monitor_until, updated_at, earliest_block_time)
			VALUES ('ord_old', 'old-1', '\x00', 'ethereum', 'USDT', 'c', 1, 1, '0xshop', 'settled', now(), now() + interval '1 hour',
			now() + interval '2 hours', now(), now())`,
		`INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at, delivered_at)
			VALUES ('evt_sent', 'ord_old', 'order.confirming', now(), now(), now()),
			       ('evt_unsent', 'ord_old', 'order.settled', now(), now(), NULL)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(`SELECT id, status, coalesce(last_error, '') FROM webhook_outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string][2]string{}
	for rows.Next() {
		var id, status, lastErr string
		if err := rows.Scan(&id, &status, &lastErr); err != nil {
			t.Fatal(err)
		}
		got[id] = [2]string{status, lastErr}
	}
	if got["evt_sent"][0] != "delivered" || got["evt_unsent"][0] != "failed" || !strings.Contains(got["evt_unsent"][1], "not sent on upgrade") {
		t.Fatalf("after the upgrade: %v", got)
	}
}
