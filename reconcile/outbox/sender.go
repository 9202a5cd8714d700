// Package outbox delivers the webhook outbox: every event paywatch writes
// beside a change of an order (in the same transaction) is POSTed, signed,
// to the storefront until a 2xx answers, with capped exponential backoff
// and jitter for up to max_retry_age, each attempt logged. Events of one
// order leave in the order they were written. The package also serves the
// operators' view of deliveries and their redelivery.
package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/webhook"
)

// Channel is the PostgreSQL notification channel on which new events are
// announced (a trigger on the outbox).
const Channel = "paywatch_webhook"

// Delivery statuses.
const (
	StatusPending   = "pending"
	StatusDelivered = "delivered"
	StatusFailed    = "failed"  // retried until max_retry_age, then given up
	StatusRefused   = "refused" // given up while the SSRF guard stopped each attempt
)

// Defaults of a Sender.
const (
	DefaultBackoffBase = 5 * time.Second
	DefaultBackoffCap  = time.Hour
	DefaultTimeout     = 10 * time.Second
	DefaultParallel    = 8
	// pollInterval bounds how long a new event waits when a notification
	// is lost (the listener reconnecting): a first delivery leaves within
	// it.
	pollInterval = 500 * time.Millisecond
	batchSize    = 64
	maxErrorText = 500
)

// Sender delivers due events. Run it in one instance at a time (serve
// holds a lease for it); a second one running by mistake sends some events
// twice, which at-least-once delivery allows, and never counts an attempt
// twice.
type Sender struct {
	db     *sqlx.DB
	log    *slog.Logger
	client *http.Client
	url    string
	secret string
	// MaxRetryAge is how long after an event (or its redelivery) attempts
	// go on.
	MaxRetryAge time.Duration
	// BackoffBase is the first retry's delay, doubled on each failure up
	// to BackoffCap; each delay is drawn from its upper half (jitter).
	BackoffBase, BackoffCap time.Duration
	// Parallel bounds concurrent requests (to different orders).
	Parallel int
	// DSN is where Run listens for new events; empty to poll alone.
	DSN string
	// Sealer seals events a writer left without a body (none in normal
	// operation).
	Sealer *orders.Sealer
	// Now is the clock; tests replace it.
	Now func() time.Time
	// Metrics is told of each attempt; may be nil.
	Metrics func(status string, latency time.Duration)
}

// NewSender returns a Sender POSTing to url, signing with secret.
func NewSender(db *sqlx.DB, url, secret string, client *http.Client, log *slog.Logger) *Sender {
	return &Sender{db: db, log: log, client: client, url: url, secret: secret,
		MaxRetryAge: 72 * time.Hour, BackoffBase: DefaultBackoffBase, BackoffCap: DefaultBackoffCap,
		Parallel: DefaultParallel, Now: time.Now}
}

func (s *Sender) now() time.Time { return s.Now().UTC().Truncate(time.Microsecond) }

