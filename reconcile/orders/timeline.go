package orders

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pg"
)

// Timeline event types.
const (
	EventCreated            = "created"
	EventCustomerMarkedPaid = "customer_marked_paid"
	EventStatusChanged      = "status_changed"
	EventTransferMatched    = "transfer_matched"    // by amount, address or the customer's tx hash
	EventTransferAttached   = "transfer_attached"   // by an operator
	EventTransferOrphaned   = "transfer_orphaned"   // a reorg took it away (written by the scanner)
	EventTransferUnmatched  = "transfer_unmatched"  // it changed (a reorg, the scanner correcting a look-up) so that it cannot pay the order
	EventHintRejected       = "hint_rejected"       // the customer's tx hash claim pays nothing, and why
	EventHintContested      = "hint_contested"      // two orders claim one payment: neither gets it
	EventResolved           = "resolved"            // an operator closed a dispute
	EventRefundAdjusted     = "refund_adjusted"     // a reorg changed what a refunded order is owed
	EventWebhookRedelivered = "webhook_redelivered" // an operator queued a webhook event again
)

// Webhook event types (README "HTTP API").
const (
	WebhookConfirming         = "order.confirming"
	WebhookSettled            = "order.settled"
	WebhookDisputed           = "order.disputed"
	WebhookExpired            = "order.expired"
	WebhookCancelled          = "order.cancelled"
	WebhookRefunded           = "order.refunded"
	WebhookCustomerMarkedPaid = "order.customer_marked_paid"
)

// AppendEvent adds an entry to an order's timeline inside tx. from and to
// may be empty when the status did not change; detail may be nil.
func AppendEvent(ctx context.Context, tx *sqlx.Tx, orderID string, at time.Time, typ string, from, to paywatch.Status, actor string, detail any) error {
	var raw []byte
	if detail != nil {
		var err error
		if raw, err = json.Marshal(detail); err != nil {
			return fmt.Errorf("timeline detail: %w", err)
		}
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO order_events (order_id, at, type, from_status, to_status, actor, detail)
		VALUES ($1, $2, $3, NULLIF($4, ''), NULLIF($5, ''), $6, $7)`,
		orderID, at, typ, string(from), string(to), actor, nullJSON(raw))
	if err != nil {
		return fmt.Errorf("append %s event to %s: %w", typ, orderID, err)
	}
	return nil
}

// EnqueueWebhook writes a webhook to the outbox inside tx; the sender
// delivers it after commit, at least once.
func EnqueueWebhook(ctx context.Context, tx *sqlx.Tx, orderID string, at time.Time, typ string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at)
		VALUES ($1, $2, $3, $4, $4)`, paywatch.NewSortableID("evt", time.Now()), orderID, typ, at)
	if err != nil {
		return fmt.Errorf("enqueue %s webhook for %s: %w", typ, orderID, err)
	}
	return nil
}

func nullJSON(raw []byte) any {
	if len(raw) == 0 {
		return nil
	}
	return string(raw)
}

type eventRow struct {
	At         time.Time `db:"at"`
	Type       string    `db:"type"`
	FromStatus *string   `db:"from_status"`
	ToStatus   *string   `db:"to_status"`
	Actor      string    `db:"actor"`
	Detail     *string   `db:"detail"`
}

// Events returns an order's timeline, oldest first.
func (s *Store) Events(ctx context.Context, orderID string) ([]paywatch.Event, error) {
	if _, err := s.Get(ctx, orderID); err != nil {
		return nil, err
	}
	var rows []eventRow
	if err := pg.Read(ctx, s.db, func() error {
		rows = nil
		return s.db.SelectContext(ctx, &rows, `SELECT at, type, from_status, to_status, actor, detail::text AS detail
			FROM order_events WHERE order_id = $1 ORDER BY id`, orderID)
	}); err != nil {
		return nil, fmt.Errorf("read timeline of %s: %w", orderID, err)
	}
	events := make([]paywatch.Event, len(rows))
	for i, r := range rows {
		e := paywatch.Event{At: r.At.UTC(), Type: r.Type, Actor: r.Actor}
		if r.FromStatus != nil {
			e.FromStatus = paywatch.Status(*r.FromStatus)
		}
		if r.ToStatus != nil {
			e.ToStatus = paywatch.Status(*r.ToStatus)
		}
		if r.Detail != nil {
			e.Detail = json.RawMessage(*r.Detail)
		}
		events[i] = e
	}
	return events, nil
}
