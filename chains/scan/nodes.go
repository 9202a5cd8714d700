package scan

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// DefaultCallTimeout bounds one call (or batch of calls) to one node.
const DefaultCallTimeout = 20 * time.Second

// Nodes are a network's node endpoints (E, one client per URL), used in
// turn: a call that fails on one node for a reason other than the request
// itself is tried on the next at once, and the node that answered becomes
// the current one. A node that does not answer within CallTimeout is a
// sick node, not a range too large: the next one is tried.
type Nodes[E any] struct {
	URLs      []string
	Endpoints []E
	// CallTimeout bounds each attempt; DefaultCallTimeout when zero.
	CallTimeout time.Duration
	// Check runs once per endpoint before its first call (for example:
	// is the node on the configured chain?).
	Check func(ctx context.Context, e E) error
	// Final reports errors that another node would answer the same way
	// (the request itself is refused): they are not retried elsewhere.
	Final func(err error) bool
	Log   *slog.Logger

	current atomic.Int64
	checked []atomic.Bool
}

// NewNodes returns the endpoints of urls, each made by dial.
func NewNodes[E any](urls []string, dial func(url string) (E, error)) (*Nodes[E], error) {
	n := &Nodes[E]{URLs: urls, checked: make([]atomic.Bool, len(urls))}
	for _, u := range urls {
		e, err := dial(u)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", u, err)
		}
		n.Endpoints = append(n.Endpoints, e)
	}
	return n, nil
}

// Call runs fn on the current node and, when it fails, on the next ones.
// It returns the error of the last node tried, joined with the others'.
func (n *Nodes[E]) Call(ctx context.Context, fn func(ctx context.Context, e E) error) error {
	var errs []error
	start := int(n.current.Load())
	for i := 0; i < len(n.Endpoints); i++ {
		idx := (start + i) % len(n.Endpoints)
		err := n.attempt(ctx, idx, fn)
		if err == nil {
			if idx != start {
				n.current.Store(int64(idx))
				if n.Log != nil {
					n.Log.Info("switched node", "url", n.URLs[idx])
				}
			}
			return nil
		}
		if ctx.Err() != nil || errors.Is(err, ErrRangeTooLarge) || errors.Is(err, ErrNoBlock) || (n.Final != nil && n.Final(err)) {
			return err
		}
		errs = append(errs, fmt.Errorf("%s: %w", n.URLs[idx], err))
	}
	return errors.Join(errs...)
}

func (n *Nodes[E]) attempt(ctx context.Context, idx int, fn func(ctx context.Context, e E) error) error {
	timeout := n.CallTimeout
	if timeout <= 0 {
		timeout = DefaultCallTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	e := n.Endpoints[idx]
	if n.Check != nil && !n.checked[idx].Load() {
		if err := n.Check(ctx, e); err != nil {
			return err
		}
		n.checked[idx].Store(true)
	}
	return fn(ctx, e)
}