// Run delivers until ctx ends.
func (s *Sender) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	if s.DSN != "" {
		l := pq.NewListener(s.DSN, time.Second, time.Minute, func(_ pq.ListenerEventType, err error) {
			if err != nil && ctx.Err() == nil {
				s.log.Warn("webhook notifications", "err", err)
			}
		})
		defer l.Close()
		if err := l.Listen(Channel); err != nil {
			s.log.Warn("cannot listen for new webhook events; polling", "err", err)
		} else {
			go func() {
				for {
					select {
					case <-ctx.Done():
						return
					case <-l.Notify:
						select {
						case wake <- struct{}{}:
						default:
						}
					}
				}
			}()
		}
	}
	s.log.Info("webhook sender running", "url", redactURL(s.url))
	// Attempts run on their own: as soon as one ends, or an event is
	// announced, due events of other orders take the free places, so that
	// a receiver slow on one order holds up that order's events alone.
	parallel := max(s.Parallel, 1)
	type outcome struct {
		order    string
		recorded bool
	}
	var (
		queue    []event             // due, not yet started
		busy     = map[string]bool{} // orders with an event queued or in flight
		inFlight int
		finished = make(chan outcome, parallel) // never full: one send per attempt in flight
		wg       sync.WaitGroup
		// cooling holds the orders whose last attempt could not be
		// recorded (the database refused the write): the event is still
		// due, and is not posted again before until, a poll interval after
		// the first such failure, doubling with each failure in a row up
		// to a minute.
		cooling = map[string]cool{}
		// housekept is when the sealing and giving up last ran: at most
		// once per poll interval, not after every attempt.
		housekept time.Time
	)
	defer wg.Wait() // an attempt ends before Run returns (and the lease goes)
	fetch := true
	for {
		if fetch && len(queue) == 0 && inFlight < parallel {
			now := time.Now()
			skip := make([]string, 0, len(busy)+len(cooling))
			for id := range busy {
				skip = append(skip, id)
			}
			for id, c := range cooling {
				switch {
				case now.Before(c.until):
					skip = append(skip, id)
				case now.Sub(c.until) > time.Minute:
					delete(cooling, id) // not tried again since: given up, or delivered by another
				}
			}
			housekeep := now.Sub(housekept) >= pollInterval
			due, err := s.due(ctx, s.now(), skip, housekeep)
			if err != nil && ctx.Err() == nil {
				s.log.Warn("webhook round failed; retrying", "err", err)
			}
			if housekeep {
				housekept = now // tried: at most once per poll interval, failing or not
			}
			for _, e := range due {
				busy[e.OrderID] = true
			}
			queue, fetch = due, err == nil && len(due) == batchSize // more may be due
		}
		for ; len(queue) > 0 && inFlight < parallel; queue = queue[1:] {
			e := queue[0]
			inFlight++
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := s.deliver(ctx, e)
				if err != nil && ctx.Err() == nil {
					s.log.Warn("webhook delivery failed; retrying", "err", err)
				}
				finished <- outcome{order: e.OrderID, recorded: err == nil}
			}()
		}
		if fetch && len(queue) == 0 && inFlight < parallel {
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case o := <-finished:
			inFlight--
			delete(busy, o.order)
			if o.recorded {
				delete(cooling, o.order)
			} else {
				n := cooling[o.order].failures + 1
				cooling[o.order] = cool{until: time.Now().Add(coolingDelay(n)), failures: n}
			}
			fetch = true // the order's next event may be due now
		case <-wake:
			fetch = true
		case <-time.After(pollInterval):
			fetch = true
		}
	}
}

// cool is an order waiting after attempts in a row that could not be
// recorded.
type cool struct {
	until    time.Time
	failures int
}

// coolingDelay is how long an order waits after its n-th attempt in a
// row that could not be recorded: a poll interval, doubling up to a
// minute.
func coolingDelay(n int) time.Duration {
	d := pollInterval
	for i := 1; i < n && d < time.Minute; i++ {
		d *= 2
	}
	return min(d, time.Minute)
}

type event struct {
	ID         string `db:"id"`
	OrderID    string `db:"order_id"`
	Type       string `db:"type"`
	Body       string `db:"body"`
	Attempts   int    `db:"attempts"`
	Generation int    `db:"generation"`
}

// Round seals what is unsealed, gives up on events past their retry age
// (one that waited behind an earlier event of its order all that time
// too), and sends one batch of due events, Parallel at a time, waiting for
// them all: one step of what Run does, for tests to drive. It returns how
// many it attempted.
func (s *Sender) Round(ctx context.Context) (int, error) {
	due, err := s.due(ctx, s.now(), nil, true)
	if err != nil && len(due) == 0 {
		return 0, err
	}
	parallel := max(s.Parallel, 1)
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	errs := make([]error, len(due), len(due)+1)
	for i, e := range due {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = s.deliver(ctx, e)
		}()
	}
	wg.Wait()
	return len(due), errors.Join(append(errs, err)...)
}

// dueOrders lists the orders with an event due at $1, but those in $2
// (busy): one read of the due events (webhook_outbox_undelivered_idx, up to $1).
const dueOrders = `SELECT DISTINCT order_id FROM webhook_outbox
	WHERE status = 'pending' AND next_attempt_at <= $1 AND order_id <> ALL ($2::text[])`

