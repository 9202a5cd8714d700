package reconcile

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch/migrations/pgtest"
)

// A batch of transitions reaches its orders through the primary key: a
// pass costs what it moves, not what the shop has ever sold. Joined with
// the batch's arrays alone, the planner read every order of the table (a
// hash of them all, or the whole primary key in a merge) for each batch of
// 2,000, and a pass moving n orders in a table of N cost n/2000 × N: a
// third of a pass settling 100,000.
func TestApplyTransitionsReadsOnlyTheOrdersItMoves(t *testing.T) {
	db := pgtest.New(t)
	now := time.Now().UTC()
	// 100,000 orders; every 50th is confirming, spread over the table.
	insertBulkOrders(t, db, now, 100000, `CASE WHEN g % 50 = 0 THEN 'confirming' ELSE 'settled' END`)
	pgtest.Exec(t, db, `ANALYZE orders`)
	ids := make([]string, 2000)
	from, to, none := make([]string, len(ids)), make([]string, len(ids)), make([]string, len(ids))
	for i := range ids {
		ids[i], from[i], to[i] = fmt.Sprintf("ord_%08d", 50*(i+1)), "confirming", "settled"
	}
	tx := db.MustBegin()
	defer tx.Rollback()
	read, out := rowsRead(t, tx, "orders", applyTransitions, now, pq.Array(ids), pq.Array(from), pq.Array(to),
		pq.Array(none), pq.Array(none))
	if read > 2000 {
		t.Fatalf("moving 2,000 orders read %.0f rows of a table of 100,000:\n%s", read, out)
	}
	var moved int
	if err := tx.Get(&moved, `SELECT count(*) FROM orders WHERE status = 'settled' AND settled_at IS NOT NULL`); err != nil || moved != 2000 {
		t.Fatalf("%d orders settled (%v), want 2,000", moved, err)
	}
}

