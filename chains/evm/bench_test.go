package evm_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/evm"
	"github.com/paywatch/paywatch/chains/evm/devchain"
	"github.com/paywatch/paywatch/chains/evm/evmtest"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

const (
	benchBlocks    = 10_000
	benchTransfers = 2_000
	benchWatched   = 10_000
)

// scanBench is the benchmark's chain, as its node (serveBenchNode)
// describes it: where it serves, the token, the range holding the
// transfers, and the addresses watched.
type scanBench struct {
	URL      string
	Token    common.Address
	From, To uint64
	Watched  []string
}

// benchNodeEnv, set in the environment of this test binary run again,
// makes it the benchmark's node (TestMain) instead of running tests.
const benchNodeEnv = "PAYWATCH_BENCH_NODE"

func TestMain(m *testing.M) {
	if os.Getenv(benchNodeEnv) != "" {
		if err := serveBenchNode(); err != nil {
			fmt.Fprintln(os.Stderr, "benchmark node:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serveBenchNode builds the benchmark's chain, writes the scanBench that
// describes it as one JSON line on stdout, and serves it until stdin
// closes.
func serveBenchNode() error {
	ctx := context.Background()
	// As the node a shop runs: logs indexed, the chain on disk. (In memory,
	// go-ethereum's move of final blocks out of the key-value store scans
	// every key for each block moved: it would keep both cores busy for
	// minutes, in the middle of the measurements.)
	dir, err := os.MkdirTemp("", "paywatch-bench-node-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	c, err := devchain.New(devchain.Config{IndexLogs: true, DataDir: dir})
	if err != nil {
		return err
	}
	defer c.Close()
	usdt, err := c.DeployToken(ctx, "Tether USD", "USDT", 6)
	if err != nil {
		return err
	}
	var sb scanBench
	sb.URL, sb.Token = c.URL, usdt.Address
	for i := 0; i < benchWatched; i++ {
		var a common.Address
		_, _ = rand.Read(a[:])
		sb.Watched = append(sb.Watched, a.Hex())
	}
	if sb.From, err = c.Head(ctx); err != nil {
		return err
	}
	sb.From++
	every := benchBlocks / benchTransfers
	for i := 0; i < benchBlocks; i++ {
		if i%every == 0 {
			to := common.HexToAddress(sb.Watched[(i/every*7919)%benchWatched])
			if _, err := usdt.Call(ctx, c.Keys[i%len(c.Keys)], "transfer", to, big.NewInt(int64(1_000_000+i))); err != nil {
				return err
			}
		}
		c.Mine(1)
	}
	if sb.To, err = c.Head(ctx); err != nil {
		return err
	}
	waitIdle()
	if err := json.NewEncoder(os.Stdout).Encode(sb); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// setupScanBench starts the benchmark's node in a process of its own (this
// test binary run again), as a shop's node runs beside paywatch: a chain
// of 10,000 blocks holding 2,000 token transfers to random addresses among
// 10,000 watched ones. (A node inside the benchmark's process would share
// its Go scheduler with the scanner: the scanner's statements would wait
// behind the node's work for a time slice.)
func setupScanBench(b *testing.B) *scanBench {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), benchNodeEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	var sb scanBench
	if err := json.NewDecoder(stdout).Decode(&sb); err != nil {
		b.Fatalf("the benchmark's node did not start: %v", err)
	}
	return &sb
}

// waitIdle waits (up to a minute) until this process uses little CPU: the
// simulated node indexes the logs of new blocks in the background, and a
// measurement taken meanwhile would share the cores with that indexing.
func waitIdle() {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		before := cpu()
		time.Sleep(500 * time.Millisecond)
		if cpu()-before < 50*time.Millisecond { // under 10% of one core
			return
		}
	}
	fmt.Fprintln(os.Stderr, "benchmark node: still busy after a minute; measuring anyway")
}

// BenchmarkScan compares paywatch's scan of the range with a bare
// eth_getLogs loop over it (same batch size, same node): the ratio of the
// two ns/op is the scanner's efficiency. paywatch runs as serve runs it,
// its balance checks behind the scanner; ns/op is the time until the
// cursor reaches the head, and verified-ms until every check is done.
// Each paywatch run also comes right after a bare run of its own, and
// paired-ratio is the median of those pairs' ratios: on a shared machine,
// load that comes and goes between the two series sways the ratio of their
// means more than it sways a pair. cpu-ratio is the median of the pairs'
// ratios of the CPU time the machine spent working (the node, PostgreSQL
// and this process: pgtest.BusyCPU), paywatch's run to the bare one's;
// cpu-bound-ratio the median of the pairs' bare run's time over paywatch's
// CPU time shared among the machine's cores: the paired ratio that much
// work would reach with no core ever idle, which paired-ratio cannot pass
// (a target above it asks for less work, not for better overlap).
// It measures the token path with a watch set too large for a topic filter
// (the contract's every Transfer log is read and filtered here). Run:
//
//	go test -run '^$' -bench BenchmarkScan -benchtime 5x ./chains/evm/
//
// "local" reads the node directly; "remote-30ms" goes through a proxy
// that adds 30 ms to every request, as a hosted node far away would.
func BenchmarkScan(b *testing.B) {
	sb := setupScanBench(b)
	b.Run("local", func(b *testing.B) { benchmarkScan(b, sb, sb.URL) })
	b.Run("remote-30ms", func(b *testing.B) {
		proxy := evmtest.NewProxy(b, sb.URL)
		proxy.Delay.Store(int64(30 * time.Millisecond))
		benchmarkScan(b, sb, proxy.URL)
	})
}

// readRanges reads the contract's Transfer logs of the range, a range of
// scan.DefaultMaxBatch blocks at a time, and hands each range's to got: a
// bare loop of eth_getLogs.
func (sb *scanBench) readRanges(b *testing.B, client *ethclient.Client, got func([]types.Log)) {
	for from := sb.From; from <= sb.To; from += scan.DefaultMaxBatch {
		to := min(from+scan.DefaultMaxBatch-1, sb.To)
		logs, err := client.FilterLogs(context.Background(), ethereum.FilterQuery{
			FromBlock: new(big.Int).SetUint64(from), ToBlock: new(big.Int).SetUint64(to),
			Addresses: []common.Address{sb.Token}, Topics: [][]common.Hash{{evm.TransferTopic}}})
		if err != nil {
			b.Fatal(err)
		}
		got(logs)
	}
}

func benchmarkScan(b *testing.B, sb *scanBench, url string) {
	// The bare loop: Go's default client (which asks for compressed
	// answers), and the same loop asking the node for uncompressed answers,
	// as paywatch asks a node on the loopback interface: what the node's
	// compression costs the bare loop, and a baseline that does not pay it.
	for name, hc := range map[string]*http.Client{
		"bare-getLogs":       http.DefaultClient,
		"bare-getLogs-plain": {Transport: &http.Transport{DisableCompression: true}},
	} {
		b.Run(name, func(b *testing.B) {
			rc, err := rpc.DialOptions(context.Background(), url, rpc.WithHTTPClient(hc))
			if err != nil {
				b.Fatal(err)
			}
			client := ethclient.NewClient(rc)
			defer client.Close()
			for b.Loop() {
				n := 0
				sb.readRanges(b, client, func(logs []types.Log) { n += len(logs) })
				if n != benchTransfers {
					b.Fatalf("%d logs", n)
				}
			}
			b.ReportMetric(float64(sb.To-sb.From+1)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
	// The simplest scanner that stores what it reads: one range read, then
	// its watched transfers copied into the table (COPY, no upsert, no
	// cursor, no block hashes), then the next range. Its ratio to the bare
	// loop is what storing costs when nothing overlaps it.
	b.Run("bare-getLogs-copy", func(b *testing.B) {
		client, err := ethclient.Dial(url)
		if err != nil {
			b.Fatal(err)
		}
		defer client.Close()
		watched := make(map[common.Address]bool, len(sb.Watched))
		for _, a := range sb.Watched {
			watched[common.HexToAddress(a)] = true
		}
		for b.Loop() {
			b.StopTimer()
			db := pgtest.New(b)
			warmPool(b, db, 1)
			b.StartTimer()
			n := 0
			sb.readRanges(b, client, func(logs []types.Log) {
				if err := pg.Tx(context.Background(), db, func(tx *sqlx.Tx) error {
					stmt, err := tx.Prepare(pq.CopyIn("transfers", "id", "network", "asset", "asset_contract", "tx_hash", "tx_key",
						"idx", "from_address", "to_address", "amount", "block_number", "block_hash", "state", "first_seen_at", "updated_at"))
					if err != nil {
						return err
					}
					now := time.Now()
					for _, l := range logs {
						if len(l.Topics) != 3 {
							continue
						}
						to := common.BytesToAddress(l.Topics[2].Bytes())
						if !watched[to] {
							continue
						}
						if _, err := stmt.Exec(paywatch.NewSortableID("trf", now), "bench", "USDT", sb.Token.Hex(), l.TxHash.Hex(),
							fmt.Sprint(l.Index), int64(l.Index), common.BytesToAddress(l.Topics[1].Bytes()).Hex(), to.Hex(),
							new(big.Int).SetBytes(l.Data).String(), int64(l.BlockNumber), l.BlockHash.Hex(), "seen", now, now); err != nil {
							return err
						}
						n++
					}
					if _, err := stmt.Exec(); err != nil {
						return err
					}
					return stmt.Close()
				}); err != nil {
					b.Fatal(err)
				}
			})
			if n != benchTransfers {
				b.Fatalf("%d transfers stored", n)
			}
		}
		b.ReportMetric(float64(sb.To-sb.From+1)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
	})
	for _, verify := range []bool{true, false} {
		name := "paywatch"
		if !verify {
			name = "paywatch-no-balance-check"
		}
		b.Run(name, func(b *testing.B) {
			var peak atomic.Uint64
			var scanned, verified time.Duration
			var paired, cpu, bound []float64
			stop := make(chan struct{})
			go samplePeakHeap(&peak, stop)
			defer close(stop)
			bare, err := ethclient.Dial(url)
			if err != nil {
				b.Fatal(err)
			}
			defer bare.Close()
			for b.Loop() {
				b.StopTimer()
				// The bare loop once, just before: the pair shares the
				// machine's moment (its other load comes and goes).
				bareStart, bareCPU := time.Now(), pgtest.BusyCPU()
				sb.readRanges(b, bare, func([]types.Log) {})
				bareTook, bareCPU := time.Since(bareStart), pgtest.BusyCPU()-bareCPU
				db, dbURL := pgtest.NewWithURL(b)
				// As in serve, where the API, the leases and the other
				// networks keep the pool's connections open, the catch-up
				// starts with some open (a new PostgreSQL session costs
				// about 30 ms on this machine); the wait for the balance
				// checks polls through a connection of its own, not the
				// scanner's pool.
				warmPool(b, db, 4)
				clock, err := migrations.Open(context.Background(), dbURL)
				if err != nil {
					b.Fatal(err)
				}
				n := &paywatch.Network{Name: "bench", Family: paywatch.FamilyEVM, RPCURLs: []string{url},
					ChainID: evmtest.ChainID, Confirmations: 12, StartBlock: sb.From, PollInterval: time.Second,
					Assets: []*paywatch.Asset{{Network: "bench", Symbol: "USDT", Contract: sb.Token.Hex(),
						Decimals: 6, Mode: paywatch.ModeShared, Addresses: sb.Watched}}}
				log := slog.New(slog.NewTextHandler(io.Discard, nil))
				src, err := evm.NewSource(n, log)
				if err != nil {
					b.Fatal(err)
				}
				src.VerifyBalances = verify
				s := scan.NewScanner(n, src, scan.NewStore(db), log)
				reached := &headWatch{blocks: int64(sb.To - sb.From + 1), done: make(chan struct{})}
				s.Observer = reached
				ctx, stop := context.WithCancel(context.Background())
				done := make(chan error, 1)
				runtime.GC()
				b.StartTimer()
				// As serve runs it: the scanner with its verifier behind it.
				// The clock stops when the cursor reaches the head: when the
				// scanner reports the commit that takes it there (polling
				// the database for it every few milliseconds took a share
				// of the cores the scan runs on, which the bare loop does
				// not pay).
				start, startCPU := time.Now(), pgtest.BusyCPU()
				go func() { done <- s.Run(ctx) }()
				select {
				case <-reached.done:
				case <-time.After(5 * time.Minute):
					stop()
					b.Fatal("timed out waiting for the scanner to reach the head")
				}
				b.StopTimer()
				took, used := time.Since(start), pgtest.BusyCPU()-startCPU
				// What the batches reported is where the cursor stands (a
				// block committed twice would have stopped the clock early).
				var cursor int64
				if err := clock.Get(&cursor, `SELECT block_number FROM chain_cursors`); err != nil || cursor != int64(sb.To) {
					stop()
					b.Fatalf("the scanner reported the head reached with the cursor at %d (%v), want %d", cursor, err, sb.To)
				}
				scanned += took
				paired = append(paired, bareTook.Seconds()/took.Seconds())
				if bareCPU > 0 && used > 0 {
					cpu = append(cpu, used/bareCPU)
					bound = append(bound, bareTook.Seconds()/(used/float64(runtime.NumCPU())))
				}
				waitUntil(b, clock, `SELECT count(*) = 0 FROM transfers WHERE $1 = ANY (flags)`, scan.FlagBalancePending)
				clock.Close()
				verified += time.Since(start)
				stop()
				<-done
				var stored int
				if err := db.Get(&stored, "SELECT count(*) FROM transfers"); err != nil || stored != benchTransfers {
					b.Fatalf("%d transfers stored (%v)", stored, err)
				}
				src.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(sb.To-sb.From+1)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
			b.ReportMetric(scanned.Seconds()*1000/float64(b.N), "scan-ms")
			b.ReportMetric(verified.Seconds()*1000/float64(b.N), "verified-ms")
			b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MB")
			b.ReportMetric(median(paired), "paired-ratio")
			if len(cpu) > 0 {
				b.ReportMetric(median(cpu), "cpu-ratio")
				b.ReportMetric(median(bound), "cpu-bound-ratio")
			}
		})
	}
}

// headWatch is a scan.Observer that closes done once the batches committed
// add up to blocks: the cursor has reached the end of the range.
type headWatch struct {
	blocks    int64
	committed atomic.Int64
	done      chan struct{}
}

func (w *headWatch) Batch(_ string, blocks, _ int, _ time.Duration) {
	after := w.committed.Add(int64(blocks))
	if before := after - int64(blocks); before < w.blocks && after >= w.blocks {
		close(w.done)
	}
}

func (w *headWatch) StepFailed(string, string) {}

// warmPool opens n connections of db's pool and leaves them idle in it.
func warmPool(b *testing.B, db *sqlx.DB, n int) {
	conns := make([]*sql.Conn, n)
	for i := range conns {
		c, err := db.Conn(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if err := c.PingContext(context.Background()); err != nil {
			b.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		c.Close()
	}
}

// waitUntil polls query (one boolean) every 2 ms until it is true.
func waitUntil(b *testing.B, db *sqlx.DB, query string, args ...any) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var ok bool
		if err := db.Get(&ok, query, args...); err != nil {
			b.Fatal(err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("timed out waiting for %s", query)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// samplePeakHeap records the largest heap in use (the scanner's, the
// node running in a process of its own) until stop closes.
func samplePeakHeap(peak *atomic.Uint64, stop chan struct{}) {
	var m runtime.MemStats
	for {
		select {
		case <-stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
		runtime.ReadMemStats(&m)
		if m.HeapInuse > peak.Load() {
			peak.Store(m.HeapInuse)
		}
	}
}

// median returns the middle of xs (the mean of the two middle ones for an
// even count), sorting xs.
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}
