package scan

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"
)

// A scanner far behind logs its progress every ten seconds (rate,
// remaining, ETA) and once when caught up; one near the head says nothing.
func TestCatchUpProgressLogs(t *testing.T) {
	var buf bytes.Buffer
	s := &Scanner{Log: slog.New(slog.NewTextHandler(&buf, nil))}
	t0 := time.Unix(1_800_000_000, 0)
	s.logProgress(t0, 100, 150) // near the head
	if buf.Len() != 0 {
		t.Fatalf("logged near the head: %s", buf.String())
	}
	s.logProgress(t0, 0, 100_000)
	s.logProgress(t0.Add(5*time.Second), 5_000, 100_000) // too soon for another line
	s.logProgress(t0.Add(10*time.Second), 10_000, 100_000)
	s.logProgress(t0.Add(20*time.Second), 100_000, 100_000)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines:\n%s", len(lines), buf.String())
	}
	for _, want := range []string{"remaining=90000", "blocks_per_second=1000", "eta=1m30s"} {
		if !strings.Contains(lines[1], want) {
			t.Fatalf("progress line %q lacks %s", lines[1], want)
		}
	}
	if !strings.Contains(lines[2], "caught up") || !strings.Contains(lines[2], "blocks=100000") {
		t.Fatalf("last line %q", lines[2])
	}
}

// A rewind below where a catch-up began (a reorg, a rescan) restarts its
// count: the rate logged is never a wrapped-around figure.
func TestCatchUpProgressAfterARewind(t *testing.T) {
	var buf bytes.Buffer
	s := &Scanner{Log: slog.New(slog.NewTextHandler(&buf, nil))}
	t0 := time.Unix(1_800_000_000, 0)
	s.logProgress(t0, 50_000, 100_000)
	s.logProgress(t0.Add(10*time.Second), 40_000, 100_000) // rewound
	s.logProgress(t0.Add(20*time.Second), 50_000, 100_000)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "blocks_per_second=1000 ") {
		t.Fatalf("after a rewind the progress says:\n%s\nwant 10,000 blocks in the 10 s since the rewind: blocks_per_second=1000", buf.String())
	}
}

func TestErrorKind(t *testing.T) {
	for err, want := range map[error]string{
		context.DeadlineExceeded:                 "timeout",
		fmt.Errorf("scan: %w", ErrRangeTooLarge): "range_too_large",
		ErrReorgTooDeep:                          "reorg_too_deep",
		ErrCursorMoved:                           "cursor_moved",
		&net.OpError{Op: "dial", Err: errors.New("connection refused")}: "connection",
		errors.New("execution reverted"):                                "rpc",
	} {
		if got := ErrorKind(err); got != want {
			t.Errorf("ErrorKind(%v) = %s, want %s", err, got, want)
		}
	}
}
