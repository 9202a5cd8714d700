package reconcile

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/ledger"
	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// Operator carries out operators' actions on dossiers, each audited on the
// order's timeline with the acting key's name and the operator's note.
type Operator struct {
	db  *sqlx.DB
	Now func() time.Time
	// Sealer writes the bodies of the webhooks an action enqueues.
	Sealer *orders.Sealer
}

// NewOperator returns an Operator over db.
func NewOperator(db *sqlx.DB) *Operator { return &Operator{db: db, Now: time.Now} }

// Outcomes an operator may resolve a dispute with.
var Outcomes = []paywatch.Status{paywatch.StatusSettled, paywatch.StatusRefunded, paywatch.StatusCancelled}

// lockOrder locks an order (first, as every path does) and reads what the
// operator's actions check.
func lockOrder(ctx context.Context, tx *sqlx.Tx, id string) (status paywatch.Status, reason *string, network, asset string, err error) {
	var o struct {
		Network string  `db:"network"`
		Asset   string  `db:"asset"`
		Status  string  `db:"status"`
		Reason  *string `db:"dispute_reason"`
	}
	if !pg.ValidText(id) {
		return "", nil, "", "", paywatch.Errorf(paywatch.CodeNotFound, "no order %.80q", id)
	}
	err = tx.GetContext(ctx, &o, `SELECT network, asset, status, dispute_reason FROM orders WHERE id = $1 FOR NO KEY UPDATE`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil, "", "", paywatch.Errorf(paywatch.CodeNotFound, "no order %q", id)
	}
	if err != nil {
		return "", nil, "", "", fmt.Errorf("lock order: %w", err)
	}
	return paywatch.Status(o.Status), o.Reason, o.Network, o.Asset, nil
}

