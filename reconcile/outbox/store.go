package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// Delivery is one event's delivery state.
type Delivery struct {
	EventID        string     `db:"id" json:"event_id"`
	Type           string     `db:"type" json:"type"`
	OrderID        string     `db:"order_id" json:"order_id"`
	Status         string     `db:"status" json:"status"`
	Attempts       int        `db:"attempts" json:"attempts"`
	LastStatusCode *int       `db:"last_status_code" json:"last_status_code"`
	LastError      *string    `db:"last_error" json:"last_error"`
	LastAttemptAt  *time.Time `db:"last_attempt_at" json:"last_attempt_at"`
	LastLatencyMS  *int       `db:"last_latency_ms" json:"last_latency_ms"`
	NextAttemptAt  *time.Time `db:"next_attempt_at" json:"next_attempt_at"` // null unless pending
	DeliveredAt    *time.Time `db:"delivered_at" json:"delivered_at"`
	CreatedAt      time.Time  `db:"created_at" json:"created_at"`
}

const deliveryColumns = `id, type, order_id, status, attempts, last_status_code, last_error, last_attempt_at,
	last_latency_ms, CASE WHEN status = 'pending' THEN next_attempt_at END AS next_attempt_at, delivered_at, created_at`

func (d *Delivery) utc() {
	d.CreatedAt = d.CreatedAt.UTC()
	for _, t := range []**time.Time{&d.LastAttemptAt, &d.NextAttemptAt, &d.DeliveredAt} {
		if *t != nil {
			u := (*t).UTC()
			*t = &u
		}
	}
}

// Statuses lists the delivery statuses.
var Statuses = []string{StatusPending, StatusDelivered, StatusFailed, StatusRefused}

// Filter selects deliveries.
type Filter struct {
	EventID, OrderID, Status string
	Limit                    int
	Cursor                   string
}

// Store reads deliveries and queues events again.
type Store struct {
	db *sqlx.DB
	// Now is the clock; tests replace it.
	Now func() time.Time
}

// NewStore returns a Store over db.
func NewStore(db *sqlx.DB) *Store { return &Store{db: db, Now: time.Now} }

// Deliveries lists events newest first, and the next page's cursor.
func (s *Store) Deliveries(ctx context.Context, f Filter) ([]Delivery, string, error) {
	p := pg.Page{From: `SELECT ` + deliveryColumns + ` FROM webhook_outbox`, TimeCol: "created_at", IDCol: "id",
		Limit: f.Limit, Cursor: f.Cursor}
	for _, c := range []struct{ col, v string }{{"id", f.EventID}, {"order_id", f.OrderID}, {"status", f.Status}} {
		if c.v == "" {
			continue
		}
		if !pg.ValidText(c.v) {
			return nil, "", paywatch.Errorf(paywatch.CodeInvalidRequest, "%s is not valid text", c.col)
		}
		p.Where(c.col+" = ?", c.v)
	}
	q, args, err := p.SQL()
	if err != nil {
		return nil, "", err
	}
	var rows []Delivery
	if err := pg.Read(ctx, s.db, func() error {
		rows = nil
		return s.db.SelectContext(ctx, &rows, q, args...)
	}); err != nil {
		return nil, "", fmt.Errorf("list deliveries: %w", err)
	}
	rows, next := pg.Next(rows, f.Limit, func(d *Delivery) (time.Time, string) { return d.CreatedAt, d.EventID })
	for i := range rows {
		rows[i].utc()
	}
	return rows, next, nil
}

// Redeliver queues an event to be sent again now, whatever its status,
// with max_retry_age counted afresh, and records it on the order's
// timeline with the operator's name. An attempt in flight meanwhile does
// not count for it (the event's generation moved on). An event written
// before delivery existed has no body yet: it is sent with its order as
// it is when sent.
func (s *Store) Redeliver(ctx context.Context, eventID, actor string) (*Delivery, error) {
	if !pg.ValidText(eventID) {
		return nil, paywatch.Errorf(paywatch.CodeNotFound, "no webhook event %.80q", eventID)
	}
	now := s.Now().UTC().Truncate(time.Microsecond)
	var d Delivery
	err := pg.Tx(ctx, s.db, func(tx *sqlx.Tx) error {
		var rows []Delivery
		if err := tx.SelectContext(ctx, &rows, `UPDATE webhook_outbox SET status = 'pending', next_attempt_at = $2,
			retry_from = $2, delivered_at = NULL, last_refused = false, generation = generation + 1
			WHERE id = $1 RETURNING `+deliveryColumns, eventID, now); err != nil {
			return fmt.Errorf("redeliver %s: %w", eventID, err)
		}
		if len(rows) == 0 {
			return paywatch.Errorf(paywatch.CodeNotFound, "no webhook event %q", eventID)
		}
		d = rows[0]
		if _, err := tx.ExecContext(ctx, `SELECT pg_notify($1, '')`, Channel); err != nil {
			return fmt.Errorf("notify: %w", err)
		}
		return orders.AppendEvent(ctx, tx, d.OrderID, now, orders.EventWebhookRedelivered, "", "", actor,
			map[string]string{"event_id": d.EventID, "type": d.Type})
	})
	if err != nil {
		return nil, err
	}
	d.utc()
	return &d, nil
}

// Backlog is what the metrics report of the outbox.
type Backlog struct {
	Pending   int64 `db:"pending"`
	Failed    int64 `db:"failed"`
	Refused   int64 `db:"refused"`
	OldestAge float64
	Oldest    *time.Time `db:"oldest"`
}

// Backlog counts undelivered events and the age of the oldest pending one.
func (s *Store) Backlog(ctx context.Context) (Backlog, error) {
	var b Backlog
	err := pg.Read(ctx, s.db, func() error {
		b = Backlog{}
		return s.db.GetContext(ctx, &b, `SELECT count(*) FILTER (WHERE status = 'pending') AS pending,
			count(*) FILTER (WHERE status = 'failed') AS failed, count(*) FILTER (WHERE status = 'refused') AS refused,
			min(created_at) FILTER (WHERE status = 'pending') AS oldest
			FROM webhook_outbox WHERE status <> 'delivered'`)
	})
	if err != nil {
		return b, fmt.Errorf("webhook backlog: %w", err)
	}
	if b.Oldest != nil {
		b.OldestAge = s.Now().Sub(*b.Oldest).Seconds()
	}
	return b, nil
}
