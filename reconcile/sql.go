package reconcile

import (
	"strings"

	"github.com/paywatch/paywatch"
)

// The set-based statements of a pass. $1 is the pass's time throughout.

// holdSQL adds the held flag to a flags expression, once.
func holdSQL(flags string) string {
	return `array_append(array_remove(` + flags + `, '` + paywatch.FlagHeld + `'), '` + paywatch.FlagHeld + `')`
}

// quoteSQL renders a constant string as an SQL literal.
func quoteSQL(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// reviewSQL queues a review of orders (an expression of order ids) for the
// transitions step: their payments changed.
func reviewSQL(orderIDs string) string {
	return `INSERT INTO order_reviews (order_id, at) SELECT DISTINCT id, $1::timestamptz FROM (` + orderIDs + `) AS changed(id)`
}

// ambiguousOrders locks, in id order, the candidate orders of transfers
// that could pay more than one order, and returns them: the orders are
// locked before the transfers, as everywhere.
var ambiguousOrders = `
WITH amb AS (
	SELECT tid, array_agg(oid) AS oids` + candidates + `
	GROUP BY tid HAVING count(*) > 1
)
SELECT o.id FROM orders o WHERE o.id IN (SELECT unnest(oids) FROM amb) AND $1::timestamptz IS NOT NULL
ORDER BY o.id FOR NO KEY UPDATE`

// flagAmbiguous marks transfers that could pay more than one order (all of
// them among the orders locked, $3), and disputes those of the orders that
// hold no payment yet (a mempool sighting is none) as ambiguous: never a
// guess, each with its webhook event (ids from $4, one per order locked).
// The transfers stay in the inbox for an operator.
var flagAmbiguous = `
WITH amb AS (
	SELECT tid, array_agg(oid) AS oids` + candidates + `
	GROUP BY tid HAVING count(*) > 1 AND array_agg(oid) <@ $3::text[]
), flagged AS (
	UPDATE transfers t SET flags = array_append(t.flags, 'ambiguous'), updated_at = $1
	FROM amb WHERE t.id = amb.tid RETURNING t.id, t.tx_hash
), affected AS (
	SELECT o.id, o.status FROM orders o
	WHERE o.id IN (SELECT unnest(oids) FROM amb) AND (o.status IN ('awaiting_payment', 'expired')
		OR (o.status = 'confirming' AND NOT EXISTS (SELECT 1 FROM transfers t4 WHERE t4.order_id = o.id AND t4.state <> 'orphaned')))
), disputed AS (
	UPDATE orders o SET status = 'disputed', dispute_reason = 'ambiguous', updated_at = $1
	FROM affected a WHERE o.id = a.id RETURNING o.id, a.status AS from_status
), ev AS (
	INSERT INTO order_events (order_id, at, type, from_status, to_status, actor, detail)
	SELECT d.id, $1, 'status_changed', d.from_status, 'disputed', 'reconciler',
		jsonb_build_object('reason', 'ambiguous', 'transfers', (SELECT jsonb_agg(amb.tid) FROM amb WHERE d.id = ANY (amb.oids)))
	FROM disputed d
), wh AS (
	INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at)
	SELECT ($4::text[])[row_number() OVER (ORDER BY id)], id, 'order.disputed', $1, $1 FROM disputed
)
SELECT count(*) FROM flagged`

// matchOrders locks, in id order, the orders that transfers with exactly
// one candidate would pay, and returns those still open once locked: a
// cancel in flight and a match never both happen. It runs before
// matchTransfers, in the same transaction, so that every path that ties a
// transfer to an order locks the order before the transfer.
var matchOrders = `
WITH cand AS (
	SELECT tid, min(oid) AS oid` + candidates + `
	GROUP BY tid HAVING count(*) = 1
)
SELECT o.id FROM orders o
WHERE o.id IN (SELECT oid FROM cand) AND o.status IN ` + openStatuses + ` AND $1::timestamptz IS NOT NULL
ORDER BY o.id FOR NO KEY UPDATE`

// matchTransfers ties each transfer with exactly one candidate order, among
// the orders locked ($3), to it. Orders whose new payment waits for
// confirmations are queued for review; confirmed ones are queued when the
// ledger attributes them.
var matchTransfers = `
WITH cand AS (
	SELECT tid, min(oid) AS oid, min(kind) AS kind` + candidates + `
	GROUP BY tid HAVING count(*) = 1
), matched AS (
	UPDATE transfers t SET order_id = cand.oid, match_kind = cand.kind, updated_at = $1
	FROM cand WHERE t.id = cand.tid AND cand.oid = ANY($3::text[])
		AND t.order_id IS NULL AND t.state <> 'orphaned'
	RETURNING t.id, t.order_id, t.tx_hash, t.amount, t.state
), ev AS (
	INSERT INTO order_events (order_id, at, type, actor, detail)
	SELECT order_id, $1, 'transfer_matched', 'reconciler',
		jsonb_build_object('transfer_id', id, 'tx_hash', tx_hash, 'amount_units', amount::text)
	FROM matched
), rv AS (
	` + reviewSQL(`SELECT order_id FROM matched WHERE state <> 'confirmed'`) + `
)
SELECT count(*) FROM matched`

// orderFacts are the columns of an order (alias o) that Decide needs.
const orderFacts = `o.id, o.status, o.dispute_reason, o.pay_amount, o.accepted_amount, o.unique_k IS NOT NULL AS shared,
	o.expires_at, o.customer_marked_paid_at, o.network, o.asset`

// factsSelect reads what Decide needs of the orders in l (orderFacts),
// with the aggregates of factsJoins: a transfer counts as confirmed only
// once the ledger has attributed it (and it is neither provisional nor
// moved since), so that a settlement moves exactly what the order's
// account holds. Mempool sightings are counted apart: detected (still in
// the mempool, or not yet known to be mined; with their sum). Detached
// counts the payments taken from the order since they were matched
// (transfer_unmatched on its timeline).
const factsSelect = `l.id AS oid, l.status, l.dispute_reason, l.pay_amount::text AS pay_amount,
	l.accepted_amount::text AS accepted_amount, l.shared, l.expires_at, l.customer_marked_paid_at, l.network, l.asset,
	t.live, t.unconfirmed, t.orphaned, t.received::text AS received, t.late, m.detected,
	(SELECT count(*) FROM order_events e WHERE e.order_id = l.id AND e.type = 'transfer_unmatched') AS detached,
	m.detected_amount::text AS detected_amount`

// factsJoins sums up, for each order of l, its transfers (as t) and its
// mempool sightings (as m), for factsSelect. Each is an aggregate per
// order, read through the order_id index: never a hash of every transfer
// (which grows with the history), never a merge with that index read from
// its first entry. An aggregate subquery stays apart from the join (a
// plain one was flattened into it, and merged so).
const factsJoins = `LEFT JOIN LATERAL (
	SELECT count(*) FILTER (WHERE t.state <> 'orphaned') AS live,
		count(*) FILTER (WHERE t.state <> 'orphaned' AND NOT (t.state = 'confirmed' AND NOT t.provisional
			AND NOT t.ledger_dirty AND t.attribution_entry IS NOT NULL)) AS unconfirmed,
		count(*) FILTER (WHERE t.state = 'orphaned') AS orphaned,
		coalesce(sum(t.amount) FILTER (WHERE t.state <> 'orphaned'), 0) AS received,
		coalesce(bool_or(coalesce(t.block_time, t.first_seen_at) > l.expires_at) FILTER (WHERE t.state <> 'orphaned'), false) AS late
	FROM transfers t WHERE t.order_id = l.id) t ON true
LEFT JOIN LATERAL (
	SELECT count(*) AS detected, coalesce(sum(m.amount), 0) AS detected_amount
	FROM mempool_transfers m WHERE m.order_id = l.id AND m.left_at IS NULL) m ON true`

// recheckMatches detaches, among the locked transfers a reorg or the
// scanner changed ($2: orphaned, mined again elsewhere, or a look-up's
// provisional record corrected by what the scanner saw), those that no
// longer meet the rule they were matched by: a block their order cannot be
// paid from, another address or asset, a flag, (matched by amount) an
// amount that is not the order's, or (matched by a claim) the exact amount
// of another order. Payments count as they arrived in their final form: a
// detached transfer is in the inbox like any other (an exact payment of
// another order goes to that order). It runs before the ledger reverses
// what changed, so the reversal takes the attribution back from the order. An operator's attach is their decision
// and stays. It locks no order (the transfers it changes wait for no one),
// and queues a review of each order it changes.
var recheckMatches = func() string {
	var why []string
	var keep []string
	for _, r := range eligibility {
		if r.name == ruleLive {
			continue // an orphaned transfer stays its order's: it may come back
		}
		cond := aliases(r.cond, "t", "o")
		if r.name == ruleFlags {
			cond = aliases(recheckFlags, "t", "o")
		}
		why = append(why, "WHEN NOT ("+cond+") THEN "+quoteSQL(r.why))
		keep = append(keep, "("+cond+")")
	}
	amount := `(t.match_kind <> 'amount' OR t.amount = o.pay_amount)`
	why = append(why, "WHEN NOT "+amount+" THEN "+quoteSQL("its amount is not the order's pay amount"))
	keep = append(keep, amount)
	exact := `(t.match_kind <> 'hint' OR NOT ` + exactElsewhere("t", "o") + `)`
	why = append(why, "WHEN NOT "+exact+" THEN "+quoteSQL(whyExactElsewhere))
	keep = append(keep, exact)
	return `
WITH changed AS (
	SELECT t.id, t.order_id, t.tx_hash, t.block_number, CASE ` + strings.Join(why, " ") + ` ELSE '' END AS why
	FROM transfers t JOIN orders o ON o.id = t.order_id
	WHERE t.id = ANY($2) AND t.state <> 'orphaned' AND t.match_kind IN ('amount', 'address', 'hint')
		AND NOT (` + strings.Join(keep, " AND ") + `)
), detached AS (
	UPDATE transfers t SET order_id = NULL, match_kind = NULL, updated_at = $1
	FROM changed WHERE t.id = changed.id
	RETURNING changed.order_id, t.id, t.tx_hash, t.block_number, changed.why
), ev AS (
	INSERT INTO order_events (order_id, at, type, actor, detail)
	SELECT order_id, $1, 'transfer_unmatched', 'reconciler', jsonb_build_object('transfer_id', id, 'tx_hash', tx_hash,
		'block_number', block_number, 'why', 'as the scanner now sees it (in block ' || block_number || '), ' || why)
	FROM detached
), rv AS (
	` + reviewSQL(`SELECT order_id FROM detached`) + `
)
SELECT count(*) FROM detached`
}()

// transitionCandidates reads up to $4 orders after id $3 that may need to
// move: those queued for review (distinct: an order may be queued many
// times, and a batch of fewer than $4 orders ends the walk), those awaiting
// payment past their expiry or past the paid grace ($2 seconds), and those
// confirming past expiry (an address of their own stops waiting for a
// top-up, a mempool sighting stops holding them). It locks them
// (skipping any another transaction holds), consumes their reviews, and
// reads their facts, all in one statement: one snapshot, so that a change
// committed after it leaves its review for the next pass. Every candidate
// is returned (id); those locked come with their facts (oid non-null).
// Their reviews are deleted through the order_id index (= ANY of an
// array): as a join with the locked orders, the planner hashed them and
// read every review queued, for each batch.
var transitionCandidates = `
WITH cand AS (
	SELECT id FROM (
		(SELECT DISTINCT order_id AS id FROM order_reviews WHERE order_id > $3 ORDER BY order_id LIMIT $4)
		UNION
		(SELECT id FROM orders WHERE status = 'awaiting_payment' AND customer_marked_paid_at IS NULL
			AND expires_at <= $1 AND id > $3 ORDER BY id LIMIT $4)
		UNION
		(SELECT id FROM orders WHERE status = 'awaiting_payment' AND customer_marked_paid_at IS NOT NULL
			AND customer_marked_paid_at <= $1 - make_interval(secs => $2) AND id > $3 ORDER BY id LIMIT $4)
		UNION
		(SELECT id FROM orders WHERE status = 'confirming' AND expires_at <= $1
			AND id > $3 ORDER BY id LIMIT $4)
	) c ORDER BY id LIMIT $4
), locked AS (
	SELECT ` + orderFacts + ` FROM orders o WHERE o.id IN (SELECT id FROM cand)
	ORDER BY o.id FOR NO KEY UPDATE SKIP LOCKED
), consumed AS (
	DELETE FROM order_reviews r WHERE r.order_id = ANY (ARRAY(SELECT id FROM locked))
)
SELECT c.id, ` + factsSelect + `
FROM cand c LEFT JOIN locked l ON l.id = c.id
` + factsJoins + `
ORDER BY c.id`

// allFacts reads the facts of every order that is not closed for good, by
// id after $1, $2 at a time, for CheckDecisions.
var allFacts = `
SELECT l.id, ` + factsSelect + `
FROM (SELECT ` + orderFacts + ` FROM orders o WHERE o.status NOT IN ('cancelled', 'refunded') AND o.id > $1
	ORDER BY o.id LIMIT $2) l
` + factsJoins + `
ORDER BY l.id`

// applyTransitions moves orders as decided ($2 ids, $3 from, $4 to, $5
// reasons, $6 causes), each with its timeline event and webhook, and only
// if the order is still where it was decided from. The orders are reached
// by id through their primary key (o.id = ANY): joined with the unnest
// alone, the planner hashed every order of the table for each batch, and a
// pass over n orders cost n × (orders in the table).
var applyTransitions = `
WITH d AS (
	SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS d(id, from_status, to_status, reason, cause)
), moved AS (
	UPDATE orders o SET status = d.to_status, dispute_reason = NULLIF(d.reason, ''),
		settled_at = CASE WHEN d.to_status = 'settled' THEN $1 WHEN d.from_status = 'settled' THEN NULL ELSE o.settled_at END,
		updated_at = $1
	FROM d WHERE o.id = ANY($2::text[]) AND o.id = d.id AND o.status = d.from_status
	RETURNING o.id, d.from_status, d.to_status, d.reason, d.cause
), ev AS (
	INSERT INTO order_events (order_id, at, type, from_status, to_status, actor, detail)
	SELECT id, $1, 'status_changed', from_status, to_status, 'reconciler',
		NULLIF(jsonb_strip_nulls(jsonb_build_object('reason', NULLIF(reason, ''), 'cause', NULLIF(cause, ''))), '{}'::jsonb)
	FROM moved
)
SELECT id, to_status FROM moved`
