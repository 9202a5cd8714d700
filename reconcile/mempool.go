package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch/migrations/pg"
)

// Payments seen in a mempool (mempool_transfers, written by the Bitcoin
// watchers) show an order as "payment detected": confirming with 0
// confirmations. They never pay anything: no ledger entry reads them, and
// an order settles only on transfers in blocks. The pass ties each sighting
// to the one order it could be meant for (its own address, or the exact
// pay amount on a shared one, seen after the order was created), and
// withdraws it once the scanner has passed the height at which it left the
// mempool without a block holding it (replaced or dropped): the order goes
// back to awaiting payment, and its timeline says why.

// DroppedAfter is how long a sighting must be missing from the mempool,
// besides a block passing, before it counts as dropped.
const DroppedAfter = time.Minute

// MaxWithdrawals is how many payments of an order may be withdrawn from
// the mempool before sightings stop moving it (its payment then shows once
// mined).
const MaxWithdrawals = 3

// resolveMempool ends the sightings that left the mempool at or below the
// scanner's cursor: mined (a live transfer of the same output exists),
// replaced (a transaction was seen spending one of its inputs) or dropped.
// A replacement tied to the same order is a fee bump (payment_replaced on
// the timeline); any other end but mined withdraws the payment
// (payment_withdrawn). A sighting that is merely missing is dropped only once the scanner has
// passed a block more and it has been missing for DroppedAfter ($2): a
// node restarting or a failover to a node that has not seen it yet
// withdraws nothing. Withdrawals are written on the order's timeline.
const resolveMempool = `
WITH ended AS (
	SELECT m.id, CASE
			WHEN EXISTS (SELECT 1 FROM transfers t WHERE t.network = m.network AND t.tx_hash = m.tx_hash
				AND t.tx_key = m.tx_key AND t.state <> 'orphaned') THEN 'mined'
			WHEN m.replaced_by IS NOT NULL THEN 'replaced'
			WHEN c.block_number > m.missing_at_height AND m.missing_since <= $1::timestamptz - make_interval(secs => $2) THEN 'dropped'
		END AS reason
	FROM mempool_transfers m JOIN chain_cursors c ON c.network = m.network
	WHERE m.left_at IS NULL AND m.missing_at_height IS NOT NULL AND c.block_number >= m.missing_at_height
), gone AS (
	UPDATE mempool_transfers m SET left_at = $1, updated_at = $1, dirty = true, left_reason = ended.reason
	FROM ended WHERE m.id = ended.id AND ended.reason IS NOT NULL
	RETURNING m.network, m.order_id, m.tx_hash, m.idx, m.amount, m.left_reason, m.replaced_by
), ev AS (
	INSERT INTO order_events (order_id, at, type, actor, detail)
	SELECT g.order_id, $1, CASE WHEN EXISTS (SELECT 1 FROM mempool_transfers r WHERE r.network = g.network
			AND r.tx_hash = g.replaced_by AND r.order_id = g.order_id) THEN 'payment_replaced' ELSE 'payment_withdrawn' END,
		'reconciler', jsonb_strip_nulls(jsonb_build_object('tx_hash', g.tx_hash, 'output', g.idx,
			'amount_units', g.amount::text, 'why', g.left_reason, 'replaced_by', g.replaced_by))
	FROM gone g WHERE g.order_id IS NOT NULL AND g.left_reason <> 'mined'
)
SELECT count(*) FROM gone`

// mempoolCandidates pairs each open sighting with its candidate orders
// (mid, oid): an order awaiting payment or confirming, created before the
// sighting and expiring after it, whose address it pays (and, on a shared
// address, whose exact pay amount it is); never dust, and never an order
// that has had MaxWithdrawals ($2) payments withdrawn (its timeline's
// payment_withdrawn: replacing a payment back and forth does not move an
// order for ever), unless it replaces one of the order's own sightings (a
// fee bump). Only sightings with exactly one candidate are kept.
//
// Orders of their own address and orders on a shared one are paired
// apart, each on an equality the planner can join on: paired in one join,
// on the address and "its own address, or its pay amount", every open
// sighting was held against every order on its address, settled ones
// included (a lingering sighting to a shared address cost a read of
// every order the shop ever had there, on every pass).
const mempoolCandidates = `
WITH pair AS (
	SELECT m.id AS mid, o.id AS oid
	FROM mempool_transfers m
	JOIN orders o ON o.network = m.network AND o.pay_address = m.to_address AND o.unique_k IS NULL
	WHERE ` + mempoolCandidate + `
	UNION ALL
	SELECT m.id, o.id
	FROM mempool_transfers m
	JOIN orders o ON o.network = m.network AND o.pay_address = m.to_address AND o.pay_amount = m.amount
		AND o.unique_k IS NOT NULL
	WHERE ` + mempoolCandidate + `
), cand AS (
	SELECT mid, min(oid) AS oid FROM pair GROUP BY mid HAVING count(*) = 1
)`

