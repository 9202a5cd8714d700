package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/getkin/kin-openapi/openapi3"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/evm/evmtest"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/api"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/webhook"
)

// hook is a storefront's webhook receiver.
type hook struct {
	t   *testing.T
	mu  sync.Mutex
	got []hookDelivery
	srv *httptest.Server
}

type hookDelivery struct {
	raw   []byte
	at    time.Time
	event webhook.Event
	order map[string]any
}

func newHook(t *testing.T, secret string) *hook {
	h := &hook{t: t}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		body, _ := io.ReadAll(r.Body)
		if err := webhook.Verify(secret, r.Header.Get(webhook.Header), body, time.Minute); err != nil {
			t.Errorf("webhook with a bad signature: %v", err)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var e webhook.Event
		var o map[string]any
		if err := json.Unmarshal(body, &e); err != nil || json.Unmarshal(e.Order, &o) != nil {
			t.Errorf("undecodable webhook %s", body)
		}
		h.mu.Lock()
		h.got = append(h.got, hookDelivery{raw: body, at: at, event: e, order: o})
		h.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hook) deliveries() []hookDelivery {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hookDelivery(nil), h.got...)
}

func (h *hook) find(typ string) *hookDelivery {
	for _, d := range h.deliveries() {
		if d.event.Type == typ {
			return &d
		}
	}
	return nil
}

