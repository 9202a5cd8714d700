package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/api"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
	"github.com/paywatch/paywatch/ledger"
	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/outbox"
)

const (
	storefrontKey = "sf_test_0123456789abcdef"
	operatorKey   = "op_test_0123456789abcdef"
	vpub          = "vpub5Y6cjg78GGuNLsaPhmYsiw4gYX3HoQiRBiSwDaBXKUafCt9bNwWQiitDk5VZ5BVxYnQdwoTyXSs2JHRPAgjAvtbBrf8ZhDYe2jWAqvZVnsc"
)

const testConfig = `
database_url_env: DB
api_keys:
  - {name: shop, role: storefront, key_env: SF_KEY}
  - {name: alice, role: operator, key_env: OP_KEY}
networks:
  - name: ethereum
    family: evm
    rpc_urls: [http://127.0.0.1:1]
    chain_id: 1337
    confirmations: 3
    assets:
      - symbol: USDT
        contract: "0xdAC17F958D2ee523a2206206994597C13D831ec7"
        decimals: 6
        unique_step: "0.000001"
        max_amount: "1000000"
        receive: {addresses: ["0x1111111111111111111111111111111111111111"]}
      - symbol: ONE
        contract: "0x2222222222222222222222222222222222222222"
        decimals: 2
        unique_step: "0.01"
        unique_slots: 1
        receive: {addresses: ["0x1111111111111111111111111111111111111111"]}
  - name: bitcoin
    family: bitcoin
    rpc_urls: [http://127.0.0.1:2]
    chain: regtest
    confirmations: 2
    assets:
      - symbol: BTC
        native: true
        decimals: 8
        receive: {xpub: "` + vpub + `"}
`

type fixture struct {
	t   testing.TB
	db  *sqlx.DB
	srv *httptest.Server
	// nudges counts the reconciler passes the API asked for.
	nudges *atomic.Int64
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	return newFixtureWith(t, testConfig)
}