// dueEvents reads up to $2 events due at $1 among the orders in $3 (those
// dueOrders lists): the earliest pending event of each (an order's events
// leave in the order they were written), if it is due, sealed and within
// the retry age ($4 microseconds). The orders come as a list, not a join:
// the pending events of the listed orders are read once, however stale
// the planner's statistics are. Asking instead, for each due event,
// whether an earlier one of its order is pending let the planner pair
// every pending event with every other when its statistics predated a
// backlog (a receiver down for an hour): 3,000 pending events cost 369,000
// pages, 2.7 s a fetch. And reading every pending event, due or not, cost
// a fetch 145–245 ms at 100,000 pending with 10 due.
const dueEvents = `SELECT o.id, o.order_id, o.type, o.body, o.attempts, o.generation
	FROM (SELECT h.id, h.next_attempt_at, h.seq
		FROM (SELECT DISTINCT ON (order_id) id, order_id, seq, next_attempt_at, body IS NOT NULL AS sealed,
				coalesce(retry_from, created_at) AS retry_from
			FROM webhook_outbox WHERE status = 'pending' AND order_id = ANY ($3::text[]) ORDER BY order_id, seq, id) h
		WHERE h.next_attempt_at <= $1 AND h.sealed AND h.retry_from + $4::float8 * interval '1 microsecond' >= $1
		ORDER BY h.next_attempt_at, h.seq, h.id LIMIT $2) d
	JOIN webhook_outbox o ON o.id = d.id
	ORDER BY d.next_attempt_at, d.seq, d.id`

// due returns up to a batch of due events; with housekeep it first seals
// what is unsealed and gives up on events past their retry age. The orders
// in busy have an event on its way (or wait after a failure to record
// one): none of theirs is returned or given up (the attempt in flight
// records its own outcome). An event past its retry age is never returned,
// given up or not yet.
func (s *Sender) due(ctx context.Context, now time.Time, busy []string, housekeep bool) ([]event, error) {
	if busy == nil {
		busy = []string{} // not NULL: no order is busy
	}
	var hkErr error
	if housekeep {
		// A failure here (one order's event that cannot be sealed, say)
		// is reported, and the due events still leave.
		hkErr = s.housekeep(ctx, now, busy)
	}
	var orders []string
	if err := s.db.SelectContext(ctx, &orders, dueOrders, now, pq.Array(busy)); err != nil {
		return nil, errors.Join(hkErr, fmt.Errorf("read orders with due webhook events: %w", err))
	}
	if len(orders) == 0 {
		return nil, hkErr
	}
	var due []event
	if err := s.db.SelectContext(ctx, &due, dueEvents, now, batchSize, pq.Array(orders), s.MaxRetryAge.Microseconds()); err != nil {
		return nil, errors.Join(hkErr, fmt.Errorf("read due webhook events: %w", err))
	}
	return due, hkErr
}

// housekeep seals what is unsealed and gives up on events past their retry
// age (one that waited behind an earlier event of its order all that time
// too), except those of the orders in busy.
func (s *Sender) housekeep(ctx context.Context, now time.Time, busy []string) error {
	if s.Sealer != nil {
		var sealed int
		err := pg.Tx(ctx, s.db, func(tx *sqlx.Tx) error {
			var err error
			sealed, err = s.Sealer.Seal(ctx, tx)
			return err
		})
		if err != nil {
			return err
		}
		if sealed > 0 {
			s.log.Warn("webhook events were written without a body; sealed with their orders as they are now", "events", sealed)
		}
	}
	if _, err := s.db.ExecContext(ctx, `UPDATE webhook_outbox
		SET status = CASE WHEN last_refused THEN 'refused' ELSE 'failed' END, next_attempt_at = $1,
		last_error = coalesce(last_error || '; ', '') || 'gave up: no 2xx answer within max_retry_age'
		WHERE status = 'pending' AND coalesce(retry_from, created_at) + $2::float8 * interval '1 microsecond' < $1
			AND order_id <> ALL ($3::text[])`,
		now, s.MaxRetryAge.Microseconds(), pq.Array(busy)); err != nil {
		return fmt.Errorf("give up on old webhook events: %w", err)
	}
	return nil
}

// attempt is the outcome of one POST.
type attempt struct {
	at      time.Time
	code    int
	latency time.Duration
	err     string
	refused bool
}

