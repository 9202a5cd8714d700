package scan

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
)

// Lease is a PostgreSQL session advisory lock held on a dedicated
// connection: while it is held, no other paywatch instance runs the same
// job. It is released when the holder closes it or its connection dies.
type Lease struct {
	conn *sql.Conn
	name string
}

// TryLease takes the lease called name if no one holds it; it returns nil
// and no error when another instance does.
func TryLease(ctx context.Context, db *sqlx.DB, name string) (*Lease, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", name, err)
	}
	var got bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, "paywatch:"+name).Scan(&got); err != nil {
		conn.Close()
		return nil, fmt.Errorf("lease %s: %w", name, err)
	}
	if !got {
		conn.Close()
		return nil, nil
	}
	return &Lease{conn: conn, name: name}, nil
}

// Alive checks that the lease's connection (and so the lock) still stands,
// within timeout: a connection that does not answer in time counts as
// lost, even when the driver would go on waiting on a silent socket.
func (l *Lease) Alive(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- l.conn.PingContext(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("lease %s: its connection did not answer within %s", l.name, timeout)
	}
}

// Release gives the lease up. It does not wait on a connection that stopped
// answering (closing it waits for the driver, which may wait for ever).
func (l *Lease) Release() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = l.conn.ExecContext(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, "paywatch:"+l.name)
		l.conn.Close()
	}()
	select {
	case <-done:
	case <-time.After(6 * time.Second):
	}
}

// aliveTimeout is how long a lease's check may take before the lease
// counts as lost.
func aliveTimeout(interval time.Duration) time.Duration { return max(interval, time.Second) }

// takeoverDelay is how long an instance that took a lease over waits
// before it runs the job: by then the former holder, which checks its lease
// every interval, each check failing within aliveTimeout, has found it
// lost and stopped its own job.
func takeoverDelay(interval time.Duration) time.Duration { return 2*interval + aliveTimeout(interval) }

// RunLeased runs job whenever this instance holds the lease called name,
// polling for it every interval while another instance holds it. The job's
// context is cancelled when the lease is lost (its connection checked every
// interval, an unanswered check counting as lost); a lease taken over from
// another instance starts its job takeoverDelay later, by when the other
// has stopped its own. (An instance that starts and finds the lease free
// starts at once: a former holder whose process lives on past its dropped
// connection may run its job until its next check.) RunLeased returns when ctx
// ends, or with the job's error when the job fails for good (it is not
// restarted).
func RunLeased(ctx context.Context, db *sqlx.DB, name string, interval time.Duration, log *slog.Logger, job func(context.Context) error) error {
	waiting := false
	for {
		lease, err := TryLease(ctx, db, name)
		if err != nil && ctx.Err() == nil {
			log.Warn("could not try the lease", "lease", name, "err", err)
		}
		if lease != nil && waiting {
			// Taken from another instance: it may not know yet. It checks
			// its lease every interval and stops its job when the check
			// fails; wait until it must have, so that the two never run at
			// once.
			select {
			case <-ctx.Done():
				lease.Release()
				return ctx.Err()
			case <-time.After(takeoverDelay(interval)):
			}
		}
		if lease != nil {
			log.Info("lease taken; running", "lease", name)
			waiting = false
			jobErr := runWhileHeld(ctx, lease, interval, job)
			lease.Release()
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if jobErr != nil {
				return jobErr
			}
			log.Warn("lease lost; standing by", "lease", name)
		} else if !waiting && err == nil {
			log.Info("another instance holds the lease; standing by", "lease", name)
			waiting = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// runWhileHeld runs job, cancelling it if the lease's connection dies. It
// returns nil when the lease was lost, or the job's own error.
func runWhileHeld(ctx context.Context, lease *Lease, interval time.Duration, job func(context.Context) error) error {
	jobCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- job(jobCtx) }()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if jobCtx.Err() != nil && ctx.Err() == nil {
				return nil // lost the lease
			}
			return err
		case <-tick.C:
			if err := lease.Alive(ctx, aliveTimeout(interval)); err != nil && ctx.Err() == nil {
				cancel()
				<-done
				return nil
			}
		}
	}
}
