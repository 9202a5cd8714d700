package outbox_test

import (
	"context"
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/outbox"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
	"github.com/paywatch/paywatch/reconcile/webhook"
)

// orderOf returns the id of the order in a webhook body.
func orderOf(t *testing.T, body []byte) (webhook.Event, string) {
	t.Helper()
	var e webhook.Event
	var o struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &e); err != nil || json.Unmarshal(e.Order, &o) != nil {
		t.Errorf("undecodable delivery: %s", body)
	}
	return e, o.ID
}

// refundedAfterAnOverpayment creates a Bitcoin order, pays it 2.5 times its
// amount in block 1, runs a pass (the order is disputed as overpaid) and
// has an operator resolve it as refunded, all with the webhooks' bodies
// sealed as serve seals them. Nothing is delivered yet.
func refundedAfterAnOverpayment(t *testing.T, db *sqlx.DB, ext string) (*paywatch.Order, *orders.Sealer) {
	t.Helper()
	ctx := context.Background()
	sealer := orders.NewSealer([]*paywatch.Network{fx.Ethereum, fx.Bitcoin})
	store := newOrders(t, db)
	rec := reconcile.New(db, logger(t), 2*time.Hour, 8*24*time.Hour)
	rec.Sealer = sealer
	op := reconcile.NewOperator(db)
	op.Sealer = sealer
	// Bitcoin has been scanned up to block 0 when the order is created.
	pgtest.Exec(t, db, `INSERT INTO chain_cursors (network, head, updated_at) VALUES ('bitcoin', 0, now())`)
	o, _, err := store.Create(ctx, orders.CreateRequest{ExternalID: ext, Network: fx.Bitcoin, Asset: fx.BTC,
		Amount: big.NewInt(100_000), ExpiresIn: time.Hour, Actor: "shop"})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, from_address,
		to_address, amount, block_number, block_hash, state, first_seen_at, updated_at, block_time, flags)
		VALUES ('trf_over', 'bitcoin', 'BTC', '', $1, 'k', 0, 'bcrt1qfrom', $2, 250000, 1, '0xb1', 'confirmed',
			now(), now(), now(), '{}')`, strings.Repeat("ab", 32), o.PayAddress)
	pgtest.Exec(t, db, `UPDATE chain_cursors SET head = 1 WHERE network = 'bitcoin'`)
	if _, err := rec.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := store.Get(ctx, o.ID); err != nil || got.Status != paywatch.StatusDisputed {
		t.Fatalf("after an overpayment the order is %v (%v), want disputed", got, err)
	}
	if err := op.Resolve(ctx, o.ID, paywatch.StatusRefunded, "customer asked for the money back", "ops-bob"); err != nil {
		t.Fatal(err)
	}
	if got, err := store.Get(ctx, o.ID); err != nil || got.Status != paywatch.StatusRefunded {
		t.Fatalf("before delivery the order is %v (%v), want refunded", got, err)
	}
	return o, sealer
}

// deliverAll runs a sender (sealing as serve's does) to a receiver that
// accepts everything, until no event is pending, and returns the receiver.
func deliverAll(t *testing.T, db *sqlx.DB, sealer *orders.Sealer) *receiver {
	t.Helper()
	rcv := newReceiver(t, func(int) int { return 0 })
	snd := newSender(db, rcv.srv.URL, true, logger(t))
	snd.Sealer = sealer
	waitFor(t, "the order's webhooks delivered", 10*time.Second, func() bool {
		if _, err := snd.Round(context.Background()); err != nil {
			t.Fatal(err)
		}
		return statusCounts(t, db)[outbox.StatusPending] == 0
	})
	return rcv
}

// README: "On every status change (… `order.refunded`) … paywatch POSTs to
// `webhooks.url`". An operator resolving a disputed order as refunded
// makes paywatch POST an order.refunded event whose order is refunded.
func TestResolvingADisputeAsRefundedPostsOrderRefunded(t *testing.T) {
	db := pgtest.New(t)
	o, sealer := refundedAfterAnOverpayment(t, db, "ext-refund")
	rcv := deliverAll(t, db, sealer)
	got := rcv.snapshot()
	var types []string
	for _, id := range got {
		types = append(types, rcv.types[id])
	}
	if len(types) < 2 || types[len(types)-2] != "order.disputed" {
		t.Fatalf("the receiver got %v, want order.disputed then order.refunded", types)
	}
	last := got[len(got)-1]
	var order struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(rcv.bodies[last].Order, &order); err != nil {
		t.Fatal(err)
	}
	if rcv.types[last] != "order.refunded" || order.ID != o.ID || order.Status != string(paywatch.StatusRefunded) {
		t.Fatalf("the receiver got %v; the last one is %s with order %s %q, want order.refunded with order %s \"refunded\"",
			types, rcv.types[last], order.ID, order.Status, o.ID)
	}
}

// README: "Failed attempts are retried with exponential backoff from 5 s
// doubling to 1 h, each delay drawn from its upper half (jitter)". The
// delay after the n-th failed attempt is drawn uniformly from
// [d/2, d] with d = min(5 s × 2^(n-1), 1 h), over its whole range.
func TestWebhookBackoffDoublesFrom5sTo1hDrawnFromTheUpperHalf(t *testing.T) {
	s := outbox.NewSender(nil, "", "", nil, logger(t))
	if s.BackoffBase != 5*time.Second || s.BackoffCap != time.Hour {
		t.Fatalf("NewSender's backoff is from %s capped at %s, want from 5s capped at 1h", s.BackoffBase, s.BackoffCap)
	}
	const draws = 2000
	for _, n := range []int{1, 2, 3, 4, 5, 8, 10, 11, 12, 20, 39, 40, 63, 64, 1000} {
		d := time.Hour
		if n <= 11 {
			d = min(5*time.Second<<(n-1), time.Hour)
		}
		lo, hi := d/2, d
		minSeen, maxSeen := hi, lo
		distinct := map[time.Duration]bool{}
		for range draws {
			got := s.Backoff(n)
			if got < lo || got > hi {
				t.Fatalf("delay after attempt %d is %s, want within [%s, %s]", n, got, lo, hi)
			}
			minSeen, maxSeen = min(minSeen, got), max(maxSeen, got)
			distinct[got] = true
		}
		// Jitter over the whole upper half: 2000 uniform draws fall in
		// its lowest and its highest tenth.
		tenth := (hi - lo) / 10
		if minSeen > lo+tenth || maxSeen < hi-tenth || len(distinct) < draws/2 {
			t.Fatalf("delays after attempt %d span [%s, %s] with %d distinct values in %d draws, want them spread over [%s, %s]",
				n, minSeen, maxSeen, len(distinct), draws, lo, hi)
		}
	}
}

// README: "Failed attempts are retried with exponential backoff from 5 s
// doubling to 1 h, each delay drawn from its upper half (jitter)". What
// the sender writes after each failed attempt (a receiver answering 500):
// next_attempt_at is last_attempt_at plus a delay in attempt n's range,
// growing with n, different from one event to another, and 1 h at most.
func TestFailedAttemptIsRetriedAfterABackoffFrom5sTo1h(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	openOrders(t, newOrders(t, db), 4) // 4 orders: 4 events due at once
	rcv := newReceiver(t, func(int) int { return http.StatusInternalServerError })
	snd := outbox.NewSender(db, rcv.srv.URL, secret, outbox.Client(true, 5*time.Second), logger(t))
	clock := reconciletest.NewClock(time.Now())
	snd.Now = clock.Now
	delays := map[string][]time.Duration{}
	const attempts = 14
	for n := 1; n <= attempts; n++ {
		if k, err := snd.Round(ctx); err != nil || k != 4 {
			t.Fatalf("round %d attempted %d events (%v), want the 4 due", n, k, err)
		}
		var rows []struct {
			ID       string    `db:"id"`
			Status   string    `db:"status"`
			Attempts int       `db:"attempts"`
			Last     time.Time `db:"last_attempt_at"`
			Next     time.Time `db:"next_attempt_at"`
		}
		if err := db.Select(&rows, `SELECT id, status, attempts, last_attempt_at, next_attempt_at FROM webhook_outbox
			WHERE attempts > 0 ORDER BY seq`); err != nil {
			t.Fatal(err)
		}
		if len(rows) != 4 {
			t.Fatalf("after round %d, %d events were attempted, want 4", n, len(rows))
		}
		d := time.Hour
		if n <= 11 {
			d = min(5*time.Second<<(n-1), time.Hour)
		}
		latest := clock.Now()
		for _, r := range rows {
			delay := r.Next.Sub(r.Last)
			// Timestamps are stored to the microsecond.
			if r.Status != outbox.StatusPending || r.Attempts != n || delay < d/2-time.Microsecond || delay > d+time.Microsecond {
				t.Fatalf("after failed attempt %d, event %s is %s with %d attempts, retried %s later; want pending, retried within [%s, %s]",
					n, r.ID, r.Status, r.Attempts, delay, d/2, d)
			}
			delays[r.ID] = append(delays[r.ID], delay)
			latest = maxTime(latest, r.Next)
		}
		clock.Advance(latest.Sub(clock.Now())) // every event due again
	}
	var firsts []time.Duration
	for id, ds := range delays {
		firsts = append(firsts, ds[0])
		// Below the cap each range starts where the previous one ends, so
		// the delays grow; from attempt 11 on they are drawn in [30m, 1h].
		for i := 1; i < 10; i++ {
			if ds[i] < ds[i-1] {
				t.Fatalf("event %s: the delay shrank from %s (attempt %d) to %s (attempt %d)", id, ds[i-1], i, ds[i], i+1)
			}
		}
		if ds[len(ds)-1] < 30*time.Minute || ds[0] > 5*time.Second {
			t.Fatalf("event %s: delays %v do not go from 5s to the 1h cap", id, ds)
		}
	}
	same := 0
	for _, d := range firsts[1:] {
		if d == firsts[0] {
			same++
		}
	}
	if same == len(firsts)-1 {
		t.Fatalf("the 4 events' first retry delays are all %s: no jitter", firsts[0])
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// blockingReceiver holds every request until released (or the test ends),
// counting those in flight at once.
type blockingReceiver struct {
	mu        sync.Mutex
	inFlight  int
	peak      int
	delivered int
	release   chan struct{}
	srv       *httptest.Server
}

func newBlockingReceiver(t *testing.T) *blockingReceiver {
	r := &blockingReceiver{release: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.ReadAll(req.Body)
		r.mu.Lock()
		r.inFlight++
		r.peak = max(r.peak, r.inFlight)
		r.mu.Unlock()
		defer func() {
			r.mu.Lock()
			r.inFlight--
			r.mu.Unlock()
		}()
		select {
		case <-r.release:
		case <-req.Context().Done():
			return
		}
		r.mu.Lock()
		r.delivered++
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	t.Cleanup(func() { // runs before the server closes: lets held requests end
		select {
		case <-r.release:
		default:
			close(r.release)
		}
	})
	return r
}

func (r *blockingReceiver) counts() (inFlight, peak, delivered int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inFlight, r.peak, r.delivered
}

// README: "other orders' events are not held up (8 in flight at once, …)".
// With 20 orders' events due and a receiver that holds every request, 8
// requests are in flight at once, never more; released, all 20 arrive.
func TestWebhooksEightInFlightAtOnce(t *testing.T) {
	if outbox.DefaultParallel != 8 {
		t.Fatalf("DefaultParallel is %d, want 8", outbox.DefaultParallel)
	}
	db := pgtest.New(t)
	openOrders(t, newOrders(t, db), 20)
	rcv := newBlockingReceiver(t)
	snd := outbox.NewSender(db, rcv.srv.URL, secret, outbox.Client(true, 10*time.Second), logger(t))
	if snd.Parallel != 8 {
		t.Fatalf("NewSender's Parallel is %d, want 8", snd.Parallel)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- snd.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "8 requests in flight at once", 10*time.Second, func() bool {
		n, _, _ := rcv.counts()
		return n >= 8
	})
	// A ninth request, were the bound missing, would already be on its
	// way: give it a moment to show up.
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n, _, _ := rcv.counts(); n > 8 {
			t.Fatalf("%d requests in flight at once, want at most 8", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(rcv.release)
	waitFor(t, "the 20 first events delivered", 10*time.Second, func() bool {
		_, _, d := rcv.counts()
		return d >= 20
	})
	if _, peak, _ := rcv.counts(); peak != 8 {
		t.Fatalf("at most %d requests were in flight at once, want 8", peak)
	}
}

// README: "other orders' events are not held up (…, 10 s timeout each)".
// A receiver that hangs on one order's event does not delay another
// order's new event, and the hanging attempt is cut at the timeout and
// logged as failed in webhook_attempts (the event retried later).
func TestHangingReceiverIsCutAtTheTimeoutWithoutHoldingUpOtherOrders(t *testing.T) {
	if outbox.DefaultTimeout != 10*time.Second {
		t.Fatalf("DefaultTimeout is %s, want 10s", outbox.DefaultTimeout)
	}
	if c := outbox.Client(false, outbox.DefaultTimeout); c.Timeout != 10*time.Second {
		t.Fatalf("the default webhook client times out after %s, want 10s", c.Timeout)
	}
	db := pgtest.New(t)
	ctx := context.Background()
	store := newOrders(t, db)
	create := func(ext string) string {
		o, _, err := store.Create(ctx, orders.CreateRequest{ExternalID: ext, Network: fx.Ethereum, Asset: fx.USDT,
			Amount: big.NewInt(1_000_000), ExpiresIn: time.Hour, Actor: "shop"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.MarkPaid(ctx, o.ID, "", "shop"); err != nil {
			t.Fatal(err)
		}
		return o.ID
	}
	slow := create("ext-slow")

	var mu sync.Mutex
	var hangStart, hangEnd time.Time
	delivered := map[string]time.Time{}
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_, order := orderOf(t, body)
		if order == slow {
			mu.Lock()
			hangStart = time.Now()
			mu.Unlock()
			select { // hangs until paywatch gives up on it
			case <-r.Context().Done():
			case <-release:
			}
			mu.Lock()
			hangEnd = time.Now()
			mu.Unlock()
			return
		}
		mu.Lock()
		delivered[order] = time.Now()
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })

	const timeout = 3 * time.Second
	snd := outbox.NewSender(db, srv.URL, secret, outbox.Client(true, timeout), logger(t))
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- snd.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "the slow order's event to reach the receiver", 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !hangStart.IsZero()
	})
	// While that request hangs, another order has an event.
	other := create("ext-other")
	waitFor(t, "the other order's event delivered", 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !delivered[other].IsZero()
	})
	mu.Lock()
	heldUp := !hangEnd.IsZero()
	mu.Unlock()
	if heldUp {
		t.Fatalf("the other order's event was delivered only after the hanging attempt ended: it was held up")
	}

	var a struct {
		Code      *int    `db:"status_code"`
		LatencyMS int64   `db:"latency_ms"`
		Error     *string `db:"error"`
	}
	waitFor(t, "the hanging attempt logged", 3*timeout, func() bool {
		err := db.Get(&a, `SELECT a.status_code, a.latency_ms, a.error FROM webhook_attempts a
			JOIN webhook_outbox o ON o.id = a.event_id WHERE o.order_id = $1`, slow)
		return err == nil
	})
	latency := time.Duration(a.LatencyMS) * time.Millisecond
	if a.Code != nil || a.Error == nil || latency < timeout || latency > timeout+time.Second {
		t.Fatalf("the hanging attempt was logged with status %v, error %v, after %s; want no status, an error, cut at %s",
			a.Code, a.Error, latency, timeout)
	}
	if !strings.Contains(*a.Error, "Timeout") && !strings.Contains(*a.Error, "deadline") {
		t.Fatalf("the hanging attempt's error %q does not say it timed out", *a.Error)
	}
	var st struct {
		Status   string `db:"status"`
		Attempts int    `db:"attempts"`
	}
	if err := db.Get(&st, `SELECT status, attempts FROM webhook_outbox WHERE order_id = $1`, slow); err != nil {
		t.Fatal(err)
	}
	if st.Status != outbox.StatusPending || st.Attempts != 1 {
		t.Fatalf("after its attempt timed out the slow order's event is %s with %d attempts, want pending (to be retried) with 1",
			st.Status, st.Attempts)
	}
}

// README: "A redelivery made while an attempt is in flight is not
// swallowed by it." An operator redelivers an event while its attempt
// hangs; whether that attempt then succeeds or fails, it does not count
// for the redelivery: the event is sent again.
func TestRedeliveryWhileAnAttemptIsInFlightIsNotSwallowed(t *testing.T) {
	for _, answer := range []int{http.StatusNoContent, http.StatusInternalServerError} {
		t.Run(http.StatusText(answer), func(t *testing.T) {
			db := pgtest.New(t)
			ctx := context.Background()
			openOrders(t, newOrders(t, db), 1)
			var first string
			if err := db.Get(&first, `SELECT id FROM webhook_outbox ORDER BY seq LIMIT 1`); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var got []string
			arrived := make(chan struct{})
			release := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				e, _ := orderOf(t, body)
				mu.Lock()
				got = append(got, e.ID)
				n := len(got)
				mu.Unlock()
				if n == 1 { // the first attempt hangs until the test lets it answer
					close(arrived)
					<-release
					w.WriteHeader(answer)
					return
				}
				w.WriteHeader(http.StatusNoContent)
			}))
			t.Cleanup(srv.Close)
			snd := newSender(db, srv.URL, true, logger(t))
			// A failed attempt that counted would put the next one an hour off.
			snd.BackoffBase, snd.BackoffCap = 2*time.Hour, 2*time.Hour
			round := make(chan error, 1)
			go func() { _, err := snd.Round(ctx); round <- err }()
			select {
			case <-arrived:
			case <-time.After(5 * time.Second):
				close(release)
				t.Fatal("the first attempt never reached the receiver")
			}
			// The operator redelivers the event while its attempt is in flight.
			if _, err := outbox.NewStore(db).Redeliver(ctx, first, "ops-alice"); err != nil {
				close(release)
				t.Fatal(err)
			}
			close(release)
			if err := <-round; err != nil {
				t.Fatal(err)
			}
			var st struct {
				Status     string `db:"status"`
				Generation int    `db:"generation"`
				Due        bool   `db:"due"`
			}
			if err := db.Get(&st, `SELECT status, generation, next_attempt_at <= now() AS due
				FROM webhook_outbox WHERE id = $1`, first); err != nil {
				t.Fatal(err)
			}
			if st.Status != outbox.StatusPending || st.Generation != 1 || !st.Due {
				t.Fatalf("after the in-flight attempt answered %d, the redelivered event is %s (generation %d, due now: %v); want pending, generation 1, due now",
					answer, st.Status, st.Generation, st.Due)
			}
			waitFor(t, "the redelivered event sent again", 5*time.Second, func() bool {
				if _, err := snd.Round(ctx); err != nil {
					t.Fatal(err)
				}
				var status string
				_ = db.Get(&status, `SELECT status FROM webhook_outbox WHERE id = $1`, first)
				return status == outbox.StatusDelivered
			})
			mu.Lock()
			defer mu.Unlock()
			if len(got) < 2 || got[0] != first || got[1] != first {
				t.Fatalf("the receiver got %v, want %s twice (the attempt in flight, then the redelivery)", got, first)
			}
		})
	}
}
