package main

import (
	"bufio"
	"crypto/rand"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/btcsuite/btcd/btcutil"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

// BenchmarkServeMemory measures the resident memory of paywatch serve
// watching a Bitcoin node with 1,000,000 addresses handed out to orders
// (the watch set read from the database), beside the same daemon with
// none, and the production build (-tags nodev) watching none. Run:
//
//	go test -run '^$' -bench BenchmarkServeMemory -benchtime 1x ./cmd/paywatch/
func BenchmarkServeMemory(b *testing.B) {
	node := btctest.New(b)
	cfg := bitcoinConfig(b, node, 20)
	for _, c := range []struct {
		name   string
		built  func() (string, error)
		orders int
	}{
		{"addresses=0", buildBinary, 0},
		{"addresses=1000000", buildBinary, 1_000_000},
		// The production build, without development mode's chains.
		{"nodev-addresses=0", buildNodevBinary, 0},
	} {
		orders := c.orders
		b.Run(c.name, func(b *testing.B) {
			dbURL := pgtest.NewURL(b)
			db, err := sqlx.Open("postgres", dbURL)
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			if _, err := migrations.Up(b.Context(), db.DB); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			handOut(b, db, orders)
			b.Logf("%d orders written in %s", orders, time.Since(start).Round(time.Millisecond))
			var peak int64
			for i := 0; i < b.N; i++ {
				d := startBuilt(b, c.built, cfg, dbURL)
				// Watching: the scanner has read the node's blocks, which
				// needs the whole watch set.
				deadline := time.Now().Add(5 * time.Minute)
				for {
					code, nets := d.call("GET", "/v1/networks", e2eOperatorKey, "")
					if code == 200 {
						n := nets["data"].([]any)[0].(map[string]any)
						if n["cursor"] != nil && n["cursor"] == n["head"] {
							break
						}
					}
					if time.Now().After(deadline) {
						b.Fatalf("the daemon did not catch up: %v", nets)
					}
					time.Sleep(100 * time.Millisecond)
				}
				for j := 0; j < 20; j++ { // settle: a few more scans and passes
					peak = max(peak, rss(b, d.cmd.Process.Pid))
					time.Sleep(100 * time.Millisecond)
				}
				d.stop()
				if os.Getenv("PAYWATCH_BENCH_LOGS") != "" {
					b.Logf("daemon logs:\n%s", d.logText())
				}
			}
			b.ReportMetric(float64(peak)/(1<<20), "MiB-rss")
		})
	}
}

// handOut writes n orders with per-order addresses below
// reconciletest.VPub, as if handed out: random P2WPKH addresses (deriving
// a million would take minutes), indexes 0..n-1.
func handOut(b *testing.B, db *sqlx.DB, n int) {
	if n == 0 {
		return
	}
	tx, err := db.Begin()
	if err != nil {
		b.Fatal(err)
	}
	stmt, err := tx.Prepare(pq.CopyIn("orders", "id", "external_id", "request_hash", "network", "asset", "amount", "pay_amount",
		"pay_address", "derivation_key", "derivation_index", "status", "created_at", "expires_at", "monitor_until", "updated_at", "earliest_block_time", "created_height"))
	if err != nil {
		b.Fatal(err)
	}
	at := time.Now().Add(-48 * time.Hour)
	h := make([]byte, 20)
	for i := 0; i < n; i++ {
		_, _ = rand.Read(h)
		a, err := btcutil.NewAddressWitnessPubKeyHash(h, btctest.Params)
		if err != nil {
			b.Fatal(err)
		}
		id := "ord_bench" + strconv.Itoa(i)
		if _, err := stmt.Exec(id, id, []byte{1}, "btc", "BTC", "100000", "100000", a.EncodeAddress(), reconciletest.VPub, i,
			"expired", at, at.Add(time.Hour), at.Add(2*time.Hour), at, at, 0); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := stmt.Exec(); err != nil {
		b.Fatal(err)
	}
	if _, err := tx.Exec(`INSERT INTO derivation_counters (derivation_key, next_index) VALUES ($1, $2)`, reconciletest.VPub, n); err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
}

// rss reads a process's resident set size, in bytes.
func rss(b *testing.B, pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