// Attach ties an unmatched transfer to an order by hand; the reconciler
// then decides the order like any other. The order is locked before the
// transfer, as everywhere.
func (op *Operator) Attach(ctx context.Context, transferID, orderID, note, actor string) error {
	if note == "" {
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "note is required: say why this transfer belongs to this order")
	}
	if !pg.ValidText(transferID) {
		return paywatch.Errorf(paywatch.CodeNotFound, "no transfer %.80q", transferID)
	}
	now := op.Now().UTC().Truncate(time.Microsecond)
	return op.Sealer.SealTx(ctx, op.db, func(tx *sqlx.Tx) error {
		status, _, network, asset, err := lockOrder(ctx, tx, orderID)
		if err != nil {
			return err
		}
		var t struct {
			Network string  `db:"network"`
			Asset   string  `db:"asset"`
			State   string  `db:"state"`
			OrderID *string `db:"order_id"`
			TxHash  string  `db:"tx_hash"`
			Amount  string  `db:"amount"`
			Pending bool    `db:"pending"`
		}
		err = tx.GetContext(ctx, &t, `SELECT network, asset, state, order_id, tx_hash, amount::text AS amount,
			'`+paywatch.FlagBalancePending+`' = ANY (flags) AS pending
			FROM transfers WHERE id = $1 FOR UPDATE`, transferID)
		if errors.Is(err, sql.ErrNoRows) {
			return paywatch.Errorf(paywatch.CodeNotFound, "no transfer %q", transferID)
		}
		if err != nil {
			return fmt.Errorf("lock transfer: %w", err)
		}
		switch {
		case t.OrderID != nil:
			return paywatch.Errorf(paywatch.CodeInvalidState, "transfer %s is already matched to order %s", transferID, *t.OrderID)
		case t.State == string(paywatch.TransferOrphaned):
			return paywatch.Errorf(paywatch.CodeInvalidState, "transfer %s was orphaned by a reorg; it paid nothing", transferID)
		case t.Pending:
			return paywatch.Errorf(paywatch.CodeInvalidState,
				"transfer %s waits for its balance check (a token event may move no money); try again in a few seconds", transferID)
		case t.Network != network || t.Asset != asset:
			return paywatch.Errorf(paywatch.CodeInvalidRequest, "transfer %s is %s on %s; order %s wants %s on %s",
				transferID, t.Asset, t.Network, orderID, asset, network)
		case status.Terminal():
			return paywatch.Errorf(paywatch.CodeInvalidState, "order %s is %s; nothing can be attached to it", orderID, status)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE transfers SET order_id = $2, match_kind = 'operator',
			flags = array_remove(array_remove(flags, 'ambiguous'), '`+paywatch.FlagHeld+`'), updated_at = $3 WHERE id = $1`,
			transferID, orderID, now); err != nil {
			return fmt.Errorf("attach: %w", err)
		}
		if err := queueReviews(ctx, tx, now, []string{orderID}); err != nil {
			return err
		}
		return orders.AppendEvent(ctx, tx, orderID, now, orders.EventTransferAttached, "", "", actor,
			map[string]string{"transfer_id": transferID, "tx_hash": t.TxHash, "amount_units": t.Amount, "note": note})
	})
}

// Resolve closes a disputed order as settled, refunded or cancelled. What
// the order's ledger account holds moves to settled (settled), to
// refunds_owed (refunded), or back to suspense with its transfers detached
// (cancelled), in the same transaction as the status change. An order with
// a payment still waiting for its confirmations is not resolved: its later
// attribution would land in a closed order's account.
func (op *Operator) Resolve(ctx context.Context, orderID string, outcome paywatch.Status, note, actor string) error {
	if note == "" {
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "note is required: say why the dispute is resolved this way")
	}
	if !paywatch.CanMove(paywatch.StatusDisputed, outcome, "", paywatch.ActorOperator) {
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "outcome must be settled, refunded or cancelled, not %.40q", outcome)
	}
	now := op.Now().UTC().Truncate(time.Microsecond)
	return op.Sealer.SealTx(ctx, op.db, func(tx *sqlx.Tx) error {
		status, reason, _, _, err := lockOrder(ctx, tx, orderID)
		if err != nil {
			return err
		}
		if status != paywatch.StatusDisputed {
			return paywatch.Errorf(paywatch.CodeInvalidState, "order %s is %s; only disputed orders are resolved", orderID, status)
		}
		// Bring the ledger up to date first, so that what the order holds
		// includes every confirmed payment attached to it.
		if _, err := postLedgerTx(ctx, tx, now); err != nil {
			return fmt.Errorf("update ledger: %w", err)
		}
		var waiting int
		if err := tx.GetContext(ctx, &waiting, `SELECT count(*) FROM transfers WHERE order_id = $1 AND state <> 'orphaned'
			AND NOT (state = 'confirmed' AND NOT provisional AND NOT ledger_dirty AND attribution_entry IS NOT NULL)`,
			orderID); err != nil {
			return fmt.Errorf("count unconfirmed payments: %w", err)
		}
		if waiting > 0 {
			return paywatch.Errorf(paywatch.CodeInvalidState,
				"order %s has %d payment(s) still waiting for confirmations; resolve it once they are confirmed", orderID, waiting)
		}
		ref := orderID + "@" + now.Format("20060102150405.000000")
		var moved []ledger.Balance
		switch outcome {
		case paywatch.StatusSettled:
			moved, err = ledger.Sweep(ctx, tx, now, orderID, ledger.KindSettlement, ref, ledger.Settled)
		case paywatch.StatusRefunded:
			moved, err = ledger.Sweep(ctx, tx, now, orderID, ledger.KindRefund, ref, ledger.RefundsOwed)
		default:
			moved, err = ledger.Sweep(ctx, tx, now, orderID, ledger.KindRelease, ref, ledger.Suspense)
		}
		if err != nil {
			return err
		}
		accepted := new(big.Int)
		for _, b := range moved {
			accepted.Add(accepted, b.Amount)
		}
		if outcome == paywatch.StatusCancelled {
			// The money is no longer this order's: its transfers go back to
			// the inbox, held for an operator to place (no claim takes them).
			if _, err := tx.ExecContext(ctx, `UPDATE transfers SET order_id = NULL, match_kind = NULL, attribution_entry = NULL,
				flags = `+holdSQL("flags")+`, updated_at = $2 WHERE order_id = $1`, orderID, now); err != nil {
				return fmt.Errorf("detach transfers: %w", err)
			}
		}
		var settledAt, acceptedAmount any
		if outcome == paywatch.StatusSettled {
			settledAt, acceptedAmount = now, accepted.String()
		}
		if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = $2, dispute_reason = NULL, settled_at = COALESCE($3, settled_at),
			accepted_amount = $4, updated_at = $5 WHERE id = $1`, orderID, string(outcome), settledAt, acceptedAmount, now); err != nil {
			return fmt.Errorf("resolve: %w", err)
		}
		detail := map[string]string{"note": note}
		if reason != nil {
			detail["dispute_reason"] = *reason
		}
		if outcome == paywatch.StatusSettled {
			detail["accepted_units"] = accepted.String()
		}
		if err := orders.AppendEvent(ctx, tx, orderID, now, orders.EventResolved, paywatch.StatusDisputed, outcome, actor, detail); err != nil {
			return err
		}
		return orders.EnqueueWebhook(ctx, tx, orderID, now, "order."+string(outcome))
	})
}