// A batch of transitions reads the transfers of its own orders, one probe
// of the order_id index each, wherever its orders stand in the walk. The
// planner flattens a plain LATERAL subquery into a join, and chose to
// merge the batch's orders with transfers_order_idx read from its first
// entry: a batch read every transfer whose order id sorts below its own
// (92,001 for the 46th batch of a pass over 100,000 orders), a pass over n
// orders cost about n²/4,000 index entries, and a shop's history of paid
// orders was read again by every batch.
func TestTransitionCandidatesReadOnlyTheirOrdersTransfers(t *testing.T) {
	db := pgtest.New(t)
	now := time.Now().UTC()
	// 50,000 confirming orders, each with its confirmed payment; the last
	// 2,000 are queued for review, as the ledger queues them.
	insertBulkOrders(t, db, now, 50000, `'confirming'`)
	pgtest.Exec(t, db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address, amount,
			block_number, block_hash, state, order_id, match_kind, first_seen_at, updated_at, block_time)
		SELECT 'trf_' || lpad(g::text, 8, '0'), 'ethereum', 'USDT', 'c', '0x' || lpad(to_hex(g), 64, '0'), 'k', 0, '0xshop',
			1000000 + g, g, '0xb' || g, 'confirmed', 'ord_' || lpad(g::text, 8, '0'), 'amount', $1::timestamptz,
			$1::timestamptz, $1::timestamptz
		FROM generate_series(1, 50000) g`, now)
	queueBulkReviews(t, db, now, 48001, 50000)
	// As autovacuum leaves a running shop's tables (it also takes the
	// inserts' turn, at any moment, unless this does).
	pgtest.Exec(t, db, `VACUUM ANALYZE`)
	tx := db.MustBegin()
	defer tx.Rollback()
	// What the batch reads: each order with its one payment.
	rows := readCandidates(t, tx, now)
	if len(rows) != 2000 || rows[0].ID != "ord_00048001" {
		t.Fatalf("%d candidates from %v, want 2,000 from ord_00048001", len(rows), rows[:min(len(rows), 1)])
	}
	for _, r := range rows {
		if r.OrderID == nil || r.Live != 1 || r.Received != *r.PayAmount {
			t.Fatalf("order %s: %d live payments, %s received of %v", r.ID, r.Live, r.Received, r.PayAmount)
		}
	}
	read, out := rowsRead(t, tx, "transfers", transitionCandidates, now, time.Hour.Seconds(), "", 2000)
	if read > 2000 {
		t.Fatalf("reading the facts of 2,000 orders read %.0f transfers of 50,000:\n%s", read, out)
	}
}

// TestTransitionCandidatesConsumeOnlyTheirReviews: a batch deletes the
// reviews of the orders it locked, and only theirs, through the order_id
// index. Joined with the locked orders, the reviews were hashed: every
// review queued was read (50,000 here, for each of the 25 batches of the
// pass: a catch-up that queues n reviews cost n²/2,000 rows to consume
// them).
func TestTransitionCandidatesConsumeOnlyTheirReviews(t *testing.T) {
	db := pgtest.New(t)
	now := time.Now().UTC()
	insertBulkOrders(t, db, now, 50000, `'confirming'`)
	queueBulkReviews(t, db, now, 1, 50000)
	pgtest.Exec(t, db, `VACUUM ANALYZE`)
	// Another transaction holds one of the batch's candidates: its review
	// waits for the next pass.
	other := db.MustBegin()
	defer other.Rollback()
	other.MustExec(`SELECT 1 FROM orders WHERE id = 'ord_00000100' FOR NO KEY UPDATE`)
	tx := db.MustBegin()
	defer tx.Rollback()
	read, out := rowsRead(t, tx, "order_reviews", transitionCandidates, now, time.Hour.Seconds(), "", 2000)
	// 2,000 to find the candidates, 1,999 to delete the locked ones' reviews.
	if read > 4000 {
		t.Fatalf("a batch of 2,000 orders read %.0f of 50,000 reviews:\n%s", read, out)
	}
	var left struct {
		N     int    `db:"n"`
		First string `db:"first"`
		Held  bool   `db:"held"`
	}
	if err := tx.Get(&left, `SELECT count(*) AS n, min(order_id) AS first,
		bool_or(order_id = 'ord_00000100') AS held FROM order_reviews`); err != nil {
		t.Fatal(err)
	}
	if left.N != 48001 || left.First != "ord_00000100" || !left.Held {
		t.Fatalf("after the batch: %d reviews left from %s (the held order's kept: %v); want 48,001 from ord_00000100, kept",
			left.N, left.First, left.Held)
	}
}

// TestTransitionCandidatesCountDetachedPaymentsByProbe: a batch counts
// each order's detached payments (transfer_unmatched on its timeline)
// through an index of those events alone, not by fetching every event of
// each order's timeline to look at its type (10,000 here for 2,000
// orders of five events each).
func TestTransitionCandidatesCountDetachedPaymentsByProbe(t *testing.T) {
	db := pgtest.New(t)
	now := time.Now().UTC()
	insertBulkOrders(t, db, now, 2000, `'confirming'`)
	pgtest.Exec(t, db, `INSERT INTO order_events (order_id, at, type, actor)
		SELECT 'ord_' || lpad(g::text, 8, '0'), $1::timestamptz, type, 'reconciler'
		FROM generate_series(1, 2000) g,
			unnest(ARRAY['created', 'transfer_matched', 'status_changed', 'hint_rejected', 'webhook_redelivered']) AS type`, now)
	// One order had a payment taken back.
	pgtest.Exec(t, db, `INSERT INTO order_events (order_id, at, type, actor) VALUES ('ord_00000007', $1, 'transfer_unmatched', 'reconciler')`, now)
	queueBulkReviews(t, db, now, 1, 2000)
	pgtest.Exec(t, db, `VACUUM ANALYZE`)
	tx := db.MustBegin()
	defer tx.Rollback()
	rows := readCandidates(t, tx, now)
	detached := 0
	for _, r := range rows {
		detached += r.Detached
		if r.Detached != 0 && r.ID != "ord_00000007" {
			t.Fatalf("order %s: %d detached payments, want none", r.ID, r.Detached)
		}
	}
	if len(rows) != 2000 || detached != 1 {
		t.Fatalf("%d candidates, %d detached payments among them; want 2,000 and 1", len(rows), detached)
	}
	plan, out := explainAnalyze(t, tx, transitionCandidates, now, time.Hour.Seconds(), "", 2000)
	if n := plan.examined("order_events"); n > 100 {
		t.Fatalf("counting the detached payments of 2,000 orders examined %.0f of their 10,001 events:\n%s", n, out)
	}
}

// queueBulkReviews queues a review of orders ord_%08d(from) to
// ord_%08d(to), as the ledger queues them.
func queueBulkReviews(t *testing.T, db *sqlx.DB, now time.Time, from, to int) {
	t.Helper()
	pgtest.Exec(t, db, `INSERT INTO order_reviews (order_id, at)
		SELECT 'ord_' || lpad(g::text, 8, '0'), $1::timestamptz FROM generate_series($2::int, $3::int) g`, now, from, to)
}

// readCandidates reads a batch of 2,000 transition candidates in tx, then
// undoes what reading them did (their locks, their reviews consumed).
func readCandidates(t *testing.T, tx *sqlx.Tx, now time.Time) []factsRow {
	t.Helper()
	tx.MustExec(`SAVEPOINT read`)
	var rows []factsRow
	if err := tx.Select(&rows, transitionCandidates, now, time.Hour.Seconds(), "", 2000); err != nil {
		t.Fatal(err)
	}
	tx.MustExec(`ROLLBACK TO SAVEPOINT read`)
	return rows
}

// insertBulkOrders inserts orders ord_00000001 to ord_%08d(n), each paying
// its own amount to the shop's address on ethereum, made at now and
// expiring an hour later; status is an SQL expression of g, the order's
// number.
func insertBulkOrders(t *testing.T, db *sqlx.DB, now time.Time, n int, status string) {
	t.Helper()
	pgtest.Exec(t, db, insertOrders+`SELECT 'ord_' || lpad(g::text, 8, '0'), 'bulk-' || g, '\x00', 'ethereum', 'USDT', 'c',
			1000000 + g, 1000000 + g, '0xshop', NULL, `+status+`, $1::timestamptz, $1::timestamptz + interval '1 hour',
			$1::timestamptz + interval '25 hours', $1::timestamptz, 0, $1::timestamptz
		FROM generate_series(1, $2::int) g`, now, n)
}

// rowsRead runs query under EXPLAIN (ANALYZE, FORMAT JSON) in tx and
// returns how many rows its scans of relation read (the rows an UPDATE of
// it writes are not counted), with the plan for a failure's message.
func rowsRead(t *testing.T, tx *sqlx.Tx, relation, query string, args ...any) (float64, string) {
	t.Helper()
	plan, out := explainAnalyze(t, tx, query, args...)
	return plan.sum(relation, func(n planNode) float64 {
		if n.Operation != "" {
			return 0
		}
		return n.Rows
	}), out
}

// explainAnalyze runs query under EXPLAIN (ANALYZE, FORMAT JSON) in tx and
// returns its plan, and the plan as text for a failure's message.
func explainAnalyze(t *testing.T, tx *sqlx.Tx, query string, args ...any) (planNode, string) {
	t.Helper()
	var out string
	if err := tx.Get(&out, `EXPLAIN (ANALYZE, FORMAT JSON) `+query, args...); err != nil {
		t.Fatal(err)
	}
	var plans []struct{ Plan planNode }
	if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
		t.Fatalf("plan %s: %v", out, err)
	}
	return plans[0].Plan, out
}

// planNode is a node of EXPLAIN (FORMAT JSON).
type planNode struct {
	Relation  string     `json:"Relation Name"`
	Operation string     `json:"Operation"` // set on the Update node itself
	Rows      float64    `json:"Actual Rows"`
	Loops     float64    `json:"Actual Loops"`
	Removed   float64    `json:"Rows Removed by Filter"`
	Rechecked float64    `json:"Rows Removed by Index Recheck"`
	Plans     []planNode `json:"Plans"`
}

// sum adds up rows(node) × its loops over the nodes under n (n too) that
// scan relation: rows is per loop, as EXPLAIN gives its counts.
func (n planNode) sum(relation string, rows func(planNode) float64) float64 {
	var total float64
	if n.Relation == relation {
		total = rows(n) * n.Loops
	}
	for _, c := range n.Plans {
		total += c.sum(relation, rows)
	}
	return total
}

// examined is how many rows of relation the scans under n looked at: those
// they returned and those their filters removed.
func (n planNode) examined(relation string) float64 {
	return n.sum(relation, func(n planNode) float64 { return n.Rows + n.Removed + n.Rechecked })
}

// The mempool step pairs open sightings with open orders: what it reads
// does not grow with the orders of the past. With one join on the address
// and "its own address, or its pay amount", every open sighting to a
// shared address was held against every order the shop ever had there:
// 1,000 sightings no order is waiting for, among 100,000 settled orders,
// cost a read of the whole pay index per sighting, on every pass.
func TestMempoolCandidatesReadNoOrderOfThePast(t *testing.T) {
	db := pgtest.New(t)
	now := time.Now().UTC()
	// 100,000 settled orders, half on the shared address and half each on
	// an address of its own, then 1,000 open on the shared address and 200
	// open each on its own.
	pgtest.Exec(t, db, `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
			pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time)
		SELECT 'ord_' || lpad(g::text, 8, '0'), 'bulk-' || g, '\x00', 'bitcoin', 'BTC', '', 1000000 + g, 1000000 + g,
			CASE WHEN g % 2 = 0 THEN 'bc1qshop' ELSE 'bc1qown' || g END, CASE WHEN g % 2 = 0 THEN g % 1000 END,
			CASE WHEN g > 100000 THEN 'awaiting_payment' ELSE 'settled' END, $1::timestamptz - interval '1 hour',
			$1::timestamptz + interval '1 hour', $1::timestamptz + interval '25 hours', $1::timestamptz, 0, $1::timestamptz
		FROM generate_series(1, 102400) g WHERE g <= 100000 OR g % 2 = 0 OR g > 102000`, now)
	// 20,000 sightings of the past, 1,000 open ones that pay no order, one
	// paying the shared address's open order ord_00100002 its amount, and
	// one paying the own address of open order ord_00102001.
	pgtest.Exec(t, db, `INSERT INTO mempool_transfers (id, network, asset, tx_hash, tx_key, idx, to_address, amount,
			first_seen_at, updated_at, dirty, left_at, left_reason)
		SELECT 'mpt_' || g, 'bitcoin', 'BTC', md5(g::text), 'vout:0', 0, 'bc1qshop', 7 + g, $1, $1, false,
			CASE WHEN g <= 20000 THEN $1::timestamptz END, CASE WHEN g <= 20000 THEN 'mined' END
		FROM generate_series(1, 21000) g`, now)
	pgtest.Exec(t, db, `INSERT INTO mempool_transfers (id, network, asset, tx_hash, tx_key, idx, to_address, amount,
			first_seen_at, updated_at, dirty)
		VALUES ('mpt_shared', 'bitcoin', 'BTC', 'shared', 'vout:0', 0, 'bc1qshop', 1100002, $1, $1, false),
			('mpt_own', 'bitcoin', 'BTC', 'own', 'vout:0', 0, 'bc1qown102001', 5, $1, $1, false)`, now)
	pgtest.Exec(t, db, `ANALYZE orders`)
	pgtest.Exec(t, db, `ANALYZE mempool_transfers`)

	// A probe of a few pages per open sighting, and the open orders read
	// once: about 3,200 pages. (Held against every order on its address,
	// each sighting read the 100,000 orders' pay index: 3,000,000.)
	checkMempoolPairing(t, db, now, 5000, "[ord_00100002 ord_00102001]")
}

// checkMempoolPairing runs the mempool step's pairing (lockMempoolOrders)
// in a transaction rolled back: it must read at most maxPages and lock
// exactly the orders want lists.
func checkMempoolPairing(t *testing.T, db *sqlx.DB, now time.Time, maxPages float64, want string) {
	t.Helper()
	tx := db.MustBegin()
	defer tx.Rollback()
	plan, out := pgtest.Explain(t, tx, lockMempoolOrders, now, MaxWithdrawals)
	if plan.Pages() > maxPages {
		t.Fatalf("pairing the open sightings with the open orders read %.0f pages:\n%s", plan.Pages(), out)
	}
	var locked []string
	if err := tx.Select(&locked, lockMempoolOrders, now, MaxWithdrawals); err != nil || fmt.Sprint(locked) != want {
		t.Fatalf("candidates %v (%v), want %s", locked, err, want)
	}
}

// The same when the planner probes orders for each sighting, as it does
// when the table's statistics predate the sightings (autovacuum analyzes
// after a tenth of the table changed, and sightings are never deleted): a
// probe takes the open orders on the sighting's shared address and amount,
// not every order of its network ever sold (about 600 pages each here).
func TestMempoolCandidatesReadNoOrderOfThePastOnStaleStatistics(t *testing.T) {
	db := pgtest.New(t)
	now := time.Now().UTC()
	// 100,000 settled orders on the shared address, 30,000 open ones on
	// another network, and the open order a sighting will pay.
	seedPastSales(t, db, now)
	pgtest.Exec(t, db, insertOrders+`SELECT 'ord_e' || g, 'e-' || g, '\x00', 'ethereum', 'USDT', 'c', 1000 + g, 1000 + g,
			'0xshop', g % 1000, 'awaiting_payment', $1::timestamptz - interval '1 hour', $1::timestamptz + interval '1 hour',
			$1::timestamptz + interval '25 hours', $1, 0, $1
		FROM generate_series(1, 30000) g`, now)
	insertOpenOrder(t, db, now)
	insertSightings := `INSERT INTO mempool_transfers (id, network, asset, tx_hash, tx_key, idx, to_address, amount,
		first_seen_at, updated_at, dirty, left_at, left_reason) `
	pgtest.Exec(t, db, insertSightings+`SELECT 'mpt_l' || g, 'bitcoin', 'BTC', 'l' || g, 'vout:0', 0, 'bc1qshop', 7 + g, $1, $1,
			false, $1, 'mined'
		FROM generate_series(1, 20000) g`, now)
	pgtest.Exec(t, db, `ANALYZE`)
	// After the statistics: 1,000 outputs paying the shared address no
	// order's amount, and one paying ord_open.
	pgtest.Exec(t, db, insertSightings+`SELECT 'mpt_n' || g, 'bitcoin', 'BTC', 'n' || g, 'vout:0', 0, 'bc1qshop', 7 + g, $1, $1,
			false, NULL, NULL
		FROM generate_series(1, 1000) g`, now)
	pgtest.Exec(t, db, insertSightings+`VALUES ('mpt_pay', 'bitcoin', 'BTC', 'pay', 'vout:0', 0, 'bc1qshop', 5000, $1, $1,
			false, NULL, NULL)`, now)

	// A few pages per open sighting and arm: about 4,500. (Probing the
	// network's every order: 600,000.)
	checkMempoolPairing(t, db, now, 10000, "[ord_open]")
}

// The match step (ambiguousOrders, matchOrders: every round of every pass,
// idle or not) pairs the unmatched transfers of the lookback with the open
// orders. When the statistics predate the open orders (taken at a quiet
// hour; a morning's few hundred checkouts are far below autovacuum's tenth
// of a large table), the planner starts from the open orders and probes the
// unmatched transfers by address: every stray payment the address ever
// received (wrong amounts, late payments, dust, address-poisoning spam)
// stays unmatched, so the probe must be bounded by first seen in the index
// itself (migration 00014), not row by row on the heap.
func TestMatchingReadsNoStrayPaymentOfThePast(t *testing.T) {
	db := pgtest.New(t)
	now := time.Now().UTC().Truncate(time.Microsecond)
	lookback := now.Add(-8 * 24 * time.Hour) // max_expiry 7d + monitoring_window 24h
	// 100,000 settled orders over three years, half on the two shared
	// addresses; each with its payment, and every 20th payment a stray one
	// (to a shared address, no order's amount), all in the order seen.
	pgtest.Exec(t, db, `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
			pay_address, unique_k, status, created_at, expires_at, monitor_until, settled_at, updated_at, created_height,
			earliest_block_time, has_transfers)
		SELECT 'ord_h' || lpad(g::text, 7, '0'), 'h-' || g, '\x00', n, a, c, p, p + CASE WHEN g % 4 < 2 THEN g % 1000 ELSE 0 END,
			CASE WHEN g % 4 < 2 THEN s ELSE s || g END, CASE WHEN g % 4 < 2 THEN g % 1000 END, 'settled', at, at + interval '1 hour',
			at + interval '25 hours', at + interval '20 minutes', at, g, at - interval '10 minutes', true
		FROM generate_series(1, 100000) g,
			LATERAL (SELECT CASE WHEN g % 2 = 0 THEN 'bitcoin' ELSE 'ethereum' END AS n, CASE WHEN g % 2 = 0 THEN 'BTC' ELSE 'USDT' END AS a,
				CASE WHEN g % 2 = 0 THEN '' ELSE '0xusdt' END AS c, CASE WHEN g % 2 = 0 THEN 'bc1qshop' ELSE '0xshop' END AS s,
				(1 + g % 20) * 1000000::numeric AS p, $1::timestamptz - (100001 - g) * interval '15 minutes' - interval '2 days' AS at) x`, now)
	pgtest.Exec(t, db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address, amount, block_number,
			block_hash, state, order_id, match_kind, first_seen_at, updated_at, block_time, receipt_entry, attribution_entry)
		SELECT * FROM (
			SELECT 'trf_h' || o.id, o.network, o.asset, o.asset_contract, md5(o.id), 'k', 0, o.pay_address, o.pay_amount,
				o.created_height + 1, 'b', 'confirmed', o.id, CASE WHEN o.unique_k IS NULL THEN 'address' ELSE 'amount' END,
				o.created_at + interval '10 minutes', o.created_at, o.created_at + interval '10 minutes', 1::bigint, 1::bigint
			FROM orders o
			UNION ALL
			SELECT 'trf_s' || o.id, o.network, o.asset, o.asset_contract, md5('s' || o.id), 'k', 1,
				CASE WHEN o.network = 'bitcoin' THEN 'bc1qshop' ELSE '0xshop' END, 777, o.created_height + 1, 'b', 'confirmed', NULL, NULL,
				o.created_at + interval '11 minutes', o.created_at, o.created_at + interval '11 minutes', 1, NULL
			FROM orders o WHERE o.created_height % 20 = 0
		) x ORDER BY 15`)
	pgtest.Exec(t, db, `ANALYZE`)
	// After the statistics: a busy hour's 300 open orders, half on the
	// shared addresses, and 20 strays of the last day.
	pgtest.Exec(t, db, `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
			pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time)
		SELECT 'ord_o' || g, 'o-' || g, '\x00', n, a, c, p, p + CASE WHEN g % 4 < 2 THEN (g * 13 + 5) % 1000 ELSE 0 END,
			CASE WHEN g % 4 < 2 THEN s ELSE s || 'o' || g END, CASE WHEN g % 4 < 2 THEN (g * 13 + 5) % 1000 END, 'awaiting_payment',
			at, at + interval '1 hour', at + interval '25 hours', at, 100000, at - interval '10 minutes'
		FROM generate_series(1, 300) g,
			LATERAL (SELECT CASE WHEN g % 2 = 0 THEN 'bitcoin' ELSE 'ethereum' END AS n, CASE WHEN g % 2 = 0 THEN 'BTC' ELSE 'USDT' END AS a,
				CASE WHEN g % 2 = 0 THEN '' ELSE '0xusdt' END AS c, CASE WHEN g % 2 = 0 THEN 'bc1qshop' ELSE '0xshop' END AS s,
				(1 + g % 20) * 1000000::numeric AS p, $1::timestamptz - (g % 60) * interval '1 minute' AS at) x`, now)
	pgtest.Exec(t, db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address, amount, block_number,
			block_hash, state, first_seen_at, updated_at, block_time, receipt_entry)
		SELECT 'trf_r' || g, CASE WHEN g % 2 = 0 THEN 'bitcoin' ELSE 'ethereum' END, CASE WHEN g % 2 = 0 THEN 'BTC' ELSE 'USDT' END,
			CASE WHEN g % 2 = 0 THEN '' ELSE '0xusdt' END, md5('r' || g), 'k', 1, CASE WHEN g % 2 = 0 THEN 'bc1qshop' ELSE '0xshop' END,
			333 + g, 100001, 'b', 'confirmed', $1::timestamptz - g * interval '1 hour', $1, $1::timestamptz - g * interval '1 hour', 1
		FROM generate_series(1, 20) g`, now)

	for _, c := range []struct{ name, sql string }{{"ambiguousOrders", ambiguousOrders}, {"matchOrders", matchOrders}} {
		tx := db.MustBegin()
		p, plan := pgtest.Explain(t, tx, c.sql, now, lookback)
		pages := p.Pages()
		tx.Rollback()
		t.Logf("%s: %.0f pages", c.name, pages)
		// About 3 pages per open order (a probe of the lookback's strays on
		// its address): about 800. (Probing every stray the address ever
		// received: about 240,000 here, and growing with every one.)
		if pages > 10000 {
			t.Errorf("%s read %.0f pages to find nothing to match among 20 recent strays:\n%s", c.name, pages, plan)
		}
	}
}

// Deciding a customer's tx hash claim (claimQuery, once per claim whose
// transaction is recorded) asks whether another order waiting for about
// the claimed amount could be owed it (waitingElsewhere). It reads the open
// orders of its shared address within a range of pay amounts about the
// claimed one (orders_open_shared_window_idx), not every order ever sold
// there: with the tolerance as its only bound on the amount, it read the
// address's whole history, per claim.
func TestDecidingAClaimReadsNoOrderOfThePast(t *testing.T) {
	db := pgtest.New(t)
	now := time.Now().UTC().Truncate(time.Microsecond)
	// 100,000 settled orders of the past, half on the shared address
	// (amounts of 20 prices, 1 to 20 USDT, plus their unique increments),
	// half each on an address of its own: the planner then takes an
	// address for a selective key.
	pgtest.Exec(t, db, `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
			pay_address, unique_k, derivation_key, derivation_index, status, created_at, expires_at, monitor_until, settled_at,
			updated_at, created_height, earliest_block_time, has_transfers)
		SELECT 'ord_h' || lpad(g::text, 7, '0'), 'h-' || g, '\x00', 'ethereum', 'USDT', '0xusdt', p,
			p + CASE WHEN g % 2 = 0 THEN g % 1000 ELSE 0 END, CASE WHEN g % 2 = 0 THEN '0xshop' ELSE '0xh' || g END,
			CASE WHEN g % 2 = 0 THEN g % 1000 END, CASE WHEN g % 2 = 1 THEN 'xpub' END, CASE WHEN g % 2 = 1 THEN g END,
			'settled', at, at + interval '1 hour', at + interval '25 hours', at + interval '20 minutes', at, g, at - interval '10 minutes', true
		FROM generate_series(1, 100000) g,
			LATERAL (SELECT (1 + g % 20) * 1000000::numeric AS p, $1::timestamptz - (100001 - g) * interval '15 minutes' - interval '2 days' AS at) x`, now)
	// And 20,000 abandoned checkouts of the past on the shared address:
	// expired, which stays a status that takes payments.
	pgtest.Exec(t, db, `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
			pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time)
		SELECT 'ord_x' || lpad(g::text, 7, '0'), 'x-' || g, '\x00', 'ethereum', 'USDT', '0xusdt', p, p + g % 1000, '0xshop',
			g % 1000, 'expired', at, at + interval '1 hour', at + interval '25 hours', at, g, at - interval '10 minutes'
		FROM generate_series(1, 20000) g,
			LATERAL (SELECT (1 + g % 20) * 1000000::numeric AS p, $1::timestamptz - (20001 - g) * interval '1 hour' - interval '2 days' AS at) x`, now)
	// Two open orders with a claim each: the transaction of the first pays
	// the shared address 50 USDT (no order of any time near it), that of
	// the second 10.5 USDT (near a tenth of the past's orders, near no
	// waiting one).
	pgtest.Exec(t, db, `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
			pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time,
			tx_hash_hint, hint_state, customer_marked_paid_at)
		SELECT 'ord_' || c, c, '\x00', 'ethereum', 'USDT', '0xusdt', 3000000, 3000005 + k, '0xshop', 5 + k, 'awaiting_payment',
			$1::timestamptz - interval '10 minutes', $1::timestamptz + interval '50 minutes', $1::timestamptz + interval '1450 minutes',
			$1, 100000, $1::timestamptz - interval '20 minutes', 'tx_' || c, 'pending', $1
		FROM (VALUES ('far', 0), ('near', 1)) AS v(c, k)`, now)
	// And a busy hour's other open orders, half on the shared address,
	// none waiting for about 10.5 USDT.
	pgtest.Exec(t, db, `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
			pay_address, unique_k, derivation_key, derivation_index, status, created_at, expires_at, monitor_until, updated_at,
			created_height, earliest_block_time)
		SELECT 'ord_o' || g, 'o-' || g, '\x00', 'ethereum', 'USDT', '0xusdt', p, p + CASE WHEN g % 2 = 0 THEN 100 + g ELSE 0 END,
			CASE WHEN g % 2 = 0 THEN '0xshop' ELSE '0xo' || g END, CASE WHEN g % 2 = 0 THEN 100 + g END,
			CASE WHEN g % 2 = 1 THEN 'xpub' END, CASE WHEN g % 2 = 1 THEN 200000 + g END, 'awaiting_payment',
			$1::timestamptz - (g % 60) * interval '1 minute', $1::timestamptz + interval '1 hour' - (g % 60) * interval '1 minute',
			$1::timestamptz + interval '25 hours', $1, 100000, $1::timestamptz - interval '1 hour'
		FROM generate_series(1, 400) g, LATERAL (SELECT (1 + g % 20) * 1000000::numeric AS p) x WHERE g % 20 NOT IN (9, 10)`, now)
	pgtest.Exec(t, db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address, amount, block_number,
			block_hash, state, first_seen_at, updated_at, block_time, receipt_entry)
		VALUES ('trf_far', 'ethereum', 'USDT', '0xusdt', 'tx_far', 'log:0', 0, '0xshop', 50000000, 100001, 'b', 'confirmed', $1, $1, $1, 1),
			('trf_near', 'ethereum', 'USDT', '0xusdt', 'tx_near', 'log:0', 0, '0xshop', 10500000, 100001, 'b', 'confirmed', $1, $1, $1, 1)`, now)
	pgtest.Exec(t, db, `ANALYZE`)

	for _, order := range []string{"ord_far", "ord_near"} {
		tx := db.MustBegin()
		p, plan := pgtest.Explain(t, tx, claimQuery, order)
		pages := p.Pages()
		tx.Rollback()
		t.Logf("%s: %.0f pages", order, pages)
		// The orders of the address waiting near the amount: 11-27 pages.
		// (Without the range of pay amounts, every abandoned checkout of
		// the address's past, within the index: about 270; without the
		// index, every order the address ever had: 5,000 and more.)
		if pages > 100 {
			t.Errorf("deciding the claim of %s read %.0f pages:\n%s", order, pages, plan)
		}
	}
	// What the claim finds is the same either way: each transfer is free
	// to link (no waiting order near), eligible.
	var found []claimed
	if err := db.Select(&found, claimQuery, "ord_near"); err != nil || len(found) != 1 || found[0].WaitingElsewhere || found[0].why() != "" {
		t.Fatalf("claim of ord_near: %+v (%v)", found, err)
	}
}

