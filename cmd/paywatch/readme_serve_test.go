package main

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/paywatch/paywatch/migrations/pgtest"
)

// README: "`PAYWATCH_LOG_LEVEL` sets the log level: ... any other value is
// refused (exit 2)". A misspelt level stops serve before it touches
// anything (its database is not even created), and an operator command
// before it calls the API, with a message naming the variable and the
// levels it takes; the levels README names, in any case, are taken.
func TestLogLevelOtherThanDebugInfoWarnErrorIsRefused(t *testing.T) {
	dbURL, name := pgtest.UnusedURL(t)
	vars := map[string]string{}
	for _, kv := range daemonEnv(dbURL) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	vars["PAYWATCH_LOG_LEVEL"] = "verbose"
	want := `PAYWATCH_LOG_LEVEL="verbose" is not a log level: use debug, info, warn or error`
	// Refused at once; should serve start instead, it stops after a while
	// (exit 0) and the test fails on that.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var buf bytes.Buffer
	code := run(ctx, []string{"serve", "--config", writeConfig(t)}, &buf, &buf, func(k string) string { return vars[k] })
	out := buf.String()
	if code != exitUsage || !strings.Contains(out, "paywatch serve: "+want) {
		t.Fatalf("serve with PAYWATCH_LOG_LEVEL=verbose exited %d, want %d and %q:\n%s", code, exitUsage, want, out)
	}
	if strings.Contains(out, "level=") {
		t.Fatalf("serve with PAYWATCH_LOG_LEVEL=verbose logged before it stopped:\n%s", out)
	}
	admin, err := sql.Open("postgres", pgtest.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var exists bool
	if err := admin.QueryRow(`SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil || exists {
		t.Fatalf("serve with PAYWATCH_LOG_LEVEL=verbose created its database (%v)", err)
	}

	// An operator command, pointed at an API where nothing answers: the
	// level is refused first.
	out, code = cli(map[string]string{"PAYWATCH_LOG_LEVEL": "verbose", "PAYWATCH_API": "http://127.0.0.1:9",
		"PAYWATCH_API_KEY": e2eOperatorKey}, "networks")
	if code != exitUsage || !strings.Contains(out, "paywatch networks: "+want) || strings.Contains(out, "127.0.0.1:9") {
		t.Fatalf("paywatch networks with PAYWATCH_LOG_LEVEL=verbose exited %d, want %d and %q:\n%s", code, exitUsage, want, out)
	}

	for level, l := range map[string]slog.Level{"": slog.LevelInfo, "debug": slog.LevelDebug, "info": slog.LevelInfo,
		"warn": slog.LevelWarn, "error": slog.LevelError, "WARN": slog.LevelWarn, "Debug": slog.LevelDebug} {
		if got, err := logLevel(level); err != nil || got != l {
			t.Fatalf("PAYWATCH_LOG_LEVEL=%q: level %s (%v), want %s", level, got, err, l)
		}
	}
}

// README: "the daemon warns in its log (once an hour) when it reaches
// `gap_limit`, with `wallet_gap_limit_needed`". serve's daemon, whose
// Bitcoin asset (the example configuration's: gap_limit 20) has handed out
// 20 addresses none of which was paid, says so in its log as it starts.
func TestServeWarnsWhenUnpaidAddressesReachTheGapLimit(t *testing.T) {
	var logs syncBuffer
	d := inProcessDaemon(t, slog.New(slog.NewTextHandler(&logs, nil)))
	xpub := ""
	for _, n := range d.cfg.Networks {
		for _, a := range n.Assets {
			if a.XPub != "" {
				if xpub != "" || a.GapLimit != 20 || n.Name != "bitcoin" {
					t.Fatalf("the example configuration's derived addresses: network %s, gap limit %d (another key: %q)", n.Name, a.GapLimit, xpub)
				}
				xpub = a.XPub
			}
		}
	}
	pgtest.Exec(t, d.db, `INSERT INTO derivation_counters (derivation_key, next_index) VALUES ($1, 20)`, xpub)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()
	warning := regexp.MustCompile(`level=WARN msg="unpaid derived addresses past the gap limit[^"]*" network=bitcoin asset=BTC ` +
		`unpaid_run=20 gap_limit=20 last_paid_index=-1 addresses_given=20 wallet_gap_limit_needed=21`)
	deadline := time.Now().Add(10 * time.Second)
	for !warning.MatchString(logs.String()) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatalf("the daemon stopped with %v", err)
	}
	if n := len(warning.FindAllString(logs.String(), -1)); n != 1 {
		t.Fatalf("%d gap limit warnings in the daemon's log, want 1 within 10 s of its start:\n%s", n, logs.String())
	}
}
