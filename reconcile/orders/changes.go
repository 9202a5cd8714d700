package orders

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/lib/pq"

	"github.com/paywatch/paywatch/migrations/pg"
)

// Changes tells waiting readers that an order may have changed: its row,
// its transfers or sightings (PostgreSQL notifications on pg.OrderChannel,
// sent by triggers) or its network's blocks, which change its
// confirmations (pg.NotifyChannel, sent by the scanners). One listening
// connection serves every waiter; a waiter re-reads the order when woken.
type Changes struct {
	dsn string
	log *slog.Logger

	mu        sync.Mutex
	byOrder   map[string]map[chan struct{}]struct{}
	byNetwork map[string]map[chan struct{}]struct{}
}

// NewChanges returns a Changes listening on the database at dsn once Run.
func NewChanges(dsn string, log *slog.Logger) *Changes {
	return &Changes{dsn: dsn, log: log, byOrder: map[string]map[chan struct{}]struct{}{},
		byNetwork: map[string]map[chan struct{}]struct{}{}}
}

// Subscribe returns a channel that receives (coalesced) when the order
// may have changed, or its network has new blocks (unless network is
// empty), and a function to stop.
func (c *Changes) Subscribe(orderID, network string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	c.mu.Lock()
	add(c.byOrder, orderID, ch)
	if network != "" {
		add(c.byNetwork, network, ch)
	}
	c.mu.Unlock()
	return ch, func() {
		c.mu.Lock()
		remove(c.byOrder, orderID, ch)
		if network != "" {
			remove(c.byNetwork, network, ch)
		}
		c.mu.Unlock()
	}
}

func add(m map[string]map[chan struct{}]struct{}, k string, ch chan struct{}) {
	if m[k] == nil {
		m[k] = map[chan struct{}]struct{}{}
	}
	m[k][ch] = struct{}{}
}

func remove(m map[string]map[chan struct{}]struct{}, k string, ch chan struct{}) {
	delete(m[k], ch)
	if len(m[k]) == 0 {
		delete(m, k)
	}
}

func wake(set map[chan struct{}]struct{}) {
	for ch := range set {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Run listens until ctx ends. When the connection is lost and comes back,
// every waiter is woken (what happened meanwhile is unknown).
func (c *Changes) Run(ctx context.Context) error {
	l := pq.NewListener(c.dsn, 100*time.Millisecond, 10*time.Second, func(_ pq.ListenerEventType, err error) {
		if err != nil && ctx.Err() == nil {
			c.log.Warn("order change notifications", "err", err)
		}
	})
	defer l.Close()
	for _, ch := range []string{pg.OrderChannel, pg.NotifyChannel} {
		if err := l.Listen(ch); err != nil {
			c.log.Warn("cannot listen for order changes; long-polls wait their whole time", "err", err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case n := <-l.Notify:
			c.mu.Lock()
			switch {
			case n == nil:
				for _, set := range c.byOrder {
					wake(set)
				}
			case n.Channel == pg.OrderChannel:
				wake(c.byOrder[n.Extra])
			default:
				wake(c.byNetwork[n.Extra])
			}
			c.mu.Unlock()
		}
	}
}
