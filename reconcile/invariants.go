package reconcile

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/ledger"
)

// Invariant is one property every database paywatch keeps must have.
type Invariant struct {
	Name string
	// Query selects one line per violation.
	Query string
	// Args gives the query's parameters, if it has any.
	Args func() []any
}

// Invariants lists the checks CheckInvariants runs. They hold whenever the
// reconciler is idle; while a pass runs, a check may see a step half done.
var Invariants = []Invariant{
	// Every transfer is recorded once (the unique key makes it so; a
	// duplicate here would mean the key was dropped).
	{"transfer recorded twice", `SELECT network || ' ' || tx_hash || ' ' || tx_key FROM transfers
		GROUP BY network, tx_hash, tx_key HAVING count(*) > 1`, nil},
	// A settled order has confirmed transfers, to its address, in its
	// asset, summing exactly to its pay amount, or to what an operator
	// accepted; and none still waiting.
	{"settled order without exact confirmed payment", `WITH paid AS (
			SELECT order_id, sum(amount) FILTER (WHERE state = 'confirmed' AND network_ok) AS total,
				count(*) FILTER (WHERE state = 'seen') AS waiting
			FROM (SELECT t.*, (t.network = o.network AND t.asset_contract = o.asset_contract AND t.to_address = o.pay_address)
				OR t.match_kind = 'operator' AS network_ok
				FROM transfers t JOIN orders o ON o.id = t.order_id WHERE o.status = 'settled') x
			GROUP BY order_id)
		SELECT o.id || ' received ' || coalesce(p.total, 0)::text || ' of ' || coalesce(o.accepted_amount, o.pay_amount)::text
			|| ', ' || coalesce(p.waiting, 0) || ' waiting'
		FROM orders o LEFT JOIN paid p ON p.order_id = o.id
		WHERE o.status = 'settled' AND (coalesce(p.total, 0) <> coalesce(o.accepted_amount, o.pay_amount) OR coalesce(p.waiting, 0) > 0)`, nil},
	// Every matched transfer leads its order to a state that accounts for
	// it: never an order awaiting payment or expired holding a live
	// payment, never any transfer on a cancelled order.
	{"matched transfer on an order that ignores it", `SELECT t.id || ' (' || t.state || ') on ' || o.status || ' order ' || o.id
		FROM transfers t JOIN orders o ON o.id = t.order_id
		WHERE (o.status IN ('awaiting_payment', 'expired') AND t.state <> 'orphaned') OR o.status = 'cancelled'`, nil},
	// Nothing mined before an order existed pays it, unless an operator
	// attached it by hand.
	{"transfer matched to an order created after it was mined", `SELECT t.id || ' in block ' || t.block_number
			|| ' matched by ' || coalesce(t.match_kind, '?') || ' to ' || o.id || ' created at height ' || coalesce(o.created_height::text, 'unknown')
		FROM transfers t JOIN orders o ON o.id = t.order_id
		WHERE coalesce(t.match_kind, '') <> 'operator'
			AND (o.created_height IS NULL OR t.block_number <= o.created_height OR t.first_seen_at < o.created_at)`, nil},
	// A transfer a look-up recorded ahead of the scanner confirms only once
	// the scanner has seen it.
	{"provisional transfer confirmed", `SELECT id FROM transfers WHERE provisional AND state = 'confirmed'`, nil},
	// A token transfer whose balance check has not run yet confirms
	// nothing (it would count money the token may never have moved).
	{"transfer confirmed before its balance check", `SELECT id FROM transfers
		WHERE state = 'confirmed' AND 'balance_pending' = ANY (flags)`, nil},
	// An order a transfer or a mempool sighting was ever tied to says so
	// (a GET lists its transfers only then): a trigger sets it.
	{"order with transfers not marked so", `SELECT o.id FROM orders o WHERE NOT o.has_transfers
		AND (EXISTS (SELECT 1 FROM transfers t WHERE t.order_id = o.id)
			OR EXISTS (SELECT 1 FROM mempool_transfers m WHERE m.order_id = o.id))`, nil},
	// No two orders that could take the same payment (their lives, up to
	// the end of their monitoring windows, overlap) share a pay amount on
	// one address.
	{"orders that could take the same payment share a pay amount", `SELECT id || ' and an order whose window ends at ' || before::text
		FROM (SELECT id, created_at, max(monitor_until) OVER (PARTITION BY network, asset, pay_address, pay_amount
			ORDER BY created_at, id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
			FROM orders WHERE unique_k IS NOT NULL AND status <> 'cancelled') x
		WHERE before > created_at`, nil},
	// Wallets and suspense hold exactly what the transfers say.
	{"wallet balance differs from confirmed transfers", `WITH w AS (
			SELECT account, network, asset, sum(amount) AS bal FROM ledger_postings WHERE account LIKE ` + ledger.KindLikeSQL(ledger.WalletPrefix) + `
			GROUP BY account, network, asset),
		t AS (SELECT ` + ledger.WalletSQL("network", "to_address") + ` AS account, network, asset, sum(amount) AS bal
			FROM transfers WHERE state = 'confirmed' GROUP BY 1, 2, 3)
		SELECT coalesce(w.account, t.account) || ' ledger ' || coalesce(w.bal, 0)::text || ' transfers ' || coalesce(t.bal, 0)::text
		FROM w FULL JOIN t ON w.account = t.account AND w.asset = t.asset AND w.network = t.network
		WHERE coalesce(w.bal, 0) <> coalesce(t.bal, 0)`, nil},
	{"suspense differs from unmatched confirmed transfers", `WITH s AS (
			SELECT network, asset, -sum(amount) AS bal FROM ledger_postings WHERE account LIKE ` + ledger.KindLikeSQL(ledger.SuspensePrefix) + `
			GROUP BY network, asset),
		t AS (SELECT network, asset, sum(amount) AS bal FROM transfers
			WHERE state = 'confirmed' AND order_id IS NULL GROUP BY 1, 2)
		SELECT coalesce(s.network, t.network) || ':' || coalesce(s.asset, t.asset) || ' ledger ' || coalesce(s.bal, 0)::text
			|| ' transfers ' || coalesce(t.bal, 0)::text
		FROM s FULL JOIN t ON s.network = t.network AND s.asset = t.asset
		WHERE coalesce(s.bal, 0) <> coalesce(t.bal, 0)`, nil},
	// An open order's account holds its confirmed payments; a closed one's
	// holds nothing.
	{"order account differs from its payments", `WITH a AS (
			SELECT substr(account, ` + fmt.Sprint(len(ledger.OrderPrefix)+1) + `) AS order_id, -sum(amount) AS bal FROM ledger_postings
			WHERE account LIKE ` + ledger.KindLikeSQL(ledger.OrderPrefix) + ` GROUP BY account),
		t AS (SELECT order_id, sum(amount) AS bal FROM transfers WHERE order_id IS NOT NULL AND state = 'confirmed' GROUP BY order_id)
		SELECT o.id || ' (' || o.status || ') holds ' || coalesce(a.bal, 0)::text || ', its confirmed payments ' || coalesce(t.bal, 0)::text
		FROM orders o LEFT JOIN a ON a.order_id = o.id LEFT JOIN t ON t.order_id = o.id
		WHERE (a.bal IS NOT NULL OR t.bal IS NOT NULL) AND coalesce(a.bal, 0) <>
			CASE WHEN o.status IN ('settled', 'refunded', 'cancelled') THEN 0 ELSE coalesce(t.bal, 0) END`, nil},
	// Revenue is the confirmed payments of settled orders, and refunds owed
	// those of refunded ones: never refunds owed for money that never
	// arrived.
	{"settled or refunds owed differ from the payments of those orders", `WITH l AS (
			SELECT split_part(account, ':', 1) || ':' AS kind, network, asset, -sum(amount) AS bal FROM ledger_postings
			WHERE account LIKE ` + ledger.KindLikeSQL(ledger.SettledPrefix) + ` OR account LIKE ` + ledger.KindLikeSQL(ledger.RefundsOwedPrefix) + `
			GROUP BY 1, 2, 3),
		t AS (SELECT CASE o.status WHEN 'settled' THEN '` + ledger.SettledPrefix + `' ELSE '` + ledger.RefundsOwedPrefix + `' END AS kind,
			t.network, t.asset, sum(t.amount) AS bal
			FROM transfers t JOIN orders o ON o.id = t.order_id
			WHERE o.status IN ('settled', 'refunded') AND t.state = 'confirmed' GROUP BY 1, 2, 3)
		SELECT coalesce(l.kind, t.kind) || coalesce(l.network, t.network) || ':' || coalesce(l.asset, t.asset)
			|| ' ledger ' || coalesce(l.bal, 0)::text || ' payments ' || coalesce(t.bal, 0)::text
		FROM l FULL JOIN t ON l.kind = t.kind AND l.network = t.network AND l.asset = t.asset
		WHERE coalesce(l.bal, 0) <> coalesce(t.bal, 0)`, nil},
	// Every recorded status change is a move of the lifecycle (by the
	// reconciler, an operator's resolution, or the storefront's cancel).
	{"status change the lifecycle does not allow", `SELECT e.order_id || ' ' || e.from_status || ' -> ' || e.to_status
			|| coalesce(' ' || (e.detail->>'reason'), '') || ' by ' || e.actor
		FROM order_events e
		WHERE e.type IN ('status_changed', 'resolved') AND e.from_status IS NOT NULL
			AND (e.from_status, e.to_status, CASE WHEN e.to_status = 'disputed' THEN coalesce(e.detail->>'reason', '') ELSE '' END,
				CASE WHEN e.type = 'resolved' THEN 'operator' WHEN e.actor = 'reconciler' THEN 'reconciler' ELSE 'storefront' END)
			NOT IN (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]))`, lifecycleArrays},
}