// A sale's checkouts arrive after the planner's statistics were taken (a
// tenth of a large table must change before autovacuum analyzes it again,
// and autovacuum may be off), and so does a flood of dust outputs to the
// shop's address. Believing the open orders none, the planner read them
// all once per sighting: 4,300,000 pages here (13,000,000 with 30,000
// checkouts). Before each pass the runner analyzes the tables that moved
// by AnalyzeAfter rows, and the pairing is back to a probe per sighting.
func TestStatisticsFollowABurstOfOpenOrders(t *testing.T) {
	db := pgtest.New(t)
	now := time.Now().UTC()
	seedPastSales(t, db, now)
	pgtest.Exec(t, db, `ANALYZE`)
	// The sale: 10,000 checkouts on the shared address, and the one a
	// sighting pays; then 1,000 dust outputs and that payment.
	pgtest.Exec(t, db, insertOrders+`SELECT 'ord_o' || g, 'o-' || g, '\x00', 'bitcoin', 'BTC', '', 3000000 + g, 3000000 + g,
			'bc1qshop', g % 1000, 'awaiting_payment', $1::timestamptz - interval '1 hour', $1::timestamptz + interval '1 hour',
			$1::timestamptz + interval '25 hours', $1, 0, $1
		FROM generate_series(1, 10000) g`, now)
	insertOpenOrder(t, db, now)
	insertSightings := `INSERT INTO mempool_transfers (id, network, asset, tx_hash, tx_key, idx, to_address, amount,
		first_seen_at, updated_at, dirty) `
	pgtest.Exec(t, db, insertSightings+`SELECT 'mpt_n' || g, 'bitcoin', 'BTC', 'n' || g, 'vout:0', 0, 'bc1qshop', 7 + g, $1, $1, false
		FROM generate_series(1, 1000) g`, now)
	pgtest.Exec(t, db, insertSightings+`VALUES ('mpt_pay', 'bitcoin', 'BTC', 'pay', 'vout:0', 0, 'bc1qshop', 5000, $1, $1, false)`, now)
	pgtest.WaitModified(t, db, "orders", 10001)

	rec := New(db, slog.New(slog.DiscardHandler), time.Hour, 48*time.Hour)
	tables, err := rec.RefreshStatistics(t.Context())
	if err != nil || fmt.Sprint(tables) != "[mempool_transfers orders]" {
		t.Fatalf("analyzed %v (%v), want the orders and the sightings", tables, err)
	}
	checkMempoolPairing(t, db, now, 10000, "[ord_open]")
	// Nothing moved since: nothing to analyze.
	if tables, err := rec.RefreshStatistics(t.Context()); err != nil || len(tables) != 0 {
		t.Fatalf("analyzed %v (%v) again, with nothing changed", tables, err)
	}
}

