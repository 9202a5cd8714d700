package reconcile

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

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
	pgtest.Exec(t, db, `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
			pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time)
		SELECT 'ord_' || lpad(g::text, 8, '0'), 'bulk-' || g, '\x00', 'ethereum', 'USDT', 'c', 1000000 + g, 1000000 + g,
			'0xshop', NULL, CASE WHEN g % 50 = 0 THEN 'confirming' ELSE 'settled' END, $1::timestamptz,
			$1::timestamptz + interval '1 hour', $1::timestamptz + interval '25 hours', $1::timestamptz, 0, $1::timestamptz
		FROM generate_series(1, 100000) g`, now)
	pgtest.Exec(t, db, `ANALYZE orders`)
	ids := make([]string, 2000)
	from, to, none := make([]string, len(ids)), make([]string, len(ids)), make([]string, len(ids))
	for i := range ids {
		ids[i], from[i], to[i] = fmt.Sprintf("ord_%08d", 50*(i+1)), "confirming", "settled"
	}
	tx := db.MustBegin()
	defer tx.Rollback()
	var out string
	if err := tx.Get(&out, `EXPLAIN (ANALYZE, FORMAT JSON) `+applyTransitions, now, pq.Array(ids), pq.Array(from), pq.Array(to),
		pq.Array(none), pq.Array(none)); err != nil {
		t.Fatal(err)
	}
	var plans []struct{ Plan planNode }
	if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
		t.Fatalf("plan %s: %v", out, err)
	}
	var read float64
	var walk func(n planNode)
	walk = func(n planNode) {
		if n.Relation == "orders" && n.Operation == "" {
			read += n.Rows * n.Loops
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(plans[0].Plan)
	if read > 2000 {
		t.Fatalf("moving 2,000 orders read %.0f rows of a table of 100,000:\n%s", read, out)
	}
	var moved int
	if err := tx.Get(&moved, `SELECT count(*) FROM orders WHERE status = 'settled' AND settled_at IS NOT NULL`); err != nil || moved != 2000 {
		t.Fatalf("%d orders settled (%v), want 2,000", moved, err)
	}
}

// planNode is a node of EXPLAIN (FORMAT JSON).
type planNode struct {
	Relation  string     `json:"Relation Name"`
	Operation string     `json:"Operation"` // set on the Update node itself
	Rows      float64    `json:"Actual Rows"`
	Loops     float64    `json:"Actual Loops"`
	Plans     []planNode `json:"Plans"`
}
