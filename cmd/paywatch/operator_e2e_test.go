package main

import (
	"encoding/json"
	"math/big"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/paywatch/paywatch/chains/evm/evmtest"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// cli runs an operator command of the real binary against d.
func (d *daemonProcess) cli(key string, args ...string) (string, int) {
	d.t.Helper()
	bin, _ := buildBinary()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "PAYWATCH_API="+d.url, "PAYWATCH_API_KEY="+key)
	out, _ := cmd.CombinedOutput()
	return string(out), cmd.ProcessState.ExitCode()
}

// An operator works a payment that matched nothing from the terminal: the
// inbox, attach with a note, the dossier and its timeline, resolve; with
// tables, --json, and exit codes.
func TestOperatorCommands(t *testing.T) {
	chain := evmtest.New(t)
	usdt := chain.DeployToken("Tether USD", "USDT", 6)
	shop := common.HexToAddress("0x1111111111111111111111111111111111111111")
	d := startDaemon(t, chainConfig(t, chain.URL, chain.Head(), usdt.Address, shop), pgtest.NewURL(t))
	code, order := d.call("POST", "/v1/orders", e2eStorefrontKey,
		`{"external_id":"gpu-cli","network":"devnet","asset":"USDT","amount":"10"}`)
	if code != 201 {
		t.Fatalf("create: %d %v", code, order)
	}
	id := order["id"].(string)
	usdt.Transfer(chain.Payer, shop, big.NewInt(12_000_000)) // not the pay amount: matches nothing
	chain.Mine(3)
	waitUntil(t, 30*time.Second, "the payment in the inbox", func() bool { return len(d.transfers()) == 1 })

	out, rc := d.cli(e2eOperatorKey, "transfers", "list", "--unmatched")
	if rc != 0 || !strings.Contains(out, "ID") || !strings.Contains(out, "12") || !strings.Contains(out, "trf_") {
		t.Fatalf("transfers list --unmatched (%d):\n%s", rc, out)
	}
	var inbox struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	out, rc = d.cli(e2eOperatorKey, "transfers", "list", "--unmatched", "--json")
	if rc != 0 || json.Unmarshal([]byte(out), &inbox) != nil || len(inbox.Data) != 1 {
		t.Fatalf("transfers list --json (%d):\n%s", rc, out)
	}
	trf := inbox.Data[0].ID

	if out, rc = d.cli(e2eOperatorKey, "transfers", "attach", trf, "--order", id); rc != 2 || !strings.Contains(out, "--note") {
		t.Fatalf("attach without a note (%d):\n%s", rc, out)
	}
	if out, rc = d.cli(e2eOperatorKey, "transfers", "attach", trf, "--order", id, "--note", "customer sent 12 by mistake"); rc != 0 ||
		!strings.Contains(out, "attached "+trf+" to "+id) {
		t.Fatalf("attach (%d):\n%s", rc, out)
	}
	waitUntil(t, 30*time.Second, "the order disputed as overpaid", func() bool {
		_, o := d.call("GET", "/v1/orders/"+id, e2eStorefrontKey, "")
		return o["status"] == "disputed"
	})
	out, rc = d.cli(e2eOperatorKey, "orders", "show", id)
	for _, want := range []string{"status:", "disputed", "overpaid", "Timeline:", "transfer_attached", "customer sent 12 by mistake", "ops", trf} {
		if !strings.Contains(out, want) {
			t.Fatalf("orders show lacks %q (%d):\n%s", want, rc, out)
		}
	}
	out, rc = d.cli(e2eOperatorKey, "orders", "list", "--status", "disputed")
	if rc != 0 || !strings.Contains(out, id) || !strings.Contains(out, "overpaid") {
		t.Fatalf("orders list (%d):\n%s", rc, out)
	}
	if out, rc = d.cli(e2eOperatorKey, "resolve", id, "--outcome", "settled", "--note", "kept the 2 as credit"); rc != 0 ||
		!strings.Contains(out, "is settled") {
		t.Fatalf("resolve (%d):\n%s", rc, out)
	}
	var shown struct {
		Order  map[string]any   `json:"order"`
		Events []map[string]any `json:"events"`
	}
	out, rc = d.cli(e2eOperatorKey, "orders", "show", id, "--json")
	if rc != 0 || json.Unmarshal([]byte(out), &shown) != nil || shown.Order["status"] != "settled" || len(shown.Events) < 4 {
		t.Fatalf("orders show --json (%d):\n%s", rc, out)
	}
	if out, rc = d.cli(e2eOperatorKey, "networks"); rc != 0 || !strings.Contains(out, "devnet") || !strings.Contains(out, "ok") {
		t.Fatalf("networks (%d):\n%s", rc, out)
	}
	if out, rc = d.cli(e2eOperatorKey, "webhooks", "list", "--order", id); rc != 0 || !strings.Contains(out, "order.disputed") {
		t.Fatalf("webhooks list (%d):\n%s", rc, out)
	}
	// No webhook URL here: nothing was sent, nothing failed; an operator
	// may queue an event again, and the order's timeline says so.
	if out, rc = d.cli(e2eOperatorKey, "webhooks", "list", "--status", "failed"); rc != 0 || strings.Contains(out, "order.") {
		t.Fatalf("webhooks list --status failed (%d):\n%s", rc, out)
	}
	if out, rc = d.cli(e2eOperatorKey, "webhooks", "list", "--order", id, "--status", "pending"); rc != 0 ||
		!strings.Contains(out, "order.disputed") || strings.Contains(out, "delivered") {
		t.Fatalf("without webhooks.url the events wait, pending, unsent (%d):\n%s", rc, out)
	}
	var hooks page
	out, rc = d.cli(e2eOperatorKey, "webhooks", "list", "--order", id, "--json")
	if rc != 0 || json.Unmarshal([]byte(out), &hooks) != nil || len(hooks.Data) == 0 {
		t.Fatalf("webhooks list --json (%d):\n%s", rc, out)
	}
	evt := str(hooks.Data[0]["event_id"])
	if out, rc = d.cli(e2eOperatorKey, "webhooks", "redeliver", evt); rc != 0 || !strings.Contains(out, "event "+evt) || !strings.Contains(out, "queued for delivery") {
		t.Fatalf("webhooks redeliver (%d):\n%s", rc, out)
	}
	if out, rc = d.cli(e2eOperatorKey, "orders", "show", id); rc != 0 || !strings.Contains(out, "webhook_redelivered") {
		t.Fatalf("the timeline after a redelivery (%d):\n%s", rc, out)
	}
	if out, rc = d.cli(e2eOperatorKey, "webhooks", "redeliver", "evt_nope"); rc != 1 || !strings.Contains(out, "not_found") {
		t.Fatalf("redeliver an unknown event (%d):\n%s", rc, out)
	}

	// Errors: exit 1 with the API's word; usage errors exit 2; help exits 0.
	if out, rc = d.cli(e2eOperatorKey, "orders", "show", "ord_nope"); rc != 1 || !strings.Contains(out, "not_found") {
		t.Fatalf("unknown order (%d):\n%s", rc, out)
	}
	if out, rc = d.cli(e2eStorefrontKey, "transfers", "list"); rc != 1 || !strings.Contains(out, "forbidden") {
		t.Fatalf("a storefront key (%d):\n%s", rc, out)
	}
	if out, rc = d.cli("", "networks"); rc != 2 || !strings.Contains(out, "PAYWATCH_API_KEY") {
		t.Fatalf("no key (%d):\n%s", rc, out)
	}
	if out, rc = d.cli(e2eOperatorKey, "resolve", id, "--outcome", "settled", "--note", "again"); rc != 1 || !strings.Contains(out, "invalid_state") {
		t.Fatalf("resolve a settled order (%d):\n%s", rc, out)
	}
	for _, args := range [][]string{{"orders", "--help"}, {"transfers", "attach", "--help"}, {"networks", "-h"}} {
		if out, rc = d.cli(e2eOperatorKey, args...); rc != 0 || !strings.Contains(out, "paywatch") {
			t.Fatalf("%v (%d):\n%s", args, rc, out)
		}
	}
}
