package evm_test

import (
	"context"
	"math/big"
	"testing"
	"time"

	"github.com/paywatch/paywatch/chains/evm"
	"github.com/paywatch/paywatch/chains/evm/devchain"
	"github.com/paywatch/paywatch/chains/evm/evmtest"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations"
)

// sprinkle makes a payment every `every` blocks over n blocks.
func (e *env) sprinkle(n, every int) []want {
	var wants []want
	for i := 0; i < n; i++ {
		if i%every == 0 {
			amount := big.NewInt(int64(3_000_000 + i))
			wants = append(wants, want{e.usdt.Transfer(e.chain.Payer, e.shop, amount), "USDT", amount.String(), "", ""})
		}
		e.chain.Mine(1)
	}
	return wants
}

// A restart in the middle of a catch-up finds every payment once.
func TestRestartMidScan(t *testing.T) {
	e := newEnv(t)
	e.network.StartBlock = e.chain.Head()
	wants := e.sprinkle(60, 3)
	s := e.scanner()
	s.MaxBatch = 7
	for i := 0; i < 4; i++ {
		if _, err := s.Step(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(e.transfers()); n == 0 || n == len(wants) {
		t.Fatalf("%d transfers after 4 small steps: not mid-scan", n)
	}
	restarted := e.scanner() // a new process: state only in the database
	restarted.MaxBatch = 7
	e.sync(restarted)
	e.expect(wants...)
}

// After 2,000 blocks of downtime every sprinkled payment is found, and the
// scanner never skips ahead.
func TestDowntime2000Blocks(t *testing.T) {
	e := newEnv(t)
	e.network.StartBlock = e.chain.Head()
	s := e.scanner()
	e.sync(s)
	wants := e.sprinkle(2000, 50)
	e.sync(s)
	e.expect(wants...)
}

// A node that refuses ranges over 100 blocks still yields every transfer.
func TestNodeRefusingWideRanges(t *testing.T) {
	e := newEnv(t)
	proxy := evmtest.NewProxy(t, e.chain.URL)
	proxy.MaxLogRange.Store(100)
	e.network.RPCURLs = []string{proxy.URL}
	e.network.StartBlock = e.chain.Head()
	wants := e.sprinkle(600, 25)
	e.sync(e.scanner())
	e.expect(wants...)
	if proxy.Refused.Load() == 0 {
		t.Fatal("the proxy never refused a range: the test tests nothing")
	}
}

// A node that goes down shows in the status and the scanner resumes when it
// is back; a second URL is used while the first is down.
func TestNodeDownThenBack(t *testing.T) {
	e := newEnv(t)
	proxy := evmtest.NewProxy(t, e.chain.URL)
	e.network.RPCURLs = []string{proxy.URL}
	e.network.StartBlock = e.chain.Head()
	s := e.scanner()
	s.RetryMin, s.RetryMax = 10*time.Millisecond, 50*time.Millisecond
	e.sync(s)
	proxy.Down.Store(true)
	wants := e.sprinkle(10, 2)
	if _, err := s.Step(t.Context()); err == nil {
		t.Fatal("step succeeded with the node down")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	waitFor(t, func() bool {
		var lastErr *string
		_ = e.db.QueryRow(`SELECT last_error FROM chain_cursors WHERE network = 'devnet'`).Scan(&lastErr)
		return lastErr != nil && *lastErr != ""
	}, "last_error recorded")
	proxy.Down.Store(false)
	waitFor(t, func() bool { return e.recorded(len(wants)) }, "catch-up after the node came back")
	cancel()
	<-done
	e.expect(wants...)
	var lastErr *string
	if err := e.db.QueryRow(`SELECT last_error FROM chain_cursors WHERE network = 'devnet'`).Scan(&lastErr); err != nil || lastErr != nil {
		t.Fatalf("last_error after recovery: %v %v", lastErr, err)
	}

	// Failover: the first URL dead, the second alive.
	e.network.RPCURLs = []string{"http://127.0.0.1:9", e.chain.URL}
	more := e.sprinkle(4, 2)
	e.sync(e.scanner())
	e.expect(append(wants, more...)...)
}

// A node that accepts connections and never answers is a sick node, not a
// range too large: the scanner fails over to the next URL at once, keeps
// its batch size, and finds every payment.
func TestHungNodeFailsOver(t *testing.T) {
	e := newEnv(t)
	hung := evmtest.NewProxy(t, e.chain.URL)
	e.network.RPCURLs = []string{hung.URL, e.chain.URL}
	e.network.StartBlock = e.chain.Head()
	src, err := evm.NewSource(e.network, e.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	src.SetCallTimeout(300 * time.Millisecond)
	s := scan.NewScanner(e.network, src, e.store, e.log)
	e.sync(s)
	hung.Hang.Store(true) // it served well until now
	wants := e.sprinkle(40, 4)
	e.sync(s)
	e.expect(wants...)
	if hung.Hung.Load() == 0 {
		t.Fatal("the hung node was never asked: the test tests nothing")
	}
	if hung.Hung.Load() > 1 {
		t.Fatalf("the hung node was asked %d times: the scanner did not stay on the healthy one", hung.Hung.Load())
	}
}

// A node that gives no block time with its logs: the times come from the
// blocks' headers, so lateness is decided by when a payment was mined.
func TestBlockTimesWithoutLogTimestamps(t *testing.T) {
	e := newEnv(t)
	proxy := evmtest.NewProxy(t, e.chain.URL)
	proxy.NoLogTimes.Store(true)
	e.network.RPCURLs = []string{proxy.URL}
	e.network.StartBlock = e.chain.Head()
	wants := e.sprinkle(6, 3)
	e.sync(e.scanner())
	e.expect(wants...)
	var rows []struct {
		Block uint64     `db:"block_number"`
		Time  *time.Time `db:"block_time"`
	}
	if err := e.db.Select(&rows, `SELECT block_number, block_time FROM transfers`); err != nil || len(rows) != len(wants) {
		t.Fatalf("%d transfers (%v)", len(rows), err)
	}
	for _, r := range rows {
		h, err := e.chain.Client.HeaderByNumber(t.Context(), new(big.Int).SetUint64(r.Block))
		if err != nil {
			t.Fatal(err)
		}
		if r.Time == nil || r.Time.Unix() != int64(h.Time) {
			t.Fatalf("block %d: time %v, the block says %d", r.Block, r.Time, h.Time)
		}
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Two daemons share the database: one scans, the other stands by, takes
// over within seconds when the first dies, and nothing is missed or doubled.
func TestTwoDaemonsTakeOver(t *testing.T) {
	e := newEnv(t)
	e.network.StartBlock = e.chain.Head()
	e.network.PollInterval = 20 * time.Millisecond
	type daemon struct {
		cancel context.CancelFunc
		done   chan error
		store  *scan.Store
	}
	start := func() *daemon {
		db, err := migrations.Open(t.Context(), e.dbURL)
		if err != nil {
			t.Fatal(err)
		}
		store := scan.NewStore(db)
		s := e.scanner()
		s.Store = store
		ctx, cancel := context.WithCancel(t.Context())
		d := &daemon{cancel: func() { cancel(); db.Close() }, done: make(chan error, 1), store: store}
		go func() {
			d.done <- scan.RunLeased(ctx, db, "scan:devnet", 200*time.Millisecond, e.log, s.Run)
		}()
		return d
	}
	a := start()
	time.Sleep(300 * time.Millisecond) // a takes the lease
	b := start()
	wants := e.sprinkle(20, 2)
	waitFor(t, func() bool { return e.recorded(len(wants)) }, "first daemon's scan")
	killed := time.Now()
	a.cancel() // dies: its connections close, the lock with them
	<-a.done
	wants = append(wants, e.sprinkle(20, 2)...)
	waitFor(t, func() bool { return e.recorded(len(wants)) }, "takeover")
	if took := time.Since(killed); took > 10*time.Second {
		t.Fatalf("takeover took %s", took)
	}
	b.cancel()
	<-b.done
	e.expect(wants...)
}

// A node whose connections are reset now and then (one request in three,
// at random, dropped without an answer): every payment is found once, the
// scan and the balance checks retrying what was cut.
func TestNodeResettingConnections(t *testing.T) {
	e := newEnv(t)
	proxy := evmtest.NewProxy(t, e.chain.URL)
	proxy.ResetEvery.Store(3)
	proxy.MaxLogRange.Store(10) // many batches, many requests: resets are sure to come
	e.network.RPCURLs = []string{proxy.URL}
	e.network.StartBlock = e.chain.Head()
	wants := e.sprinkle(40, 3)
	s := e.scanner()
	s.RetryMin, s.RetryMax = time.Millisecond, 10*time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	waitFor(t, func() bool { return e.recorded(len(wants)) }, "every payment through the resets")
	cancel()
	<-done
	e.expect(wants...)
	if proxy.Resets.Load() == 0 {
		t.Fatal("no connection was reset: the test tests nothing")
	}
	t.Logf("%d connections reset", proxy.Resets.Load())
}

// The first node answers well but lags 20 blocks behind the chain: the
// scanner moves to the node ahead, and a payment is found once and
// confirmed promptly, not 20 blocks late.
func TestLaggingNodeIsPassedOver(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	e.chain.Mine(30)
	lagging := evmtest.NewProxy(t, e.chain.URL)
	lagging.Lag.Store(20)
	e.network.RPCURLs = []string{lagging.URL, e.chain.URL}
	e.network.StartBlock = e.chain.Head() - 25
	s := e.scanner()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	pay := e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(7_000_000))
	e.chain.Mine(4) // three confirmations, far less than the lag
	start := time.Now()
	waitFor(t, func() bool {
		got := e.transfers()
		return len(got) == 1 && got[0].State == "confirmed"
	}, "the payment, confirmed, past the lagging node")
	t.Logf("found and confirmed %s after its confirmations", time.Since(start).Round(time.Millisecond))
	cancel()
	<-done
	e.expect(want{pay, "USDT", "7000000", "confirmed", ""})
}

// A second node with the same chain id but on another chain (a fork, a
// local copy of the chain) runs ahead: it is never preferred, so a payment
// that exists only on it is never recorded, and the real one stays
// confirmed.
func TestNodeOnAnotherChainAheadIsNotPreferred(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	fork := evmtest.New(t, func(c *devchain.Config) { c.Keys = e.chain.Keys })
	usdt := fork.DeployToken("Tether USD", "USDT", 6)
	fork.DeployToken("Dai", "DAI", 18)
	if usdt.Address != e.usdt.Address {
		t.Fatalf("setup: the token is at %s on the fork, %s on the chain", usdt.Address, e.usdt.Address)
	}
	e.chain.Mine(30)
	e.network.RPCURLs = []string{e.chain.URL, fork.URL}
	e.network.StartBlock = e.chain.Head() - 5
	s := e.scanner()
	s.Source.(interface{ SetLagCheckInterval(time.Duration) }).SetLagCheckInterval(100 * time.Millisecond)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	real := e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(5_000_000))
	e.chain.Mine(4)
	waitFor(t, func() bool { g := e.transfers(); return len(g) == 1 && g[0].State == "confirmed" }, "the real payment confirmed")
	for fork.Head() <= e.chain.Head()+10 {
		fork.Mine(1)
	}
	fake := usdt.Transfer(fork.Payer, e.shop, big.NewInt(9_000_000))
	fork.Mine(5)
	time.Sleep(3 * time.Second) // thirty comparisons of the heads
	cancel()
	<-done
	e.expect(want{real, "USDT", "5000000", "confirmed", ""})
	_ = fake
}
