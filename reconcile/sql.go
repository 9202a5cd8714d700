package reconcile

// The set-based statements of a pass. $1 is the pass's time throughout.

// candidates pairs unmatched live transfers (t) with the orders (o) they
// may pay: same network, asset and address; for shared addresses exactly the
// pay amount; seen within the order's life (created, up to the end of its
// monitoring window). $2 bounds how far back transfers are considered. The
// two receiving modes are joined apart so that each join is on equalities.
const candidates = `
	FROM (
		SELECT t.id AS tid, o.id AS oid FROM transfers t
		JOIN orders o ON o.network = t.network AND o.asset = t.asset AND o.asset_contract = t.asset_contract
			AND o.pay_address = t.to_address AND o.pay_amount = t.amount AND o.unique_k IS NOT NULL
		WHERE ` + candidateFilter + `
		UNION ALL
		SELECT t.id, o.id FROM transfers t
		JOIN orders o ON o.network = t.network AND o.asset = t.asset AND o.asset_contract = t.asset_contract
			AND o.pay_address = t.to_address AND o.unique_k IS NULL
		WHERE ` + candidateFilter + `
	) pairs`

const candidateFilter = `t.order_id IS NULL AND t.state <> 'orphaned' AND t.first_seen_at >= $2
			AND t.flags <@ ARRAY['balance_unchecked']::text[]
			AND coalesce(t.block_time, t.first_seen_at) <= o.monitor_until
			AND coalesce(t.block_time, t.first_seen_at) >= o.created_at - interval '10 minutes'
			AND o.status IN ('awaiting_payment', 'confirming', 'expired', 'disputed')`

// flagAmbiguous marks transfers that could pay more than one order, and
// disputes those orders as ambiguous: never a guess.
const flagAmbiguous = `
WITH amb AS (
	SELECT tid, array_agg(oid) AS oids` + candidates + `
	GROUP BY tid HAVING count(*) > 1
), flagged AS (
	UPDATE transfers t SET flags = array_append(t.flags, 'ambiguous'), updated_at = $1
	FROM amb WHERE t.id = amb.tid RETURNING t.id, t.tx_hash
), affected AS (
	SELECT o.id, o.status FROM orders o
	WHERE o.id IN (SELECT unnest(oids) FROM amb) AND o.status IN ('awaiting_payment', 'expired', 'confirming')
	FOR UPDATE
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
	SELECT 'evt_' || replace(gen_random_uuid()::text, '-', ''), id, 'order.disputed', $1, $1 FROM disputed
)
SELECT count(*) FROM flagged`

// matchTransfers ties each transfer with exactly one candidate order to it.
const matchTransfers = `
WITH cand AS (
	SELECT tid, min(oid) AS oid` + candidates + `
	GROUP BY tid HAVING count(*) = 1
), matched AS (
	UPDATE transfers t SET order_id = cand.oid, updated_at = $1
	FROM cand WHERE t.id = cand.tid AND t.order_id IS NULL
	RETURNING t.id, t.order_id, t.tx_hash, t.amount
), ev AS (
	INSERT INTO order_events (order_id, at, type, actor, detail)
	SELECT order_id, $1, 'transfer_matched', 'reconciler',
		jsonb_build_object('transfer_id', id, 'tx_hash', tx_hash, 'amount_units', amount::text)
	FROM matched
)
SELECT count(*) FROM matched`

// reverseOrphaned posts a reversal of the live receipt and attribution of
// every transfer a reorg orphaned or moved to another block (the scanner
// marks them ledger_dirty), and forgets them, so that the receipt and
// attribution steps post anew for the transfer's current block.
const reverseOrphaned = `
WITH dirty AS (
	SELECT id, receipt_entry, attribution_entry FROM transfers WHERE ledger_dirty
), todo AS (
	SELECT nextval('ledger_entries_id_seq') AS eid, e.id, e.transfer_id, e.order_id
	FROM ledger_entries e
	WHERE e.id IN (SELECT receipt_entry FROM dirty UNION ALL SELECT attribution_entry FROM dirty)
		AND NOT EXISTS (SELECT 1 FROM ledger_entries r WHERE r.reverses = e.id)
), ins AS (
	INSERT INTO ledger_entries (id, at, kind, ref, reverses, transfer_id, order_id)
	SELECT eid, $1, 'reversal', 'reverse:' || id, id, transfer_id, order_id FROM todo
), post AS (
	INSERT INTO ledger_postings (entry_id, account, network, asset, amount)
	SELECT todo.eid, p.account, p.network, p.asset, -p.amount FROM todo JOIN ledger_postings p ON p.entry_id = todo.id
), clean AS (
	UPDATE transfers t SET receipt_entry = NULL, attribution_entry = NULL, ledger_dirty = false
	FROM dirty WHERE t.id = dirty.id
)
SELECT count(*) FROM todo WHERE $2::timestamptz IS NOT NULL`

