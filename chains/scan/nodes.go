package scan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
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
	// Check runs once per endpoint, beside its first call (for example:
	// is the node on the configured chain?). That call's answer counts only
	// if the check passes: the check costs no round trip of its own, and a
	// node that fails it answers nothing.
	Check func(ctx context.Context, e E) error
	// Final reports errors that another node would answer the same way
	// (the request itself is refused): they are not retried elsewhere.
	Final func(err error) bool
	Log   *slog.Logger

	current atomic.Int64
	checked []atomic.Bool
	// lagChecked is when PreferAhead last compared the heads (unix ns).
	lagChecked atomic.Int64
	// LagCheckEvery is how often PreferAhead compares the heads;
	// LagCheckInterval when zero.
	LagCheckEvery time.Duration
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

// Call runs fn on the current node and, when it fails, on the next ones
// (or on the same one again, after a dropped connection). fn may thus run
// several times: what it returns through its closure, it sets afresh on
// each run, keeping nothing of a run that failed. It returns the error of
// the last node tried, joined with the others'.
func (n *Nodes[E]) Call(ctx context.Context, fn func(ctx context.Context, e E) error) error {
	var errs []error
	start := int(n.current.Load())
	for i := 0; i < len(n.Endpoints); i++ {
		idx := (start + i) % len(n.Endpoints)
		err := n.tryNode(ctx, idx, fn)
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

// resetRetries is how many times Call tries a node again, at once, when the
// connection to it was dropped under a call (a reset or a closed
// connection, as a load balancer in trouble does to some of them): the
// calls are reads, and a node that answers most calls is better asked
// again than passed over for one that may answer none.
const resetRetries = 2

// dropped reports whether err is a connection dropped under a call.
func dropped(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// tryNode runs fn on node idx, and again after a dropped connection, all
// within one CallTimeout: a node whose connections drop late is not given
// three timeouts before the next node is asked.
func (n *Nodes[E]) tryNode(ctx context.Context, idx int, fn func(ctx context.Context, e E) error) error {
	ctx, cancel := context.WithTimeout(ctx, n.callTimeout())
	defer cancel()
	err := n.attempt(ctx, idx, fn)
	for again := 0; err != nil && again < resetRetries && dropped(err) && ctx.Err() == nil; again++ {
		err = n.attempt(ctx, idx, fn)
	}
	return err
}

func (n *Nodes[E]) callTimeout() time.Duration {
	if n.CallTimeout <= 0 {
		return DefaultCallTimeout
	}
	return n.CallTimeout
}

func (n *Nodes[E]) attempt(ctx context.Context, idx int, fn func(ctx context.Context, e E) error) error {
	ctx, cancel := context.WithTimeout(ctx, n.callTimeout())
	defer cancel()
	e := n.Endpoints[idx]
	if n.Check == nil || n.checked[idx].Load() {
		return fn(ctx, e)
	}
	checked := make(chan error, 1)
	go func() { checked <- n.Check(ctx, e) }()
	err := fn(ctx, e)
	if cerr := <-checked; cerr != nil {
		return cerr // whatever fn read came from a node not known to be on the chain
	}
	n.checked[idx].Store(true)
	return err
}

// LagCheckInterval is how often PreferAhead compares the nodes' heads.
const LagCheckInterval = 10 * time.Second

// MaxLag is how many blocks the current node may trail another before
// PreferAhead switches to the one ahead.
const MaxLag = 2

// PreferAhead compares, at most once per LagCheckInterval and in the
// background (it never holds the caller up), the heads the nodes report
// (head reads one, within LagCheckTimeout), and makes the node furthest
// ahead the current one when the current trails it by more than MaxLag
// blocks and both agree on the block at the current node's head (hashAt
// reads a node's hash at a height): a node that answers but lags behind
// would otherwise hold every payment back by its lag, and a node on
// another chain or fork, however far ahead, is never preferred. A node
// that does not answer is left out (Call's failover deals with it). It is a
// no-op with one node.
func (n *Nodes[E]) PreferAhead(ctx context.Context, head func(ctx context.Context, e E) (uint64, error),
	hashAt func(ctx context.Context, e E, height uint64) (string, error)) {
	if len(n.Endpoints) < 2 {
		return
	}
	every := n.LagCheckEvery
	if every <= 0 {
		every = LagCheckInterval
	}
	now := time.Now().UnixNano()
	last := n.lagChecked.Load()
	if now-last < int64(every) || !n.lagChecked.CompareAndSwap(last, now) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), LagCheckTimeout)
	go func() {
		defer cancel()
		n.compareHeads(ctx, head, hashAt)
	}()
}

// LagCheckTimeout bounds one comparison of the nodes' heads.
const LagCheckTimeout = 5 * time.Second

func (n *Nodes[E]) compareHeads(ctx context.Context, head func(ctx context.Context, e E) (uint64, error),
	hashAt func(ctx context.Context, e E, height uint64) (string, error)) {
	heads := make([]uint64, len(n.Endpoints))
	ok := make([]bool, len(n.Endpoints))
	var wg sync.WaitGroup
	for i := range n.Endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got uint64
			err := n.attempt(ctx, i, func(ctx context.Context, e E) error {
				var err error
				got, err = head(ctx, e)
				return err
			})
			heads[i], ok[i] = got, err == nil
		}()
	}
	wg.Wait()
	cur := int(n.current.Load())
	best := cur
	for i := range heads {
		if ok[i] && (!ok[best] || heads[i] > heads[best]) {
			best = i
		}
	}
	if best == cur || !ok[best] || !ok[cur] || heads[best] <= heads[cur]+MaxLag {
		return // (a current node that does not answer is Call's to fail over)
	}
	// The same chain: the node ahead holds the current node's head block.
	var mine, theirs string
	errMine := n.attempt(ctx, cur, func(ctx context.Context, e E) (err error) { mine, err = hashAt(ctx, e, heads[cur]); return err })
	errTheirs := n.attempt(ctx, best, func(ctx context.Context, e E) (err error) { theirs, err = hashAt(ctx, e, heads[cur]); return err })
	if errMine != nil || errTheirs != nil || mine == "" || mine != theirs {
		if n.Log != nil && errMine == nil && errTheirs == nil {
			n.Log.Warn("a node reports a head ahead of the current one but holds another block at its height; not switching",
				"url", n.URLs[best], "head", heads[best], "height", heads[cur])
		}
		return
	}
	n.current.Store(int64(best))
	if n.Log != nil {
		n.Log.Warn("a node lags behind another; switched to the one ahead", "url", n.URLs[best], "head", heads[best],
			"lagging", n.URLs[cur], "its_head", heads[cur])
	}
}
