package scan_test

import (
	"context"
	"errors"
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