// testStore parses the configuration doc with the test keys and returns it
// with an order store over db that takes the smallest free unique amount
// (for the assertions).
func testStore(t testing.TB, db *sqlx.DB, doc string) (*config.Config, *orders.Store) {
	t.Helper()
	cfg, err := config.Parse([]byte(doc), func(k string) string {
		return map[string]string{"DB": "unused", "SF_KEY": storefrontKey, "OP_KEY": operatorKey}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	wallets, err := bitcoin.NewWallets(cfg.Networks)
	if err != nil {
		t.Fatal(err)
	}
	store := orders.NewStore(db, cfg.Orders.MonitoringWindow, wallets)
	store.Rand = func(int) int { return 0 }
	return cfg, store
}

// newFixtureWith serves the API configured by doc over a fresh database.
func newFixtureWith(t testing.TB, doc string) *fixture {
	t.Helper()
	return newFixtureLogged(t, doc, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// newFixtureLogged serves the API configured by doc over a fresh database,
// logging to log.
func newFixtureLogged(t testing.TB, doc string, log *slog.Logger) *fixture {
	t.Helper()
	db := pgtest.New(t)
	cfg, store := testStore(t, db, doc)
	nudges := new(atomic.Int64)
	var h http.Handler = api.New(cfg, api.Deps{Orders: store, Chains: scan.NewStore(db),
		Operator: reconcile.NewOperator(db), Ledger: ledger.NewBook(db), Webhooks: outbox.NewStore(db),
		Metrics: promhttp.Handler(), Nudge: func() { nudges.Add(1) },
		Schema: func(ctx context.Context) (int64, int64, error) { return migrations.Version(ctx, db.DB) }}, log).Handler()
	if _, bench := t.(*testing.B); !bench { // benchmarks measure the API alone
		h = validated(t, h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &fixture{t: t, db: db, srv: srv, nudges: nudges}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) code() string    { c, _ := r.errorBody(); return c }
func (r response) message() string { _, m := r.errorBody(); return m }

func (r response) errorBody() (code, message string) {
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Code, e.Error.Message
}

func (r response) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

func (f *fixture) do(method, path, key, body string, headers ...string) response {
	f.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.srv.URL+path, rd)
	if err != nil {
		f.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return response{status: res.StatusCode, header: res.Header, body: b}
}

// rows counts what requests may write, to prove a rejected one wrote nothing.
func (f *fixture) rows() [4]int {
	var n [4]int
	for i, table := range []string{"orders", "order_events", "webhook_outbox", "amount_slots"} {
		if err := f.db.Get(&n[i], "SELECT count(*) FROM "+table); err != nil {
			f.t.Fatal(err)
		}
	}
	return n
}

type orderJSON struct {
	ID                    string          `json:"id"`
	ExternalID            string          `json:"external_id"`
	Status                string          `json:"status"`
	Amount                string          `json:"amount"`
	PayAmount             string          `json:"pay_amount"`
	PayAddress            string          `json:"pay_address"`
	AssetContract         *string         `json:"asset_contract"`
	DisputeReason         *string         `json:"dispute_reason"`
	CustomerMarkedPaidAt  *string         `json:"customer_marked_paid_at"`
	TxHashHint            *string         `json:"tx_hash_hint"`
	ReceivedAmount        string          `json:"received_amount"`
	RequiredConfirmations int             `json:"required_confirmations"`
	Transfers             []any           `json:"transfers"`
	Metadata              json.RawMessage `json:"metadata"`
	ExpiresAt             string          `json:"expires_at"`
	CreatedAt             string          `json:"created_at"`
}

const createBody = `{"external_id": "kd-2026-000123", "network": "ethereum", "asset": "USDT",
	"amount": "1234.00", "expires_in_seconds": 3600, "metadata": {"plan": "L40S-7d"}}`

func TestCreateAndRead(t *testing.T) {
	f := newFixture(t)
	res := f.do("POST", "/v1/orders", storefrontKey, createBody)
	if res.status != http.StatusCreated {
		t.Fatalf("create: %d %s", res.status, res.body)
	}
	var o orderJSON
	res.decode(t, &o)
	if o.Status != "awaiting_payment" || o.Amount != "1234" || o.PayAmount != "1234" || o.ReceivedAmount != "0" ||
		o.RequiredConfirmations != 3 || o.DisputeReason != nil || o.CustomerMarkedPaidAt != nil ||
		*o.AssetContract != "0xdAC17F958D2ee523a2206206994597C13D831ec7" || !jsonEqual(o.Metadata, `{"plan":"L40S-7d"}`) ||
		o.Transfers == nil {
		t.Fatalf("order %s", res.body)
	}
	// A second order for the same amount pays one step more.
	res2 := f.do("POST", "/v1/orders", storefrontKey, strings.Replace(createBody, "000123", "000124", 1))
	var o2 orderJSON
	res2.decode(t, &o2)
	if res2.status != 201 || o2.PayAmount != "1234.000001" {
		t.Fatalf("second order: %d %s", res2.status, res2.body)
	}
	// Replays return the same order with 200.
	again := f.do("POST", "/v1/orders", storefrontKey, createBody)
	var o3 orderJSON
	again.decode(t, &o3)
	if again.status != 200 || o3.ID != o.ID {
		t.Fatalf("replay: %d %s", again.status, again.body)
	}
	idem := f.do("POST", "/v1/orders", storefrontKey, strings.Replace(createBody, "000123", "000200", 1), "Idempotency-Key", "k-1")
	idem2 := f.do("POST", "/v1/orders", storefrontKey, strings.Replace(createBody, "000123", "000200", 1), "Idempotency-Key", "k-1")
	if idem.status != 201 || idem2.status != 200 {
		t.Fatalf("idempotency key: %d then %d", idem.status, idem2.status)
	}
	// Reads, by either role.
	for _, key := range []string{storefrontKey, operatorKey} {
		got := f.do("GET", "/v1/orders/"+o.ID, key, "")
		if got.status != 200 || !bytes.Equal(got.body, res.body) {
			t.Fatalf("get: %d\n%s\nwant\n%s", got.status, got.body, res.body)
		}
	}
	var list struct {
		Data       []orderJSON `json:"data"`
		NextCursor *string     `json:"next_cursor"`
	}
	f.do("GET", "/v1/orders?external_id=kd-2026-000123", storefrontKey, "").decode(t, &list)
	if len(list.Data) != 1 || list.Data[0].ID != o.ID || list.NextCursor != nil {
		t.Fatalf("by external id: %+v", list)
	}
	f.do("GET", "/v1/orders?limit=2", storefrontKey, "").decode(t, &list)
	if len(list.Data) != 2 || list.NextCursor == nil {
		t.Fatalf("page 1: %+v", list)
	}
	f.do("GET", "/v1/orders?limit=2&cursor="+*list.NextCursor, storefrontKey, "").decode(t, &list)
	if len(list.Data) != 1 || list.Data[0].ID != o.ID || list.NextCursor != nil {
		t.Fatalf("page 2: %+v", list)
	}
	// Per-order address on bitcoin.
	btc := f.do("POST", "/v1/orders", storefrontKey, `{"external_id":"b1","network":"bitcoin","asset":"BTC","amount":"0.0015"}`)
	var b orderJSON
	btc.decode(t, &b)
	if btc.status != 201 || !strings.HasPrefix(b.PayAddress, "bcrt1q") || b.PayAmount != "0.0015" || b.AssetContract != nil {
		t.Fatalf("bitcoin order: %s", btc.body)
	}
}

func TestPaidCancelAndTimeline(t *testing.T) {
	f := newFixture(t)
	var o orderJSON
	f.do("POST", "/v1/orders", storefrontKey, createBody).decode(t, &o)
	hash := "0x" + strings.Repeat("0a", 32)
	res := f.do("POST", "/v1/orders/"+o.ID+"/paid", storefrontKey, `{"tx_hash":"`+hash+`"}`)
	var paid orderJSON
	res.decode(t, &paid)
	if res.status != 200 || paid.CustomerMarkedPaidAt == nil || *paid.TxHashHint != hash {
		t.Fatalf("paid: %d %s", res.status, res.body)
	}
	// Idempotent: body optional, order unchanged.
	res = f.do("POST", "/v1/orders/"+o.ID+"/paid", storefrontKey, "")
	var again orderJSON
	res.decode(t, &again)
	if res.status != 200 || *again.CustomerMarkedPaidAt != *paid.CustomerMarkedPaidAt {
		t.Fatalf("second paid: %s", res.body)
	}
	res = f.do("POST", "/v1/orders/"+o.ID+"/cancel", storefrontKey, "")
	var c orderJSON
	res.decode(t, &c)
	if res.status != 200 || c.Status != "cancelled" {
		t.Fatalf("cancel: %d %s", res.status, res.body)
	}
	var events []struct {
		Type, Actor string
		FromStatus  *string         `json:"from_status"`
		ToStatus    *string         `json:"to_status"`
		Detail      json.RawMessage `json:"detail"`
	}
	ev := f.do("GET", "/v1/orders/"+o.ID+"/events", operatorKey, "")
	ev.decode(t, &events)
	if ev.status != 200 || len(events) != 3 || events[0].Type != "created" || events[1].Type != "customer_marked_paid" ||
		events[2].Type != "status_changed" || *events[2].ToStatus != "cancelled" || events[2].Actor != "shop" {
		t.Fatalf("timeline: %s", ev.body)
	}
	var hooks []string
	if err := f.db.Select(&hooks, "SELECT type FROM webhook_outbox ORDER BY created_at, type"); err != nil ||
		strings.Join(hooks, ",") != "order.customer_marked_paid,order.cancelled" {
		t.Fatalf("outbox %v %v", hooks, err)
	}
}

func TestOperatorViews(t *testing.T) {
	f := newFixture(t)
	var list struct {
		Data []struct {
			Name      string  `json:"name"`
			Head      *int64  `json:"head"`
			Cursor    *int64  `json:"cursor"`
			LastError *string `json:"last_error"`
			Health    string  `json:"health"`
		} `json:"data"`
	}
	res := f.do("GET", "/v1/networks", operatorKey, "")
	res.decode(t, &list)
	if res.status != 200 || len(list.Data) != 2 || list.Data[0].Name != "ethereum" || list.Data[0].Head != nil || list.Data[1].Cursor != nil ||
		list.Data[0].Health != "not_started" || list.Data[1].Health != "not_started" {
		t.Fatalf("networks: %s", res.body)
	}
	res = f.do("GET", "/v1/transfers?matched=false", operatorKey, "")
	if res.status != 200 || string(bytes.TrimSpace(res.body)) != `{"data":[],"next_cursor":null}` {
		t.Fatalf("transfers: %d %s", res.status, res.body)
	}
	pgtest.Exec(t, f.db, `INSERT INTO chain_cursors (network, block_number, block_hash, head, updated_at) VALUES ('ethereum', 100, '0xab', 104, now())`)
	pgtest.Exec(t, f.db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, from_address, to_address,
		amount, block_number, block_hash, state, flags, first_seen_at, updated_at)
		VALUES ('trf_a', 'ethereum', 'USDT', '0xdAC17F958D2ee523a2206206994597C13D831ec7', '0xaa', 'log', 7, '0xfrom',
		'0x1111111111111111111111111111111111111111', 10000317, 102, '0xbb', 'seen', '{dust}', now(), now())`)
	var tr struct {
		Data []struct {
			ID            string   `json:"id"`
			Amount        string   `json:"amount"`
			Confirmations int      `json:"confirmations"`
			Index         int      `json:"index"`
			OrderID       *string  `json:"order_id"`
			Flags         []string `json:"flags"`
		} `json:"data"`
	}
	f.do("GET", "/v1/transfers?matched=false&network=ethereum&state=seen", operatorKey, "").decode(t, &tr)
	if len(tr.Data) != 1 || tr.Data[0].Amount != "10.000317" || tr.Data[0].Confirmations != 3 || tr.Data[0].Index != 7 ||
		tr.Data[0].OrderID != nil || len(tr.Data[0].Flags) != 1 {
		t.Fatalf("transfers: %+v", tr)
	}
	if res := f.do("GET", "/v1/transfers/trf_a", operatorKey, ""); res.status != 200 {
		t.Fatalf("transfer: %d", res.status)
	}
	res = f.do("GET", "/v1/networks", operatorKey, "")
	if !strings.Contains(string(res.body), `"head":104,"cursor":100,"cursor_hash":"0xab","lag_blocks":4,"last_error":null,"health":"ok"`) {
		t.Fatalf("networks after scan: %s", res.body)
	}
}

func TestHealth(t *testing.T) {
	f := newFixture(t)
	for _, p := range []string{"/healthz", "/readyz"} {
		if res := f.do("GET", p, "", ""); res.status != 200 {
			t.Fatalf("%s: %d %s", p, res.status, res.body)
		}
	}
	// A network halted by a reorg too deep turns health red.
	pgtest.Exec(t, f.db, `INSERT INTO chain_cursors (network, last_error, halted, updated_at) VALUES ('ethereum', 'reorg deeper than the kept window', true, now())`)
	res := f.do("GET", "/healthz", "", "")
	if res.status != 503 || !strings.Contains(string(res.body), `"halted_networks":["ethereum"]`) {
		t.Fatalf("healthz with a halted network: %d %s", res.status, res.body)
	}
	res = f.do("GET", "/v1/networks", operatorKey, "")
	if !strings.Contains(string(res.body), `"health":"halted"`) {
		t.Fatalf("networks: %s", res.body)
	}
}

func jsonEqual(a json.RawMessage, b string) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}

func TestAttachResolveAndBalances(t *testing.T) {
	f := newFixture(t)
	var o orderJSON
	f.do("POST", "/v1/orders", storefrontKey, `{"external_id":"a1","network":"ethereum","asset":"USDT","amount":"10"}`).decode(t, &o)
	pgtest.Exec(t, f.db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address,
		amount, block_number, block_hash, state, first_seen_at, updated_at)
		VALUES ('trf_stray', 'ethereum', 'USDT', '0xdAC17F958D2ee523a2206206994597C13D831ec7', '0xaa', 'k', 0,
		'0x1111111111111111111111111111111111111111', 9990000, 5, '0xbb', 'confirmed', now(), now())`)
	res := f.do("POST", "/v1/transfers/trf_stray/attach", operatorKey, `{"order_id":"`+o.ID+`","note":"exchange fee"}`)
	var tr struct {
		OrderID *string `json:"order_id"`
	}
	res.decode(t, &tr)
	if res.status != 200 || tr.OrderID == nil || *tr.OrderID != o.ID {
		t.Fatalf("attach: %d %s", res.status, res.body)
	}
	// An operator's action asks the reconciler for a pass at once.
	if n := f.nudges.Load(); n != 1 {
		t.Fatalf("%d reconciler passes asked for after the attach, want 1", n)
	}
	if res := f.do("POST", "/v1/transfers/trf_stray/attach", operatorKey, `{"order_id":"`+o.ID+`","note":"again"}`); res.status != 409 {
		t.Fatalf("second attach: %d %s", res.status, res.body)
	}
	pgtest.Exec(t, f.db, `UPDATE orders SET status = 'disputed', dispute_reason = 'underpaid' WHERE id = $1`, o.ID)
	res = f.do("POST", "/v1/orders/"+o.ID+"/resolve", operatorKey, `{"outcome":"settled","note":"accept the fee"}`)
	var resolved orderJSON
	res.decode(t, &resolved)
	if res.status != 200 || resolved.Status != "settled" || resolved.ReceivedAmount != "9.99" {
		t.Fatalf("resolve: %d %s", res.status, res.body)
	}
	if n := f.nudges.Load(); n != 2 {
		t.Fatalf("%d reconciler passes asked for after a refused attach and a resolve, want 2", n)
	}
	var events []struct{ Type, Actor string }
	f.do("GET", "/v1/orders/"+o.ID+"/events", operatorKey, "").decode(t, &events)
	if len(events) != 3 || events[1].Type != "transfer_attached" || events[2].Type != "resolved" || events[2].Actor != "alice" {
		t.Fatalf("audit trail %+v", events)
	}
	var bal struct {
		Data []struct{ Account, Network, Asset, Balance string } `json:"data"`
	}
	res = f.do("GET", "/v1/ledger/balances?account_prefix=settled:", operatorKey, "")
	res.decode(t, &bal)
	if res.status != 200 || len(bal.Data) != 1 || bal.Data[0].Account != "settled:ethereum:USDT" || bal.Data[0].Balance != "9.99" {
		t.Fatalf("balances: %s", res.body)
	}
}

// /readyz answers 503 while the database lacks a migration this binary
// knows (a rollout in progress), 200 once every one is applied.
func TestReadyzWantsEveryMigration(t *testing.T) {
	f := newFixture(t)
	if res := f.do("GET", "/readyz", "", ""); res.status != 200 {
		t.Fatalf("readyz: %d %s", res.status, res.body)
	}
	pgtest.Exec(t, f.db, `DELETE FROM goose_db_version WHERE version_id = (SELECT max(version_id) FROM goose_db_version)`)
	res := f.do("GET", "/readyz", "", "")
	if res.status != 503 || !strings.Contains(string(res.body), "migrations pending") {
		t.Fatalf("readyz with a migration missing: %d %s", res.status, res.body)
	}
}

// Deliveries and redelivery (operators only), ETag and 304, and /metrics
// without a key.
func TestWebhookEndpointsETagAndMetrics(t *testing.T) {
	f := newFixture(t)
	var o orderJSON
	f.do("POST", "/v1/orders", storefrontKey, createBody).decode(t, &o)
	f.do("POST", "/v1/orders/"+o.ID+"/paid", storefrontKey, "")
	var list struct {
		Data []struct {
			EventID string `json:"event_id"`
			Type    string `json:"type"`
			Status  string `json:"status"`
		} `json:"data"`
	}
	res := f.do("GET", "/v1/webhooks/deliveries?order_id="+o.ID, operatorKey, "")
	res.decode(t, &list)
	if res.status != 200 || len(list.Data) != 1 || list.Data[0].Type != "order.customer_marked_paid" || list.Data[0].Status != "pending" {
		t.Fatalf("deliveries: %d %s", res.status, res.body)
	}
	if res := f.do("GET", "/v1/webhooks/deliveries", storefrontKey, ""); res.status != 403 {
		t.Fatalf("a storefront key lists deliveries: %d", res.status)
	}
	if res := f.do("GET", "/v1/webhooks/deliveries?status=gone", operatorKey, ""); res.status != 400 {
		t.Fatalf("unknown status: %d", res.status)
	}
	if res := f.do("POST", "/v1/webhooks/events/"+list.Data[0].EventID+"/redeliver", operatorKey, ""); res.status != 200 {
		t.Fatalf("redeliver: %d %s", res.status, res.body)
	}
	if res := f.do("POST", "/v1/webhooks/events/evt_none/redeliver", operatorKey, ""); res.status != 404 {
		t.Fatalf("redeliver an unknown event: %d", res.status)
	}
	if res := f.do("POST", "/v1/webhooks/events/x/redeliver", operatorKey, `{"extra":1}`); res.status != 400 {
		t.Fatalf("redeliver with a body: %d", res.status)
	}

	res = f.do("GET", "/v1/orders/"+o.ID, storefrontKey, "")
	etag := res.header.Get("ETag")
	if res.status != 200 || etag == "" {
		t.Fatalf("GET: %d, ETag %q", res.status, etag)
	}
	if res := f.do("GET", "/v1/orders/"+o.ID, storefrontKey, "", "If-None-Match", etag); res.status != 304 || len(res.body) != 0 {
		t.Fatalf("If-None-Match: %d %s", res.status, res.body)
	}
	if res := f.do("GET", "/v1/orders/"+o.ID, storefrontKey, "", "If-None-Match", `"stale"`); res.status != 200 {
		t.Fatalf("a stale ETag: %d", res.status)
	}
	for _, bad := range []string{"61s", "-1s", "soon", "30"} {
		if res := f.do("GET", "/v1/orders/"+o.ID+"?wait="+bad, storefrontKey, ""); res.status != 400 {
			t.Fatalf("wait=%s: %d", bad, res.status)
		}
	}
	if res := f.do("GET", "/metrics", "", ""); res.status != 200 || !strings.Contains(string(res.body), "go_goroutines") {
		t.Fatalf("metrics: %d", res.status)
	}
}

// The probes answer through a pool of their own: with every connection of
// the API's pool taken (a burst of requests), /healthz, /readyz and
// /metrics still answer at once.
func TestProbesAnswerWhileTheAPIPoolIsExhausted(t *testing.T) {
	db, url := pgtest.NewWithURL(t)
	control, err := migrations.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer control.Close()
	cfg, err := config.Parse([]byte(testConfig), func(k string) string {
		return map[string]string{"DB": "unused", "SF_KEY": storefrontKey, "OP_KEY": operatorKey}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	held, err := db.Conn(context.Background()) // the API pool's only connection, taken
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	wallets, _ := bitcoin.NewWallets(cfg.Networks)
	srv := httptest.NewServer(api.New(cfg, api.Deps{Orders: orders.NewStore(db, time.Hour, wallets), Chains: scan.NewStore(db),
		Probes: scan.NewStore(control), Metrics: promhttp.Handler(),
		Schema: func(ctx context.Context) (int64, int64, error) { return migrations.Version(ctx, control.DB) }},
		slog.New(slog.NewTextHandler(io.Discard, nil))).Handler())
	defer srv.Close()
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		start := time.Now()
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 || time.Since(start) > time.Second {
			t.Fatalf("%s answered %d after %s with the API pool exhausted", path, res.StatusCode, time.Since(start))
		}
	}
}

// A list without limit returns 50 items, and the cursor to the rest.
func TestListLimitDefaultsTo50(t *testing.T) {
	f := newFixture(t)
	for i := range 51 {
		if res := f.do("POST", "/v1/orders", storefrontKey,
			fmt.Sprintf(`{"external_id":"many-%d","network":"ethereum","asset":"USDT","amount":"%d"}`, i, i+1)); res.status != 201 {
			t.Fatalf("create: %d %s", res.status, res.body)
		}
	}
	var list struct {
		Data       []json.RawMessage `json:"data"`
		NextCursor *string           `json:"next_cursor"`
	}
	f.do("GET", "/v1/orders", storefrontKey, "").decode(t, &list)
	if len(list.Data) != 50 || list.NextCursor == nil {
		t.Fatalf("%d orders on the first page (next cursor %v), want 50 and a cursor", len(list.Data), list.NextCursor)
	}
	f.do("GET", "/v1/orders?cursor="+*list.NextCursor, storefrontKey, "").decode(t, &list)
	if len(list.Data) != 1 || list.NextCursor != nil {
		t.Fatalf("%d orders on the second page (next cursor %v), want 1 and none", len(list.Data), list.NextCursor)
	}
}
