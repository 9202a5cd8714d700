package scan

import (
	"context"
	"errors"
	"net"
	"time"
)

// Observer is told what a scanner does, for metrics. Its methods must not
// block.
type Observer interface {
	// Batch: a batch of blocks committed, with the transfers found in it,
	// after took (reading and committing).
	Batch(network string, blocks, transfers int, took time.Duration)
	// StepFailed: a step failed; kind is what ErrorKind says of the error.
	StepFailed(network, kind string)
}

// ErrorKind sorts a scan step's error for metrics: timeout, connection,
// range_too_large, reorg_too_deep, cursor_moved or rpc (anything else the
// node or the database answered).
func ErrorKind(err error) string {
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, ErrRangeTooLarge):
		return "range_too_large"
	case errors.Is(err, ErrReorgTooDeep):
		return "reorg_too_deep"
	case errors.Is(err, ErrCursorMoved):
		return "cursor_moved"
	case errors.As(err, &netErr) && netErr.Timeout():
		return "timeout"
	case errors.As(err, &netErr):
		return "connection"
	}
	return "rpc"
}

// catchUp logs progress while a scanner is far behind the head: blocks a
// second, blocks remaining and the time that leaves, every
// catchUpLogEvery, and once when it has caught up.
type catchUp struct {
	active     bool
	startAt    time.Time
	startBlock uint64
	lastLog    time.Time
}

const (
	// catchUpBehind is how far behind the head a scanner may be without
	// its progress being logged: more than that, it is.
	catchUpBehind   = 1000
	catchUpLogEvery = 10 * time.Second
)

func (s *Scanner) logProgress(now time.Time, last, head uint64) {
	c := &s.progress
	behind := head - min(head, last)
	if !c.active {
		if behind <= catchUpBehind {
			return
		}
		*c = catchUp{active: true, startAt: now, startBlock: last, lastLog: now}
		s.Log.Info("catching up", "cursor", last, "head", head, "remaining", behind)
		return
	}
	if last < c.startBlock {
		// Rewound below where the catch-up began (a reorg, a rescan):
		// count from here.
		c.startAt, c.startBlock, c.lastLog = now, last, now
		return
	}
	if behind == 0 {
		c.active = false
		s.Log.Info("caught up", "head", head, "blocks", last-c.startBlock, "took", now.Sub(c.startAt).Round(time.Second))
		return
	}
	if now.Sub(c.lastLog) < catchUpLogEvery {
		return
	}
	c.lastLog = now
	rate := float64(last-c.startBlock) / now.Sub(c.startAt).Seconds()
	args := []any{"cursor", last, "head", head, "remaining", behind, "blocks_per_second", int64(rate)}
	if rate > 0 {
		args = append(args, "eta", (time.Duration(float64(behind)/rate) * time.Second).Round(time.Second))
	}
	s.Log.Info("catching up", args...)
}
