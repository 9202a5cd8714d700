package reconcile

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/lib/pq"
	"github.com/robfig/cron/v3"
)

// Runner runs passes on a robfig/cron schedule, and at once when nudged:
// by a scanner's commit or a customer's tx hash claim (PostgreSQL
// notifications on channel) or by an operator's action. Passes never
// overlap; nudges that arrive during a pass coalesce into one more pass.
// Beside the passes, it looks customers' tx hashes up on the nodes
// (LookUpHints), once a second and when a claim arrives; a look-up that
// finds something nudges a pass.
type Runner struct {
	rec      *Reconciler
	schedule string
	dsn      string
	channel  string
	log      *slog.Logger
	nudge    chan struct{}
	lookup   chan struct{}
	// Observe is told how long each pass took and whether it failed
	// (metrics); may be nil.
	Observe func(took time.Duration, err error)
}

// lookupInterval is how often pending claims are looked up on the nodes
// when nothing nudges.
const lookupInterval = time.Second

// NewRunner returns a Runner; dsn and channel may be empty to run on the
// schedule alone.
func NewRunner(rec *Reconciler, schedule, dsn, channel string, log *slog.Logger) *Runner {
	return &Runner{rec: rec, schedule: schedule, dsn: dsn, channel: channel, log: log,
		nudge: make(chan struct{}, 1), lookup: make(chan struct{}, 1)}
}

// Nudge asks for a pass, and a round of look-ups, as soon as possible.
func (r *Runner) Nudge() {
	for _, c := range []chan struct{}{r.nudge, r.lookup} {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// lookUp runs rounds of look-ups until ctx ends.
func (r *Runner) lookUp(ctx context.Context) {
	for {
		found, err := r.rec.LookUpHints(ctx)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("tx hash look-ups failed", "err", err)
		}
		if found > 0 {
			select {
			case r.nudge <- struct{}{}:
			default:
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-r.lookup:
		case <-time.After(lookupInterval):
		}
	}
}

// Run passes until ctx ends.
func (r *Runner) Run(ctx context.Context) error {
	c := cron.New()
	if _, err := c.AddFunc(r.schedule, r.Nudge); err != nil {
		return err
	}
	c.Start()
	defer c.Stop()
	if r.dsn != "" && r.channel != "" {
		l := pq.NewListener(r.dsn, time.Second, time.Minute, func(ev pq.ListenerEventType, err error) {
			if err != nil {
				r.log.Warn("reconciler notifications", "err", err)
			}
		})
		defer l.Close()
		if err := l.Listen(r.channel); err != nil {
			r.log.Warn("cannot listen for scanner notifications; running on the schedule alone", "err", err)
		} else {
			go func() {
				for {
					select {
					case <-ctx.Done():
						return
					case n := <-l.Notify:
						_ = n // nil after a reconnect: a pass catches up anyway
						r.Nudge()
					}
				}
			}()
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.lookUp(ctx)
	}()
	r.Nudge() // a pass at start
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.nudge:
		}
		start := time.Now()
		// Each pass plans on statistics no more than AnalyzeAfter rows
		// behind its tables.
		if tables, err := r.rec.RefreshStatistics(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("could not refresh the planner's statistics; the pass goes on", "err", err)
		} else if len(tables) > 0 {
			r.log.Debug("refreshed the planner's statistics", "tables", tables, "took", time.Since(start).Round(time.Millisecond))
		}
		res, err := r.rec.Pass(ctx)
		if ctx.Err() != nil {
			continue
		}
		if r.Observe != nil {
			r.Observe(time.Since(start), err)
		}
		if err != nil {
			r.log.Error("reconciler pass failed; retrying at the next tick", "err", err)
			continue
		}
		r.log.Debug("reconciler pass", "result", res.String(), "took", time.Since(start).Round(time.Microsecond))
	}
}
