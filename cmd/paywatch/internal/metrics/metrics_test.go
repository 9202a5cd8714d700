package metrics

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paywatch/paywatch/migrations/pgtest"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var headGauge = regexp.MustCompile(`(?m)^paywatch_network_head\{network="eth"\} (\S+)$`)

// README: "The gauges read from the database are read at most every 10 s
// whatever the scrape rate." A change in the database shows in /metrics
// only once 10 s have passed since the last read, however many scrapes
// come in between: the scrapes before that read nothing.
func TestDatabaseGaugesReadAtMostEvery10s(t *testing.T) {
	db := pgtest.New(t)
	pgtest.Exec(t, db, `INSERT INTO chain_cursors (network, head, updated_at) VALUES ('eth', 100, now())`)
	m := New(db, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if m.state.now == nil || m.state.now().Sub(time.Now()).Abs() > time.Minute {
		t.Fatal("the metrics' clock is not the wall clock by default")
	}
	if cacheFor != 10*time.Second {
		t.Fatalf("the gauges are cached for %s, README says 10 s", cacheFor)
	}
	clock, scrape := scraped(t, m)
	head := func() string {
		t.Helper()
		body := scrape()
		g := headGauge.FindStringSubmatch(body)
		if g == nil {
			t.Fatalf("/metrics without paywatch_network_head for eth:\n%s", body)
		}
		return g[1]
	}
	if got := head(); got != "100" {
		t.Fatalf("first scrape: head %s, want 100", got)
	}
	pgtest.Exec(t, db, `UPDATE chain_cursors SET head = 200 WHERE network = 'eth'`)
	for i := range 50 {
		if got := head(); got != "100" {
			t.Fatalf("scrape %d, right after the first: head %s: the database was read again within 10 s", i+2, got)
		}
	}
	clock.advance(10*time.Second - time.Millisecond)
	if got := head(); got != "100" {
		t.Fatalf("scrape 9.999 s after the read: head %s: the database was read again within 10 s", got)
	}
	clock.advance(time.Millisecond)
	if got := head(); got != "200" {
		t.Fatalf("scrape 10 s after the read: head %s, want 200 (read again)", got)
	}
	// The next read is 10 s after that one, not after the first.
	pgtest.Exec(t, db, `UPDATE chain_cursors SET head = 300 WHERE network = 'eth'`)
	clock.advance(5 * time.Second)
	if got := head(); got != "200" {
		t.Fatalf("scrape 5 s after the second read: head %s, want 200 (still cached)", got)
	}
	clock.advance(5 * time.Second)
	if got := head(); got != "300" {
		t.Fatalf("scrape 10 s after the second read: head %s, want 300", got)
	}
}

// The gauges' reads run again on another connection when theirs had died
// while idle (a load balancer dropped it): the scrape says
// paywatch_database_up 1 with the gauges, and counts the retries.
func TestGaugesOutliveDeadConnections(t *testing.T) {
	_, dbURL := pgtest.NewWithURL(t)
	p, db := pgtest.ProxiedPool(t, dbURL, 3)
	clock, scrape := scraped(t, New(db, slog.New(slog.NewTextHandler(io.Discard, nil))))
	for round := range 3 {
		pgtest.FillPool(t, db, 3)
		p.Reset()
		clock.advance(cacheFor)
		body := scrape()
		if !strings.Contains(body, "\npaywatch_database_up 1\n") || !strings.Contains(body, "paywatch_webhook_backlog{status=\"pending\"} 0") {
			t.Fatalf("round %d: the scrape after the connections died:\n%s", round, body)
		}
		// The counter as the next scrape shows it (this one may have
		// gathered it before the gauges' reads counted).
		n := regexp.MustCompile(`(?m)^paywatch_database_reads_retried_total (\d+)$`).FindStringSubmatch(scrape())
		if n == nil {
			t.Fatalf("round %d: no paywatch_database_reads_retried_total", round)
		}
		if got, _ := strconv.Atoi(n[1]); got <= round {
			t.Fatalf("round %d: paywatch_database_reads_retried_total %v, want more than %d", round, n, round)
		}
	}
}

// scraped serves m's metrics with a clock the test moves, and returns the
// clock and a scrape (failing the test unless it answers 200).
func scraped(t *testing.T, m *Metrics) (*fakeClock, func() string) {
	clock := &fakeClock{t: time.Now()}
	m.state.now = clock.now
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	return clock, func() string {
		t.Helper()
		res, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 {
			t.Fatalf("/metrics answered %d:\n%s", res.StatusCode, body)
		}
		return string(body)
	}
}
