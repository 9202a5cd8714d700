package orders

import (
	"context"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pg"
)

// lockOrder reads an order's status for update inside tx.
func lockOrder(ctx context.Context, tx *sqlx.Tx, id string) (status paywatch.Status, marked bool, err error) {
	var row struct {
		Status string `db:"status"`
		Marked bool   `db:"marked"`
	}
	if !pg.ValidText(id) {
		return "", false, paywatch.Errorf(paywatch.CodeNotFound, "no order %.80q", id)
	}
	// FOR NO KEY UPDATE, as everywhere orders are locked: it does not block
	// the foreign-key checks of rows that point at the order.
	rows, err := tx.QueryxContext(ctx, `SELECT status, customer_marked_paid_at IS NOT NULL AS marked
		FROM orders WHERE id = $1 FOR NO KEY UPDATE`, id)
	if err != nil {
		return "", false, fmt.Errorf("lock order %s: %w", id, err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return "", false, fmt.Errorf("lock order %s: %w", id, err)
		}
		return "", false, paywatch.Errorf(paywatch.CodeNotFound, "no order %q", id)
	}
	if err := rows.StructScan(&row); err != nil {
		return "", false, fmt.Errorf("lock order %s: %w", id, err)
	}
	return paywatch.Status(row.Status), row.Marked, nil
}

// MarkPaid records the customer's "I've paid" click, with an optional
// transaction hash hint. The first call counts; later calls change nothing.
// The hint is a claim for the reconciler to check, stored in lower case
// (the form in which the watchers record transaction hashes).
func (s *Store) MarkPaid(ctx context.Context, id, txHash, actor string) (*paywatch.Order, error) {
	txHash = strings.ToLower(txHash)
	err := s.Sealer.SealTx(ctx, s.db, func(tx *sqlx.Tx) error {
		status, marked, err := lockOrder(ctx, tx, id)
		if err != nil {
			return err
		}
		if status.Terminal() {
			return paywatch.Errorf(paywatch.CodeInvalidState, "order %s is %s; it can no longer be marked paid", id, status)
		}
		if marked {
			return nil
		}
		now := s.now()
		if _, err := tx.ExecContext(ctx, `UPDATE orders SET customer_marked_paid_at = $2, tx_hash_hint = NULLIF($3::text, ''),
			hint_state = CASE WHEN $3::text = '' THEN NULL ELSE 'pending' END,
			hint_next_lookup_at = CASE WHEN $3::text = '' THEN NULL ELSE $2::timestamptz END,
			updated_at = $2 WHERE id = $1`, id, now, txHash); err != nil {
			return fmt.Errorf("mark order %s paid: %w", id, err)
		}
		var detail map[string]string
		if txHash != "" {
			detail = map[string]string{"tx_hash": txHash}
			// Wake the reconciler, wherever it runs: the claim is checked
			// against what is recorded, and looked up on the node.
			if _, err := tx.ExecContext(ctx, `SELECT pg_notify($1, 'hint')`, pg.NotifyChannel); err != nil {
				return fmt.Errorf("notify: %w", err)
			}
		}
		if err := AppendEvent(ctx, tx, id, now, EventCustomerMarkedPaid, "", "", actor, detail); err != nil {
			return err
		}
		return EnqueueWebhook(ctx, tx, id, now, WebhookCustomerMarkedPaid)
	})
	if err != nil {
		return nil, err
	}
	return s.Get(ctx, id)
}

// Cancel cancels an order that is still awaiting payment and has no
// transfer matched to it. The reconciler locks an order before matching a
// transfer to it, so a match and a cancel never both happen. Transfers a
// reorg took away from the order are detached: if they come back, they
// come back to the inbox, held for an operator (flag held), not to a
// cancelled order or another customer's claim.
func (s *Store) Cancel(ctx context.Context, id, actor string) (*paywatch.Order, error) {
	err := s.Sealer.SealTx(ctx, s.db, func(tx *sqlx.Tx) error {
		status, _, err := lockOrder(ctx, tx, id)
		if err != nil {
			return err
		}
		if status != paywatch.StatusAwaitingPayment {
			return paywatch.Errorf(paywatch.CodeInvalidState, "order %s is %s; only an order awaiting payment can be cancelled", id, status)
		}
		var matched bool
		if err := tx.GetContext(ctx, &matched, `SELECT EXISTS (SELECT 1 FROM transfers
			WHERE order_id = $1 AND state <> 'orphaned')`, id); err != nil {
			return fmt.Errorf("check transfers of %s: %w", id, err)
		}
		if matched {
			return paywatch.Errorf(paywatch.CodeInvalidState, "order %s has a payment matched to it; it cannot be cancelled", id)
		}
		now := s.now()
		if _, err := tx.ExecContext(ctx, `UPDATE transfers SET order_id = NULL, match_kind = NULL, updated_at = $2,
			flags = array_append(array_remove(flags, $3), $3) WHERE order_id = $1`, id, now, paywatch.FlagHeld); err != nil {
			return fmt.Errorf("detach orphaned transfers of %s: %w", id, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'cancelled', updated_at = $2 WHERE id = $1`, id, now); err != nil {
			return fmt.Errorf("cancel order %s: %w", id, err)
		}
		if err := AppendEvent(ctx, tx, id, now, EventStatusChanged, status, paywatch.StatusCancelled, actor, nil); err != nil {
			return err
		}
		return EnqueueWebhook(ctx, tx, id, now, WebhookCancelled)
	})
	if err != nil {
		return nil, err
	}
	return s.Get(ctx, id)
}