// postReceipts records every confirmed transfer: debit the receiving
// wallet, credit suspense.
//
// The ledger statements run under a transaction-scoped advisory lock (see
// postLedger), and an entry's id is drawn before it is inserted: postings
// and the transfer's marker then come from the same rows, with no join
// between the statement's parts.
const postReceipts = `
WITH need AS (
	SELECT nextval('ledger_entries_id_seq') AS eid, t.id, t.block_hash, t.network, t.asset, t.to_address, t.amount
	FROM transfers t
	WHERE t.state = 'confirmed' AND t.receipt_entry IS NULL
), ins AS (
	INSERT INTO ledger_entries (id, at, kind, ref, transfer_id)
	SELECT eid, $1, 'receipt', id || '@' || block_hash || '#' || eid, id FROM need
), post AS (
	INSERT INTO ledger_postings (entry_id, account, network, asset, amount)
	SELECT n.eid, v.account, n.network, n.asset, v.amount
	FROM need n
	CROSS JOIN LATERAL (VALUES ('wallet:' || n.network || ':' || n.to_address, n.amount),
	                           ('suspense:' || n.network || ':' || n.asset, -n.amount)) AS v(account, amount)
), mark AS (
	UPDATE transfers t SET receipt_entry = need.eid FROM need WHERE t.id = need.id
)
SELECT count(*) FROM need WHERE $2::timestamptz IS NOT NULL`

// postAttributions moves every confirmed matched transfer from suspense to
// its order.
const postAttributions = `
WITH need AS (
	SELECT nextval('ledger_entries_id_seq') AS eid, t.id, t.block_hash, t.network, t.asset, t.order_id, t.amount
	FROM transfers t
	WHERE t.state = 'confirmed' AND t.order_id IS NOT NULL AND t.attribution_entry IS NULL
), ins AS (
	INSERT INTO ledger_entries (id, at, kind, ref, transfer_id, order_id)
	SELECT eid, $1, 'attribution', id || '@' || block_hash || '>' || order_id || '#' || eid, id, order_id FROM need
), post AS (
	INSERT INTO ledger_postings (entry_id, account, network, asset, amount)
	SELECT n.eid, v.account, n.network, n.asset, v.amount
	FROM need n
	CROSS JOIN LATERAL (VALUES ('suspense:' || n.network || ':' || n.asset, n.amount),
	                           ('order:' || n.order_id, -n.amount)) AS v(account, amount)
), mark AS (
	UPDATE transfers t SET attribution_entry = need.eid FROM need WHERE t.id = need.id
)
SELECT count(*) FROM need WHERE $2::timestamptz IS NOT NULL`