// lifecycleArrays returns Lifecycle as four parallel arrays (from, to,
// reason, by), one element per allowed move and reason.
func lifecycleArrays() []any {
	var from, to, reason, by []string
	for _, t := range paywatch.Lifecycle {
		reasons := t.Reasons
		if len(reasons) == 0 {
			reasons = []paywatch.Reason{""}
		}
		for _, r := range reasons {
			from, to, reason, by = append(from, string(t.From)), append(to, string(t.To)), append(reason, string(r)), append(by, string(t.By))
		}
	}
	return []any{pq.Array(from), pq.Array(to), pq.Array(reason), pq.Array(by)}
}

// CheckInvariants runs every Invariant over the database, and checks that
// every ledger entry balances; it returns every violation found. Tests run
// it after every scenario; operators run it as paywatch check.
func CheckInvariants(ctx context.Context, db *sqlx.DB) error {
	var errs []error
	if err := ledger.CheckBalanced(ctx, db); err != nil {
		errs = append(errs, err)
	}
	for _, inv := range Invariants {
		var bad []string
		var args []any
		if inv.Args != nil {
			args = inv.Args()
		}
		if err := db.SelectContext(ctx, &bad, inv.Query, args...); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", inv.Name, err))
			continue
		}
		for _, b := range bad {
			errs = append(errs, fmt.Errorf("%s: %s", inv.Name, b))
		}
	}
	return errors.Join(errs...)
}
