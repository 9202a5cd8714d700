package bitcoin

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
)

// "a node that errs, or does not answer within 20 s, is left for the next
// at once": the Bitcoin source as serve builds it (NewSource, no timeout
// set) gives each call to a node 20 s, no more.
func TestEachCallToABitcoinNodeIsGiven20s(t *testing.T) {
	n := &paywatch.Network{Name: "btc", Family: paywatch.FamilyBitcoin, Chain: "regtest", RPCURLs: []string{"http://127.0.0.1:1"},
		Assets: []*paywatch.Asset{{Network: "btc", Symbol: "BTC", Native: true, Decimals: 8}}}
	watch, err := NewWatchSet("regtest", nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(n, Credentials{}, watch, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// No node answers here: only the deadline a call is given is read.
	src.nodes.Check = nil
	var least, most time.Duration // the timeout set lies between
	before := time.Now()
	err = src.nodes.Call(t.Context(), func(ctx context.Context, _ *client) error {
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
		t.Fatalf("a call to a Bitcoin node is given %s to %s, README says 20 s", least.Round(time.Millisecond), most.Round(time.Millisecond))
	}
}
