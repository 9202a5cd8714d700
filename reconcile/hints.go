package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/reconcile/orders"
)

type hintRow struct {
	ID            string `db:"id"`
	Status        string `db:"status"`
	Network       string `db:"network"`
	Asset         string `db:"asset"`
	AssetContract string `db:"asset_contract"`
	PayAddress    string `db:"pay_address"`
	Hint          string `db:"tx_hash_hint"`
}

type hintTransfer struct {
	ID            string  `db:"id" json:"id"`
	Asset         string  `db:"asset" json:"asset"`
	AssetContract string  `db:"asset_contract" json:"asset_contract"`
	To            string  `db:"to_address" json:"to"`
	OrderID       *string `db:"order_id" json:"order_id"`
	State         string  `db:"state" json:"state"`
}

// checkHints follows the tx hash a customer gave with "I've paid", for
// orders that have no payment yet: a transfer of that transaction to the
// order's address and asset is attached to the order whatever its amount
// (the amount rules then decide); one that went elsewhere, or in another
// asset, disputes the order as wrong_asset.
func (r *Reconciler) checkHints(ctx context.Context, now time.Time) (int64, error) {
	var pending []hintRow
	if err := r.db.SelectContext(ctx, &pending, `SELECT o.id, o.status, o.network, o.asset, o.asset_contract,
			o.pay_address, o.tx_hash_hint
		FROM orders o
		WHERE o.tx_hash_hint IS NOT NULL
			AND (o.status IN ('awaiting_payment', 'expired') OR (o.status = 'disputed' AND o.dispute_reason = 'no_payment_found'))
			AND NOT EXISTS (SELECT 1 FROM transfers t WHERE t.order_id = o.id AND t.state <> 'orphaned')
		ORDER BY o.id LIMIT 1000`); err != nil {
		return 0, err
	}
	var attached int64
	for _, o := range pending {
		if err := r.lookUpHint(ctx, o); err != nil {
			r.log.Warn("could not look up the customer's tx hash on chain", "order", o.ID, "tx_hash", o.Hint, "err", err)
		}
		n, err := r.followHint(ctx, o, now)
		if err != nil {
			return attached, fmt.Errorf("order %s: %w", o.ID, err)
		}
		attached += n
	}
	return attached, nil
}

func (r *Reconciler) followHint(ctx context.Context, o hintRow, now time.Time) (int64, error) {
	var attached int64
	err := orders.Tx(ctx, r.db, func(tx *sqlx.Tx) error {
		var status string
		if err := tx.GetContext(ctx, &status, `SELECT status FROM orders WHERE id = $1 FOR UPDATE`, o.ID); err != nil {
			return err
		}
		if status != o.Status {
			return nil // moved meanwhile; the next pass looks again
		}
		var found []hintTransfer
		if err := tx.SelectContext(ctx, &found, `SELECT id, asset, asset_contract, to_address, order_id, state
			FROM transfers WHERE network = $1 AND lower(tx_hash) = lower($2) AND state <> 'orphaned'
			ORDER BY idx FOR UPDATE`, o.Network, o.Hint); err != nil {
			return err
		}
		if len(found) == 0 {
			return nil // not seen yet: the scanner may still reach it
		}
		for _, t := range found {
			if t.OrderID == nil && t.AssetContract == o.AssetContract && t.Asset == o.Asset && t.To == o.PayAddress {
				if _, err := tx.ExecContext(ctx, `UPDATE transfers SET order_id = $2, updated_at = $3 WHERE id = $1`, t.ID, o.ID, now); err != nil {
					return err
				}
				attached++
				if err := orders.AppendEvent(ctx, tx, o.ID, now, "transfer_matched", "", "", "reconciler",
					map[string]string{"transfer_id": t.ID, "by": "tx_hash_hint"}); err != nil {
					return err
				}
			}
		}
		if attached > 0 || o.Status == string(paywatch.StatusDisputed) {
			return nil
		}
		// The hinted transaction paid something else: another asset or
		// another address.
		if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'disputed', dispute_reason = 'wrong_asset', updated_at = $2
			WHERE id = $1`, o.ID, now); err != nil {
			return err
		}
		detail := map[string]any{"reason": paywatch.ReasonWrongAsset, "tx_hash": o.Hint, "transfers": found}
		if err := orders.AppendEvent(ctx, tx, o.ID, now, orders.EventStatusChanged, paywatch.Status(o.Status),
			paywatch.StatusDisputed, "reconciler", detail); err != nil {
			return err
		}
		return orders.EnqueueWebhook(ctx, tx, o.ID, now, orders.WebhookDisputed)
	})
	return attached, err
}

// lookUpHint asks the network's node for the hinted transaction when no
// transfer of it is recorded yet, and records what it paid.
func (r *Reconciler) lookUpHint(ctx context.Context, o hintRow) error {
	lookup := r.Lookups[o.Network]
	if lookup == nil || r.Record == nil {
		return nil
	}
	var known bool
	if err := r.db.GetContext(ctx, &known, `SELECT EXISTS (SELECT 1 FROM transfers
		WHERE network = $1 AND lower(tx_hash) = lower($2))`, o.Network, o.Hint); err != nil || known {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	found, err := lookup.LookupTx(ctx, o.Hint)
	if err != nil || len(found) == 0 {
		return err
	}
	return r.Record(ctx, o.Network, found)
}
