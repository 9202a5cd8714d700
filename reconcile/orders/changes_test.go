package orders_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// A notification wakes the waiters of its order, or of its network those
// that asked for blocks, and no one else.
func TestChangesWakeOnlyWhomTheyConcern(t *testing.T) {
	db, dsn := pgtest.NewWithURL(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := orders.NewChanges(dsn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	go func() { _ = c.Run(ctx) }()
	time.Sleep(300 * time.Millisecond)                  // the listener connects
	paid, stop1 := c.Subscribe("ord_paid", "ethereum")  // has a payment: follows blocks
	idle, stop2 := c.Subscribe("ord_idle", "")          // no payment yet: its own changes only
	other, stop3 := c.Subscribe("ord_other", "bitcoin") // another network
	defer stop1()
	defer stop2()
	defer stop3()
	woken := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		case <-time.After(500 * time.Millisecond):
			return false
		}
	}
	pgtest.Exec(t, db, `SELECT pg_notify($1, 'ethereum')`, pg.NotifyChannel)
	if !woken(paid) || woken(idle) || woken(other) {
		t.Fatal("a block on ethereum woke the wrong waiters")
	}
	pgtest.Exec(t, db, `SELECT pg_notify($1, 'ord_idle')`, pg.OrderChannel)
	if !woken(idle) || woken(paid) || woken(other) {
		t.Fatal("a change of ord_idle woke the wrong waiters")
	}
}
