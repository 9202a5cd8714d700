// Package pgtest gives each test a fresh PostgreSQL database with every
// paywatch migration applied, and drops it when the test ends.
//
// The server is found through PAYWATCH_TEST_DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable). When no
// server answers, the test fails; outside CI (CI unset) it is skipped.
package pgtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the PostgreSQL driver

	"github.com/paywatch/paywatch/migrations"
)

// ServerURL is the URL of the PostgreSQL server tests use.
func ServerURL() string {
	if u := os.Getenv("PAYWATCH_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// NewURL creates an empty database and returns its URL; the database is
// dropped when t ends.
func NewURL(t testing.TB) string {
	t.Helper()
	u, name := UnusedURL(t)
	admin := adminDB(t)
	defer admin.Close()
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	// A test's database need not survive a crash of the server: commits
	// that do not wait for the disk make the suite several times faster.
	if _, err := admin.Exec("ALTER DATABASE " + name + " SET synchronous_commit TO off"); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return u
}

// UnusedURL returns the URL and name of a database that does not exist
// yet on the test server; whoever creates it, it is dropped when t ends.
func UnusedURL(t testing.TB) (string, string) {
	t.Helper()
	adminDB(t).Close() // fail (or skip) early when there is no server
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "paywatch_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		db, err := sql.Open("postgres", ServerURL())
		if err != nil {
			return
		}
		defer db.Close()
		_, _ = db.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)")
	})
	u, err := url.Parse(ServerURL())
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	u.Path = "/" + name
	return u.String(), name
}

func adminDB(t testing.TB) *sql.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := sql.Open("postgres", ServerURL())
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if err := admin.PingContext(ctx); err != nil {
		admin.Close()
		if os.Getenv("CI") == "" {
			t.Skipf("pgtest: no PostgreSQL at %s: %v", ServerURL(), err)
		}
		t.Fatalf("pgtest: no PostgreSQL at %s: %v", ServerURL(), err)
	}
	return admin
}

// New returns a connection to a fresh database with all migrations applied.
func New(t testing.TB) *sqlx.DB {
	t.Helper()
	db, _ := NewWithURL(t)
	return db
}

// NewWithURL is New that also returns the database's URL, for tests that
// start the daemon against it.
func NewWithURL(t testing.TB) (*sqlx.DB, string) {
	t.Helper()
	u := NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db, err := migrations.Open(ctx, u)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := migrations.Up(ctx, db.DB); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return db, u
}

// Exec runs statements on db and fails the test on error; for fixtures.
func Exec(t testing.TB, db *sqlx.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.Exec(query, args...); err != nil {
		t.Fatalf("pgtest: %s: %v", fmt.Sprintf("%.80s", query), err)
	}
}

// FillPool opens n connections of db at once and returns them to its pool,
// idle, and fails the test unless the pool then holds n idle connections:
// the state a daemon's pool is in between bursts.
func FillPool(t testing.TB, db *sqlx.DB, n int) {
	t.Helper()
	conns := make([]*sqlx.Conn, 0, n)
	for range n {
		c, err := db.Connx(context.Background())
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Close()
	}
	if idle := db.Stats().Idle; idle != n {
		t.Fatalf("pgtest: %d idle connections, want %d", idle, n)
	}
}

// WaitForLockWaits waits until n sessions of db's database wait on locks,
// and fails the test when they do not within 10 s.
func WaitForLockWaits(t testing.TB, db *sqlx.DB, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var waiting int
		if err := db.Get(&waiting, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		if waiting >= n {
			return
		}
	}
	t.Fatalf("fewer than %d sessions waited on a lock within 10 s", n)
}

// Plan is a node of EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON): the buffers
// it read (its children's included) and its children.
type Plan struct {
	Hit   float64 `json:"Shared Hit Blocks"`
	Read  float64 `json:"Shared Read Blocks"`
	Plans []Plan  `json:"Plans"`
}

// Pages is how many pages the node read, from the cache or not.
func (p Plan) Pages() float64 { return p.Hit + p.Read }

// Explain runs query with args through q under EXPLAIN (ANALYZE, BUFFERS,
// FORMAT JSON) and returns its top node, with the plan as PostgreSQL wrote
// it (for a failure's message). Run it in a transaction the test rolls
// back when query writes.
func Explain(t testing.TB, q sqlx.Queryer, query string, args ...any) (Plan, string) {
	t.Helper()
	var out string
	if err := sqlx.Get(q, &out, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+query, args...); err != nil {
		t.Fatal(err)
	}
	var plans []struct{ Plan Plan }
	if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
		t.Fatalf("plan %s: %v", out, err)
	}
	return plans[0].Plan, out
}

// WaitModified waits until PostgreSQL's statistics counters show at least
// n rows of table changed since it was last analyzed, and fails t after
// 30 s: a session sends its counters at a transaction's end at most once
// a second, and within 10 s once idle.
func WaitModified(t testing.TB, db *sqlx.DB, table string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var moved int
		if err := db.Get(&moved, `SELECT coalesce((SELECT n_mod_since_analyze FROM pg_stat_user_tables
			WHERE relid = to_regclass($1)), 0)`, table); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		if moved >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: the statistics counters show %d rows of %s changed, want %d", moved, table, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
