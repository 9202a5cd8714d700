package reconcile

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/ledger"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// Operator carries out operators' actions on dossiers, each audited on the
// order's timeline with the acting key's name and the operator's note.
type Operator struct {
	db  *sqlx.DB
	Now func() time.Time
}

// NewOperator returns an Operator over db.
func NewOperator(db *sqlx.DB) *Operator { return &Operator{db: db, Now: time.Now} }

// Outcomes an operator may resolve a dispute with.
var Outcomes = []paywatch.Status{paywatch.StatusSettled, paywatch.StatusRefunded, paywatch.StatusCancelled}

// Attach ties an unmatched transfer to an order by hand; the reconciler
// then treats the order like any other.
func (op *Operator) Attach(ctx context.Context, transferID, orderID, note, actor string) error {
	if note == "" {
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "note is required: say why this transfer belongs to this order")
	}
	now := op.Now().UTC().Truncate(time.Microsecond)
	return orders.Tx(ctx, op.db, func(tx *sqlx.Tx) error {
		var t struct {
			Network string  `db:"network"`
			Asset   string  `db:"asset"`
			State   string  `db:"state"`
			OrderID *string `db:"order_id"`
			TxHash  string  `db:"tx_hash"`
			Amount  string  `db:"amount"`
		}
		err := tx.GetContext(ctx, &t, `SELECT network, asset, state, order_id, tx_hash, amount::text AS amount
			FROM transfers WHERE id = $1 FOR UPDATE`, transferID)
		if errors.Is(err, sql.ErrNoRows) {
			return paywatch.Errorf(paywatch.CodeNotFound, "no transfer %q", transferID)
		}
		if err != nil {
			return fmt.Errorf("lock transfer: %w", err)
		}
		var o struct {
			Network string `db:"network"`
			Asset   string `db:"asset"`
			Status  string `db:"status"`
		}
		err = tx.GetContext(ctx, &o, `SELECT network, asset, status FROM orders WHERE id = $1 FOR UPDATE`, orderID)
		if errors.Is(err, sql.ErrNoRows) {
			return paywatch.Errorf(paywatch.CodeNotFound, "no order %q", orderID)
		}
		if err != nil {
			return fmt.Errorf("lock order: %w", err)
		}
		switch {
		case t.OrderID != nil:
			return paywatch.Errorf(paywatch.CodeInvalidState, "transfer %s is already matched to order %s", transferID, *t.OrderID)
		case t.State == string(paywatch.TransferOrphaned):
			return paywatch.Errorf(paywatch.CodeInvalidState, "transfer %s was orphaned by a reorg; it paid nothing", transferID)
		case t.Network != o.Network || t.Asset != o.Asset:
			return paywatch.Errorf(paywatch.CodeInvalidRequest, "transfer %s is %s on %s; order %s wants %s on %s",
				transferID, t.Asset, t.Network, orderID, o.Asset, o.Network)
		case paywatch.Status(o.Status).Terminal():
			return paywatch.Errorf(paywatch.CodeInvalidState, "order %s is %s; nothing can be attached to it", orderID, o.Status)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE transfers SET order_id = $2, flags = array_remove(flags, 'ambiguous'),
			updated_at = $3 WHERE id = $1`, transferID, orderID, now); err != nil {
			return fmt.Errorf("attach: %w", err)
		}
		return orders.AppendEvent(ctx, tx, orderID, now, "transfer_attached", "", "", actor,
			map[string]string{"transfer_id": transferID, "tx_hash": t.TxHash, "amount_units": t.Amount, "note": note})
	})
}

// Resolve closes a disputed order as settled, refunded or cancelled. What
// the order's ledger account holds moves to settled (settled), to
// refunds_owed (refunded), or back to suspense with its transfers detached
// (cancelled), in the same transaction as the status change.
func (op *Operator) Resolve(ctx context.Context, orderID string, outcome paywatch.Status, note, actor string) error {
	if note == "" {
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "note is required: say why the dispute is resolved this way")
	}
	valid := false
	for _, o := range Outcomes {
		valid = valid || o == outcome
	}
	if !valid {
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "outcome must be settled, refunded or cancelled, not %q", outcome)
	}
	now := op.Now().UTC().Truncate(time.Microsecond)
	return orders.Tx(ctx, op.db, func(tx *sqlx.Tx) error {
		var o struct {
			Status string  `db:"status"`
			Reason *string `db:"dispute_reason"`
		}
		err := tx.GetContext(ctx, &o, `SELECT status, dispute_reason FROM orders WHERE id = $1 FOR UPDATE`, orderID)
		if errors.Is(err, sql.ErrNoRows) {
			return paywatch.Errorf(paywatch.CodeNotFound, "no order %q", orderID)
		}
		if err != nil {
			return fmt.Errorf("lock order: %w", err)
		}
		if o.Status != string(paywatch.StatusDisputed) {
			return paywatch.Errorf(paywatch.CodeInvalidState, "order %s is %s; only disputed orders are resolved", orderID, o.Status)
		}
		// Bring the ledger up to date first, so that what the order holds
		// includes every confirmed payment attached to it.
		if _, err := postLedgerTx(ctx, tx, now, now); err != nil {
			return fmt.Errorf("update ledger: %w", err)
		}
		balances, err := ledger.OrderBalances(ctx, tx, orderID)
		if err != nil {
			return err
		}
		for _, b := range balances {
			if b.Amount.Sign() == 0 {
				continue
			}
			var e ledger.Entry
			ref := orderID + "@" + now.Format("20060102150405.000000")
			switch outcome {
			case paywatch.StatusSettled:
				e = ledger.Move(ledger.KindSettlement, ref, b.Network, b.Asset, b.Account, ledger.Settled(b.Network, b.Asset), b.Amount)
			case paywatch.StatusRefunded:
				e = ledger.Move(ledger.KindRefund, ref, b.Network, b.Asset, b.Account, ledger.RefundsOwed(b.Network, b.Asset), b.Amount)
			default:
				e = ledger.Move(ledger.KindRelease, ref, b.Network, b.Asset, b.Account, ledger.Suspense(b.Network, b.Asset), b.Amount)
			}
			e.OrderID = orderID
			if _, _, err := ledger.Post(ctx, tx, now, e); err != nil {
				return err
			}
		}
		if outcome == paywatch.StatusCancelled {
			// The money is no longer this order's: its transfers go back to
			// the inbox for an operator to place.
			if _, err := tx.ExecContext(ctx, `UPDATE transfers SET order_id = NULL, attribution_entry = NULL, updated_at = $2 WHERE order_id = $1`, orderID, now); err != nil {
				return fmt.Errorf("detach transfers: %w", err)
			}
		}
		settledAt := any(nil)
		if outcome == paywatch.StatusSettled {
			settledAt = now
		}
		if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = $2, dispute_reason = NULL, settled_at = COALESCE($3, settled_at),
			updated_at = $4 WHERE id = $1`, orderID, string(outcome), settledAt, now); err != nil {
			return fmt.Errorf("resolve: %w", err)
		}
		detail := map[string]string{"note": note}
		if o.Reason != nil {
			detail["dispute_reason"] = *o.Reason
		}
		if err := orders.AppendEvent(ctx, tx, orderID, now, "resolved", paywatch.StatusDisputed, outcome, actor, detail); err != nil {
			return err
		}
		return orders.EnqueueWebhook(ctx, tx, orderID, now, "order."+string(outcome))
	})
}