// Anyone may send the shop's shared address payments no order is waiting
// for (dust, address-poisoning spam): 20,000 of them in the lookback,
// known to the planner's statistics with the shop's settled orders, and
// then 499 checkouts it has not seen
// (fewer than RefreshStatistics waits for). The match step probes the
// strays once per checkout, and each probe reads those of the checkout's
// amount only, not every stray of the lookback (263,000 pages a match
// statement here with a probe by address and first seen, 6,000,000 beside
// 100,000 settled orders): the payment of one checkout is found among
// them.
func TestMatchingReadsOnlyStraysOfTheAmount(t *testing.T) {
	db := pgtest.New(t)
	now := time.Now().UTC().Truncate(time.Microsecond)
	lookback := now.Add(-8 * 24 * time.Hour)
	strays := `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address, amount, block_number,
			block_hash, state, first_seen_at, updated_at, block_time, receipt_entry)
		SELECT 'trf_' || $2::text || g, 'ethereum', 'USDT', '0xusdt', md5($2::text || g), 'k', 1, '0xshop', $3::numeric + g, 100001, 'b',
			'confirmed', $1::timestamptz - (g % 100) * interval '1 minute', $1, $1::timestamptz - (g % 100) * interval '1 minute', 1
		FROM generate_series(1, $4::int) g`
	pgtest.Exec(t, db, strays, now, "s", 333, 20000)
	pgtest.Exec(t, db, `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
			pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time)
		SELECT 'ord_h' || g, 'h-' || g, '\x00', 'ethereum', 'USDT', '0xusdt', 1000000, 1000000 + g % 1000, '0xshop', g % 1000,
			'settled', $1::timestamptz - interval '30 days', $1::timestamptz - interval '29 days',
			$1::timestamptz - interval '28 days', $1, g, $1::timestamptz - interval '31 days'
		FROM generate_series(1, 20000) g`, now)
	pgtest.Exec(t, db, `ANALYZE`)
	pgtest.Exec(t, db, `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
			pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time)
		SELECT 'ord_' || lpad(g::text, 3, '0'), 'o-' || g, '\x00', 'ethereum', 'USDT', '0xusdt', 2000000, 2000000 + g, '0xshop', g,
			'awaiting_payment', $1::timestamptz - interval '3 hours', $1::timestamptz + interval '1 hour',
			$1::timestamptz + interval '25 hours', $1, 100000, $1::timestamptz - interval '4 hours'
		FROM generate_series(1, 499) g`, now)
	// ord_007's payment (2,000,007), seen a minute ago.
	pgtest.Exec(t, db, strays, now, "p", 2000006, 1)

	for _, c := range []struct{ name, sql, want string }{
		{"ambiguousOrders", ambiguousOrders, "[]"},
		{"matchOrders", matchOrders, "[ord_007]"},
	} {
		tx := db.MustBegin()
		p, plan := pgtest.Explain(t, tx, c.sql, now, lookback)
		var locked []string
		if err := tx.Select(&locked, c.sql, now, lookback); err != nil {
			t.Fatal(err)
		}
		tx.Rollback()
		// A few pages a checkout: about 1,200.
		if p.Pages() > 5000 {
			t.Errorf("%s read %.0f pages for 499 checkouts beside 20,000 strays:\n%s", c.name, p.Pages(), plan)
		}
		if fmt.Sprint(locked) != c.want {
			t.Errorf("%s locked %v, want %s", c.name, locked, c.want)
		}
		t.Logf("%s: %.0f pages", c.name, p.Pages())
	}
}

