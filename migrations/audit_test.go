package migrations_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pressly/goose/v3/lock"

	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// latestVersion is the number of the last migration file (they are
// numbered 1, 2, 3, …).
func latestVersion(t *testing.T) int64 {
	t.Helper()
	files, err := filepath.Glob("*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations found (%v)", err)
	}
	return int64(len(files))
}

// recorded returns how many times goose's table records each version
// applied.
func recorded(t *testing.T, db *sql.DB) map[int64]int {
	t.Helper()
	rows, err := db.Query(`SELECT version_id, count(*) FROM goose_db_version WHERE is_applied AND version_id > 0 GROUP BY version_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[int64]int{}
	for rows.Next() {
		var v int64
		var n int
		if err := rows.Scan(&v, &n); err != nil {
			t.Fatal(err)
		}
		m[v] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// README: "pressly/goose — embedded SQL migrations, applied under a
// PostgreSQL advisory lock so that several daemons starting at once
// migrate once." Four daemons' Up calls on one empty database, each from
// its own connection pool, started together: none fails, the migrations
// are applied once in all (each version returned by exactly one caller),
// and goose's table records each version once.
func TestSeveralDaemonsStartingAtOnceMigrateOnce(t *testing.T) {
	u := pgtest.NewURL(t)
	const daemons = 4
	latest := latestVersion(t)
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		applied = make([][]int64, daemons)
		errs    = make([]error, daemons)
	)
	for i := range daemons {
		db, err := openDB(u)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.Ping(); err != nil { // connected before the start
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			applied[i], errs[i] = migrations.Up(ctx, db)
		}()
	}
	close(start)
	wg.Wait()
	var all []int64
	for i := range daemons {
		if errs[i] != nil {
			t.Fatalf("daemon %d of %d starting at once failed to migrate: %v", i, daemons, errs[i])
		}
		all = append(all, applied[i]...)
	}
	slices.Sort(all)
	want := make([]int64, latest)
	for i := range want {
		want[i] = int64(i + 1)
	}
	if !slices.Equal(all, want) {
		t.Fatalf("the %d daemons applied versions %v between them (per daemon: %v), want each of 1…%d once", daemons, all, applied, latest)
	}
	db, err := openDB(u)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	got := recorded(t, db)
	for v := int64(1); v <= latest; v++ {
		if got[v] != 1 {
			t.Fatalf("goose_db_version records version %d %d times (all: %v), want once", v, got[v], got)
		}
	}
	if len(got) != int(latest) {
		t.Fatalf("goose_db_version records versions %v, want 1…%d", got, latest)
	}
}

// README: "applied under a PostgreSQL advisory lock". While another
// session holds goose's advisory lock (a daemon migrating), Up applies
// nothing: it is seen trying the lock, with no migration applied; once
// the lock is released it applies every migration.
func TestMigrationsWaitForTheAdvisoryLock(t *testing.T) {
	u := pgtest.NewURL(t)
	ctx := context.Background()
	holder, err := openDB(u)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	conn, err := holder.Conn(ctx) // a session of its own, as a migrating daemon holds
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, lock.DefaultLockID); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := conn.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}

	db, err := openDB(u)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	done := make(chan error, 1)
	var applied []int64
	go func() {
		var err error
		applied, err = migrations.Up(ctx, db)
		done <- err
	}()
	// Up is seen trying the lock (goose polls it with pg_try_advisory_lock)
	// while it is held.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := holder.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND pid NOT IN ($1, pg_backend_pid()) AND query ILIKE '%pg_try_advisory_lock%'`, pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Up returned (%v, applied %v) while another session held the migration lock, without waiting for it", err, applied)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("Up never tried the migration lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var tables int
	if err := holder.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables
		WHERE table_schema = 'public' AND table_name IN ('orders', 'transfers')`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("Up returned (%v, applied %v) while another session held the migration lock", err, applied)
	default:
	}
	if tables != 0 {
		t.Fatalf("%d of the schema's tables exist while another session holds the migration lock, want none: Up did not wait", tables)
	}
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, lock.DefaultLockID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil || len(applied) != int(latestVersion(t)) {
			t.Fatalf("once the lock was released Up applied %v (%v), want every migration", applied, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Up did not finish within 30 s of the lock's release")
	}
	if got := recorded(t, db); len(got) != int(latestVersion(t)) {
		t.Fatalf("goose_db_version records %v", got)
	}
}
