package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/outbox"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
	"github.com/paywatch/paywatch/reconcile/webhook"
)

const secret = "whsec_test"

var fx = reconciletest.NewFixtures()

func logger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newOrders returns an order store that seals webhook bodies.
func newOrders(t *testing.T, db *sqlx.DB) *orders.Store {
	s := orders.NewStore(db, 24*time.Hour, reconciletest.Wallets(t))
	s.Sealer = orders.NewSealer([]*paywatch.Network{fx.Ethereum, fx.Bitcoin})
	return s
}

// openOrders creates n orders, each marked paid then cancelled: two events
// per order, in that order.
func openOrders(t *testing.T, s *orders.Store, n int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := range n {
		o, _, err := s.Create(ctx, orders.CreateRequest{ExternalID: "ext-" + string(rune('a'+i)), Network: fx.Ethereum,
			Asset: fx.USDT, Amount: big.NewInt(int64(1_000_000 * (i + 1))), ExpiresIn: time.Hour, Actor: "shop"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.MarkPaid(ctx, o.ID, "", "shop"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Cancel(ctx, o.ID, "shop"); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, o.ID)
	}
	return ids
}

// receiver records what reaches it; it answers fail(n) for the n-th
// request (1-based) or 204.
type receiver struct {
	t    *testing.T
	mu   sync.Mutex
	n    int
	fail func(n int) int
	// accepted lists event ids answered 2xx, in order; orders their
	// order's id.
	accepted []string
	order    map[string]string
	types    map[string]string
	bodies   map[string]webhook.Event
	srv      *httptest.Server
}

func newReceiver(t *testing.T, fail func(int) int) *receiver {
	r := &receiver{t: t, fail: fail, order: map[string]string{}, types: map[string]string{}, bodies: map[string]webhook.Event{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	if err := webhook.Verify(secret, req.Header.Get(webhook.Header), body, time.Minute); err != nil {
		r.t.Errorf("delivery with a bad signature: %v", err)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	var e webhook.Event
	if err := json.Unmarshal(body, &e); err != nil {
		r.t.Errorf("undecodable delivery: %v", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if code := r.fail(r.n); code != 0 {
		w.WriteHeader(code)
		return
	}
	var o struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(e.Order, &o)
	r.accepted = append(r.accepted, e.ID)
	r.order[e.ID] = o.ID
	r.types[e.ID] = e.Type
	r.bodies[e.ID] = e
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.accepted...)
}

func newSender(db *sqlx.DB, url string, allowPrivate bool, log *slog.Logger) *outbox.Sender {
	s := outbox.NewSender(db, url, secret, outbox.Client(allowPrivate, 5*time.Second), log)
	s.BackoffBase, s.BackoffCap = 20*time.Millisecond, 80*time.Millisecond
	return s
}

// events returns the outbox's event ids per order, in the order written.
func events(t *testing.T, db *sqlx.DB) map[string][]string {
	t.Helper()
	var rows []struct {
		ID      string `db:"id"`
		OrderID string `db:"order_id"`
	}
	if err := db.Select(&rows, `SELECT id, order_id FROM webhook_outbox ORDER BY seq`); err != nil {
		t.Fatal(err)
	}
	m := map[string][]string{}
	for _, r := range rows {
		m[r.OrderID] = append(m[r.OrderID], r.ID)
	}
	return m
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func statusCounts(t *testing.T, db *sqlx.DB) map[string]int {
	t.Helper()
	var rows []struct {
		Status string `db:"status"`
		N      int    `db:"n"`
	}
	if err := db.Select(&rows, `SELECT status, count(*) AS n FROM webhook_outbox GROUP BY status`); err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, r := range rows {
		m[r.Status] = r.N
	}
	return m
}

func TestBodyIsTheOrderWhenTheEventHappened(t *testing.T) {
	db := pgtest.New(t)
	s := newOrders(t, db)
	ids := openOrders(t, s, 1)
	var bodies []string
	if err := db.Select(&bodies, `SELECT body FROM webhook_outbox ORDER BY seq`); err != nil {
		t.Fatal(err)
	}
	if len(bodies) != 2 {
		t.Fatalf("%d events, want 2 (marked paid, cancelled)", len(bodies))
	}
	want := []struct{ typ, status string }{{"order.customer_marked_paid", "awaiting_payment"}, {"order.cancelled", "cancelled"}}
	for i, b := range bodies {
		var e struct {
			ID    string `json:"id"`
			Type  string `json:"type"`
			Order struct {
				ID                   string  `json:"id"`
				Status               string  `json:"status"`
				Amount               string  `json:"amount"`
				CustomerMarkedPaidAt *string `json:"customer_marked_paid_at"`
			} `json:"order"`
		}
		if err := json.Unmarshal([]byte(b), &e); err != nil {
			t.Fatal(err)
		}
		if e.Type != want[i].typ || e.Order.Status != want[i].status || e.Order.ID != ids[0] ||
			e.Order.Amount != "1" || e.Order.CustomerMarkedPaidAt == nil || !strings.HasPrefix(e.ID, "evt_") {
			t.Fatalf("event %d: %s", i, b)
		}
	}
}

func TestEveryEventOnceInOrderAfterTheReceiverRecovers(t *testing.T) {
	db := pgtest.New(t)
	ids := openOrders(t, newOrders(t, db), 4)
	// The receiver is down for its first 7 requests (500, 502, 503, a 3xx,
	// a 4xx...), then well.
	codes := []int{500, 502, 503, 302, 400, 500, 404}
	rcv := newReceiver(t, func(n int) int {
		if n <= len(codes) {
			return codes[n-1]
		}
		return 0
	})
	snd := newSender(db, rcv.srv.URL, true, logger(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- snd.Run(ctx) }()
	waitFor(t, "all 8 events delivered", 20*time.Second, func() bool { return statusCounts(t, db)["delivered"] == 8 })
	cancel()
	<-done
	got := rcv.snapshot()
	seen := map[string]int{}
	for _, id := range got {
		seen[id]++
	}
	for order, evs := range events(t, db) {
		// Each event accepted exactly once, and an order's events in the
		// order they happened.
		last := -1
		for _, e := range evs {
			if seen[e] != 1 {
				t.Fatalf("event %s accepted %d times", e, seen[e])
			}
			at := indexOf(got, e)
			if at < last {
				t.Fatalf("order %s: event %s arrived before an earlier one", order, e)
			}
			last = at
		}
	}
	if len(got) != 8 || len(ids) != 4 {
		t.Fatalf("accepted %d events", len(got))
	}
	// Every attempt is logged; the failures with their status codes.
	var attempts, failures int
	if err := db.Get(&attempts, `SELECT count(*) FROM webhook_attempts`); err != nil {
		t.Fatal(err)
	}
	if err := db.Get(&failures, `SELECT count(*) FROM webhook_attempts WHERE status_code NOT BETWEEN 200 AND 299`); err != nil {
		t.Fatal(err)
	}
	if attempts != 8+len(codes) || failures != len(codes) {
		t.Fatalf("%d attempts (%d failed), want %d (%d)", attempts, failures, 8+len(codes), len(codes))
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func TestRestartInTheMiddleOfRetriesLosesNothing(t *testing.T) {
	db := pgtest.New(t)
	openOrders(t, newOrders(t, db), 3)
	down := true
	var mu sync.Mutex
	rcv := newReceiver(t, func(int) int {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	ctx, cancel := context.WithCancel(context.Background())
	first := newSender(db, rcv.srv.URL, true, logger(t))
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	waitFor(t, "a few failed attempts", 10*time.Second, func() bool {
		var n int
		_ = db.Get(&n, `SELECT count(*) FROM webhook_attempts`)
		return n >= 6
	})
	cancel() // the daemon stops in the middle of retries
	<-done
	if c := statusCounts(t, db); c["pending"] != 6 {
		t.Fatalf("after the stop: %v, want 6 pending", c)
	}
	mu.Lock()
	down = false
	mu.Unlock()
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	second := newSender(db, rcv.srv.URL, true, logger(t))
	go func() { done <- second.Run(ctx) }()
	waitFor(t, "every event delivered after the restart", 20*time.Second, func() bool {
		return statusCounts(t, db)["delivered"] == 6
	})
	if got := len(rcv.snapshot()); got != 6 {
		t.Fatalf("receiver accepted %d events, want 6", got)
	}
}

func TestTwoDaemonsDeliverEachEventOnce(t *testing.T) {
	db := pgtest.New(t)
	openOrders(t, newOrders(t, db), 10)
	rcv := newReceiver(t, func(int) int { return 0 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		snd := newSender(db, rcv.srv.URL, true, logger(t))
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = scan.RunLeased(ctx, db, "webhooks", 50*time.Millisecond, logger(t), snd.Run)
		}()
	}
	waitFor(t, "20 events delivered", 20*time.Second, func() bool { return statusCounts(t, db)["delivered"] == 20 })
	cancel()
	wg.Wait()
	got := rcv.snapshot()
	seen := map[string]bool{}
	for _, id := range got {
		if seen[id] {
			t.Fatalf("event %s delivered twice", id)
		}
		seen[id] = true
	}
	if len(got) != 20 {
		t.Fatalf("%d deliveries, want 20", len(got))
	}
}

func TestPrivateAddressesAreRefused(t *testing.T) {
	db := pgtest.New(t)
	openOrders(t, newOrders(t, db), 1)
	rcv := newReceiver(t, func(int) int { return 0 })
	// The receiver is on 127.0.0.1; by name too (localhost resolves to it).
	for _, url := range []string{rcv.srv.URL, strings.Replace(rcv.srv.URL, "127.0.0.1", "localhost", 1)} {
		pgtest.Exec(t, db, `UPDATE webhook_outbox SET status = 'pending', next_attempt_at = now(), retry_from = now(), last_refused = false`)
		snd := newSender(db, url, false, logger(t))
		clock := reconciletest.NewClock(time.Now())
		snd.Now, snd.MaxRetryAge = clock.Now, time.Hour
		if _, err := snd.Round(context.Background()); err != nil {
			t.Fatal(err)
		}
		first := func() (st struct {
			Status  string  `db:"status"`
			Err     *string `db:"last_error"`
			Refused bool    `db:"last_refused"`
		}) {
			if err := db.Get(&st, `SELECT status, last_error, last_refused FROM webhook_outbox ORDER BY seq LIMIT 1`); err != nil {
				t.Fatal(err)
			}
			return st
		}
		// Refused, and retried (the name may point elsewhere later); the
		// order's next event waits behind it.
		if st := first(); st.Status != outbox.StatusPending || !st.Refused || st.Err == nil || !strings.Contains(*st.Err, "loopback") {
			t.Fatalf("%s: first event %+v, want pending, refused as loopback", url, st)
		}
		for range 8 {
			clock.Advance(10 * time.Minute)
			if _, err := snd.Round(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		if st := first(); st.Status != outbox.StatusRefused {
			t.Fatalf("%s: after max_retry_age the first event is %+v, want refused", url, st)
		}
	}
	if n := len(rcv.snapshot()); n != 0 {
		t.Fatalf("the receiver got %d deliveries", n)
	}
}

func TestForbidden(t *testing.T) {
	for addr, refused := range map[string]bool{
		"127.0.0.1": true, "::1": true, "10.1.2.3": true, "172.16.0.1": true, "192.168.1.1": true,
		"169.254.169.254": true, "fd00:ec2::254": true, "fe80::1": true, "::ffff:127.0.0.1": true,
		"::ffff:10.0.0.1": true, "100.64.0.1": true, "0.0.0.0": true, "::": true, "224.0.0.1": true,
		"255.255.255.255": true, "64:ff9b::a00:1": true, "198.18.0.1": true,
		"8.8.8.8": false, "1.1.1.1": false, "2001:4860:4860::8888": false, "93.184.216.34": false,
	} {
		if got := outbox.Forbidden(netip.MustParseAddr(addr)) != ""; got != refused {
			t.Errorf("Forbidden(%s) = %v, want %v", addr, got, refused)
		}
	}
}

func TestGiveUpAfterMaxRetryAgeThenRedeliver(t *testing.T) {
	db := pgtest.New(t)
	ids := openOrders(t, newOrders(t, db), 1)
	up := false
	var mu sync.Mutex
	rcv := newReceiver(t, func(int) int {
		mu.Lock()
		defer mu.Unlock()
		if up {
			return 0
		}
		return http.StatusInternalServerError
	})
	snd := newSender(db, rcv.srv.URL, true, logger(t))
	clock := reconciletest.NewClock(time.Now())
	snd.Now = clock.Now
	snd.MaxRetryAge = time.Hour
	ctx := context.Background()
	for range 5 {
		if _, err := snd.Round(ctx); err != nil {
			t.Fatal(err)
		}
		clock.Advance(20 * time.Minute)
	}
	if _, err := snd.Round(ctx); err != nil {
		t.Fatal(err)
	}
	// The first event was retried for max_retry_age and given up; the
	// second, which waited behind it all that time, was given up too.
	c := statusCounts(t, db)
	store := outbox.NewStore(db)
	failed, _, err := store.Deliveries(ctx, outbox.Filter{Status: "failed", Limit: 10})
	if err != nil || c["failed"] != 2 || len(failed) != 2 || failed[1].Attempts < 3 || failed[0].Attempts != 0 ||
		failed[1].NextAttemptAt != nil || failed[1].LastStatusCode == nil || *failed[1].LastStatusCode != 500 {
		t.Fatalf("after max_retry_age: %v; failed deliveries %+v, %v", c, failed, err)
	}
	mu.Lock()
	up = true
	mu.Unlock()
	store.Now = clock.Now
	for _, f := range failed {
		d, err := store.Redeliver(ctx, f.EventID, "ops-alice")
		if err != nil || d.Status != outbox.StatusPending {
			t.Fatalf("redeliver: %+v %v", d, err)
		}
	}
	for range 3 {
		if _, err := snd.Round(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if c := statusCounts(t, db); c["delivered"] != 2 {
		t.Fatalf("after redelivery: %v, want both delivered", c)
	}
	var actors []string
	if err := db.Select(&actors, `SELECT actor FROM order_events WHERE order_id = $1 AND type = 'webhook_redelivered'`, ids[0]); err != nil ||
		len(actors) != 2 || actors[0] != "ops-alice" {
		t.Fatalf("redelivery audit: %q %v", actors, err)
	}
	if _, err := store.Redeliver(ctx, "evt_nope", "ops"); paywatch.ErrorCode(err) != paywatch.CodeNotFound {
		t.Fatalf("unknown event: %v", err)
	}
}

func TestDeliveriesList(t *testing.T) {
	db := pgtest.New(t)
	ids := openOrders(t, newOrders(t, db), 3)
	store := outbox.NewStore(db)
	ctx := context.Background()
	var all []outbox.Delivery
	cursor := ""
	for {
		page, next, err := store.Deliveries(ctx, outbox.Filter{Limit: 4, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if next == "" {
			break
		}
		cursor = next
	}
	if len(all) != 6 || all[0].Status != "pending" || all[0].NextAttemptAt == nil {
		t.Fatalf("%d deliveries: %+v", len(all), all)
	}
	mine, _, err := store.Deliveries(ctx, outbox.Filter{OrderID: ids[1], Limit: 10})
	if err != nil || len(mine) != 2 || mine[0].Type != "order.cancelled" || mine[1].Type != "order.customer_marked_paid" {
		t.Fatalf("by order: %+v %v", mine, err)
	}
	one, _, err := store.Deliveries(ctx, outbox.Filter{EventID: mine[1].EventID, Limit: 10})
	if err != nil || len(one) != 1 {
		t.Fatalf("by event: %+v %v", one, err)
	}
}

// A receiver down for an hour gets every event once it is back, in order
// per order, within the backoff cap of its recovery.
func TestReceiverDownForAnHour(t *testing.T) {
	db := pgtest.New(t)
	openOrders(t, newOrders(t, db), 3)
	var mu sync.Mutex
	down := true
	rcv := newReceiver(t, func(int) int {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return http.StatusBadGateway
		}
		return 0
	})
	snd := outbox.NewSender(db, rcv.srv.URL, secret, outbox.Client(true, 5*time.Second), logger(t))
	clock := reconciletest.NewClock(time.Now())
	snd.Now = clock.Now
	ctx := context.Background()
	round := func() {
		if _, err := snd.Round(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 60 { // an hour, a round a minute
		round()
		clock.Advance(time.Minute)
	}
	if c := statusCounts(t, db); c["pending"] != 6 {
		t.Fatalf("after an hour down: %v", c)
	}
	mu.Lock()
	down = false
	mu.Unlock()
	recovered := clock.Now()
	for statusCounts(t, db)["delivered"] < 6 {
		if clock.Now().Sub(recovered) > 3*outbox.DefaultBackoffCap {
			t.Fatalf("not delivered %s after the receiver recovered: %v", clock.Now().Sub(recovered), statusCounts(t, db))
		}
		round()
		clock.Advance(time.Minute)
	}
	if got := len(rcv.snapshot()); got != 6 {
		t.Fatalf("%d accepted, want 6", got)
	}
	t.Logf("all delivered %s after the receiver recovered", clock.Now().Sub(recovered))
}

// An event older than max_retry_age that was never sent (written with no
// body by a writer that did not seal, or left by an upgrade) is given up,
// not sealed with today's order and sent a year late.
func TestOldUnsentEventIsNotSentWithTodaysOrder(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	old := orders.NewStore(db, 24*time.Hour, reconciletest.Wallets(t)) // a pre-00007 writer: no Sealer
	o, _, err := old.Create(ctx, orders.CreateRequest{ExternalID: "ext-old", Network: fx.Ethereum, Asset: fx.USDT,
		Amount: big.NewInt(1_000_000), ExpiresIn: time.Hour, Actor: "shop"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.MarkPaid(ctx, o.ID, "", "shop"); err != nil {
		t.Fatal(err)
	}
	// What 00007 leaves of it: pending, no body; written a year ago.
	pgtest.Exec(t, db, `UPDATE webhook_outbox SET created_at = now() - interval '365 days', next_attempt_at = now() - interval '365 days'`)
	if _, err := newOrders(t, db).Cancel(ctx, o.ID, "shop"); err != nil { // and the order moved on since
		t.Fatal(err)
	}
	rcv := newReceiver(t, func(int) int { return 0 })
	snd := newSender(db, rcv.srv.URL, true, logger(t))
	snd.Sealer = orders.NewSealer(nil)
	snd.MaxRetryAge = 72 * time.Hour
	for range 3 {
		if _, err := snd.Round(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for id, typ := range rcv.types {
		var view struct{ Status string }
		_ = json.Unmarshal(rcv.bodies[id].Order, &view)
		if typ == "order.customer_marked_paid" {
			t.Fatalf("a 365-day-old %s (created_at %s) was delivered after the upgrade, its body sealed now: order status %q",
				typ, rcv.bodies[id].CreatedAt.Format(time.DateOnly), view.Status)
		}
	}
}

// A refusal is retried: one round during which the receiver's name
// resolves to a private address (a DNS hiccup, or whoever controls the
// zone) loses nothing, and no later event of the order overtakes it.
func TestRefusedOnceIsRetried(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	openOrders(t, newOrders(t, db), 2)
	rcv := newReceiver(t, func(int) int { return 0 })
	// The name resolves to 127.0.0.1 for one round...
	bad := newSender(db, strings.Replace(rcv.srv.URL, "127.0.0.1", "localhost", 1), false, logger(t))
	if _, err := bad.Round(ctx); err != nil {
		t.Fatal(err)
	}
	// ...then to a reachable address again (modelled by allowing it).
	good := newSender(db, rcv.srv.URL, true, logger(t))
	for range 5 {
		if _, err := good.Round(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c := statusCounts(t, db)
	if c[outbox.StatusRefused] > 0 || c[outbox.StatusDelivered] != 4 {
		t.Fatalf("after the resolver recovered: %v; receiver got %v (the refused events are never retried)", c, rcv.types)
	}
}

// A token or password in the webhook URL shows nowhere: not in the
// attempt log, the delivery's last error, nor the logs.
func TestURLSecretsStayOutOfErrorsAndLogs(t *testing.T) {
	db := pgtest.New(t)
	openOrders(t, newOrders(t, db), 1)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	for _, allowPrivate := range []bool{true, false} {
		pgtest.Exec(t, db, `UPDATE webhook_outbox SET status = 'pending', next_attempt_at = now() - interval '1 hour', retry_from = now()`)
		snd := newSender(db, "http://user:hunter2@127.0.0.1:1/hook?token=SECRET_TOKEN", allowPrivate, log)
		if _, err := snd.Round(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	var texts []string
	if err := db.Select(&texts, `SELECT coalesce(error, '') || ' ' || url FROM webhook_attempts
		UNION ALL SELECT coalesce(last_error, '') FROM webhook_outbox`); err != nil {
		t.Fatal(err)
	}
	if len(texts) < 2 {
		t.Fatalf("no attempts recorded: %v", texts)
	}
	for _, s := range append(texts, logs.String()) {
		if strings.Contains(s, "SECRET_TOKEN") || strings.Contains(s, "hunter2") {
			t.Errorf("secret leaked: %s", s)
		}
	}
}

// The webhook client takes no proxy from the environment (HTTPS_PROXY and
// the like): a proxy would connect where the SSRF guard cannot look.
func TestWebhookClientUsesNoProxy(t *testing.T) {
	for _, allowPrivate := range []bool{false, true} {
		c := outbox.Client(allowPrivate, time.Second)
		tr, ok := c.Transport.(*http.Transport)
		if !ok || tr.Proxy != nil {
			t.Fatalf("allow_private_networks %v: the client's transport takes a proxy (%T)", allowPrivate, c.Transport)
		}
		if c.CheckRedirect == nil || c.CheckRedirect(nil, nil) == nil {
			t.Fatalf("allow_private_networks %v: the client follows redirects", allowPrivate)
		}
	}
}