// insertOrders begins an INSERT of orders with the columns the plan tests
// fill.
const insertOrders = `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
	pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time) `

// seedPastSales writes 100,000 settled orders on the shop's shared Bitcoin
// address (bc1qshop): a history the plans must not read.
func seedPastSales(t *testing.T, db *sqlx.DB, now time.Time) {
	t.Helper()
	pgtest.Exec(t, db, insertOrders+`SELECT 'ord_s' || g, 's-' || g, '\x00', 'bitcoin', 'BTC', '', 1000000 + g, 1000000 + g,
			'bc1qshop', g % 1000, 'settled', $1::timestamptz - interval '2 hours', $1::timestamptz - interval '1 hour', $1, $1, 0, $1
		FROM generate_series(1, 100000) g`, now)
}

// insertOpenOrder writes ord_open, awaiting 5,000 units on bc1qshop: the
// order a sighting pays.
func insertOpenOrder(t *testing.T, db *sqlx.DB, now time.Time) {
	t.Helper()
	pgtest.Exec(t, db, insertOrders+`VALUES ('ord_open', 'open', '\x00', 'bitcoin', 'BTC', '', 5000, 5000, 'bc1qshop', 1,
			'awaiting_payment', $1::timestamptz - interval '1 hour', $1::timestamptz + interval '1 hour',
			$1::timestamptz + interval '25 hours', $1, 0, $1)`, now)
}