// transitionBatch decides and applies the next status of up to $4 orders
// after id $3, with their timeline events, webhooks and ledger entries, in
// one statement. $2 is paid_grace in seconds.
const transitionBatch = `
WITH cand AS (
	-- Each branch walks an index from $3 and stops after $4 rows.
	SELECT DISTINCT id FROM (
		(SELECT o.id FROM orders o
		WHERE o.id > $3 AND o.status IN ('awaiting_payment', 'confirming', 'expired', 'disputed')
			AND (o.status IN ('awaiting_payment', 'confirming') OR o.monitor_until > $1
			     OR EXISTS (SELECT 1 FROM transfers t WHERE t.order_id = o.id AND t.state = 'seen'))
		ORDER BY o.id LIMIT $4)
		UNION ALL
		(SELECT t.order_id FROM transfers t JOIN orders o ON o.id = t.order_id
		WHERE t.state = 'orphaned' AND o.status = 'settled' AND t.order_id > $3
		ORDER BY t.order_id LIMIT $4)
	) c ORDER BY id LIMIT $4
), locked AS (
	SELECT o.* FROM orders o WHERE o.id IN (SELECT id FROM cand) FOR UPDATE SKIP LOCKED
), agg AS (
	SELECT o.id, o.status, o.dispute_reason, o.pay_amount, o.unique_k IS NOT NULL AS shared, o.expires_at,
		o.customer_marked_paid_at AS marked, o.network, o.asset,
		count(t.id) FILTER (WHERE t.state <> 'orphaned') AS live,
		count(t.id) FILTER (WHERE t.state = 'confirmed') AS confirmed,
		count(t.id) FILTER (WHERE t.state = 'orphaned') AS orphaned,
		coalesce(sum(t.amount) FILTER (WHERE t.state <> 'orphaned'), 0) AS received,
		coalesce(bool_or(coalesce(t.block_time, t.first_seen_at) > o.expires_at) FILTER (WHERE t.state <> 'orphaned'), false) AS late
	FROM locked o LEFT JOIN transfers t ON t.order_id = o.id
	GROUP BY o.id, o.status, o.dispute_reason, o.pay_amount, o.unique_k, o.expires_at, o.customer_marked_paid_at,
		o.network, o.asset
), decided AS (
	SELECT a.*, split_part(d.outcome, ':', 1) AS to_status, NULLIF(split_part(d.outcome, ':', 2), '') AS to_reason
	FROM agg a CROSS JOIN LATERAL (SELECT CASE
		WHEN a.live = 0 AND a.orphaned > 0 AND a.status IN ('confirming', 'settled') THEN 'disputed:orphaned_payment'
		WHEN a.live = 0 AND a.status = 'awaiting_payment' AND a.marked IS NOT NULL
			AND $1 >= a.marked + make_interval(secs => $2) THEN 'disputed:no_payment_found'
		WHEN a.live = 0 AND a.status = 'awaiting_payment' AND a.marked IS NULL AND $1 >= a.expires_at THEN 'expired:'
		WHEN a.live = 0 THEN a.status || ':' || coalesce(a.dispute_reason, '')
		WHEN a.confirmed < a.live THEN CASE WHEN a.status IN ('awaiting_payment', 'expired') THEN 'confirming:'
			ELSE a.status || ':' || coalesce(a.dispute_reason, '') END
		WHEN a.status = 'settled' THEN 'settled:'
		WHEN a.status = 'disputed' AND a.dispute_reason NOT IN ('no_payment_found', 'orphaned_payment')
			THEN 'disputed:' || a.dispute_reason
		WHEN a.status = 'disputed' AND a.received = a.pay_amount AND NOT (a.shared AND a.live > 1) THEN 'settled:'
		WHEN a.shared AND a.live > 1 THEN 'disputed:multiple_payments'
		WHEN a.late AND a.status <> 'disputed' THEN 'disputed:late_payment'
		WHEN a.received = a.pay_amount THEN 'settled:'
		WHEN a.received > a.pay_amount THEN 'disputed:overpaid'
		WHEN NOT a.shared AND $1 < a.expires_at THEN 'confirming:'
		ELSE 'disputed:underpaid'
	END AS outcome) d
), moved AS (
	UPDATE orders o SET status = d.to_status, dispute_reason = d.to_reason,
		settled_at = CASE WHEN d.to_status = 'settled' THEN $1 ELSE o.settled_at END, updated_at = $1
	FROM decided d
	WHERE o.id = d.id AND (d.to_status, coalesce(d.to_reason, '')) <> (d.status, coalesce(d.dispute_reason, ''))
	RETURNING o.id, d.status AS from_status, d.to_status, d.to_reason, d.received, o.network, o.asset,
		CASE WHEN d.to_status = 'settled' AND d.received > 0 THEN nextval('ledger_entries_id_seq') END AS eid
), ev AS (
	INSERT INTO order_events (order_id, at, type, from_status, to_status, actor, detail)
	SELECT id, $1, 'status_changed', from_status, to_status, 'reconciler',
		CASE WHEN to_reason IS NULL THEN NULL ELSE jsonb_build_object('reason', to_reason) END
	FROM moved
), wh AS (
	INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at)
	SELECT 'evt_' || replace(gen_random_uuid()::text, '-', ''), id, 'order.' || to_status, $1, $1 FROM moved
), settle AS (
	INSERT INTO ledger_entries (id, at, kind, ref, order_id)
	SELECT eid, $1, 'settlement', id || '@' || to_char($1, 'YYYYMMDDHH24MISSUS'), id FROM moved
	WHERE eid IS NOT NULL
), settle_post AS (
	INSERT INTO ledger_postings (entry_id, account, network, asset, amount)
	SELECT m.eid, v.account, m.network, m.asset, v.amount
	FROM moved m
	CROSS JOIN LATERAL (VALUES ('order:' || m.id, m.received),
	                           ('settled:' || m.network || ':' || m.asset, -m.received)) AS v(account, amount)
	WHERE m.eid IS NOT NULL
), unsettle_todo AS (
	-- Driven from the (few) orders leaving settled, one index lookup each.
	SELECT nextval('ledger_entries_id_seq') AS eid, e.id, e.order_id
	FROM moved m CROSS JOIN LATERAL (
		SELECT e.id, e.order_id FROM ledger_entries e
		WHERE e.order_id = m.id AND e.kind = 'settlement'
			AND NOT EXISTS (SELECT 1 FROM ledger_entries r WHERE r.reverses = e.id)
	) e
	WHERE m.from_status = 'settled'
), unsettle AS (
	INSERT INTO ledger_entries (id, at, kind, ref, reverses, order_id)
	SELECT eid, $1, 'reversal', 'reverse:' || id, id, order_id FROM unsettle_todo
), unsettle_post AS (
	INSERT INTO ledger_postings (entry_id, account, network, asset, amount)
	SELECT u.eid, p.account, p.network, p.asset, -p.amount FROM unsettle_todo u JOIN ledger_postings p ON p.entry_id = u.id
)
SELECT (SELECT count(*) FROM cand) AS candidates, (SELECT max(id) FROM cand) AS last_id,
	(SELECT count(*) FROM moved) AS moved`
