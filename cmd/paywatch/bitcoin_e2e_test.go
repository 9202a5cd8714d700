package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

// bitcoinConfig writes a configuration watching node (regtest, per-order
// addresses from reconciletest.VPub, 2 confirmations).
func bitcoinConfig(t testing.TB, node *btctest.Node, gapLimit int) string {
	t.Helper()
	doc := fmt.Sprintf(`
listen: 127.0.0.1:0
database_url_env: PAYWATCH_DATABASE_URL
api_keys:
  - {name: storefront, role: storefront, key_env: PAYWATCH_STOREFRONT_KEY}
  - {name: ops, role: operator, key_env: PAYWATCH_OPERATOR_KEY}
reconciler: {schedule: "@every 1m"}
networks:
  - name: btc
    family: bitcoin
    rpc_urls: [%s]
    rpc_user_env: PAYWATCH_BTC_RPC_USER
    rpc_pass_env: PAYWATCH_BTC_RPC_PASS
    rpc_cert_file: %s
    chain: regtest
    confirmations: 2
    poll_interval: 200ms
    start_block: %d
    assets:
      - {symbol: BTC, native: true, decimals: 8, receive: {xpub: "%s", gap_limit: %d}}
`, node.URL, node.Credentials.CertFile, node.Height(), reconciletest.VPub, gapLimit)
	cfg := filepath.Join(t.TempDir(), "paywatch.yaml")
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The daemon pointed at a btcd regtest node: an order's own address is
// paid, the order shows "payment detected" (confirming, 0 confirmations,
// the payment in the mempool) within seconds, and settles after the
// configured confirmations; GET /v1/networks shows the run of unpaid
// derived addresses against the gap limit.
func TestBitcoinOrderDetectedThenSettled(t *testing.T) {
	node := btctest.New(t)
	cfg := bitcoinConfig(t, node, 3)
	d := startDaemon(t, cfg, pgtest.NewURL(t))
	code, order := d.call("POST", "/v1/orders", e2eStorefrontKey, `{"external_id":"gpu-btc-1","network":"btc","asset":"BTC","amount":"0.0015"}`)
	if code != 201 {
		t.Fatalf("create: %d %v", code, order)
	}
	id, addr := order["id"].(string), order["pay_address"].(string)
	get := func() map[string]any {
		_, o := d.call("GET", "/v1/orders/"+id, e2eStorefrontKey, "")
		return o
	}
	paid := time.Now()
	txid := node.Pay(btctest.Output{Address: addr, Sats: 150_000})
	waitUntil(t, 10*time.Second, "payment detected", func() bool {
		o := get()
		trs, _ := o["transfers"].([]any)
		return o["status"] == "confirming" && len(trs) == 1 && trs[0].(map[string]any)["state"] == "mempool"
	})
	t.Logf("payment detected %s after it was sent", time.Since(paid).Round(time.Millisecond))
	o := get()
	tr := o["transfers"].([]any)[0].(map[string]any)
	if tr["tx_hash"] != txid || tr["block_number"] != nil || tr["confirmations"].(float64) != 0 ||
		o["confirmations"].(float64) != 0 || o["received_amount"] != "0" {
		t.Fatalf("detected order %v", o)
	}
	node.Mine(1)
	waitUntil(t, 10*time.Second, "one confirmation", func() bool {
		o := get()
		trs, _ := o["transfers"].([]any)
		return len(trs) == 1 && trs[0].(map[string]any)["state"] == "seen" && o["confirmations"].(float64) == 1
	})
	if o := get(); o["status"] != "confirming" || o["received_amount"] != "0.0015" {
		t.Fatalf("after one block: %v", o)
	}
	node.Mine(1)
	waitUntil(t, 10*time.Second, "settled", func() bool { return get()["status"] == "settled" })

	// Three more orders, unpaid: the run of unpaid addresses reaches the
	// gap limit.
	for i := 2; i <= 4; i++ {
		if code, o := d.call("POST", "/v1/orders", e2eStorefrontKey,
			fmt.Sprintf(`{"external_id":"gpu-btc-%d","network":"btc","asset":"BTC","amount":"0.001"}`, i)); code != 201 {
			t.Fatalf("create: %d %v", code, o)
		}
	}
	code, nets := d.call("GET", "/v1/networks", e2eOperatorKey, "")
	if code != 200 {
		t.Fatalf("networks: %d %v", code, nets)
	}
	n := nets["data"].([]any)[0].(map[string]any)
	gaps, _ := n["addresses"].([]any)
	if n["health"] != "ok" || len(gaps) != 1 {
		t.Fatalf("network %v", n)
	}
	g := gaps[0].(map[string]any)
	if g["xpub"] != reconciletest.VPub[:12]+"…"+reconciletest.VPub[len(reconciletest.VPub)-6:] || g["addresses_given"].(float64) != 4 || g["last_paid_index"].(float64) != 0 ||
		g["unpaid_run"].(float64) != 3 || g["gap_limit"].(float64) != 3 || g["over_gap_limit"] != true {
		t.Fatalf("gap %v", g)
	}
}
