package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/outbox"
)

// When an attempt cannot be recorded (the database refuses the write while
// the reads that find due events still work), the event stays due. The
// sender does not post it again in a tight loop: the order waits a poll
// interval (500 ms) before its event is tried again.
func TestAnAttemptThatCannotBeRecordedIsNotRepostedInATightLoop(t *testing.T) {
	db := pgtest.New(t)
	openOrders(t, newOrders(t, db), 1) // one order, two events
	pgtest.Exec(t, db, `CREATE FUNCTION refuse_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'disk full (simulated)'; END $$`)
	pgtest.Exec(t, db, `CREATE TRIGGER refuse_attempt BEFORE INSERT ON webhook_attempts
		FOR EACH ROW EXECUTE FUNCTION refuse_attempt()`)
	rcv := newReceiver(t, func(int) int { return 0 }) // answers 204 to everything
	snd := newSender(db, rcv.srv.URL, true, logger(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- snd.Run(ctx) }()
	time.Sleep(1500 * time.Millisecond) // the window observed: posts are counted over it
	cancel()
	<-done
	rcv.mu.Lock()
	n := rcv.n
	rcv.mu.Unlock()
	// One post at start, then after 0.5 s and 1 s more: 2 or 3 in 1.5 s.
	if n == 0 || n > 4 {
		t.Fatalf("the receiver got %d POSTs of the same event in 1.5 s while its attempts could not be recorded; want a few, further apart each time", n)
	}
}

// An order whose attempts cannot be recorded waits longer after each such
// failure in a row: a poll interval, doubling up to a minute.
func TestUnrecordedAttemptsCoolTheirOrderLongerEachTime(t *testing.T) {
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second}
	for i, w := range want {
		if got := outbox.CoolingDelay(i + 1); got != w {
			t.Fatalf("after %d unrecorded attempts in a row the order waits %s, want %s", i+1, got, w)
		}
	}
	if got := outbox.CoolingDelay(40); got != time.Minute {
		t.Fatalf("after 40 unrecorded attempts in a row the order waits %s, want a minute at most", got)
	}
}

// An event past its retry age is never posted by Run, is given up within
// about a poll interval, and the later event of its order that waited
// behind it (still within its own age) then leaves.
func TestPastAgeEventGivenUpAndTheNextOfItsOrderLeaves(t *testing.T) {
	db := pgtest.New(t)
	ids := openOrders(t, newOrders(t, db), 2)
	pgtest.Exec(t, db, `UPDATE webhook_outbox SET created_at = now() - interval '2 hours'
		WHERE seq = (SELECT min(seq) FROM webhook_outbox WHERE order_id = '`+ids[0]+`')`)
	rcv := newReceiver(t, func(int) int { return 0 })
	snd := newSender(db, rcv.srv.URL, true, logger(t))
	snd.MaxRetryAge = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- snd.Run(ctx) }()
	waitFor(t, "three deliveries and one give-up", 5*time.Second, func() bool {
		c := statusCounts(t, db)
		return c["delivered"] == 3 && c["failed"] == 1
	})
	cancel()
	<-done
	ev := events(t, db)
	for _, id := range rcv.snapshot() {
		if id == ev[ids[0]][0] {
			t.Fatalf("the event past its retry age was posted")
		}
	}
}

// The database refuses to record attempts and the event passes its retry
// age while its order waits: it is given up (the posts stop), neither
// posted on for ever nor left pending.
func TestEventPastItsAgeWhileItsOrderWaitsIsGivenUp(t *testing.T) {
	db := pgtest.New(t)
	ids := openOrders(t, newOrders(t, db), 1)
	pgtest.Exec(t, db, `CREATE FUNCTION refuse_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'disk full (simulated)'; END $$`)
	pgtest.Exec(t, db, `CREATE TRIGGER refuse_attempt BEFORE INSERT ON webhook_attempts
		FOR EACH ROW EXECUTE FUNCTION refuse_attempt()`)
	// The events have 1.2 s left of their hour.
	pgtest.Exec(t, db, `UPDATE webhook_outbox SET created_at = now() - interval '1 hour' + interval '1200 milliseconds'
		WHERE order_id = '`+ids[0]+`'`)
	rcv := newReceiver(t, func(int) int { return 0 })
	snd := newSender(db, rcv.srv.URL, true, logger(t))
	snd.MaxRetryAge = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- snd.Run(ctx) }()
	waitFor(t, "both events given up", 5*time.Second, func() bool {
		return statusCounts(t, db)["failed"] == 2
	})
	rcv.mu.Lock()
	n1 := rcv.n
	rcv.mu.Unlock()
	time.Sleep(1200 * time.Millisecond) // the window observed: no post may come in it
	rcv.mu.Lock()
	n2 := rcv.n
	rcv.mu.Unlock()
	cancel()
	<-done
	if n2 != n1 {
		t.Fatalf("posts went on after the give-up: %d, then %d", n1, n2)
	}
}
