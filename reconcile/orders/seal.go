package orders

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/reconcile/webhook"
)

// Sealer writes the bodies of webhook events: the event with its order as
// the order stands at the end of the transaction that announced it.
// Everything that writes to the outbox calls Seal before it commits, so a
// delivery, however late, tells what was true when the event happened.
type Sealer struct {
	networks map[string]*paywatch.Network
}

// NewSealer renders orders with the given networks' assets.
func NewSealer(networks []*paywatch.Network) *Sealer {
	s := &Sealer{networks: make(map[string]*paywatch.Network, len(networks))}
	for _, n := range networks {
		s.networks[n.Name] = n
	}
	return s
}

// Seal writes the body of every event in the outbox that has none yet:
// those tx wrote (others' are skipped, not waited for).
func (s *Sealer) Seal(ctx context.Context, tx *sqlx.Tx) (int, error) {
	var rows []struct {
		ID        string    `db:"id"`
		OrderID   string    `db:"order_id"`
		Type      string    `db:"type"`
		CreatedAt time.Time `db:"created_at"`
	}
	if err := tx.SelectContext(ctx, &rows, `SELECT id, order_id, type, created_at FROM webhook_outbox
		WHERE body IS NULL AND status = 'pending' ORDER BY seq FOR UPDATE SKIP LOCKED`); err != nil {
		return 0, fmt.Errorf("read unsealed webhook events: %w", err)
	}
	if len(rows) == 0 {
		return 0, nil
	}
	// The orders in two statements and the bodies in one, however many
	// events a transaction wrote (a pass may settle thousands of orders).
	var ids []string
	seen := map[string]bool{}
	for _, r := range rows {
		if !seen[r.OrderID] {
			seen[r.OrderID] = true
			ids = append(ids, r.OrderID)
		}
	}
	var orows []orderRow
	if err := tx.SelectContext(ctx, &orows, `SELECT `+orderColumns+` FROM orders WHERE id = ANY($1)`, pq.Array(ids)); err != nil {
		return 0, fmt.Errorf("read orders of webhook events: %w", err)
	}
	list := make([]*paywatch.Order, len(orows))
	for i := range orows {
		o, err := orows[i].order()
		if err != nil {
			return 0, err
		}
		list[i] = o
	}
	if err := attachTransfers(ctx, tx, list); err != nil {
		return 0, err
	}
	views := make(map[string]json.RawMessage, len(list))
	for _, o := range list {
		view, err := json.Marshal(NewView(o, s.networks[o.Network]))
		if err != nil {
			return 0, fmt.Errorf("render order %s: %w", o.ID, err)
		}
		views[o.ID] = view
	}
	eventIDs, bodies := make([]string, len(rows)), make([]string, len(rows))
	for i, r := range rows {
		view, ok := views[r.OrderID]
		if !ok {
			return 0, fmt.Errorf("seal webhook %s: order %s not found", r.ID, r.OrderID)
		}
		body, err := json.Marshal(webhook.Event{ID: r.ID, Type: r.Type, CreatedAt: r.CreatedAt.UTC(), Order: view})
		if err != nil {
			return 0, fmt.Errorf("seal webhook %s: %w", r.ID, err)
		}
		eventIDs[i], bodies[i] = r.ID, string(body)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE webhook_outbox w SET body = u.body
		FROM unnest($1::text[], $2::text[]) AS u(id, body) WHERE w.id = u.id`, pq.Array(eventIDs), pq.Array(bodies)); err != nil {
		return 0, fmt.Errorf("seal %d webhook events: %w", len(rows), err)
	}
	return len(rows), nil
}

// SealTx runs fn in a transaction and seals the webhook events it wrote
// before committing. A nil Sealer leaves them for the sender, which seals
// what it finds unsealed with the order as it is then.
func (s *Sealer) SealTx(ctx context.Context, db *sqlx.DB, fn func(tx *sqlx.Tx) error) error {
	return pg.Tx(ctx, db, func(tx *sqlx.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		if s == nil {
			return nil
		}
		_, err := s.Seal(ctx, tx)
		return err
	})
}
