package ledger

import (
	"context"
	"fmt"
	"math/big"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// lockSQL serialises the set-based statements of concurrent passes (and of
// operators' resolutions): each sees what the previous one posted.
const lockSQL = `SELECT pg_advisory_xact_lock(hashtextextended('paywatch:ledger', 0))`

// Lock takes the ledger's transaction-scoped lock inside tx.
func Lock(ctx context.Context, tx *sqlx.Tx) error {
	if _, err := tx.ExecContext(ctx, lockSQL); err != nil {
		return fmt.Errorf("lock the ledger: %w", err)
	}
	return nil
}

// Posted is what PostTransfers did.
type Posted struct {
	Entries int64
	// Orders are the orders whose accounts changed: an attribution posted
	// or reversed, or a matched transfer a reorg moved or took away.
	Orders []string
}

// PostTransfers brings the ledger up to date with the transfers, inside tx
// and under the ledger's lock: it reverses the live entries of transfers a
// reorg orphaned or moved (which the scanner marks ledger_dirty), posts a
// receipt for every confirmed transfer (wallet → suspense) and an
// attribution for every confirmed matched one (suspense → order).
//
// The dirty transfers are locked first and handed to beforeReversal (which
// may be nil), so that the caller can act on exactly those — detach what
// can no longer pay its order — before their entries are reversed; a
// transfer the scanner marks dirty meanwhile waits for the next call.
//
// Each transfer carries the ids of its live receipt and attribution, so
// that the work is found through small partial indexes instead of scanning
// every transfer; an entry's id is drawn before it is inserted, so that its
// postings and the transfer's marker come from the same rows.
func PostTransfers(ctx context.Context, tx *sqlx.Tx, at time.Time, beforeReversal func(dirty []string) error) (Posted, error) {
	var p Posted
	if err := Lock(ctx, tx); err != nil {
		return p, err
	}
	var dirty []string
	if err := tx.SelectContext(ctx, &dirty, `SELECT id FROM transfers WHERE ledger_dirty ORDER BY id FOR UPDATE`); err != nil {
		return p, fmt.Errorf("lock transfers a reorg undid: %w", err)
	}
	if beforeReversal != nil && len(dirty) > 0 {
		if err := beforeReversal(dirty); err != nil {
			return p, err
		}
	}
	for _, step := range []struct {
		name, sql string
		args      []any
	}{
		{"reverse entries of transfers a reorg undid", reverseDirty, []any{at, pq.Array(dirty)}},
		{"post receipts", postReceipts, []any{at}},
		{"post attributions", postAttributions, []any{at}},
	} {
		var row struct {
			N      int64          `db:"n"`
			Orders pq.StringArray `db:"orders"`
		}
		if err := tx.GetContext(ctx, &row, step.sql, step.args...); err != nil {
			return p, fmt.Errorf("%s: %w", step.name, err)
		}
		p.Entries += row.N
		p.Orders = append(p.Orders, row.Orders...)
	}
	return p, nil
}

// reverseDirty reverses the live receipt and attribution of the dirty
// transfers ($2, locked) and forgets them, so that the receipt and
// attribution steps post anew for the transfer's current block and order.
var reverseDirty = `
WITH dirty AS (
	SELECT id, order_id, receipt_entry, attribution_entry FROM transfers WHERE id = ANY($2)
), ` + reversal(`SELECT receipt_entry FROM dirty UNION ALL SELECT attribution_entry FROM dirty`) + `, clean AS (
	UPDATE transfers t SET receipt_entry = NULL, attribution_entry = NULL, ledger_dirty = false
	FROM dirty WHERE t.id = dirty.id
)
SELECT (SELECT count(*) FROM todo) AS n,
	(SELECT coalesce(array_agg(DISTINCT order_id), '{}') FROM dirty WHERE order_id IS NOT NULL) AS orders`

// reversal is the common table expressions that post a reversing entry
// for each entry whose id pick selects and that is not reversed yet: the
// same postings with the opposite sign. $1 is the time; todo holds what it
// reversed.
func reversal(pick string) string {
	return `todo AS (
	SELECT nextval('ledger_entries_id_seq') AS eid, e.id, e.transfer_id, e.order_id
	FROM ledger_entries e
	WHERE e.id IN (` + pick + `) AND NOT EXISTS (SELECT 1 FROM ledger_entries r WHERE r.reverses = e.id)
), ins AS (
	INSERT INTO ledger_entries (id, at, kind, ref, reverses, transfer_id, order_id)
	SELECT eid, $1, 'reversal', 'reverse:' || id, id, transfer_id, order_id FROM todo
), post AS (
	INSERT INTO ledger_postings (entry_id, account, network, asset, amount)
	SELECT todo.eid, p.account, p.network, p.asset, -p.amount FROM todo JOIN ledger_postings p ON p.entry_id = todo.id
)`
}

// postReceipts records every confirmed transfer: debit the receiving
// wallet, credit suspense.
var postReceipts = `
WITH need AS (
	SELECT nextval('ledger_entries_id_seq') AS eid, t.id, t.block_hash, t.network, t.asset, t.to_address, t.amount
	FROM transfers t
	WHERE t.state = 'confirmed' AND t.receipt_entry IS NULL AND NOT t.ledger_dirty
), ins AS (
	INSERT INTO ledger_entries (id, at, kind, ref, transfer_id)
	SELECT eid, $1, 'receipt', id || '@' || block_hash || '#' || eid, id FROM need
), post AS (
	INSERT INTO ledger_postings (entry_id, account, network, asset, amount)
	SELECT n.eid, v.account, n.network, n.asset, v.amount
	FROM need n
	CROSS JOIN LATERAL (VALUES (` + WalletSQL("n.network", "n.to_address") + `, n.amount),
	                           (` + SuspenseSQL("n.network", "n.asset") + `, -n.amount)) AS v(account, amount)
), mark AS (
	UPDATE transfers t SET receipt_entry = need.eid FROM need WHERE t.id = need.id
)
SELECT count(*) AS n, '{}'::text[] AS orders FROM need`

// postAttributions moves every confirmed matched transfer from suspense to
// its order.
var postAttributions = `
WITH need AS (
	SELECT nextval('ledger_entries_id_seq') AS eid, t.id, t.block_hash, t.network, t.asset, t.order_id, t.amount
	FROM transfers t
	WHERE t.state = 'confirmed' AND t.order_id IS NOT NULL AND t.attribution_entry IS NULL AND NOT t.ledger_dirty
), ins AS (
	INSERT INTO ledger_entries (id, at, kind, ref, transfer_id, order_id)
	SELECT eid, $1, 'attribution', id || '@' || block_hash || '>' || order_id || '#' || eid, id, order_id FROM need
), post AS (
	INSERT INTO ledger_postings (entry_id, account, network, asset, amount)
	SELECT n.eid, v.account, n.network, n.asset, v.amount
	FROM need n
	CROSS JOIN LATERAL (VALUES (` + SuspenseSQL("n.network", "n.asset") + `, n.amount),
	                           (` + OrderSQL("n.order_id") + `, -n.amount)) AS v(account, amount)
), mark AS (
	UPDATE transfers t SET attribution_entry = need.eid FROM need WHERE t.id = need.id
)
SELECT count(*) AS n, coalesce(array_agg(DISTINCT order_id), '{}') AS orders FROM need`

// OrderAmount is what an order's account moves, in its network and asset.
type OrderAmount struct {
	OrderID, Network, Asset string
	Amount                  *big.Int
}

// Settle moves each order's amount from its account to the shop's revenue
// (settled:<network>:<asset>) in one settlement entry, inside tx: a posting
// per order and, per network and asset, one to revenue for their sum. A
// batch of orders settled together is one entry, not one per order: a pass
// settling thousands writes a third of the rows it would otherwise (what
// each order moved stays on its own posting, under its own account).
func Settle(ctx context.Context, tx *sqlx.Tx, at time.Time, items []OrderAmount) error {
	var ids, networks, assets, amounts []string
	for _, it := range items {
		if it.Amount.Sign() == 0 {
			continue // nothing received: nothing to move (a posting is never zero)
		}
		ids, networks, assets = append(ids, it.OrderID), append(networks, it.Network), append(assets, it.Asset)
		amounts = append(amounts, it.Amount.String())
	}
	if len(ids) == 0 {
		return nil
	}
	// The revenue postings leave out a sum of zero (orders moving opposite
	// amounts of one asset): the orders' postings balance by themselves.
	_, err := tx.ExecContext(ctx, `
WITH e AS (
	SELECT nextval('ledger_entries_id_seq') AS eid
), ins AS (
	INSERT INTO ledger_entries (id, at, kind, ref, memo)
	SELECT eid, $1, 'settlement', 'batch#' || eid, $6 FROM e
), u AS (
	SELECT u.id, u.network, u.asset, u.amount::numeric AS amount
	FROM unnest($2::text[], $3::text[], $4::text[], $5::text[]) AS u(id, network, asset, amount)
)
INSERT INTO ledger_postings (entry_id, account, network, asset, amount)
SELECT e.eid, `+OrderSQL("u.id")+`, u.network, u.asset, u.amount FROM e, u
UNION ALL
SELECT e.eid, `+SettledSQL("u.network", "u.asset")+`, u.network, u.asset, -sum(u.amount) FROM e, u
GROUP BY e.eid, u.network, u.asset HAVING sum(u.amount) <> 0`,
		at, pq.Array(ids), pq.Array(networks), pq.Array(assets), pq.Array(amounts), settledMemo(len(ids)))
	if err != nil {
		return fmt.Errorf("post settlements: %w", err)
	}
	return nil
}

func settledMemo(n int) string {
	if n == 1 {
		return "settles 1 order"
	}
	return fmt.Sprintf("settles %d orders", n)
}

// Reverse posts, inside tx, a reversing entry for each entry selected by
// query (a SELECT of ledger entry ids; its parameters, args, start at $2)
// that is not reversed yet: the same postings with the opposite sign. It
// returns how many it reversed.
func Reverse(ctx context.Context, tx *sqlx.Tx, at time.Time, query string, args ...any) (int64, error) {
	var n int64
	err := tx.GetContext(ctx, &n, `WITH `+reversal(query)+` SELECT count(*) FROM todo`, append([]any{at}, args...)...)
	if err != nil {
		return 0, fmt.Errorf("post reversals: %w", err)
	}
	return n, nil
}

// settledShareSQL is the condition (parenthesised) on a ledger entry (alias e) whose
// postings on an order's account count towards what revenue holds of the
// order: settlements (a batch's, an operator's), unsettlements, and
// reversals of either (settlements were undone by reversal before
// batches). Migration 00018's commit check counts the same entries.
func settledShareSQL(e string) string {
	return `(` + e + `.kind IN ('` + KindSettlement + `', '` + KindUnsettlement + `') OR (` + e + `.kind = '` + KindReversal +
		`' AND EXISTS (SELECT 1 FROM ledger_entries r WHERE r.id = ` + e + `.reverses AND r.kind IN ('` +
		KindSettlement + `', '` + KindUnsettlement + `'))))`
}

// Unsettle moves back, inside tx, what was settled for orders that are no
// longer settled (a reorg took their payment away): per order and asset,
// an unsettlement entry (revenue → order) of what the order's settlements
// moved and nothing has moved back yet. A settlement covers a batch of
// orders, so it is not reversed whole: each order's share comes back on its
// own (settledShareSQL says what counts). An unsettlement's ref names the
// last entry it counted: the same share cannot be moved back twice, even
// by two transactions at once (the second meets the first's (kind, ref)).
func Unsettle(ctx context.Context, tx *sqlx.Tx, at time.Time, orderIDs []string) error {
	if len(orderIDs) == 0 {
		return nil
	}
	_, err := tx.ExecContext(ctx, `
WITH owed AS (
	SELECT u.id, p.network, p.asset, sum(p.amount) AS amount, max(p.entry_id) AS last
	FROM (SELECT DISTINCT id FROM unnest($2::text[]) AS x(id)) AS u(id)
	JOIN ledger_postings p ON p.account = `+OrderSQL("u.id")+`
	JOIN ledger_entries e ON e.id = p.entry_id
	WHERE `+settledShareSQL("e")+`
	GROUP BY u.id, p.network, p.asset HAVING sum(p.amount) <> 0
), s AS (
	SELECT nextval('ledger_entries_id_seq') AS eid, id, network, asset, amount, last FROM owed
), ins AS (
	INSERT INTO ledger_entries (id, at, kind, ref, order_id)
	SELECT eid, $1, '`+KindUnsettlement+`', id || ':' || network || ':' || asset || '@' || last, id FROM s
)
INSERT INTO ledger_postings (entry_id, account, network, asset, amount)
SELECT s.eid, v.account, s.network, s.asset, v.amount
FROM s CROSS JOIN LATERAL (VALUES (`+OrderSQL("s.id")+`, -s.amount),
                                  (`+SettledSQL("s.network", "s.asset")+`, s.amount)) AS v(account, amount)`,
		at, pq.Array(orderIDs))
	if err != nil {
		return fmt.Errorf("post unsettlements: %w", err)
	}
	return nil
}

// Sweep moves whatever an order's account holds, in each asset, to the
// account to names (settled, refunds owed, suspense): one entry of kind per
// asset, inside tx. A negative balance moves back the other way. It returns
// what it moved.
func Sweep(ctx context.Context, tx *sqlx.Tx, at time.Time, orderID, kind, ref string,
	to func(network, asset string) string) ([]Balance, error) {
	balances, err := OrderBalances(ctx, tx, orderID)
	if err != nil {
		return nil, err
	}
	var moved []Balance
	for _, b := range balances {
		if b.Amount.Sign() == 0 {
			continue
		}
		e := Move(kind, ref+":"+b.Network+":"+b.Asset, b.Network, b.Asset, b.Account, to(b.Network, b.Asset), b.Amount)
		e.OrderID = orderID
		_, posted, err := Post(ctx, tx, at, e)
		if err != nil {
			return nil, err
		}
		if !posted {
			// The balance is there to move, yet an entry of that ref was
			// written: a second sweep under one ref would leave the money
			// where it is while its caller believes it moved.
			return nil, fmt.Errorf("sweep %s/%s: an entry of that ref is already posted", e.Kind, e.Ref)
		}
		moved = append(moved, b)
	}
	return moved, nil
}
