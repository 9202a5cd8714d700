package main

import (
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/evm/evmtest"
	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

func chainConfig(t *testing.T, chainURL string, start uint64, usdt common.Address, shop common.Address) string {
	t.Helper()
	doc := fmt.Sprintf(`
listen: 127.0.0.1:0
database_url_env: PAYWATCH_DATABASE_URL
api_keys:
  - {name: storefront, role: storefront, key_env: PAYWATCH_STOREFRONT_KEY}
  - {name: ops, role: operator, key_env: PAYWATCH_OPERATOR_KEY}
networks:
  - name: devnet
    family: evm
    rpc_urls: [%s]
    chain_id: %d
    confirmations: 2
    poll_interval: 100ms
    start_block: %d
    assets:
      - {symbol: ETH, native: true, decimals: 18, unique_step: "0.000001", receive: {addresses: ["%s"]}}
      - {symbol: USDT, contract: "%s", decimals: 6, unique_step: "0.000001", receive: {addresses: ["%s"]}}
`, chainURL, evmtest.ChainID, start, shop.Hex(), usdt.Hex(), shop.Hex())
	path := filepath.Join(t.TempDir(), "paywatch.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (d *daemonProcess) transfers() []any {
	d.t.Helper()
	code, body := d.call("GET", "/v1/transfers?network=devnet&limit=500", e2eOperatorKey, "")
	if code != 200 {
		d.t.Fatalf("transfers: %d %v", code, body)
	}
	return body["data"].([]any)
}

func (d *daemonProcess) logText() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.logs.String()
}

// Two daemons share one database and watch the simulated chain: payments
// show up once in GET /v1/transfers; when the daemon holding the scanner's
// lease is killed with SIGKILL, the other takes over and nothing is missed
// or doubled.
func TestPaymentsSeenAcrossDaemonKill(t *testing.T) {
	chain := evmtest.New(t)
	usdt := chain.DeployToken("Tether USD", "USDT", 6)
	shop := common.HexToAddress("0x1111111111111111111111111111111111111111")
	dbURL := pgtest.NewURL(t)
	cfg := chainConfig(t, chain.URL, chain.Head(), usdt.Address, shop)

	a := startDaemon(t, cfg, dbURL)
	b := startDaemon(t, cfg, dbURL)
	pay := func(n int64) common.Hash {
		h := usdt.Transfer(chain.Payer, shop, big.NewInt(n))
		chain.Mine(1)
		return h
	}
	code, order := a.call("POST", "/v1/orders", e2eStorefrontKey,
		`{"external_id":"gpu-1","network":"devnet","asset":"USDT","amount":"1234.000317"}`)
	if code != 201 {
		t.Fatalf("create: %d %v", code, order)
	}
	// The pay amount is the amount plus a unique increment drawn at random.
	payAmount, _ := order["pay_amount"].(string)
	units, err := paywatch.ParseUnits(payAmount, 6, "USDT", nil)
	if err != nil || units.Int64() < 1_234_000_317 || units.Int64() >= 1_234_000_317+10_000 {
		t.Fatalf("pay amount %q (%v) is not 1234.000317 plus one of 10,000 increments", payAmount, err)
	}
	first := pay(units.Int64())
	waitUntil(t, 30*time.Second, "the payment in GET /v1/transfers", func() bool { return len(a.transfers()) == 1 })
	got := a.transfers()[0].(map[string]any)
	if got["tx_hash"] != first.Hex() || got["amount"] != payAmount || got["asset"] != "USDT" || got["to"] != shop.Hex() {
		t.Fatalf("transfer %v", got)
	}
	chain.Mine(2)
	waitUntil(t, 30*time.Second, "confirmations", func() bool {
		tr := b.transfers()
		return len(tr) == 1 && tr[0].(map[string]any)["state"] == "confirmed" && tr[0].(map[string]any)["confirmations"].(float64) >= 2
	})
	// The order settles, with its one transfer and its confirmations.
	waitUntil(t, 30*time.Second, "the order to settle", func() bool {
		_, o := b.call("GET", "/v1/orders/"+order["id"].(string), e2eStorefrontKey, "")
		return o["status"] == "settled"
	})
	_, settled := a.call("GET", "/v1/orders/"+order["id"].(string), e2eStorefrontKey, "")
	trs := settled["transfers"].([]any)
	if len(trs) != 1 || trs[0].(map[string]any)["tx_hash"] != first.Hex() || settled["confirmations"].(float64) < 2 ||
		settled["received_amount"] != payAmount {
		t.Fatalf("settled order %v", settled)
	}

	// The scanner's holder: the daemon whose log says it took the lease
	// scan:devnet (each also takes others, the reconciler's among them);
	// exactly one of the two does.
	const scanLease = `msg="lease taken; running" lease=scan:devnet`
	holder, standby := a, b
	if strings.Contains(b.logText(), scanLease) {
		holder, standby = b, a
	}
	if !strings.Contains(holder.logText(), scanLease) || strings.Contains(standby.logText(), scanLease) {
		t.Fatalf("not exactly one daemon holds the scanner's lease:\n%s\n%s", a.logText(), b.logText())
	}
	if err := holder.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-holder.done
	killed := time.Now()
	second := pay(2_000_000)
	eth := chain.SendETH(chain.Payer, shop, big.NewInt(3e15))
	chain.Mine(1)
	waitUntil(t, 30*time.Second, "takeover by the standby daemon", func() bool { return len(standby.transfers()) == 3 })
	t.Logf("standby took over and caught up %s after the kill", time.Since(killed).Round(time.Millisecond))
	seen := map[string]int{}
	for _, tr := range standby.transfers() {
		seen[tr.(map[string]any)["tx_hash"].(string)]++
	}
	for _, h := range []common.Hash{first, second, eth} {
		if seen[h.Hex()] != 1 {
			t.Fatalf("tx %s seen %d times: %v", h.Hex(), seen[h.Hex()], seen)
		}
	}
	if code, n := standby.call("GET", "/v1/networks", e2eOperatorKey, ""); code != 200 ||
		n["data"].([]any)[0].(map[string]any)["health"] != "ok" {
		t.Fatalf("networks: %v", n)
	}
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// paywatch rescan rewinds a network's cursor through the real binary.
func TestRescanCommand(t *testing.T) {
	chain := evmtest.New(t)
	usdt := chain.DeployToken("Tether USD", "USDT", 6)
	shop := common.HexToAddress("0x1111111111111111111111111111111111111111")
	dbURL := pgtest.NewURL(t)
	cfg := chainConfig(t, chain.URL, chain.Head(), usdt.Address, shop)
	d := startDaemon(t, cfg, dbURL)
	usdt.Transfer(chain.Payer, shop, big.NewInt(5_000_000))
	chain.Mine(3)
	waitUntil(t, 30*time.Second, "the payment", func() bool { return len(d.transfers()) == 1 })
	bin, _ := buildBinary()
	from := chain.Head() - 2
	cmd := exec.Command(bin, "rescan", "--config", cfg, "--network", "devnet", "--from", fmt.Sprint(from))
	cmd.Env = daemonEnv(dbURL)
	out, err := cmd.CombinedOutput()
	// The rewind took the payment away (it is above the new cursor)…
	if err != nil || !strings.Contains(string(out), fmt.Sprintf("devnet rewound to block %d", from-1)) ||
		!strings.Contains(string(out), "; 1 transfers above it are orphaned") {
		t.Fatalf("rescan: %v\n%s", err, out)
	}
	// …and the daemon scans the range again: the same transfer, found again
	// in its block (not a second one), confirmed once more, the cursor back
	// at the head.
	waitUntil(t, 30*time.Second, "the rescan", func() bool {
		tr := d.transfers()
		return len(tr) == 1 && tr[0].(map[string]any)["state"] == "confirmed"
	})
	db, err := migrations.Open(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var cursor int64
	var orphanedAt *time.Time
	if err := db.QueryRow(`SELECT block_number FROM chain_cursors WHERE network = 'devnet'`).Scan(&cursor); err != nil || uint64(cursor) < chain.Head() {
		t.Fatalf("cursor %d after the rescan (%v), head %d", cursor, err, chain.Head())
	}
	if err := db.QueryRow(`SELECT orphaned_at FROM transfers`).Scan(&orphanedAt); err != nil || orphanedAt != nil {
		t.Fatalf("the transfer found again still carries orphaned_at %v (%v)", orphanedAt, err)
	}
	bad := exec.Command(bin, "rescan", "--config", cfg, "--network", "nope", "--from", "1")
	bad.Env = daemonEnv(dbURL)
	if out, _ := bad.CombinedOutput(); bad.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "not configured") {
		t.Fatalf("rescan of an unknown network: %s", out)
	}
}
