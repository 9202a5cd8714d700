package reconcile

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch/ledger"
)

// CheckInvariants verifies DESIGN.md's invariants over the whole database
// and returns every violation found. Tests run it after every scenario;
// operators can run it too.
func CheckInvariants(ctx context.Context, db *sqlx.DB) error {
	var errs []error
	check := func(name, query string) {
		var bad []string
		if err := db.SelectContext(ctx, &bad, query); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			return
		}
		for _, b := range bad {
			errs = append(errs, fmt.Errorf("%s: %s", name, b))
		}
	}
	// 1. Every transfer is recorded once (the unique key makes it so; a
	// duplicate here would mean the key was dropped).
	check("transfer recorded twice", `SELECT network || ' ' || tx_hash || ' ' || tx_key FROM transfers
		GROUP BY network, tx_hash, tx_key HAVING count(*) > 1`)
	// 2. A settled order has confirmed transfers, to its address, in its
	// asset, summing exactly to its pay amount, or an operator's resolution.
	check("settled order without exact confirmed payment", `WITH paid AS (
			SELECT order_id, network, asset_contract, to_address, sum(amount) AS total FROM transfers
			WHERE state = 'confirmed' AND order_id IS NOT NULL GROUP BY 1, 2, 3, 4)
		SELECT o.id || ' received ' || coalesce(p.total, 0)::text || ' of ' || o.pay_amount::text
		FROM orders o LEFT JOIN paid p ON p.order_id = o.id AND p.network = o.network
			AND p.asset_contract = o.asset_contract AND p.to_address = o.pay_address
		WHERE o.status = 'settled' AND coalesce(p.total, 0) <> o.pay_amount
			AND NOT EXISTS (SELECT 1 FROM order_events e WHERE e.order_id = o.id AND e.type = 'resolved')`)
	// 3. The ledger balances, and wallets and suspense hold exactly what the
	// transfers say.
	if err := ledger.CheckBalanced(ctx, db); err != nil {
		errs = append(errs, err)
	}
	check("wallet balance differs from confirmed transfers", `WITH w AS (
			SELECT account, network, asset, sum(amount) AS bal FROM ledger_postings WHERE account LIKE 'wallet:%'
			GROUP BY account, network, asset),
		t AS (SELECT 'wallet:' || network || ':' || to_address AS account, network, asset, sum(amount) AS bal
			FROM transfers WHERE state = 'confirmed' GROUP BY 1, 2, 3)
		SELECT coalesce(w.account, t.account) || ' ledger ' || coalesce(w.bal, 0)::text || ' transfers ' || coalesce(t.bal, 0)::text
		FROM w FULL JOIN t ON w.account = t.account AND w.asset = t.asset AND w.network = t.network
		WHERE coalesce(w.bal, 0) <> coalesce(t.bal, 0)`)
	check("suspense differs from unmatched confirmed transfers", `WITH s AS (
			SELECT network, asset, -sum(amount) AS bal FROM ledger_postings WHERE account LIKE 'suspense:%'
			GROUP BY network, asset),
		t AS (SELECT network, asset, sum(amount) AS bal FROM transfers
			WHERE state = 'confirmed' AND order_id IS NULL GROUP BY 1, 2)
		SELECT coalesce(s.network, t.network) || ':' || coalesce(s.asset, t.asset) || ' ledger ' || coalesce(s.bal, 0)::text
			|| ' transfers ' || coalesce(t.bal, 0)::text
		FROM s FULL JOIN t ON s.network = t.network AND s.asset = t.asset
		WHERE coalesce(s.bal, 0) <> coalesce(t.bal, 0)`)
	check("settled order account not empty", `SELECT o.id || ' holds ' || (-sum(p.amount))::text FROM orders o
		JOIN ledger_postings p ON p.account = 'order:' || o.id
		WHERE o.status IN ('settled', 'refunded') GROUP BY o.id HAVING sum(p.amount) <> 0`)
	// 4. No two open orders share (network, asset, address, pay amount).
	check("open orders share a pay amount", `SELECT string_agg(id, ', ') FROM orders
		WHERE status IN ('awaiting_payment', 'confirming') AND unique_k IS NOT NULL
		GROUP BY network, asset, pay_address, pay_amount HAVING count(*) > 1`)
	// 5. No status moves backwards except through a recorded reorg or an
	// operator's action.
	check("status moved backwards", `SELECT e.order_id || ' ' || e.from_status || ' -> ' || e.to_status || ' by ' || e.actor
		FROM order_events e
		WHERE e.type = 'status_changed' AND e.from_status IS NOT NULL AND e.actor = 'reconciler' AND NOT (
			(e.from_status = 'awaiting_payment' AND e.to_status IN ('confirming', 'expired', 'disputed', 'settled'))
			OR (e.from_status = 'expired' AND e.to_status IN ('confirming', 'disputed', 'settled'))
			OR (e.from_status = 'confirming' AND e.to_status IN ('settled', 'disputed'))
			OR (e.from_status = 'disputed' AND e.to_status IN ('settled', 'disputed'))
			OR (e.from_status = 'settled' AND e.to_status = 'disputed' AND e.detail->>'reason' = 'orphaned_payment'))`)
	return errors.Join(errs...)
}
