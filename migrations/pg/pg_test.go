package pg_test

import (
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// After every pooled connection died while idle (the server restarted or
// ended its sessions, a load balancer reset them), the next transactions
// begin on fresh connections: a BEGIN that found its connection dead
// started nothing, so beginning again elsewhere is safe, and the caller
// never sees the dead connection. Both ways a connection dies are tried:
// the server ends the session (the driver reads its farewell) and the
// network resets it (the driver reads a TCP reset, the way a session
// ended under load sometimes ends).
func TestTxBeginsAgainAfterItsConnectionDied(t *testing.T) {
	ctx := t.Context()
	dbURL := pgtest.NewURL(t)
	p, viaProxy := pgtest.NewProxy(t, dbURL)
	db, err := sqlx.Open("postgres", viaProxy)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	admin, err := sqlx.Open("postgres", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	const pooled = 4
	db.SetMaxIdleConns(pooled)
	db.SetMaxOpenConns(pooled)
	kills := map[string]func() error{
		"the server ends the sessions": func() error {
			_, err := admin.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid()`)
			return err
		},
		"the network resets the connections as they speak": func() error { p.Reset(); return nil },
	}
	for how, kill := range kills {
		for round := range 3 {
			// Fill the pool with live idle connections.
			var wg sync.WaitGroup
			hold := make(chan struct{})
			for range pooled {
				wg.Go(func() {
					conn, err := db.Connx(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					defer conn.Close()
					<-hold
				})
			}
			time.Sleep(50 * time.Millisecond)
			close(hold)
			wg.Wait()
			if n := db.Stats().Idle; n != pooled {
				t.Fatalf("%d idle connections, want %d", n, pooled)
			}
			if err := kill(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			for i := range pooled {
				err := pg.Tx(ctx, db, func(tx *sqlx.Tx) error {
					_, err := tx.ExecContext(ctx, `SELECT 1`)
					return err
				})
				if err != nil {
					t.Fatalf("%s, round %d, transaction %d: %v", how, round, i, err)
				}
			}
		}
	}
}
