package orders

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

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
	views := map[string]json.RawMessage{}
	for _, r := range rows {
		view, ok := views[r.OrderID]
		if !ok {
			o, err := getOrder(ctx, tx, r.OrderID)
			if err != nil {
				return 0, fmt.Errorf("seal webhook %s: %w", r.ID, err)
			}
			if view, err = json.Marshal(NewView(o, s.networks[o.Network])); err != nil {
				return 0, fmt.Errorf("seal webhook %s: %w", r.ID, err)
			}
			views[r.OrderID] = view
		}
		body, err := json.Marshal(webhook.Event{ID: r.ID, Type: r.Type, CreatedAt: r.CreatedAt.UTC(), Order: view})
		if err != nil {
			return 0, fmt.Errorf("seal webhook %s: %w", r.ID, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE webhook_outbox SET body = $2 WHERE id = $1`, r.ID, string(body)); err != nil {
			return 0, fmt.Errorf("seal webhook %s: %w", r.ID, err)
		}
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
