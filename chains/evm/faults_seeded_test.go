package evm_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/paywatch/paywatch/chains/evm"
	"github.com/paywatch/paywatch/chains/evm/evmtest"
	"github.com/paywatch/paywatch/chains/scan"
)

var (
	nodeFaultSeed   = flag.Uint64("faults.seed", 0, "seed of TestNodeFaultsSeeded (0: from the clock; the seed is printed)")
	nodeFaultPhases = flag.Int("faults.phases", 6, "how many fault phases TestNodeFaultsSeeded runs (the long form: 60)")
)

// nodeFault is one way a node misbehaves, applied to a proxy in front of it.
type nodeFault struct {
	name  string
	apply func(p *evmtest.Proxy, rng *rand.Rand) string
}

var (
	// Faults any node may have: the scanner must get through them on that
	// node or another.
	commonFaults = []nodeFault{
		{"none", func(*evmtest.Proxy, *rand.Rand) string { return "healthy" }},
		{"latency", func(p *evmtest.Proxy, rng *rand.Rand) string {
			d := time.Duration(5+rng.IntN(40)) * time.Millisecond
			p.Delay.Store(int64(d))
			return fmt.Sprintf("%v a request", d)
		}},
		{"resets", func(p *evmtest.Proxy, rng *rand.Rand) string {
			n := 2 + rng.Int64N(3)
			p.ResetEvery.Store(n)
			return fmt.Sprintf("resets one connection in %d", n)
		}},
		{"limit", func(p *evmtest.Proxy, rng *rand.Rand) string {
			n := 2 + rng.Uint64N(20)
			p.MaxLogRange.Store(n)
			return fmt.Sprintf(`"more than 10000 results" past %d blocks`, n)
		}},
	}
	// Faults only the first node gets, so that a node that can serve is
	// always there.
	firstNodeFaults = []nodeFault{
		{"hang", func(p *evmtest.Proxy, _ *rand.Rand) string { p.Hang.Store(true); return "hangs" }},
		{"lag", func(p *evmtest.Proxy, rng *rand.Rand) string {
			n := 10 + rng.Int64N(20)
			p.Lag.Store(n)
			return fmt.Sprintf("lags %d blocks", n)
		}},
	}
)

// heal clears every fault of p.
func heal(p *evmtest.Proxy) {
	p.Delay.Store(0)
	p.ResetEvery.Store(0)
	p.MaxLogRange.Store(0)
	p.Hang.Store(false)
	p.Lag.Store(0)
}

// Node faults, seeded: the scanner runs against two nodes behind proxies
// while phase after phase each misbehaves in a way drawn at random (the
// first: latency, connection resets, "limit exceeded" answers, hanging
// after serving well, lagging behind the other; the second: any of those
// but hanging and lagging), and payments keep arriving. Every payment is
// recorded once, with its balance checked, and found promptly once the
// last block is mined, with the last phase's faults still on. The seed and
// the phases are printed; -faults.seed replays a run, -faults.phases sets
// how many (the long form: -faults.phases 60).
func TestNodeFaultsSeeded(t *testing.T) {
	seed := *nodeFaultSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	e := newEnv(t)
	e.withoutNative()
	first, second := evmtest.NewProxy(t, e.chain.URL), evmtest.NewProxy(t, e.chain.URL)
	e.network.RPCURLs = []string{first.URL, second.URL}
	e.network.StartBlock = e.chain.Head()
	src, err := evm.NewSource(e.network, e.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	src.SetCallTimeout(500 * time.Millisecond)
	src.SetLagCheckInterval(100 * time.Millisecond)
	s := scan.NewScanner(e.network, src, e.store, e.log)
	s.RetryMin, s.RetryMax = 5*time.Millisecond, 50*time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()

	var wants []want
	var phases []string
	for i := range *nodeFaultPhases {
		heal(first)
		heal(second)
		f1 := append(append([]nodeFault(nil), commonFaults...), firstNodeFaults...)[rng.IntN(len(commonFaults)+len(firstNodeFaults))]
		f2 := commonFaults[rng.IntN(len(commonFaults))]
		phase := fmt.Sprintf("phase %d: first node %s, second node %s", i+1, f1.apply(first, rng), f2.apply(second, rng))
		blocks, every := 10+rng.IntN(20), 2+rng.IntN(3)
		wants = append(wants, e.sprinkle(blocks, every)...)
		phases = append(phases, fmt.Sprintf("%s; %d blocks", phase, blocks))
	}
	e.chain.Mine(int(e.network.Confirmations))
	start := time.Now()
	waitFor(t, func() bool {
		got := e.transfers()
		for _, g := range got {
			if g.State != "confirmed" {
				return false
			}
		}
		return e.recorded(len(wants))
	}, fmt.Sprintf("every payment, seed %d:\n%s", seed, strings.Join(phases, "\n")))
	took := time.Since(start)
	e.expect(wants...)
	t.Logf("seed %d:\n%s", seed, strings.Join(phases, "\n"))
	fmt.Printf("node faults, seed %d: %d phases; nothing lost: %d payments recorded once each, confirmed and checked %v after the last block\n",
		seed, len(phases), len(wants), took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Fatalf("seed %d: the payments were complete only %v after the last block", seed, took)
	}
}
