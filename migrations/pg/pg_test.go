package pg_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
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
	const pooled = 4
	p, db := pgtest.ProxiedPool(t, dbURL, pooled)
	admin, err := sqlx.Open("postgres", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
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
			pgtest.FillPool(t, db, pooled)
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

// Read tries again only when the connection died under it: not when a
// connection could not be opened, on a timeout, once the caller gave up,
// or on any other error.
func TestReadTriesAgainOnlyWhenTheConnectionDied(t *testing.T) {
	db, err := sqlx.Open("postgres", "postgres://nobody@127.0.0.1:1/x?sslmode=disable") // never dialled
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name string
		err  error
		ctx  context.Context
		want int
	}{
		{"reset (wrapped), the pool empty (the connection was a new one)", fmt.Errorf("read order x: %w", reset), context.Background(), 1},
		{"reset, the caller gone", reset, done, 1},
		{"dial", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, context.Background(), 1},
		{"timeout", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, context.Background(), 1},
		{"another error", errors.New("pq: relation does not exist"), context.Background(), 1},
	} {
		n := 0
		if err := pg.Read(c.ctx, db, func() error { n++; return c.err }); !errors.Is(err, c.err) || n != c.want {
			t.Errorf("%s: %d tries (want %d), %v", c.name, n, c.want, err)
		}
	}
}

// When the path to the server resets every connection, old and new (a
// load balancer in trouble), reads fail, and each costs the server at most
// one new connection: the dead idle ones are tried, then one new one.
func TestReadsOpenOneConnectionEachWhenEveryConnectionResets(t *testing.T) {
	ctx := t.Context()
	const pooled, readers = 20, 40
	p, db := pgtest.ProxiedPool(t, pgtest.NewURL(t), pooled)
	pgtest.FillPool(t, db, pooled)
	p.Break()
	before := p.Accepted()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range readers {
		wg.Go(func() {
			if err := pg.Read(ctx, db, func() error {
				var one int
				return db.GetContext(ctx, &one, `SELECT 1`)
			}); err != nil {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if failed.Load() != readers {
		t.Errorf("%d of %d reads failed, want all", failed.Load(), readers)
	}
	// About one each: database/sql itself sometimes opens a second when
	// the first fails as it starts (each read tried every dead idle
	// connection and then opened 5-6 new ones before: 231 in all).
	opened := p.Accepted() - before
	if opened > 2*readers {
		t.Errorf("%d reads opened %d connections, want about one each", readers, opened)
	}
	t.Logf("%d failed reads opened %d connections", readers, opened)
}

// A connection in use when every connection dies may come back to the
// pool while a read goes through the dead idle ones: the read tries it too,
// and still reaches a new connection (a daemon whose pool was opened ahead
// of requests got a 500 here when the scanner put a dead connection back).
func TestReadOutlivesADeadConnectionPutBackMeanwhile(t *testing.T) {
	ctx := t.Context()
	const pooled = 4
	p, db := pgtest.ProxiedPool(t, pgtest.NewURL(t), pooled)
	pgtest.FillPool(t, db, pooled-1)
	held, err := db.Connx(ctx) // in use (the scanner's)
	if err != nil {
		t.Fatal(err)
	}
	if err := held.PingContext(ctx); err != nil {
		t.Fatal(err)
	}
	p.Reset() // every connection open now dies
	runs := 0
	err = pg.Read(ctx, db, func() error {
		runs++
		if runs == 1 {
			held.Close() // back to the pool, dead
		}
		var one int
		return db.GetContext(ctx, &one, `SELECT 1`)
	})
	if err != nil {
		t.Fatalf("the read failed after %d runs: %v", runs, err)
	}
	if runs < 2 || runs > pooled+1 {
		t.Fatalf("the read ran %d times, want between 2 and %d", runs, pooled+1)
	}
}

// Each time Read runs a read again, it tells the context's Trace why: the
// daemon counts and logs it, so that connections dying under reads (which
// the callers never see) show.
func TestReadTellsItsTraceOfEachReadRunAgain(t *testing.T) {
	const pooled = 3
	p, db := pgtest.ProxiedPool(t, pgtest.NewURL(t), pooled)
	var why []error
	ctx := pg.WithTrace(t.Context(), &pg.Trace{Retried: func(err error) { why = append(why, err) }})
	read := func(ctx context.Context) error {
		return pg.Read(ctx, db, func() error {
			var one int
			return db.GetContext(ctx, &one, `SELECT 1`)
		})
	}
	pgtest.FillPool(t, db, pooled)
	if err := read(ctx); err != nil || len(why) != 0 {
		t.Fatalf("a read on live connections: %v, %d retries told", err, len(why))
	}
	p.Reset()
	if err := read(ctx); err != nil {
		t.Fatalf("the read after the reset: %v", err)
	}
	// The dead idle connections are tried in turn, then a new one answers.
	if len(why) < 1 || len(why) > pooled {
		t.Fatalf("%d retries told, want 1 to %d", len(why), pooled)
	}
	var netErr *net.OpError
	for _, err := range why {
		if !errors.As(err, &netErr) {
			t.Errorf("told %v, not the connection's death", err)
		}
	}
	// Without a trace, the same happens untold.
	pgtest.FillPool(t, db, pooled)
	p.Reset()
	told := len(why)
	if err := read(t.Context()); err != nil || len(why) != told {
		t.Fatalf("a read without a trace: %v, %d more told", err, len(why)-told)
	}
}
