package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/paywatch/paywatch/migrations/pgtest"
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
	// One post at start, then one per 500 ms: about 3 in 1.5 s.
	if n == 0 || n > 6 {
		t.Fatalf("the receiver got %d POSTs of the same event in 1.5 s while its attempts could not be recorded; want one per poll interval (about 3)", n)
	}
}
