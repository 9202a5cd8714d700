package scan_test

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/paywatch/paywatch/chains/scan"
)

// A node's check (is it on the configured chain?) runs beside its first
// call, costing no round trip of its own; that call's answer counts only
// if the check passes, and a node that fails it is left for the next.
func TestNodeCheckRunsBesideTheFirstCallAndGuardsItsAnswer(t *testing.T) {
	type node struct{ name string }
	nodes, err := scan.NewNodes([]string{"wrong", "right"}, func(u string) (*node, error) { return &node{u}, nil })
	if err != nil {
		t.Fatal(err)
	}
	const rtt = 200 * time.Millisecond
	checks := map[string]int{}
	nodes.Check = func(ctx context.Context, n *node) error {
		time.Sleep(rtt)
		checks[n.name]++ // read once Call has returned
		if n.name == "wrong" {
			return errors.New("node is on chain 2, the configuration says 1")
		}
		return nil
	}
	var answers []string
	call := func(ctx context.Context, n *node) error {
		time.Sleep(rtt)
		answers = append(answers, n.name)
		return nil
	}
	start := time.Now()
	if err := nodes.Call(context.Background(), call); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	// Two nodes, each asked its check and the call at once: two round
	// trips, not four.
	if took > 3*rtt {
		t.Fatalf("a first call through two unchecked nodes took %s with %s a round trip: the checks ran before the calls", took, rtt)
	}
	if answers[len(answers)-1] != "right" || checks["wrong"] != 1 || checks["right"] != 1 {
		t.Fatalf("answers from %v, checks %v; want the call answered by the node that passed its check, each node checked once", answers, checks)
	}
	// Checked once: later calls go to the right node without a check.
	start = time.Now()
	if err := nodes.Call(context.Background(), call); err != nil {
		t.Fatal(err)
	}
	if checks["right"] != 1 || time.Since(start) > 2*rtt {
		t.Fatalf("the checked node was checked %d times, the call took %s", checks["right"], time.Since(start))
	}
}

// A node whose connection drops under a call (a reset, a closed
// connection) is asked again at once, a few times, before the next node
// is tried: a load balancer that drops some connections should not send
// every other call to a node that may not answer at all (hanging until the
// call's timeout). A node whose connections keep dropping is passed over.
func TestNodeDroppingAConnectionIsAskedAgainBeforeTheNext(t *testing.T) {
	type node struct {
		name  string
		drops int // calls to drop before answering
		calls int
	}
	nodes, err := scan.NewNodes([]string{"flaky", "hanging"}, func(u string) (*node, error) { return &node{name: u}, nil })
	if err != nil {
		t.Fatal(err)
	}
	flaky, hanging := nodes.Endpoints[0], nodes.Endpoints[1]
	hanging.drops = 1 << 30
	var answered string
	call := func(ctx context.Context, n *node) error {
		n.calls++
		if n.drops > 0 {
			n.drops--
			if n.name == "hanging" {
				return context.DeadlineExceeded
			}
			return fmt.Errorf("post: %w", syscall.ECONNRESET)
		}
		answered = n.name
		return nil
	}
	flaky.drops = 2
	if err := nodes.Call(context.Background(), call); err != nil {
		t.Fatalf("two dropped connections, then an answer: %v", err)
	}
	if answered != "flaky" || flaky.calls != 3 || hanging.calls != 0 {
		t.Fatalf("answered by %q after %d calls to it and %d to the hanging node; want the flaky node's third call, none to the other",
			answered, flaky.calls, hanging.calls)
	}
	flaky.calls, flaky.drops = 0, 1<<30
	if err := nodes.Call(context.Background(), call); err == nil || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a node whose every connection drops: %v, want its reset reported", err)
	}
	if flaky.calls != 3 || hanging.calls != 1 {
		t.Fatalf("%d calls to the flaky node, %d to the next; want 3 (asked again twice), then 1", flaky.calls, hanging.calls)
	}
}

// A node asked again after dropped connections is asked within the one
// call timeout it was given, not a timeout per try: one whose connections
// drop late leaves its turn to the next node after CallTimeout.
func TestNodeAskedAgainWithinOneCallTimeout(t *testing.T) {
	nodes, err := scan.NewNodes([]string{"late-dropping", "good"}, func(u string) (string, error) { return u, nil })
	if err != nil {
		t.Fatal(err)
	}
	nodes.CallTimeout = 300 * time.Millisecond
	tries := 0
	start := time.Now()
	err = nodes.Call(context.Background(), func(ctx context.Context, name string) error {
		if name == "good" {
			return nil
		}
		tries++
		select {
		case <-time.After(200 * time.Millisecond): // answers nothing, then drops
			return fmt.Errorf("post: %w", syscall.ECONNRESET)
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if took := time.Since(start); err != nil || took > 450*time.Millisecond || tries != 2 {
		t.Fatalf("the good node answered after %v and %d tries of the other (%v); want within the 300 ms call timeout, after 2 tries",
			took, tries, err)
	}
}
