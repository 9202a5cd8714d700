package api_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/api"
	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// readCounter is the order store, counting when each order is read.
type readCounter struct {
	api.Store
	mu    sync.Mutex
	reads map[string][]time.Time
}

func (s *readCounter) Get(ctx context.Context, id string) (*paywatch.Order, error) {
	s.mu.Lock()
	s.reads[id] = append(s.reads[id], time.Now())
	s.mu.Unlock()
	return s.Store.Get(ctx, id)
}

func (s *readCounter) readsOf(id string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.reads[id]...)
}

// subscriptions is the daemon's change notifications, counting the
// long-polls that are listening for changes.
type subscriptions struct {
	*orders.Changes
	active atomic.Int64
}

func (c *subscriptions) Subscribe(orderID, network string) (<-chan struct{}, func()) {
	ch, stop := c.Changes.Subscribe(orderID, network)
	c.active.Add(1)
	var once sync.Once
	return ch, func() {
		once.Do(func() { c.active.Add(-1) })
		stop()
	}
}

// liveFixture serves the API as the daemon does, long-polls included: a
// real orders.Changes listening on the test database.
type liveFixture struct {
	*fixture
	api     *api.Server
	store   *readCounter
	changes *subscriptions
	// observer is a connection of its own, outside the API's pool.
	observer *sql.DB
}

