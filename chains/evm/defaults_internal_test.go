package evm

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/evm/evmtest"
)

// "a node that errs, or does not answer within 20 s, is left for the next
// at once": the source as serve builds it (NewSource, no timeout set)
// gives each call to a node 20 s, no more.
func TestEachCallToANodeIsGiven20s(t *testing.T) {
	c := evmtest.New(t)
	n := &paywatch.Network{Name: "devnet", Family: paywatch.FamilyEVM, RPCURLs: []string{c.URL}, ChainID: evmtest.ChainID}
	src, err := NewSource(n, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	var least, most time.Duration // the timeout set lies between
	before := time.Now()
	err = src.nodes.call(t.Context(), func(ctx context.Context, _ *endpoint) error {
		deadline, ok := ctx.Deadline()
		if !ok {
			return errors.New("a call to a node has no deadline")
		}
		least, most = time.Until(deadline), deadline.Sub(before)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if least > 20*time.Second || most < 20*time.Second {
		t.Fatalf("a call to a node is given %s to %s, README says 20 s", least.Round(time.Millisecond), most.Round(time.Millisecond))
	}
}
