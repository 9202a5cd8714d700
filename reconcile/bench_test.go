package reconcile_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// benchOrders is the number of orders BenchmarkSettle100k settles;
// PAYWATCH_BENCH_ORDERS changes it for a quick run.
var benchOrders = envCount("PAYWATCH_BENCH_ORDERS", 100_000)

// benchHistory is how many settled orders of the past the database holds
// beside them (PAYWATCH_BENCH_HISTORY; none by default): a pass must cost
// what it moves, not what the shop has ever sold.
var benchHistory = envCount("PAYWATCH_BENCH_HISTORY", 0)

// envCount is the positive count the environment variable name holds, or
// def.
func envCount(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// seedMatched fills a fresh database with n confirming orders, each with its
// exact confirmed transfer matched and its receipt and attribution posted:
// what a pass finds just before it settles them.
func seedMatched(b *testing.B, n int) (*sqlx.DB, time.Time) {
	db := pgtest.New(b)
	now := time.Now().UTC().Truncate(time.Microsecond)
	for _, q := range []struct {
		sql   string
		count int // $2
	}{
		{`INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
			pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time)
		SELECT 'ord_' || lpad(g::text, 8, '0'), 'bulk-' || g, '\x00', 'ethereum', 'USDT', 'c', 1000000 + g, 1000000 + g,
			'0xshop', g % 10000, 'confirming', $1::timestamptz, $1::timestamptz + interval '1 hour',
			$1::timestamptz + interval '25 hours', $1::timestamptz, 0, $1::timestamptz - interval '5 minutes'
		FROM generate_series(1, $2) g`, n},
		{`INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address, amount,
			block_number, block_hash, state, order_id, match_kind, first_seen_at, updated_at, block_time)
		SELECT 'trf_' || lpad(g::text, 8, '0'), 'ethereum', 'USDT', 'c', '0x' || lpad(to_hex(g), 64, '0'), 'k', 0, '0xshop',
			1000000 + g, g, '0xb' || g, 'confirmed', 'ord_' || lpad(g::text, 8, '0'), 'amount', $1::timestamptz, $1::timestamptz, $1::timestamptz
		FROM generate_series(1, $2) g`, n},
		{`INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
			pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, settled_at, created_height,
			earliest_block_time, has_transfers)
		SELECT 'ord_h' || lpad(g::text, 8, '0'), 'past-' || g, '\x00', 'ethereum', 'USDT', 'c', 1000000 + g, 1000000 + g,
			'0xshop', g % 10000, 'settled', $1::timestamptz - interval '30 days', $1::timestamptz - interval '29 days',
			$1::timestamptz - interval '28 days', $1::timestamptz, $1::timestamptz, 0, $1::timestamptz, true
		FROM generate_series(1, $2) g`, benchHistory},
	} {
		if _, err := db.Exec(q.sql, now, q.count); err != nil {
			b.Fatal(err)
		}
	}
	// Receipts and attributions, as earlier passes post them.
	rec := reconcile.New(db, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Hour, 48*time.Hour)
	rec.Now = func() time.Time { return now }
	if posted, err := rec.PostLedger(context.Background()); err != nil || posted != 2*int64(n) {
		b.Fatalf("seed ledger: %d entries, want %d (%v)", posted, 2*n, err)
	}
	if _, err := db.Exec(`ANALYZE`); err != nil {
		b.Fatal(err)
	}
	return db, now
}

// benchBodySize is about the size of a settled order's webhook body here.
const benchBodySize = 790

// BenchmarkSettle100k compares one reconciler pass settling 100,000 matched
// orders (with their timeline events, webhooks and ledger entries) with a
// bare set-based UPDATE of the same rows' status. Run:
//
//	go test -run '^$' -bench BenchmarkSettle100k -benchtime 1x ./reconcile/
func BenchmarkSettle100k(b *testing.B) {
	// cpu-s is the CPU time the machine spent busy per run (see
	// reconciler-pass).
	b.Run("bare-update", func(b *testing.B) {
		var busy float64
		for b.Loop() {
			b.StopTimer()
			db, _ := seedMatched(b, benchOrders)
			b.StartTimer()
			busy -= pgtest.BusyCPU()
			bareUpdate(b, db)
			busy += pgtest.BusyCPU()
		}
		b.ReportMetric(busy/float64(b.N), "cpu-s")
	})
	// The rows a pass writes for each settled order, written by hand in
	// one statement: the status change, its timeline event, its webhook
	// event with a body of the same size (and an id in the order made, as
	// the pass's), its posting in the settlement entry (one entry for the
	// lot here, one per batch of the pass's, with a revenue posting each),
	// its review consumed. What the pass costs beyond this is paywatch's;
	// this much is the design's.
	b.Run("bare-writes", func(b *testing.B) {
		var busy float64
		for b.Loop() {
			b.StopTimer()
			db, _ := seedMatched(b, benchOrders)
			b.StartTimer()
			busy -= pgtest.BusyCPU()
			var n int
			if err := db.Get(&n, `
WITH moved AS (
	UPDATE orders SET status = 'settled', settled_at = now(), updated_at = now()
	WHERE status = 'confirming' RETURNING id, network, asset, pay_amount
), ev AS (
	INSERT INTO order_events (order_id, at, type, from_status, to_status, actor)
	SELECT id, now(), 'status_changed', 'confirming', 'settled', 'reconciler' FROM moved
), wh AS (
	INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at, body)
	SELECT 'evt_' || id, id, 'order.settled', now(), now(), repeat('x', $1) FROM moved
), e AS (
	SELECT nextval('ledger_entries_id_seq') AS eid
), entry AS (
	INSERT INTO ledger_entries (id, at, kind, ref) SELECT eid, now(), 'settlement', 'batch#' || eid FROM e
), postings AS (
	INSERT INTO ledger_postings (entry_id, account, network, asset, amount)
	SELECT e.eid, 'order:' || m.id, m.network, m.asset, m.pay_amount FROM e, moved m
	UNION ALL
	SELECT e.eid, 'settled:' || m.network || ':' || m.asset, m.network, m.asset, -sum(m.pay_amount) FROM e, moved m
	GROUP BY e.eid, m.network, m.asset
), reviewed AS (
	DELETE FROM order_reviews WHERE order_id IN (SELECT id FROM moved)
)
SELECT count(*) FROM moved`, benchBodySize); err != nil || n != benchOrders {
				b.Fatalf("%d rows (%v)", n, err)
			}
			busy += pgtest.BusyCPU()
		}
		b.ReportMetric(busy/float64(b.N), "cpu-s")
	})
	// Each pass is paired with a bare UPDATE run just before it, on a
	// database seeded the same way: the pair shares the machine's moment.
	// On one shared machine the bare UPDATE alone took 3.4 s in one run
	// and 4.4 s in another, within the hour. paired-ratio is the median of the
	// pairs' ratios (of an even count, the greater of the middle two).
	// cpu-ratio is the median of the pairs' ratios of the CPU time the
	// machine spent working (Linux: /proc/stat, see pgtest.BusyCPU): the work
	// each did, which waiting for a core shared with another virtual
	// machine does not lengthen as it lengthens the time. go-cpu-share
	// is the part of a pass's CPU time spent in this process (deciding,
	// rendering the webhook bodies, the driver), the rest being
	// PostgreSQL's.
	b.Run("reconciler-pass", func(b *testing.B) {
		var paired, cpu, goShare []float64
		for b.Loop() {
			b.StopTimer()
			bareDB, _ := seedMatched(b, benchOrders)
			bareStart := time.Now()
			bareCPU := pgtest.BusyCPU()
			bareUpdate(b, bareDB)
			bareCPU = pgtest.BusyCPU() - bareCPU
			bareTook := time.Since(bareStart)
			bareDB.Close()
			db, now := seedMatched(b, benchOrders)
			rec := reconcile.New(db, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Hour, 48*time.Hour)
			rec.Now = func() time.Time { return now }
			// As serve runs it: each webhook event's body is written in the
			// transaction that enqueues it.
			rec.Sealer = orders.NewSealer([]*paywatch.Network{{Name: "ethereum", Family: paywatch.FamilyEVM, Confirmations: 12,
				Assets: []*paywatch.Asset{{Network: "ethereum", Symbol: "USDT", Contract: "c", Decimals: 6}}}})
			b.StartTimer()
			start := time.Now()
			passCPU, ownCPU := pgtest.BusyCPU(), pgtest.ProcessCPU(0)
			res, err := rec.Pass(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			if res.Transitions != int64(benchOrders) {
				b.Fatalf("pass: %v", res)
			}
			b.StopTimer()
			paired = append(paired, time.Since(start).Seconds()/bareTook.Seconds())
			passCPU, ownCPU = pgtest.BusyCPU()-passCPU, pgtest.ProcessCPU(0)-ownCPU
			if passCPU > 0 && bareCPU > 0 {
				cpu = append(cpu, passCPU/bareCPU)
				goShare = append(goShare, ownCPU/passCPU)
			}
			var body float64
			if err := db.Get(&body, `SELECT avg(length(body)) FROM webhook_outbox`); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(body, "body-bytes")
			// The next pass finds nothing to do; it must stay cheap however
			// many orders and transfers the database holds.
			start = time.Now()
			if res, err := rec.Pass(context.Background()); err != nil || res != (reconcile.Result{}) {
				b.Fatalf("idle pass: %v %v", res, err)
			}
			b.ReportMetric(float64(time.Since(start).Milliseconds()), "idle-pass-ms")
			// Once autovacuum has been through what the pass left behind
			// (dead row versions in the partial indexes it emptied), as it is
			// whenever the reconciler idles in a running shop.
			if _, err := db.Exec(`VACUUM ANALYZE`); err != nil {
				b.Fatal(err)
			}
			start = time.Now()
			if res, err := rec.Pass(context.Background()); err != nil || res != (reconcile.Result{}) {
				b.Fatalf("idle pass: %v %v", res, err)
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "idle-pass-vacuumed-ms")
			b.StartTimer()
		}
		for _, m := range []struct {
			name   string
			series []float64
		}{{"paired-ratio", paired}, {"cpu-ratio", cpu}, {"go-cpu-share", goShare}} {
			if len(m.series) > 0 {
				slices.Sort(m.series)
				b.ReportMetric(m.series[len(m.series)/2], m.name)
			}
		}
	})
}

// bareUpdate settles the matched orders of a seeded database in one bare
// UPDATE: the baseline of a pass.
func bareUpdate(b *testing.B, db *sqlx.DB) {
	res, err := db.Exec(`UPDATE orders SET status = 'settled', settled_at = now(), updated_at = now()
		WHERE status = 'confirming'`)
	if err != nil {
		b.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != int64(benchOrders) {
		b.Fatalf("%d rows", n)
	}
}
