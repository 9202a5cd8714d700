package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// lwDaemon is a daemon as serve builds it, running in this process, with
// its log (debug level: a line per reconciler pass).
type lwDaemon struct {
	d       *daemon
	logs    *syncBuffer
	started time.Time
	stop    context.CancelFunc
	done    chan error
}

func lwStart(t *testing.T, cfg *config.Config) *lwDaemon {
	t.Helper()
	logs := &syncBuffer{}
	d, err := newDaemon(context.Background(), slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	l := &lwDaemon{d: d, logs: logs, started: time.Now(), stop: stop, done: make(chan error, 1)}
	go func() { l.done <- d.Run(ctx) }()
	t.Cleanup(func() {
		l.halt(t)
		if t.Failed() {
			t.Logf("daemon log:\n%s", logs.String())
		}
	})
	return l
}

// halt stops the daemon and waits until it has, once.
func (l *lwDaemon) halt(t *testing.T) {
	t.Helper()
	if l.stop == nil {
		return
	}
	l.stop()
	l.stop = nil
	select {
	case err := <-l.done:
		if err != nil {
			t.Errorf("the daemon stopped with %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("the daemon did not stop")
	}
	l.d.Close()
}

// waitLine waits for a line of the daemon's log holding text, and returns
// when it was first seen.
func (l *lwDaemon) waitLine(t *testing.T, text string, timeout time.Duration) time.Time {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(5 * time.Millisecond) {
		if strings.Contains(l.logs.String(), text) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the daemon's log after %s:\n%s", text, timeout, l.logs.String())
		}
	}
}

// lwHolder returns the server process holding the lease called name, or 0.
func lwHolder(t *testing.T, db *sqlx.DB, name string) int {
	t.Helper()
	var pids []int
	if err := db.Select(&pids, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid::bigint = (hashtextextended($1, 0) >> 32) & 4294967295 AND objid::bigint = hashtextextended($1, 0) & 4294967295`,
		"paywatch:"+name); err != nil {
		t.Fatal(err)
	}
	switch len(pids) {
	case 0:
		return 0
	case 1:
		return pids[0]
	}
	t.Fatalf("%d sessions hold the lease %s", len(pids), name)
	return 0
}

// README, "Faults and scale": "each network's scanner, and the reconciler,
// run in one instance at a time under a PostgreSQL advisory-lock lease; ...
// the holder checks its lease's connection every 2 s ... and the instance
// that takes the lease over waits 6 s before it starts ... An instance that
// starts and finds the lease free starts at once". Two daemons as serve
// builds them share a database: the first finds the reconciler's lease
// free and runs its reconciler at once; the second stands by and runs no
// pass while the first's passes go on; when the first stops, the second
// takes the lease and starts its reconciler 6 s after it took it; and when
// its lease's connection is killed just after that start, it sees the loss
// at its first check, 2 s after the start.
func TestReconcilerLeaseOneDaemonAtATimeChecked2sTakenOverAfter6s(t *testing.T) {
	if leaseInterval != 2*time.Second {
		t.Fatalf("serve checks its leases every %s, README says 2 s", leaseInterval)
	}
	dbURL := pgtest.NewURL(t)
	vars := map[string]string{}
	for _, kv := range daemonEnv(dbURL) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	cfg, err := config.Load(writeConfig(t), func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	admin, err := migrations.Open(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	const (
		running  = `msg="lease taken; running" lease=reconcile`
		standing = `msg="another instance holds the lease; standing by" lease=reconcile`
		lost     = `msg="lease lost; standing by" lease=reconcile`
		pass     = `msg="reconciler pass"`
	)

	a := lwStart(t, cfg)
	if took := a.waitLine(t, running, 10*time.Second).Sub(a.started); took > time.Second {
		t.Fatalf("a daemon that found the reconciler's lease free started its reconciler %s after it started, want at once",
			took.Round(time.Millisecond))
	}
	a.waitLine(t, pass, 10*time.Second)
	b := lwStart(t, cfg)
	b.waitLine(t, standing, 10*time.Second)
	// A pass called for on the scanners' channel runs on the holder alone.
	passes := strings.Count(a.logs.String(), pass)
	if _, err := admin.Exec(`SELECT pg_notify($1, 'devnet')`, scan.NotifyChannel); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "a pass on the daemon holding the lease", func() bool {
		return strings.Count(a.logs.String(), pass) > passes
	})
	if log := b.logs.String(); strings.Contains(log, pass) || strings.Contains(log, running) {
		t.Fatalf("the daemon standing by ran its reconciler while the other held the lease:\n%s", log)
	}

	a.halt(t)
	// The lease is taken after the last look that found it free began,
	// and before the first that found it held ended.
	var freeSeen, heldSeen time.Time
	for deadline := time.Now().Add(10 * time.Second); heldSeen.IsZero(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the lease was not taken over within 10 s of the holder's stop:\n%s", b.logs.String())
		}
		look := time.Now()
		if lwHolder(t, admin, "reconcile") == 0 {
			freeSeen = look
		} else {
			heldSeen = time.Now()
		}
	}
	started := b.waitLine(t, running, 15*time.Second)
	if least, most := started.Sub(heldSeen), started.Sub(freeSeen); least > 6*time.Second+700*time.Millisecond ||
		most < 6*time.Second-100*time.Millisecond {
		t.Fatalf("the daemon that took the lease over started its reconciler %s to %s after it took it, README says 6 s",
			least.Round(time.Millisecond), most.Round(time.Millisecond))
	}
	t.Logf("the reconciler started %s after the lease was taken over", started.Sub(heldSeen).Round(time.Millisecond))
	b.waitLine(t, pass, 10*time.Second)
	if log := b.logs.String(); strings.Index(log, pass) < strings.Index(log, running) {
		t.Fatalf("the daemon that took the lease over ran a reconciler pass before it held the lease:\n%s", log)
	}

	time.Sleep(time.Until(started.Add(500 * time.Millisecond))) // the reconciler runs; then its lease's session dies
	if _, err := admin.Exec(`SELECT pg_terminate_backend($1)`, lwHolder(t, admin, "reconcile")); err != nil {
		t.Fatal(err)
	}
	if seen := b.waitLine(t, lost, 10*time.Second).Sub(started); seen < 2*time.Second-100*time.Millisecond || seen > 3*time.Second {
		t.Fatalf("a lease lost 0.5 s after its holder started was found lost %s after the start, "+
			"want at the first check, 2 s after it (README: checked every 2 s)", seen.Round(time.Millisecond))
	} else {
		t.Logf("the lease killed 0.5 s after the start was found lost %s after the start", seen.Round(time.Millisecond))
	}
}
