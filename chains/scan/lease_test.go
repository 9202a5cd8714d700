package scan

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// runs records which instance's job runs, when, and never two at once.
type runs struct {
	mu      sync.Mutex
	running map[string]bool
	started map[string]time.Time
	overlap bool
}

func (r *runs) job(name string) func(context.Context) error {
	return func(ctx context.Context) error {
		r.mu.Lock()
		for other, on := range r.running {
			if on && other != name {
				r.overlap = true
			}
		}
		r.running[name] = true
		r.started[name] = time.Now()
		r.mu.Unlock()
		<-ctx.Done()
		r.mu.Lock()
		r.running[name] = false
		r.mu.Unlock()
		return nil
	}
}

func (r *runs) is(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running[name]
}

// One instance at a time: a standby never runs the job while the holder
// lives, and takes over within a few intervals when the holder's database
// connection drops (killed, not released: no unlock is ever sent).
func TestLeaseTakeoverWhenTheHoldersConnectionDrops(t *testing.T) {
	dbURL := pgtest.NewURL(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := &runs{running: map[string]bool{}, started: map[string]time.Time{}}
	const interval = 100 * time.Millisecond
	done := make(chan struct{}, 2)
	start := func(name string) {
		db, err := migrations.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		go func() {
			_ = RunLeased(ctx, db, "job", interval, log, r.job(name))
			done <- struct{}{}
		}()
	}
	start("a")
	deadline := time.Now().Add(10 * time.Second)
	for !r.is("a") {
		if time.Now().After(deadline) {
			t.Fatal("a never took the lease")
		}
		time.Sleep(10 * time.Millisecond)
	}
	start("b")
	// b stands by while a lives, however many times it tries.
	time.Sleep(10 * interval)
	if r.is("b") || !r.is("a") {
		t.Fatalf("with a alive: a running %v, b running %v", r.is("a"), r.is("b"))
	}
	// a's lease connection dies: the server ends its session.
	admin, err := migrations.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var killed int
	if err := admin.Get(&killed, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Fatalf("terminated %d sessions holding the lease, want 1", killed)
	}
	dropped := time.Now()
	for !r.is("b") {
		if time.Since(dropped) > 10*time.Second {
			t.Fatal("b never took over")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r.is("a") {
		t.Fatal("a still runs after losing its connection")
	}
	r.mu.Lock()
	overlap, took := r.overlap, r.started["b"].Sub(dropped)
	r.mu.Unlock()
	if overlap {
		t.Fatal("a and b ran at the same time")
	}
	t.Logf("b took over %s after a's connection dropped", took.Round(time.Millisecond))
	cancel()
	<-done
	<-done
}

// The holder's connection goes silent (a half-dead network: the server
// ends the session, the holder hears nothing, and the driver would wait on
// the socket for ever): its check still fails within its timeout, it stops
// its job, and the standby starts only after that.
func TestLeaseTakeoverWhenTheHoldersConnectionGoesSilent(t *testing.T) {
	dbURL := pgtest.NewURL(t)
	p, viaProxy := pgtest.NewProxy(t, dbURL)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := &runs{running: map[string]bool{}, started: map[string]time.Time{}}
	const interval = 200 * time.Millisecond
	start := func(name, url string) {
		db, err := migrations.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		// (a's pool is not closed: its silent connection would hold Close.)
		go func() { _ = RunLeased(ctx, db, "job", interval, log, r.job(name)) }()
	}
	start("a", viaProxy)
	deadline := time.Now().Add(10 * time.Second)
	for !r.is("a") {
		if time.Now().After(deadline) {
			t.Fatal("a never took the lease")
		}
		time.Sleep(10 * time.Millisecond)
	}
	start("b", dbURL)
	time.Sleep(5 * interval)
	admin, err := migrations.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	p.Silence()
	var killed int
	if err := admin.Get(&killed, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); err != nil || killed != 1 {
		t.Fatalf("terminated %d sessions (%v)", killed, err)
	}
	dropped := time.Now()
	for !r.is("b") {
		if time.Since(dropped) > 20*time.Second {
			t.Fatalf("b never took over; a running %v", r.is("a"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.mu.Lock()
	overlap := r.overlap
	r.mu.Unlock()
	if overlap || r.is("a") {
		t.Fatalf("a and b ran at the same time (a still running: %v)", r.is("a"))
	}
	t.Logf("b took over %s after a's connection went silent", time.Since(dropped).Round(time.Millisecond))
}
