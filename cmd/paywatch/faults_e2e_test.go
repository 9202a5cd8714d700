//go:build !nodev

package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
	"github.com/paywatch/paywatch/chains/evm/evmtest"
	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

var (
	faultSeed  = flag.Uint64("faults.seed", 0, "seed of the fault-injection tests (0: from the clock; the seed is printed)")
	faultKills = flag.Int("faults.kills", 4, "how many times the kill -9 test kills the daemon")
)

// kill -9 at random points of a catch-up over 2,000 token transfers: each
// restart goes on from what the last committed, and in the end every
// transfer is recorded once, checked, confirmed, and the invariants hold.
// The seed and the kill times are printed; -faults.seed replays a run and
// -faults.kills sets how many kills (the long form: -faults.kills 40).
func TestKillNineDuringCatchUp(t *testing.T) {
	seed, rng := faultRand(0)
	chain := evmtest.New(t)
	usdt := chain.DeployToken("Tether USD", "USDT", 6)
	shop := common.HexToAddress("0x1111111111111111111111111111111111111111")
	start := chain.Head() + 1
	// 2,000 transfers to the shop, 50 to a transaction, among empty blocks.
	const transfers, perTx = 2000, 50
	want := new(big.Int)
	for i := 0; i < transfers/perTx; i++ {
		to, amounts := make([]common.Address, perTx), make([]*big.Int, perTx)
		for j := range to {
			to[j], amounts[j] = shop, big.NewInt(int64(1_000_000+i*perTx+j))
			want.Add(want, amounts[j])
		}
		usdt.BatchTransfer(chain.Payer, to, amounts)
		chain.Mine(1 + rng.IntN(20))
	}
	chain.Mine(5)
	// A node far away that serves 40 blocks of logs at a time: the
	// catch-up takes many batches, and the kills land between and inside
	// them.
	proxy := evmtest.NewProxy(t, chain.URL)
	proxy.MaxLogRange.Store(40)
	proxy.Delay.Store(int64(15 * time.Millisecond))
	dbURL := pgtest.NewURL(t)
	cfg := chainConfig(t, proxy.URL, start, usdt.Address, shop)
	db, err := migrations.Open(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	kills := killRepeatedly(t, cfg, dbURL, rng, func() string {
		var at struct {
			Cursor *int64 `db:"block_number"`
			N      int    `db:"n"`
		}
		if err := db.Get(&at, `SELECT (SELECT block_number FROM chain_cursors) AS block_number, (SELECT count(*) FROM transfers) AS n`); err != nil {
			t.Fatal(err)
		}
		cursor := "none"
		if at.Cursor != nil {
			cursor = fmt.Sprint(*at.Cursor)
		}
		return fmt.Sprintf("cursor %s of %d, %d transfers", cursor, chain.Head(), at.N)
	})
	t.Logf("seed %d: SIGKILL %d times, after: %s", seed, len(kills), strings.Join(kills, "; "))
	d := startDaemon(t, cfg, dbURL)
	var got struct {
		N, Confirmed, Pending, Distinct int
		Sum                             string
	}
	query := `SELECT count(*) AS n, count(*) FILTER (WHERE state = 'confirmed') AS confirmed,
		count(*) FILTER (WHERE 'balance_pending' = ANY (flags)) AS pending,
		count(DISTINCT (tx_hash, tx_key)) AS distinct, coalesce(sum(amount), 0)::text AS sum FROM transfers`
	waitUntil(t, 90*time.Second, "every transfer recorded, checked and confirmed", func() bool {
		if err := db.Get(&got, query); err != nil {
			t.Fatal(err)
		}
		return got.N >= transfers && got.Confirmed == got.N && got.Pending == 0
	})
	if got.N != transfers || got.Distinct != transfers || got.Sum != want.String() {
		t.Fatalf("seed %d: %d transfers (%d distinct) summing %s, want %d summing %s", seed, got.N, got.Distinct, got.Sum, transfers, want)
	}
	if code := d.stop(); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	checkInvariants(t, cfg, dbURL, seed)
	fmt.Printf("kill -9 during catch-up, seed %d: %d kills; nothing lost: %d transfers recorded once each, summing %s\n",
		seed, len(kills), got.N, got.Sum)
}

// The daemon's PostgreSQL sessions are terminated again and again while
// orders are created through the API and payments arrive: a creation is
// either written whole (its order, its timeline's first event, its amount
// slot) or not at all. A session terminated as it commits can lose the
// answer of a creation that was written; the storefront's retry of the
// same request then answers it (200), once. Every order written is one the
// storefront was answered for; the daemon reconnects by itself, every
// payment is found once, and every invariant holds.
func TestSessionsTerminatedUnderLoad(t *testing.T) {
	seed, rng := faultRand(1)
	chain := evmtest.New(t)
	usdt := chain.DeployToken("Tether USD", "USDT", 6)
	shop := common.HexToAddress("0x1111111111111111111111111111111111111111")
	dbURL := pgtest.NewURL(t)
	cfg := chainConfig(t, chain.URL, chain.Head()+1, usdt.Address, shop)
	d := startDaemon(t, cfg, dbURL)
	db, err := migrations.Open(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stop := make(chan struct{})
	killed := make(chan []int, 1)
	var roundsDone atomic.Int64
	go func() {
		var rounds []int
		defer func() { killed <- rounds }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(50+rng.IntN(250)) * time.Millisecond):
			}
			var n int
			_ = db.Get(&n, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid()`)
			rounds = append(rounds, n)
			roundsDone.Add(1)
		}
	}()
	created := map[string]bool{}
	var failed []int // creations answered 5xx, retried once the faults end
	body := func(i int) string {
		return fmt.Sprintf(`{"external_id":"load-%d","network":"devnet","asset":"USDT","amount":"%d"}`, i, 10+i)
	}
	var payments []int64
	for i := 0; (i < 120 || roundsDone.Load() < 10) && i < 2000; i++ {
		code, o := d.call("POST", "/v1/orders", e2eStorefrontKey, body(i))
		switch {
		case code == 201:
			created[fmt.Sprintf("load-%d", i)] = true
			if i%10 == 0 {
				units, err := paywatch.ParseUnits(o["pay_amount"].(string), 6, "USDT", nil)
				if err != nil {
					t.Fatal(err)
				}
				usdt.Transfer(chain.Payer, shop, units)
				payments = append(payments, units.Int64())
				chain.Mine(1)
			}
		case code >= 500:
			failed = append(failed, i)
		default:
			t.Fatalf("create: %d %v", code, o)
		}
	}
	chain.Mine(3)
	close(stop)
	rounds := <-killed
	total := 0
	for _, n := range rounds {
		total += n
	}
	first := len(created)
	// A storefront retries what failed. A session terminated as it
	// committed loses the answer, not the order: the retry of the same
	// request answers it (200), or creates it (201).
	retriedExisting := 0
	for _, i := range failed {
		code, o := d.call("POST", "/v1/orders", e2eStorefrontKey, body(i))
		if code != 200 && code != 201 {
			t.Fatalf("seed %d: the retry of load-%d after the faults: %d %v", seed, i, code, o)
		}
		if code == 200 {
			retriedExisting++
		}
		created[fmt.Sprintf("load-%d", i)] = true
	}
	t.Logf("seed %d: %d rounds terminated %d sessions; %d creations answered 201, %d failed; of those, %d were written (their retry answered 200)",
		seed, len(rounds), total, first, len(failed), retriedExisting)
	if total == 0 || first == 0 {
		t.Fatalf("setup: %d sessions terminated, %d orders created: the test tests nothing", total, first)
	}
	// Every order written is one the storefront was answered for, and whole.
	var rows []struct {
		External string `db:"external_id"`
		Events   int    `db:"events"`
		Slots    int    `db:"slots"`
	}
	if err := db.Select(&rows, `SELECT o.external_id,
		(SELECT count(*) FROM order_events e WHERE e.order_id = o.id AND e.type = 'created') AS events,
		(SELECT count(*) FROM amount_slots s WHERE s.order_id = o.id) AS slots FROM orders o`); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if !created[r.External] || r.Events != 1 || r.Slots != 1 {
			t.Fatalf("seed %d: order %s: answered %v, %d creation events, %d slots", seed, r.External, created[r.External], r.Events, r.Slots)
		}
	}
	if len(rows) != len(created) {
		t.Fatalf("seed %d: %d orders written, %d answered", seed, len(rows), len(created))
	}
	// The daemon reconnected: every payment is found once and settles.
	waitUntil(t, 60*time.Second, "the payments to settle", func() bool {
		var n int
		if err := db.Get(&n, `SELECT count(*) FROM orders WHERE status = 'settled'`); err != nil {
			return false
		}
		return n == len(payments)
	})
	var transfers int
	if err := db.Get(&transfers, `SELECT count(*) FROM transfers`); err != nil || transfers != len(payments) {
		t.Fatalf("seed %d: %d transfers (%v), %d payments", seed, transfers, err, len(payments))
	}
	if code := d.stop(); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	checkInvariants(t, cfg, dbURL, seed)
	fmt.Printf("sessions terminated under load, seed %d: %d sessions in %d rounds; %d orders whole, none partial; %d payments settled once\n",
		seed, total, len(rounds), len(rows), len(payments))
}

var faultDBDown = flag.Duration("faults.dbdown", 5*time.Second, "how long TestDatabaseDown stops PostgreSQL (the long form: 60s)")

// PostgreSQL (a throwaway cluster this test starts, never the shared
// server) stops while orders are created and payments arrive. The daemon
// keeps running: /readyz says it is not ready (503), creations answer 500
// internal (without detail) and write nothing, /metrics says
// paywatch_database_up 0; once the server is back the daemon reconnects by
// itself, is ready again within a second, says paywatch_database_up 1, and
// finds the payments made meanwhile and settles them once.
func TestDatabaseDown(t *testing.T) {
	pg, err := startLocalPostgres(t.Context(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Stop)
	chain := evmtest.New(t)
	usdt := chain.DeployToken("Tether USD", "USDT", 6)
	shop := common.HexToAddress("0x1111111111111111111111111111111111111111")
	cfg := chainConfig(t, chain.URL, chain.Head()+1, usdt.Address, shop)
	d := startDaemon(t, cfg, pg.URL)
	create := func(ext string) (int, map[string]any) {
		return d.call("POST", "/v1/orders", e2eStorefrontKey,
			fmt.Sprintf(`{"external_id":%q,"network":"devnet","asset":"USDT","amount":"25"}`, ext))
	}
	var orders []map[string]any
	for i := range 3 {
		code, o := create(fmt.Sprintf("before-%d", i))
		if code != 201 {
			t.Fatalf("create: %d %v", code, o)
		}
		orders = append(orders, o)
	}
	pay := func(o map[string]any) {
		units, err := paywatch.ParseUnits(o["pay_amount"].(string), 6, "USDT", nil)
		if err != nil {
			t.Fatal(err)
		}
		usdt.Transfer(chain.Payer, shop, units)
		chain.Mine(1)
	}
	pay(orders[0])
	if err := pg.stopServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	// While it is down: payments keep coming, the daemon stays up and says
	// it is not ready, and creations fail without writing.
	pay(orders[1])
	pay(orders[2])
	chain.Mine(3)
	failed := 0
	// The first scrape reads the gauges (no scrape came before): they are
	// then served from the cache for up to 10 s.
	sawDown := false
	for time.Since(down) < *faultDBDown {
		if code, _ := d.call("GET", "/readyz", "", ""); code != 503 {
			t.Fatalf("readyz %d with the database down", code)
		}
		if code, o := create(fmt.Sprintf("during-%d", failed)); code != 500 || fmt.Sprint(o["error"]) != "map[code:internal message:internal error]" {
			t.Fatalf("create with the database down: %d %v, want 500 {\"error\": {\"code\": \"internal\", \"message\": \"internal error\"}}", code, o)
		}
		if strings.Contains(apMetrics(t, d.url), "\npaywatch_database_up 0\n") {
			sawDown = true
		}
		failed++
		select {
		case err := <-d.done:
			t.Fatalf("the daemon exited while the database was down: %v\n%s", err, d.logText())
		case <-time.After(200 * time.Millisecond):
		}
	}
	if !sawDown {
		t.Fatalf("/metrics never said paywatch_database_up 0 while the database was down; now it says %q",
			regexp.MustCompile(`(?m)^paywatch_database_up .*$`).FindString(apMetrics(t, d.url)))
	}
	if err := pg.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	waitUntil(t, 30*time.Second, "the daemon to be ready again", func() bool {
		code, _ := d.call("GET", "/readyz", "", "")
		return code == 200
	})
	ready := time.Since(back)
	if ready > time.Second {
		t.Fatalf("the daemon was ready again %s after the database came back, want within a second", ready.Round(time.Millisecond))
	}
	waitUntil(t, 60*time.Second, "the payments made meanwhile to settle", func() bool {
		for _, o := range orders {
			if _, got := d.call("GET", "/v1/orders/"+o["id"].(string), e2eStorefrontKey, ""); got["status"] != "settled" {
				return false
			}
		}
		return true
	})
	settled := time.Since(back)
	// The gauges are read again once the cached ones are 10 s old.
	waitUntil(t, 15*time.Second, "/metrics to say paywatch_database_up 1", func() bool {
		return strings.Contains(apMetrics(t, d.url), "\npaywatch_database_up 1\n")
	})
	db, err := migrations.Open(t.Context(), pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var written, transfers int
	if err := db.Get(&written, `SELECT count(*) FROM orders WHERE external_id LIKE 'during-%'`); err != nil || written != 0 {
		t.Fatalf("%d orders written while the database was down (%v)", written, err)
	}
	if err := db.Get(&transfers, `SELECT count(*) FROM transfers`); err != nil || transfers != 3 {
		t.Fatalf("%d transfers (%v), want 3", transfers, err)
	}
	if code, o := create("after"); code != 201 {
		t.Fatalf("create after the outage: %d %v", code, o)
	}
	if code := d.stop(); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	fmt.Printf("PostgreSQL down for %s: the daemon stayed up, %d creations refused and none written; ready %s after the server came back, the 2 payments made meanwhile settled %s after\n",
		back.Sub(down).Round(100*time.Millisecond), failed, ready.Round(time.Millisecond), settled.Round(time.Millisecond))
}

// kill -9 at random points of a Bitcoin catch-up over 2,000 payments (20
// transactions of 100 outputs to 20 orders' own addresses, mined while the
// daemon was down): every restart goes on, and in the end every output is
// recorded once, confirmed, and the invariants hold.
func TestKillNineDuringBitcoinCatchUp(t *testing.T) {
	seed, rng := faultRand(2)
	node := btctest.New(t)
	// The node is reached through a link that holds each piece of its
	// answers back 20 ms: the catch-up takes many requests' time, and the
	// kills land inside it.
	proxy := btctest.NewProxy(t, node)
	cfg := bitcoinConfig(t, node, 100)
	raw, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte(strings.Replace(string(raw), node.URL, proxy.URL, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	dbURL := pgtest.NewURL(t)
	d := startDaemon(t, cfg, dbURL)
	var addrs []string
	for i := range 20 {
		code, o := d.call("POST", "/v1/orders", e2eStorefrontKey, fmt.Sprintf(`{"external_id":"btc-%d","network":"btc","asset":"BTC","amount":"0.001"}`, i))
		if code != 201 {
			t.Fatalf("create: %d %v", code, o)
		}
		addrs = append(addrs, o["pay_address"].(string))
	}
	if code := d.stop(); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	const outputs = 2000
	var want int64
	for i := range outputs / 100 {
		outs := make([]btctest.Output, 100)
		for j := range outs {
			outs[j] = btctest.Output{Address: addrs[j%len(addrs)], Sats: int64(1000 + i*100 + j)}
			want += outs[j].Sats
		}
		node.Pay(outs...)
		node.Mine(1 + rng.IntN(5))
	}
	node.Mine(3)
	proxy.Delay.Store(int64(20 * time.Millisecond))
	db, err := migrations.Open(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	kills := killRepeatedly(t, cfg, dbURL, rng, func() string {
		var n int
		if err := db.Get(&n, `SELECT count(*) FROM transfers WHERE state <> 'mempool'`); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%d outputs recorded", n)
	})
	t.Logf("seed %d: SIGKILL %d times, after: %s", seed, len(kills), strings.Join(kills, "; "))
	d = startDaemon(t, cfg, dbURL)
	var got struct {
		N, Confirmed, Distinct int
		Sum                    int64
	}
	waitUntil(t, 90*time.Second, "every output recorded and confirmed", func() bool {
		if err := db.Get(&got, `SELECT count(*) AS n, count(*) FILTER (WHERE state = 'confirmed') AS confirmed,
			count(DISTINCT (tx_hash, tx_key)) AS distinct, coalesce(sum(amount), 0)::bigint AS sum FROM transfers`); err != nil {
			t.Fatal(err)
		}
		return got.N >= outputs && got.Confirmed == got.N
	})
	if got.N != outputs || got.Distinct != outputs || got.Sum != want {
		t.Fatalf("seed %d: %d outputs (%d distinct) summing %d, want %d summing %d", seed, got.N, got.Distinct, got.Sum, outputs, want)
	}
	if code := d.stop(); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	checkInvariants(t, cfg, dbURL, seed)
	fmt.Printf("kill -9 during a Bitcoin catch-up, seed %d: %d kills; nothing lost: %d outputs recorded once each, summing %d sat\n",
		seed, len(kills), got.N, got.Sum)
}

// One network's node is dead: the other network's payments are found and
// settle as usual, and the API answers; the dead one shows its error.
func TestDeadNodeBlocksNoOtherNetwork(t *testing.T) {
	chain := evmtest.New(t)
	usdt := chain.DeployToken("Tether USD", "USDT", 6)
	shop := common.HexToAddress("0x1111111111111111111111111111111111111111")
	cfg := chainConfig(t, chain.URL, chain.Head()+1, usdt.Address, shop)
	raw, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dead := strings.Replace(strings.SplitN(string(raw), "networks:\n", 2)[1], "name: devnet", "name: deadnet", 1)
	dead = strings.Replace(dead, chain.URL, "http://127.0.0.1:9", 1) // nothing listens there
	if err := os.WriteFile(cfg, []byte(string(raw)+dead), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, cfg, pgtest.NewURL(t))
	code, o := d.call("POST", "/v1/orders", e2eStorefrontKey, `{"external_id":"alive-1","network":"devnet","asset":"USDT","amount":"12"}`)
	if code != 201 {
		t.Fatalf("create: %d %v", code, o)
	}
	units, err := paywatch.ParseUnits(o["pay_amount"].(string), 6, "USDT", nil)
	if err != nil {
		t.Fatal(err)
	}
	usdt.Transfer(chain.Payer, shop, units)
	chain.Mine(3)
	waitUntil(t, 30*time.Second, "the live network's payment to settle", func() bool {
		_, got := d.call("GET", "/v1/orders/"+o["id"].(string), e2eStorefrontKey, "")
		return got["status"] == "settled"
	})
	_, n := d.call("GET", "/v1/networks", e2eOperatorKey, "")
	health := map[string]string{}
	for _, x := range n["data"].([]any) {
		v := x.(map[string]any)
		health[v["name"].(string)] = v["health"].(string)
	}
	if health["devnet"] != "ok" || health["deadnet"] != "error" {
		t.Fatalf("health %v, want devnet ok and deadnet error", health)
	}
}

// faultRand returns the fault tests' seed (-faults.seed, or the clock's)
// and a source of random numbers from it, one stream per test.
func faultRand(stream uint64) (uint64, *rand.Rand) {
	seed := *faultSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	return seed, rand.New(rand.NewPCG(seed, stream))
}

// killRepeatedly starts the daemon and kills it with SIGKILL at a random
// moment within 1.5 s, -faults.kills times; it returns each kill's moment
// with what progress said after it.
func killRepeatedly(t *testing.T, cfg, dbURL string, rng *rand.Rand, progress func() string) []string {
	t.Helper()
	var kills []string
	for range *faultKills {
		d := startDaemon(t, cfg, dbURL)
		after := time.Duration(rng.IntN(1500)) * time.Millisecond
		time.Sleep(after)
		if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-d.done
		kills = append(kills, fmt.Sprintf("%s (%s)", after, progress()))
	}
	return kills
}

// checkInvariants runs a last reconciler pass (posting what a stopped
// daemon's had not yet), then paywatch check, which must find every
// invariant holding.
func checkInvariants(t *testing.T, cfg, dbURL string, seed uint64) {
	t.Helper()
	bin, _ := buildBinary()
	once := exec.Command(bin, "reconcile", "--config", cfg, "--once")
	once.Env = daemonEnv(dbURL)
	if out, err := once.CombinedOutput(); err != nil {
		t.Fatalf("reconcile --once: %v\n%s", err, out)
	}
	check := exec.Command(bin, "check", "--config", cfg)
	check.Env = daemonEnv(dbURL)
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("seed %d: invariants: %v\n%s", seed, err, out)
	}
}
