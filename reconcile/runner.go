package reconcile

import (
	"context"
	"log/slog"
	"time"

	"github.com/lib/pq"
	"github.com/robfig/cron/v3"
)

// Runner runs passes on a robfig/cron schedule, and at once when nudged:
// by a scanner's commit (a PostgreSQL notification on notifyChannel) or by
// an operator's action. Passes never overlap; nudges that arrive during a
// pass coalesce into one more pass.
type Runner struct {
	rec      *Reconciler
	schedule string
	dsn      string
	channel  string
	log      *slog.Logger
	nudge    chan struct{}
}

// NewRunner returns a Runner; dsn and channel may be empty to run on the
// schedule alone.
func NewRunner(rec *Reconciler, schedule, dsn, channel string, log *slog.Logger) *Runner {
	return &Runner{rec: rec, schedule: schedule, dsn: dsn, channel: channel, log: log, nudge: make(chan struct{}, 1)}
}

// Nudge asks for a pass as soon as possible.
func (r *Runner) Nudge() {
	select {
	case r.nudge <- struct{}{}:
	default:
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
	r.Nudge() // a pass at start
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.nudge:
		}
		if _, err := r.rec.Pass(ctx); err != nil && ctx.Err() == nil {
			r.log.Error("reconciler pass failed; retrying at the next tick", "err", err)
		}
	}
}
