package scan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
)

// "Each reads `(cursor, head]` in batches (up to 2,000 blocks, …)" and "The
// hashes of the blocks within a window of the head (128 blocks, or twice
// the confirmations) are kept": a scanner's largest batch is 2,000 blocks
// and its window 128 blocks, or 2 × confirmations + 2 when that is more.
func TestScannerBatchAndWindowDefaults(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		confirmations int
		window        uint64
	}{{0, 128}, {3, 128}, {63, 128}, {64, 130}, {100, 202}} {
		n := &paywatch.Network{Name: "fake", Confirmations: c.confirmations}
		s := NewScanner(n, newFakeChain(1), nil, log)
		if s.Window != c.window {
			t.Errorf("%d confirmations: a window of %d blocks, want %d", c.confirmations, s.Window, c.window)
		}
		if s.MaxBatch != 2000 {
			t.Errorf("%d confirmations: batches of up to %d blocks, want 2,000", c.confirmations, s.MaxBatch)
		}
	}
}

// "a node that errs, or does not answer within 20 s, is left for the next
// at once": each attempt on a node is given 20 s unless told otherwise;
// one that does not answer within its time is left for the next node as
// soon as the time is up, and the one that answered becomes the current.
func TestNodesLeaveASilentNodeAfterTheCallTimeout(t *testing.T) {
	n, err := NewNodes([]string{"silent", "healthy"}, func(u string) (string, error) { return u, nil })
	if err != nil {
		t.Fatal(err)
	}
	var least, most time.Duration // the timeout set lies between
	before := time.Now()
	if err := n.Call(context.Background(), func(ctx context.Context, e string) error {
		deadline, ok := ctx.Deadline()
		if !ok {
			return errors.New("no deadline")
		}
		least, most = time.Until(deadline), deadline.Sub(before)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if least > 20*time.Second || most < 20*time.Second {
		t.Fatalf("an attempt is given %s to %s by default, README says 20 s", least.Round(time.Millisecond), most.Round(time.Millisecond))
	}

	n.CallTimeout = 100 * time.Millisecond
	var asked []string
	start := time.Now()
	err = n.Call(context.Background(), func(ctx context.Context, e string) error {
		asked = append(asked, e)
		if e == "silent" {
			<-ctx.Done() // never answers
			return fmt.Errorf("no answer: %w", ctx.Err())
		}
		return nil
	})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("a call with a healthy second node failed: %v", err)
	}
	if fmt.Sprint(asked) != "[silent healthy]" {
		t.Fatalf("nodes asked: %v, want the silent one then the healthy one", asked)
	}
	if took < n.CallTimeout || took > n.CallTimeout+time.Second {
		t.Fatalf("the call took %s with a %s call timeout: the next node was not asked as the time was up", took, n.CallTimeout)
	}
	if cur := n.current.Load(); cur != 1 {
		t.Fatalf("the current node is %d after the silent one was left, want the healthy one (1)", cur)
	}
}