// mempoolCandidate is what makes order o a candidate for sighting m, once
// o's address is the one m pays (mempoolCandidates).
const mempoolCandidate = `m.order_id IS NULL AND m.left_at IS NULL AND m.missing_at_height IS NULL AND m.flags = '{}'
		AND o.asset = m.asset AND o.status IN ('awaiting_payment', 'confirming') AND o.created_at <= m.first_seen_at
		AND m.first_seen_at < o.expires_at
		AND ((SELECT count(*) FROM order_events w WHERE w.order_id = o.id AND w.type = 'payment_withdrawn') < $2
			OR EXISTS (SELECT 1 FROM mempool_transfers p WHERE p.order_id = o.id AND p.network = m.network
				AND p.replaced_by = m.tx_hash))`

// lockMempoolOrders locks, by id, the orders matchMempool would tie
// sightings to: orders are locked before what is tied to them, here as
// everywhere (tying a sighting marks its order has_transfers). An order
// another transaction holds is skipped (its sighting waits for the next
// pass): the step holds the sightings' turn, and waits for no one.
const lockMempoolOrders = mempoolCandidates + `
SELECT o.id FROM orders o WHERE o.id IN (SELECT oid FROM cand) AND $1::timestamptz IS NOT NULL
ORDER BY o.id FOR NO KEY UPDATE SKIP LOCKED`

// matchMempool ties each open sighting with exactly one candidate order,
// among the orders locked ($3), to it. The order's timeline says a payment
// was detected.
const matchMempool = mempoolCandidates + `, matched AS (
	UPDATE mempool_transfers m SET order_id = cand.oid, dirty = true, updated_at = $1
	FROM cand WHERE m.id = cand.mid AND cand.oid = ANY($3::text[]) AND m.order_id IS NULL
	RETURNING m.order_id, m.tx_hash, m.idx, m.amount
), ev AS (
	INSERT INTO order_events (order_id, at, type, actor, detail)
	SELECT order_id, $1, 'payment_detected', 'reconciler',
		jsonb_build_object('tx_hash', tx_hash, 'output', idx, 'amount_units', amount::text, 'confirmations', 0)
	FROM matched
)
SELECT count(*) FROM matched`

// reviewMempool queues a review of every order whose sightings changed.
var reviewMempool = `
WITH changed AS (
	UPDATE mempool_transfers SET dirty = false WHERE dirty AND $1::timestamptz IS NOT NULL RETURNING order_id
)
` + reviewSQL(`SELECT order_id FROM changed WHERE order_id IS NOT NULL`)

// mempool runs the mempool statements in one transaction; it returns the
// sightings it tied to orders or ended.
//
// It writes sightings in turns with the Bitcoin watchers (see
// pg.LockSightings), but never waits for a turn: while a watcher records
// what it read, the step is left for the next pass (which the watcher's
// commit asks for), so that neither the rest of the pass nor the orders
// the step would lock wait for a watcher's write.
func (r *Reconciler) mempool(ctx context.Context, now time.Time) (int64, error) {
	var total int64
	err := r.Sealer.SealTx(ctx, r.db, func(tx *sqlx.Tx) error {
		if turn, err := pg.TryLockSightings(ctx, tx); err != nil || !turn {
			if err == nil {
				r.log.Debug("a mempool watcher is recording; the mempool step waits for the next pass")
			}
			return err
		}
		// Matching first: a replacement is tied to its order before the
		// sighting it replaced ends, so that a fee bump reads as one.
		var resolved, matched int64
		var locked []string
		if err := tx.SelectContext(ctx, &locked, lockMempoolOrders, now, MaxWithdrawals); err != nil {
			return err
		}
		if len(locked) > 0 {
			if err := tx.GetContext(ctx, &matched, matchMempool, now, MaxWithdrawals, pq.Array(locked)); err != nil {
				return err
			}
		}
		if err := tx.GetContext(ctx, &resolved, resolveMempool, now, DroppedAfter.Seconds()); err != nil {
			return err
		}
		total = resolved + matched
		_, err := tx.ExecContext(ctx, reviewMempool, now)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("mempool payments: %w", err)
	}
	return total, nil
}