func (s *Sender) deliver(ctx context.Context, e event) error {
	a := s.post(ctx, e)
	if ctx.Err() != nil {
		return ctx.Err() // shutting down: the attempt did not count
	}
	// A refusal is retried like any failure: the name may resolve to a
	// public address again (only a give-up makes the event refused).
	status := StatusPending
	if a.code >= 200 && a.code < 300 {
		status = StatusDelivered
	}
	n := e.Attempts + 1
	next := a.at.Add(s.backoff(n))
	if s.Metrics != nil {
		outcome := status
		if a.refused {
			outcome = StatusRefused
		}
		s.Metrics(outcome, a.latency)
	}
	err := pg.Tx(ctx, s.db, func(tx *sqlx.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE webhook_outbox SET attempts = $3, last_attempt_at = $4::timestamptz,
			last_status_code = $5, last_latency_ms = $6, last_error = NULLIF($7::text, ''), last_refused = $10,
			status = CASE WHEN $2::text = 'pending' AND coalesce(retry_from, created_at) + $9::float8 * interval '1 microsecond' < $8::timestamptz
				THEN CASE WHEN $10 THEN 'refused' ELSE 'failed' END ELSE $2::text END,
			next_attempt_at = $8::timestamptz,
			delivered_at = CASE WHEN $2::text = 'delivered' THEN $4::timestamptz END
			WHERE id = $1 AND status = 'pending' AND attempts = $3 - 1 AND generation = $11`,
			e.ID, status, n, a.at, nullCode(a.code), a.latency.Milliseconds(), a.err, next, s.MaxRetryAge.Microseconds(),
			a.refused, e.Generation)
		if err != nil {
			return err
		}
		if k, _ := res.RowsAffected(); k == 0 {
			return nil // recorded by someone else (an operator's redelivery, another sender)
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO webhook_attempts (event_id, attempt, at, url, status_code, latency_ms, error)
			VALUES ($1, $2, $3, $4, $5, $6, NULLIF($7, ''))`, e.ID, n, a.at, redactURL(s.url), nullCode(a.code), a.latency.Milliseconds(), a.err)
		return err
	})
	if err != nil {
		return fmt.Errorf("record delivery of %s: %w", e.ID, err)
	}
	if status != StatusDelivered {
		s.log.Warn("webhook not delivered", "event", e.ID, "type", e.Type, "order", e.OrderID, "attempt", n,
			"status", status, "code", a.code, "err", a.err)
	}
	return nil
}

func nullCode(code int) any {
	if code == 0 {
		return nil
	}
	return code
}

func (s *Sender) post(ctx context.Context, e event) attempt {
	a := attempt{at: s.now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader([]byte(e.Body)))
	if err != nil {
		a.err = "cannot make a request to " + redactURL(s.url)
		return a
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "paywatch-webhooks/1")
	req.Header.Set(webhook.Header, webhook.Sign(s.secret, time.Now(), []byte(e.Body)))
	start := time.Now()
	resp, err := s.client.Do(req)
	a.latency = time.Since(start)
	if err != nil {
		a.refused = errors.Is(err, ErrRefused)
		var ue *url.Error
		if errors.As(err, &ue) {
			ue.URL = redactURL(s.url) // the error would show the query (a token, maybe)
		}
		a.err = truncate(strings.ReplaceAll(err.Error(), s.url, redactURL(s.url)))
		return a
	}
	defer resp.Body.Close()
	a.code = resp.StatusCode
	if a.code < 200 || a.code >= 300 {
		text, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorText))
		a.err = truncate(fmt.Sprintf("HTTP %d: %s", a.code, strings.TrimSpace(string(text))))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	return a
}

// truncate keeps error texts short, storable (valid UTF-8, no NUL) and
// harmless on a terminal: the receiver writes part of them, so control
// characters (newlines, escape sequences) become spaces.
func truncate(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	if len(s) <= maxErrorText {
		return s
	}
	s = s[:maxErrorText]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// redactURL hides a URL's password and query (either may hold a token)
// where the URL is logged or stored.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.User != nil {
		u.User = url.User(u.User.Username())
	}
	if u.RawQuery != "" {
		u.RawQuery = "redacted"
	}
	return u.String()
}

// backoff is the delay after the n-th failed attempt: BackoffBase doubled
// n-1 times, capped at BackoffCap, drawn uniformly from its upper half.
func (s *Sender) backoff(n int) time.Duration {
	d := s.BackoffCap
	if n < 40 {
		if e := s.BackoffBase << (n - 1); e > 0 && e < d {
			d = e
		}
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(half)+1))
}
