package main

import (
	"bytes"
	"context"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

// syncBuffer is a log destination safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var gapWarning = regexp.MustCompile(`level=WARN msg="unpaid derived addresses past the gap limit[^"]*" network=btc asset=BTC ` +
	`unpaid_run=(\d+) gap_limit=3 last_paid_index=-1 addresses_given=(\d+) wallet_gap_limit_needed=(\d+)`)

// README: "the daemon warns in its log (once an hour) when it reaches
// `gap_limit`, with `wallet_gap_limit_needed`". Below the limit nothing is
// logged; at it, one warning with the gap limit a wallet needs; none again
// within the hour (even as the run grows), another once the hour is over.
func TestGapLimitWarnedOnceAnHourWithWalletGapLimitNeeded(t *testing.T) {
	db := pgtest.New(t)
	store := orders.NewStore(db, time.Hour, nil)
	networks := []*paywatch.Network{{Name: "btc", Family: paywatch.FamilyBitcoin,
		Assets: []*paywatch.Asset{{Network: "btc", Symbol: "BTC", Native: true, Decimals: 8, Mode: paywatch.ModePerOrder,
			XPub: reconciletest.VPub, GapLimit: 3}}}}
	handOut := func(n int) { // n addresses handed out, none paid
		t.Helper()
		pgtest.Exec(t, db, `INSERT INTO derivation_counters (derivation_key, next_index) VALUES ($1, $2)
			ON CONFLICT (derivation_key) DO UPDATE SET next_index = excluded.next_index`, reconciletest.VPub, n)
	}
	var logs syncBuffer
	w := newGapWatch(slog.New(slog.NewTextHandler(&logs, nil)), store, networks)
	if w.now == nil || w.now().Sub(time.Now()).Abs() > time.Minute {
		t.Fatal("the gap watch's clock is not the wall clock by default")
	}
	clock := time.Now()
	w.now = func() time.Time { return clock }
	ctx := context.Background()
	warnings := func() [][]string {
		return gapWarning.FindAllStringSubmatch(logs.String(), -1)
	}

	handOut(2)
	w.check(ctx)
	if n := len(warnings()); n != 0 || strings.Contains(logs.String(), "gap limit") {
		t.Fatalf("a run of 2 unpaid addresses under a gap limit of 3 was warned about:\n%s", logs.String())
	}
	handOut(3)
	w.check(ctx)
	if got := warnings(); len(got) != 1 || got[0][1] != "3" || got[0][2] != "3" || got[0][3] != "4" {
		t.Fatalf("at the gap limit (3 unpaid of 3 given), want one warning with wallet_gap_limit_needed=4; log:\n%s", logs.String())
	}
	clock = clock.Add(30 * time.Minute)
	handOut(4)
	w.check(ctx)
	clock = clock.Add(30*time.Minute - time.Nanosecond)
	w.check(ctx)
	if n := len(warnings()); n != 1 {
		t.Fatalf("%d warnings within the hour after the first, want 1; log:\n%s", n, logs.String())
	}
	clock = clock.Add(time.Nanosecond)
	w.check(ctx)
	if got := warnings(); len(got) != 2 || got[1][1] != "4" || got[1][3] != "5" {
		t.Fatalf("an hour after the first warning, want a second one with wallet_gap_limit_needed=5; log:\n%s", logs.String())
	}

	// The daemon's loop checks at once when it starts, on the wall clock.
	var loopLogs syncBuffer
	loopCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchGaps(loopCtx, slog.New(slog.NewTextHandler(&loopLogs, nil)), store, networks)
	}()
	waitUntil(t, 10*time.Second, "the daemon's gap watch to warn", func() bool {
		return gapWarning.MatchString(loopLogs.String())
	})
	cancel()
	<-done
}