// A storefront follows an order live with one long-poll and gets every
// status change by signed webhook, each within a second of the change; an
// operator lists the deliveries and redelivers one.
func TestWebhooksAndLiveStatus(t *testing.T) {
	chain := evmtest.New(t)
	usdt := chain.DeployToken("Tether USD", "USDT", 6)
	shop := common.HexToAddress("0x1111111111111111111111111111111111111111")
	dbURL := pgtest.NewURL(t)
	receiver := newHook(t, "whsec_e2e")
	cfg := chainConfig(t, chain.URL, chain.Head(), usdt.Address, shop)
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("webhooks:\n  url: " + receiver.srv.URL + "/paywatch\n  secret_env: PAYWATCH_WEBHOOK_SECRET\n  allow_private_networks: true\n")
	f.Close()
	d := startDaemon(t, cfg, dbURL)

	code, order := d.call("POST", "/v1/orders", e2eStorefrontKey,
		`{"external_id":"gpu-live","network":"devnet","asset":"USDT","amount":"25"}`)
	if code != 201 {
		t.Fatalf("create: %d %v", code, order)
	}
	id := order["id"].(string)
	path := "/v1/orders/" + id

	// ETag and If-None-Match.
	req, _ := http.NewRequest("GET", d.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+e2eStorefrontKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	etag := resp.Header.Get("ETag")
	if resp.StatusCode != 200 || etag == "" {
		t.Fatalf("GET: %d, ETag %q", resp.StatusCode, etag)
	}
	req.Header.Set("If-None-Match", etag)
	if resp, err = http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNotModified {
		t.Fatalf("conditional GET: %v %v", resp.StatusCode, err)
	}
	resp.Body.Close()

	// A long-poll with nothing happening answers 304 when its wait ends.
	start := time.Now()
	short, _ := http.NewRequest("GET", d.url+path+"?wait=1s", nil)
	short.Header = req.Header.Clone()
	if resp, err = http.DefaultClient.Do(short); err != nil || resp.StatusCode != http.StatusNotModified ||
		time.Since(start) < time.Second {
		t.Fatalf("idle long-poll: %v %v after %s", resp.StatusCode, err, time.Since(start))
	}
	resp.Body.Close()

	// The checkout page long-polls; the customer pays.
	type answer struct {
		at     time.Time
		status int
		order  map[string]any
		etag   string
	}
	poll := func(etag string) chan answer {
		c := make(chan answer, 1)
		go func() {
			r, _ := http.NewRequest("GET", d.url+path+"?wait=30s", nil)
			r.Header.Set("Authorization", "Bearer "+e2eStorefrontKey)
			r.Header.Set("If-None-Match", etag)
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Error(err)
				c <- answer{}
				return
			}
			defer resp.Body.Close()
			var o map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&o)
			c <- answer{at: time.Now(), status: resp.StatusCode, order: o, etag: resp.Header.Get("ETag")}
		}()
		return c
	}
	first := poll(etag)
	time.Sleep(300 * time.Millisecond)
	units, _ := paywatch.ParseUnits(order["pay_amount"].(string), 6, "USDT", nil)
	usdt.Transfer(chain.Payer, shop, units)
	chain.Mine(1)
	// Each answer is a change (the payment matched, then the order
	// confirming); the page polls again with the new ETag.
	var a answer
	for c := first; ; c = poll(a.etag) {
		select {
		case a = <-c:
		case <-time.After(30 * time.Second):
			t.Fatal("the long-poll did not answer after the payment")
		}
		if a.status != 200 || a.etag == etag {
			t.Fatalf("long-poll answered %d %v (etag %s)", a.status, a.order["status"], a.etag)
		}
		if a.order["status"] == "confirming" {
			break
		}
		etag = a.etag
	}
	changedAt := d.eventAt(id, "confirming")
	if lag := a.at.Sub(changedAt); lag > time.Second {
		t.Fatalf("the long-poll answered %s after the order changed", lag)
	}
	t.Logf("long-poll answered %s after the change", a.at.Sub(changedAt).Round(time.Millisecond))

	// Follow it to settled, one long-poll after another.
	etag = a.etag
	chain.Mine(2)
	deadline := time.Now().Add(30 * time.Second)
	for a.order["status"] != "settled" && time.Now().Before(deadline) {
		a = <-poll(etag)
		etag = a.etag
	}
	if a.order["status"] != "settled" {
		t.Fatalf("order %v", a.order)
	}

	// Webhooks: confirming then settled, each the order as it was then,
	// each within a second of its event.
	waitUntil(t, 10*time.Second, "the settled webhook", func() bool { return receiver.find("order.settled") != nil })
	for _, typ := range []string{"order.confirming", "order.settled"} {
		got := receiver.find(typ)
		if got == nil {
			t.Fatalf("no %s webhook", typ)
		}
		if want := typ[len("order."):]; got.order["status"] != want || got.order["id"] != id {
			t.Fatalf("%s webhook carries order %v", typ, got.order)
		}
		if lag := got.at.Sub(got.event.CreatedAt); lag > time.Second {
			t.Fatalf("%s webhook left %s after its event", typ, lag)
		}
		t.Logf("%s webhook delivered %s after its event", typ, got.at.Sub(got.event.CreatedAt).Round(time.Millisecond))
	}

	// Each body is what the OpenAPI document says a WebhookEvent is.
	raw, err := api.OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range receiver.deliveries() {
		var v any
		if err := json.Unmarshal(got.raw, &v); err != nil {
			t.Fatal(err)
		}
		if err := doc.Components.Schemas["WebhookEvent"].Value.VisitJSON(v); err != nil {
			t.Fatalf("webhook body does not fit the document: %v\n%s", err, got.raw)
		}
	}

	// Operators: deliveries, then a redelivery of the same event.
	// (The sender records a delivery once the receiver has answered.)
	var list map[string]any
	waitUntil(t, 10*time.Second, "both deliveries recorded", func() bool {
		code, l := d.call("GET", "/v1/webhooks/deliveries?order_id="+id+"&status=delivered", e2eOperatorKey, "")
		list = l
		return code == 200 && len(l["data"].([]any)) == 2
	})
	settled := list["data"].([]any)[0].(map[string]any)
	if settled["status"] != "delivered" || settled["type"] != "order.settled" || settled["attempts"].(float64) != 1 ||
		settled["last_status_code"].(float64) != 200 || settled["delivered_at"] == nil {
		t.Fatalf("delivery %v", settled)
	}
	if code, _ := d.call("GET", "/v1/webhooks/deliveries", e2eStorefrontKey, ""); code != 403 {
		t.Fatalf("a storefront key lists deliveries: %d", code)
	}
	if code, _ := d.call("GET", "/v1/webhooks/deliveries?status=lost", e2eOperatorKey, ""); code != 400 {
		t.Fatalf("unknown status filter: %d", code)
	}
	if code, _ := d.call("POST", "/v1/webhooks/events/evt_nope/redeliver", e2eOperatorKey, ""); code != 404 {
		t.Fatalf("redeliver an unknown event: %d", code)
	}
	// The metrics tell the same story.
	res, err := http.Get(d.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{`paywatch_orders{status="settled"} 1`, `paywatch_webhook_attempts_total{outcome="delivered"} 2`,
		`paywatch_network_lag_blocks{network="devnet"}`, `paywatch_webhook_backlog{status="pending"} 0`,
		`paywatch_scan_blocks_total{network="devnet"}`, `paywatch_transfers_seen_total{network="devnet"} 1`,
		`paywatch_reconcile_pass_seconds_count`, `paywatch_database_up 1`,
		// Every metric README lists is there.
		`paywatch_network_head{network="devnet"}`, `paywatch_network_cursor{network="devnet"}`,
		`paywatch_network_halted{network="devnet"} 0`, `paywatch_network_error{network="devnet"} 0`,
		`paywatch_scan_batch_seconds_count{network="devnet"}`, `paywatch_reconcile_failures_total 0`,
		`paywatch_webhook_oldest_pending_seconds 0`, `paywatch_webhook_latency_seconds_count`} {
		if !strings.Contains(string(text), want) {
			t.Fatalf("/metrics lacks %s:\n%s", want, text)
		}
	}
	evt := settled["event_id"].(string)
	if code, body := d.call("POST", "/v1/webhooks/events/"+evt+"/redeliver", e2eOperatorKey, ""); code != 200 {
		t.Fatalf("redeliver: %d %v", code, body)
	}
	waitUntil(t, 10*time.Second, "the redelivery", func() bool {
		n := 0
		for _, g := range receiver.deliveries() {
			if g.event.ID == evt {
				n++
			}
		}
		return n == 2
	})
	audited := false
	for _, e := range d.timeline(id) {
		if e["type"] == "webhook_redelivered" && e["actor"] == "ops" {
			audited = true
		}
	}
	if !audited {
		t.Fatalf("the redelivery is not on the timeline: %v", d.timeline(id))
	}
}

// eventAt is when the order's timeline recorded its move to status.
func (d *daemonProcess) eventAt(id, status string) time.Time {
	d.t.Helper()
	events := d.timeline(id)
	for _, m := range events {
		if m["type"] == "status_changed" && m["to_status"] == status {
			at, err := time.Parse(time.RFC3339Nano, m["at"].(string))
			if err != nil {
				d.t.Fatal(err)
			}
			return at
		}
	}
	d.t.Fatalf("no move to %s on the timeline: %v", status, events)
	return time.Time{}
}

// timeline is GET /v1/orders/{id}/events.
func (d *daemonProcess) timeline(id string) []map[string]any {
	d.t.Helper()
	req, _ := http.NewRequest("GET", d.url+"/v1/orders/"+id+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+e2eOperatorKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer res.Body.Close()
	var events []map[string]any
	if err := json.NewDecoder(res.Body).Decode(&events); err != nil || res.StatusCode != 200 {
		d.t.Fatalf("timeline: %d %v", res.StatusCode, err)
	}
	return events
}