func newLiveFixture(t *testing.T, validate bool) *liveFixture {
	t.Helper()
	db, dsn := pgtest.NewWithURL(t)
	cfg, st := testStore(t, db, testConfig)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	changes := &subscriptions{Changes: orders.NewChanges(dsn, log)}
	go func() { _ = changes.Run(ctx) }()
	store := &readCounter{Store: st, reads: map[string][]time.Time{}}
	a := api.New(cfg, api.Deps{Orders: store, Chains: scan.NewStore(db), Changes: changes}, log)
	var h http.Handler = a.Handler()
	if validate {
		h = validated(t, h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	t.Cleanup(a.Drain) // runs first: waiting requests answer, so Close need not wait for them
	observer, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { observer.Close() })
	f := &liveFixture{fixture: &fixture{t: t, db: db, srv: srv, nudges: new(atomic.Int64)}, api: a, store: store,
		changes: changes, observer: observer}
	// Changes arrive once the daemon's listener has subscribed.
	f.waitFor(10*time.Second, "the change listener to listen", func() bool {
		var n int
		err := observer.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND query ILIKE 'LISTEN%' || $1 || '%'`, pg.NotifyChannel).Scan(&n)
		return err == nil && n == 1
	})
	return f
}

func (f *liveFixture) waitFor(limit time.Duration, what string, ok func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			f.t.Fatalf("gave up after %s waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *liveFixture) create(network, asset, amount string) (orderJSON, string) {
	f.t.Helper()
	f.nudges.Add(1) // numbers the external ids
	res := f.do("POST", "/v1/orders", storefrontKey, fmt.Sprintf(`{"external_id":"live-%d","network":%q,"asset":%q,"amount":%q}`,
		f.nudges.Load(), network, asset, amount))
	if res.status != http.StatusCreated {
		f.t.Fatalf("create: %d %s", res.status, res.body)
	}
	var o orderJSON
	res.decode(f.t, &o)
	return o, f.do("GET", "/v1/orders/"+o.ID, storefrontKey, "").header.Get("ETag")
}

type answer struct {
	status int
	body   []byte
	etag   string
	at     time.Time
	err    error
}

// poll sends GET /v1/orders/{id}?wait=… (with If-None-Match unless inm is
// empty) and answers on the channel when the request ends.
func (f *liveFixture) poll(id, wait, inm string) <-chan answer {
	c := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest("GET", f.srv.URL+"/v1/orders/"+id+"?wait="+wait, nil)
		req.Header.Set("Authorization", "Bearer "+storefrontKey)
		if inm != "" {
			req.Header.Set("If-None-Match", inm)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			c <- answer{err: err}
			return
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		c <- answer{status: res.StatusCode, body: b, etag: res.Header.Get("ETag"), at: time.Now(), err: err}
	}()
	return c
}

func (f *liveFixture) answerOf(c <-chan answer, within time.Duration, what string) answer {
	f.t.Helper()
	select {
	case a := <-c:
		if a.err != nil {
			f.t.Fatalf("%s: %v", what, a.err)
		}
		return a
	case <-time.After(within):
		f.t.Fatalf("%s: no answer within %s", what, within)
		return answer{}
	}
}

// README: "The request is held until the order differs from the version
// named by If-None-Match (without one: from its state when the request
// arrived) and then answered at once, or answered 304 (or the unchanged
// order) when the wait ends."
func TestLongPollWithoutETagIsHeldUntilTheOrderChanges(t *testing.T) {
	f := newLiveFixture(t, true)
	o, etag := f.create("ethereum", "USDT", "12")

	// Nothing changes: held for the whole wait, then the unchanged order.
	start := time.Now()
	idle := f.answerOf(f.poll(o.ID, "1s", ""), 10*time.Second, "an idle long-poll without If-None-Match")
	if took := time.Since(start); idle.status != http.StatusOK || took < time.Second || idle.etag != etag {
		t.Fatalf("an idle long-poll without If-None-Match answered %d after %s (ETag %s, want %s): want 200, the unchanged order, after the whole 1s wait",
			idle.status, took.Round(time.Millisecond), idle.etag, etag)
	}

	// The order changes while a request waits: it answers at once, with the
	// changed order.
	waiter := f.poll(o.ID, "30s", "")
	f.waitFor(5*time.Second, "the long-poll to wait", func() bool { return f.changes.active.Load() == 1 })
	select {
	case a := <-waiter:
		t.Fatalf("a long-poll without If-None-Match answered %d before the order changed: %s", a.status, a.body)
	default:
	}
	changed := time.Now()
	if res := f.do("POST", "/v1/orders/"+o.ID+"/paid", storefrontKey, ""); res.status != http.StatusOK {
		t.Fatalf("paid: %d %s", res.status, res.body)
	}
	a := f.answerOf(waiter, 10*time.Second, "the long-poll after the order changed")
	var got orderJSON
	if err := json.Unmarshal(a.body, &got); err != nil {
		t.Fatalf("the long-poll answered %d %s: %v", a.status, a.body, err)
	}
	if a.status != http.StatusOK || got.ID != o.ID || got.CustomerMarkedPaidAt == nil || a.etag == etag {
		t.Fatalf("the long-poll answered %d (ETag %s, was %s) with %s: want 200 and the order marked paid", a.status, a.etag, etag, a.body)
	}
	if lag := a.at.Sub(changed); lag > time.Second {
		t.Fatalf("the long-poll answered %s after the order changed, want at once (under a second)", lag.Round(time.Millisecond))
	}
	t.Logf("answered %s after the change", a.at.Sub(changed).Round(time.Millisecond))
}

// README: "one listening connection per daemon serves every waiting
// request, which holds no database connection while it waits." With 50
// requests waiting, the API's pool has no connection in use, the database
// has one listening session, and its sessions are bounded by the pool, not
// by the waiters; one change then answers every waiter.
func TestLongPollWaitersShareOneListenerAndHoldNoConnection(t *testing.T) {
	const waiters = 50
	f := newLiveFixture(t, true)
	o, etag := f.create("ethereum", "USDT", "13")
	answers := make([]<-chan answer, waiters)
	for i := range answers {
		answers[i] = f.poll(o.ID, "30s", etag)
	}
	deadline := time.Now().Add(10 * time.Second)
	for f.changes.active.Load() != waiters {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d long-polls wait, with %d of the API pool's %d connections in use: waiting requests hold connections",
				f.changes.active.Load(), waiters, f.db.Stats().InUse, f.db.Stats().MaxOpenConnections)
		}
		time.Sleep(5 * time.Millisecond)
	}
	deadline = time.Now().Add(3 * time.Second)
	for f.db.Stats().InUse != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections of the API's pool in use while %d requests wait, want none", f.db.Stats().InUse, waiters)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var sessions, listening, busy int
	if err := f.observer.QueryRow(`SELECT count(*), count(*) FILTER (WHERE query ILIKE 'LISTEN%'),
			count(*) FILTER (WHERE state <> 'idle')
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&sessions, &listening, &busy); err != nil {
		t.Fatal(err)
	}
	if listening != 1 || busy != 0 || sessions > migrations.MaxOpenConns+1 {
		t.Fatalf("with %d requests waiting the database has %d sessions (%d listening, %d not idle): want one listening session, none busy, and at most the pool's %d connections besides",
			waiters, sessions, listening, busy, migrations.MaxOpenConns)
	}
	t.Logf("%d requests waiting: %d database sessions, %d of them listening, pool %+v", waiters, sessions, listening, f.db.Stats())
	if res := f.do("POST", "/v1/orders/"+o.ID+"/paid", storefrontKey, ""); res.status != http.StatusOK {
		t.Fatalf("paid: %d %s", res.status, res.body)
	}
	for i, c := range answers {
		if a := f.answerOf(c, 10*time.Second, fmt.Sprintf("waiter %d after the change", i)); a.status != http.StatusOK {
			t.Fatalf("waiter %d answered %d after the change, want 200: %s", i, a.status, a.body)
		}
	}
}

// README: "An order with no payment yet is woken by its own changes only;
// one with payments also by its network's blocks (confirmations), re-read at
// most every 250 ms." A flood of block notifications on ethereum, for the
// whole of a wait: an order without payments is never re-read, one with a
// payment is, at most every 250 ms. (A Bitcoin order follows its network's
// blocks even without a payment: a mempool sighting can come back into view
// without a change of its own.) The wake-ups never hold a request past the
// end of its wait.
func TestLongPollBlocksWakeOnlyOrdersWithPaymentsAtMostEvery250ms(t *testing.T) {
	f := newLiveFixture(t, true)
	bare, bareTag := f.create("ethereum", "USDT", "14")
	paid, _ := f.create("ethereum", "USDT", "15")
	btc, btcTag := f.create("bitcoin", "BTC", "0.001")
	pgtest.Exec(t, f.db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address,
		amount, block_number, block_hash, state, order_id, first_seen_at, updated_at)
		VALUES ('trf_paid', 'ethereum', 'USDT', '0xdAC17F958D2ee523a2206206994597C13D831ec7', '0xaa', 'log', 0,
		'0x1111111111111111111111111111111111111111', 15000001, 5, '0xbb', 'seen', $1, now(), now())`, paid.ID)
	paidTag := f.do("GET", "/v1/orders/"+paid.ID, storefrontKey, "").header.Get("ETag")

	const wait = 1050 * time.Millisecond // not a multiple of 250ms: the wait ends between two re-reads
	polled := time.Now()
	waiters := map[string]<-chan answer{bare.ID: f.poll(bare.ID, wait.String(), bareTag),
		paid.ID: f.poll(paid.ID, wait.String(), paidTag), btc.ID: f.poll(btc.ID, wait.String(), btcTag)}
	f.waitFor(5*time.Second, "three long-polls to wait", func() bool { return f.changes.active.Load() == 3 })
	// Blocks, as the scanners' commits announce them, every few
	// milliseconds until the waits end.
	stop := make(chan struct{})
	flooded := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				flooded <- n
				return
			default:
			}
			for _, network := range []string{"ethereum", "bitcoin"} {
				if _, err := f.observer.Exec(`SELECT pg_notify($1, $2)`, pg.NotifyChannel, network); err == nil {
					n++
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	for id, c := range waiters {
		a := f.answerOf(c, 10*time.Second, "a long-poll during the blocks")
		if a.status != http.StatusNotModified {
			t.Fatalf("order %s answered %d during blocks that changed nothing, want 304: %s", id, a.status, a.body)
		}
		// A flood of wake-ups does not hold a request past its wait
		// (README: "answered 304 … when the wait ends").
		if took := a.at.Sub(polled); took > wait+100*time.Millisecond {
			t.Fatalf("order %s answered %s after its long-poll began, past its %s wait", id, took.Round(time.Millisecond), wait)
		}
	}
	close(stop)
	t.Logf("%d block notifications during the waits", <-flooded)

	// A long-poll reads its order before subscribing and once right after:
	// then never for an order without payments, whatever the blocks.
	readsSince := func(id string) []time.Time {
		var r []time.Time
		for _, at := range f.store.readsOf(id) {
			if !at.Before(polled) {
				r = append(r, at)
			}
		}
		return r
	}
	if reads := readsSince(bare.ID); len(reads) != 2 {
		t.Fatalf("the order without payments was read %d times by its long-poll, want 2 (before and after subscribing): blocks woke it", len(reads))
	}
	for _, id := range []string{paid.ID, btc.ID} {
		reads := readsSince(id)[1:] // from the read right after subscribing
		if len(reads) < 3 {
			t.Fatalf("order %s was re-read %d times during %s of blocks, want it woken by them", id, len(reads)-1, wait)
		}
		for i := 1; i < len(reads); i++ {
			if gap := reads[i].Sub(reads[i-1]); gap < 230*time.Millisecond {
				t.Fatalf("order %s re-read %s after its previous read, want at most one read every 250ms (reads %d)",
					id, gap.Round(time.Millisecond), len(reads))
			}
		}
		t.Logf("order %s: %d re-reads in %s", id, len(reads)-1, wait)
	}
}

// README: "At most 10,000 requests wait at once per daemon; more answer
// 429 rate_limited." The daemon's limit is 10,000; lowered to 3 here, the
// fourth waiter is refused with the API's error body, a plain GET still
// answers, and a slot frees when a waiter ends.
func TestLongPollsBeyondTheLimitAnswer429RateLimited(t *testing.T) {
	if api.MaxWaiting != 10_000 {
		t.Fatalf("MaxWaiting is %d, README says 10,000", api.MaxWaiting)
	}
	f := newLiveFixture(t, true)
	if got := f.api.MaxWaitingLimit(); got != 10_000 {
		t.Fatalf("the API lets %d requests wait at once, README says 10,000", got)
	}
	f.api.SetMaxWaiting(3)
	var ids, tags []string
	var waiting []<-chan answer
	for i := range 3 {
		o, etag := f.create("ethereum", "USDT", fmt.Sprint(20+i))
		ids, tags = append(ids, o.ID), append(tags, etag)
		waiting = append(waiting, f.poll(o.ID, "30s", etag))
	}
	f.waitFor(5*time.Second, "three long-polls to wait", func() bool { return f.changes.active.Load() == 3 })

	for _, inm := range []string{tags[1], ""} {
		res := f.do("GET", "/v1/orders/"+ids[1]+"?wait=30s", storefrontKey, "", "If-None-Match", inm)
		if res.status != http.StatusTooManyRequests || res.code() != "rate_limited" || res.message() == "" ||
			!strings.HasPrefix(res.header.Get("Content-Type"), "application/json") {
			t.Fatalf("a fourth long-poll (If-None-Match %q) answered %d %s %s, want 429 and {\"error\": {\"code\": \"rate_limited\", \"message\": …}}",
				inm, res.status, res.header.Get("Content-Type"), res.body)
		}
	}
	if res := f.do("GET", "/v1/orders/"+ids[1], storefrontKey, ""); res.status != http.StatusOK {
		t.Fatalf("a GET without wait answered %d while long-polls are at their limit, want 200", res.status)
	}

	// One waiter ends (its order changed): the next one may wait.
	if res := f.do("POST", "/v1/orders/"+ids[0]+"/paid", storefrontKey, ""); res.status != http.StatusOK {
		t.Fatalf("paid: %d %s", res.status, res.body)
	}
	if a := f.answerOf(waiting[0], 10*time.Second, "the first waiter after its order changed"); a.status != http.StatusOK {
		t.Fatalf("the first waiter answered %d, want 200", a.status)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		start := time.Now()
		res := f.do("GET", "/v1/orders/"+ids[1]+"?wait=1s", storefrontKey, "", "If-None-Match", tags[1])
		if res.status == http.StatusNotModified && time.Since(start) >= time.Second {
			break
		}
		if res.status != http.StatusTooManyRequests || time.Now().After(deadline) {
			t.Fatalf("after a waiter ended, a new long-poll answered %d after %s, want 304 after its 1s wait: %s",
				res.status, time.Since(start).Round(time.Millisecond), res.body)
		}
	}
}
