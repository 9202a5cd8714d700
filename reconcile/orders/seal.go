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
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.OrderID
	}
	views, err := s.render(ctx, tx, ids)
	if err != nil {
		return 0, err
	}
	eventIDs, bodies := make([]string, len(rows)), make([]string, len(rows))
	for i, r := range rows {
		view, ok := views[r.OrderID]
		if !ok {
			return 0, fmt.Errorf("seal webhook %s: order %s not found", r.ID, r.OrderID)
		}
		body, err := appendEvent(nil, r.ID, r.Type, r.CreatedAt, view)
		if err != nil {
			return 0, fmt.Errorf("seal webhook %s: %w", r.ID, err)
		}
		eventIDs[i], bodies[i] = r.ID, string(body)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE webhook_outbox w SET body = u.body
		FROM unnest($1::text[], $2::text[]) AS u(id, body) WHERE w.id = ANY($1::text[]) AND w.id = u.id`, pq.Array(eventIDs), pq.Array(bodies)); err != nil {
		return 0, fmt.Errorf("seal %d webhook events: %w", len(rows), err)
	}
	return len(rows), nil
}

// render returns the views of the given orders as tx sees them: the orders
// in two statements, however many (a pass may settle thousands).
func (s *Sealer) render(ctx context.Context, tx *sqlx.Tx, orderIDs []string) (map[string]json.RawMessage, error) {
	var ids []string
	seen := map[string]bool{}
	for _, id := range orderIDs {
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	var orows []orderRow
	if err := tx.SelectContext(ctx, &orows, `SELECT `+orderColumns+` FROM orders WHERE id = ANY($1)`, pq.Array(ids)); err != nil {
		return nil, fmt.Errorf("read orders of webhook events: %w", err)
	}
	list := make([]*paywatch.Order, len(orows))
	for i := range orows {
		o, err := orows[i].order()
		if err != nil {
			return nil, err
		}
		list[i] = o
	}
	if err := attachTransfers(ctx, tx, list); err != nil {
		return nil, err
	}
	views := make(map[string]json.RawMessage, len(list))
	for _, o := range list {
		view, err := json.Marshal(NewView(o, s.networks[o.Network]))
		if err != nil {
			return nil, fmt.Errorf("render order %s: %w", o.ID, err)
		}
		views[o.ID] = view
	}
	return views, nil
}

// eventEnvelope is about what an event's body adds to its order's view.
const eventEnvelope = 96

// appendEvent appends the body of a webhook event to dst: what
// json.Marshal makes of webhook.Event{ID: id, Type: typ, CreatedAt: at in
// UTC, Order: view}, byte for byte. The view, rendered by json.Marshal
// moments before, is copied as it is: json.Marshal would check and compact
// it once more, which was a sixth of a pass settling thousands of orders.
func appendEvent(dst []byte, id, typ string, at time.Time, view json.RawMessage) ([]byte, error) {
	dst = append(dst, `{"id":`...)
	dst = appendJSONString(dst, id)
	dst = append(dst, `,"type":`...)
	dst = appendJSONString(dst, typ)
	dst = append(dst, `,"created_at":`...)
	created, err := at.UTC().MarshalJSON()
	if err != nil {
		return dst, err
	}
	dst = append(dst, created...)
	dst = append(dst, `,"order":`...)
	dst = append(dst, view...)
	return append(dst, '}'), nil
}

// appendJSONString appends s as json.Marshal renders a string.
func appendJSONString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return append(dst, b...)
}

// Event is a webhook event to enqueue: its type (order.settled, …) and
// its order.
type Event struct {
	OrderID string
	Type    string
}

// Enqueue writes webhook events into the outbox inside tx, each with its
// body: the order as tx sees it now. Call it after tx's last change to
// those orders (the reconciler does, for the events of a batch of
// transitions): it spares the outbox a second write of every row. A nil
// Sealer enqueues them unsealed, for Seal or the sender.
func (s *Sealer) Enqueue(ctx context.Context, tx *sqlx.Tx, at time.Time, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	ids, orderIDs, types := make([]string, len(events)), make([]string, len(events)), make([]string, len(events))
	made := time.Now()
	for i, e := range events {
		ids[i], orderIDs[i], types[i] = paywatch.NewSortableID("evt", made), e.OrderID, e.Type
	}
	// The bodies travel as one binary parameter and their lengths (-1 for
	// none): no quoting of thousands of JSON documents into an array.
	var bodies []byte
	lengths := make([]int64, len(events))
	for i := range lengths {
		lengths[i] = -1
	}
	if s != nil {
		views, err := s.render(ctx, tx, orderIDs)
		if err != nil {
			return err
		}
		size := 0
		for _, v := range views {
			size += len(v)
		}
		bodies = make([]byte, 0, size+len(events)*(eventEnvelope+len(ids[0])))
		for i, e := range events {
			view, ok := views[e.OrderID]
			if !ok {
				return fmt.Errorf("webhook %s: order %s not found", e.Type, e.OrderID)
			}
			n := len(bodies)
			if bodies, err = appendEvent(bodies, ids[i], e.Type, at, view); err != nil {
				return fmt.Errorf("seal webhook %s: %w", ids[i], err)
			}
			lengths[i] = int64(len(bodies) - n)
		}
	}
	if bodies == nil {
		bodies = []byte{}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at, body)
		SELECT id, order_id, type, $1, $1,
			CASE WHEN len >= 0 THEN convert_from(substring($5::bytea FROM (sum(greatest(len, 0)) OVER w - greatest(len, 0) + 1)::int
				FOR len::int), 'UTF8') END
		FROM unnest($2::text[], $3::text[], $4::text[], $6::bigint[]) WITH ORDINALITY AS u(id, order_id, type, len, n)
		WINDOW w AS (ORDER BY n)`,
		at, pq.Array(ids), pq.Array(orderIDs), pq.Array(types), bodies, pq.Array(lengths)); err != nil {
		return fmt.Errorf("enqueue %d webhook events: %w", len(events), err)
	}
	return nil
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
