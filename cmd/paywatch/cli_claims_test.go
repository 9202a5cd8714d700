package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/api"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
	"github.com/paywatch/paywatch/ledger"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/outbox"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

const cliConfig = `
database_url_env: DB
api_keys:
  - {name: shop, role: storefront, key_env: SF_KEY}
  - {name: ops, role: operator, key_env: OP_KEY}
networks:
  - name: bitcoin
    family: bitcoin
    rpc_urls: [http://127.0.0.1:2]
    chain: regtest
    confirmations: 1
    assets:
      - {symbol: BTC, native: true, decimals: 8, receive: {xpub: "` + reconciletest.VPub + `"}}
`

// cliAPI is the API served in-process over a fresh database, with the
// reconciler that moves its orders.
type cliAPI struct {
	t     *testing.T
	url   string
	db    *sqlx.DB
	store *orders.Store
	rec   *reconcile.Reconciler
}

func newCLIAPI(t *testing.T) *cliAPI {
	t.Helper()
	db := pgtest.New(t)
	cfg, err := config.Parse([]byte(cliConfig), func(k string) string {
		return map[string]string{"DB": "unused", "SF_KEY": e2eStorefrontKey, "OP_KEY": e2eOperatorKey}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	wallets, err := bitcoin.NewWallets(cfg.Networks)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := orders.NewStore(db, cfg.Orders.MonitoringWindow, wallets)
	srv := httptest.NewServer(api.New(cfg, api.Deps{Orders: store, Chains: scan.NewStore(db), Operator: reconcile.NewOperator(db),
		Ledger: ledger.NewBook(db), Webhooks: outbox.NewStore(db)}, log).Handler())
	t.Cleanup(srv.Close)
	// The scanner has recorded block 0: orders are created at that height.
	pgtest.Exec(t, db, `INSERT INTO chain_cursors (network, head, block_number, updated_at) VALUES ('bitcoin', 0, 0, now())`)
	return &cliAPI{t: t, url: srv.URL, db: db, store: store,
		rec: reconcile.New(db, log, cfg.Orders.PaidGrace, 8*24*time.Hour)}
}

// cli runs an operator command in-process with the given environment and
// returns what it printed and its exit code.
func cli(vars map[string]string, args ...string) (string, int) {
	var out bytes.Buffer
	code := run(context.Background(), args, &out, &out, func(k string) string { return vars[k] })
	return out.String(), code
}

// README ("Operating it"): "The operator commands talk to a running
// daemon's API (`--api URL`, default `$PAYWATCH_API` or
// `http://127.0.0.1:8080`)". Without either the commands use
// http://127.0.0.1:8080; $PAYWATCH_API replaces it, and --api wins over
// both; a command reaches the daemon through $PAYWATCH_API alone.
func TestOperatorCommandsAPIDefaultsToPAYWATCH_APIThenLocalhost8080(t *testing.T) {
	for _, c := range []struct {
		env  string
		args []string
		want string
	}{
		{"", nil, "http://127.0.0.1:8080"},
		{"http://10.1.2.3:9000/", nil, "http://10.1.2.3:9000"},
		{"http://10.1.2.3:9000", []string{"--api", "https://paywatch.internal"}, "https://paywatch.internal"},
		{"", []string{"--api", "http://[::1]:8081"}, "http://[::1]:8081"},
	} {
		var errs bytes.Buffer
		e := &env{stdout: io.Discard, stderr: &errs, getenv: func(k string) string {
			return map[string]string{"PAYWATCH_API": c.env, "PAYWATCH_API_KEY": e2eOperatorKey}[k]
		}}
		op, _, err := opFlags(e, "networks", c.args, nil)
		if err != nil || op.api != c.want {
			t.Fatalf("PAYWATCH_API=%q %v: the commands call %q (%v %s), want %q", c.env, c.args, opAPI(op), err, errs.String(), c.want)
		}
	}
	// --help tells the default in force.
	for env, want := range map[string]string{"": `(default "http://127.0.0.1:8080")`, "http://10.9.8.7:1234": `(default "http://10.9.8.7:1234")`} {
		out, code := cli(map[string]string{"PAYWATCH_API": env}, "networks", "--help")
		if code != exitOK || !strings.Contains(out, "-api string") || !strings.Contains(out, want) {
			t.Fatalf("paywatch networks --help with PAYWATCH_API=%q (exit %d) does not say %s:\n%s", env, code, want, out)
		}
	}

	// A real call: $PAYWATCH_API reaches the daemon, and --api overrides a
	// $PAYWATCH_API where nothing answers.
	d := newCLIAPI(t)
	out, code := cli(map[string]string{"PAYWATCH_API": d.url, "PAYWATCH_API_KEY": e2eOperatorKey}, "networks")
	if code != exitOK || !strings.Contains(out, "NETWORK") || !strings.Contains(out, "bitcoin") {
		t.Fatalf("paywatch networks with PAYWATCH_API=%s (exit %d):\n%s", d.url, code, out)
	}
	dead := "http://127.0.0.1:9" // nothing listens there
	out, code = cli(map[string]string{"PAYWATCH_API": dead, "PAYWATCH_API_KEY": e2eOperatorKey}, "networks", "--api", d.url)
	if code != exitOK || !strings.Contains(out, "bitcoin") {
		t.Fatalf("paywatch networks --api %s with PAYWATCH_API=%s (exit %d):\n%s", d.url, dead, code, out)
	}
	if out, code = cli(map[string]string{"PAYWATCH_API": dead, "PAYWATCH_API_KEY": e2eOperatorKey}, "networks"); code != exitError ||
		!strings.Contains(out, "127.0.0.1:9") {
		t.Fatalf("paywatch networks with PAYWATCH_API=%s, where nothing answers (exit %d), does not say where it called:\n%s", dead, code, out)
	}
}

func opAPI(c *opClient) string {
	if c == nil {
		return ""
	}
	return c.api
}

type timelineEvent struct {
	Type       string  `json:"type"`
	FromStatus *string `json:"from_status"`
	ToStatus   *string `json:"to_status"`
	Detail     struct {
		Why        *string `json:"why"`
		ReplacedBy *string `json:"replaced_by"`
		TxHash     *string `json:"tx_hash"`
		Cause      *string `json:"cause"`
		Reason     *string `json:"reason"`
	} `json:"detail"`
}

func (d *cliAPI) order(external string) *paywatch.Order {
	d.t.Helper()
	var o struct {
		ID string `json:"id"`
	}
	req, _ := http.NewRequest("POST", d.url+"/v1/orders", strings.NewReader(
		`{"external_id":"`+external+`","network":"bitcoin","asset":"BTC","amount":"0.001"}`))
	req.Header.Set("Authorization", "Bearer "+e2eStorefrontKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer res.Body.Close()
	if err := json.NewDecoder(res.Body).Decode(&o); err != nil || res.StatusCode != http.StatusCreated {
		d.t.Fatalf("create: %d %v", res.StatusCode, err)
	}
	got, err := d.store.Get(context.Background(), o.ID)
	if err != nil {
		d.t.Fatal(err)
	}
	return got
}

// sight records a mempool sighting of the order's whole amount, as the
// Bitcoin mempool watcher does.
func (d *cliAPI) sight(o *paywatch.Order, id, tx string) {
	pgtest.Exec(d.t, d.db, `INSERT INTO mempool_transfers (id, network, asset, tx_hash, tx_key, idx, to_address, amount,
		first_seen_at, updated_at) VALUES ($1, 'bitcoin', 'BTC', $2, 'vout:0', 0, $3, $4, now(), now())`,
		id, tx, o.PayAddress, o.PayAmount.String())
}

// gone marks a sighting missing from the mempool at the scanner's height
// (since missingFor), replaced by another transaction or not, as the
// watcher does.
func (d *cliAPI) gone(tx, replacedBy string, missingFor time.Duration) {
	pgtest.Exec(d.t, d.db, `UPDATE mempool_transfers m SET missing_at_height = c.block_number,
		missing_since = now() - make_interval(secs => $3), replaced_by = NULLIF($2, ''), dirty = true
		FROM chain_cursors c WHERE c.network = m.network AND m.tx_hash = $1`, tx, replacedBy, missingFor.Seconds())
}

func (d *cliAPI) pass() {
	d.t.Helper()
	if _, err := d.rec.Pass(context.Background()); err != nil {
		d.t.Fatal(err)
	}
}

func (d *cliAPI) status(o *paywatch.Order) paywatch.Status {
	d.t.Helper()
	got, err := d.store.Get(context.Background(), o.ID)
	if err != nil {
		d.t.Fatal(err)
	}
	return got.Status
}

// events reads GET /v1/orders/{id}/events.
func (d *cliAPI) events(o *paywatch.Order) ([]timelineEvent, string) {
	d.t.Helper()
	req, _ := http.NewRequest("GET", d.url+"/v1/orders/"+o.ID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+e2eOperatorKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var evs []timelineEvent
	if err := json.Unmarshal(raw, &evs); err != nil || res.StatusCode != http.StatusOK {
		d.t.Fatalf("GET /v1/orders/%s/events: %d %s", o.ID, res.StatusCode, raw)
	}
	return evs, string(raw)
}

func find(evs []timelineEvent, typ, from, to string) *timelineEvent {
	for i := range evs {
		e := &evs[i]
		if e.Type == typ && (from == "" || (e.FromStatus != nil && *e.FromStatus == from)) &&
			(to == "" || (e.ToStatus != nil && *e.ToStatus == to)) {
			return e
		}
	}
	return nil
}

func text(p *string) string {
	if p == nil {
		return "(none)"
	}
	return *p
}

// lineWith returns the line of out that holds every one of words, or "".
func lineWith(out string, words ...string) string {
	for _, l := range strings.Split(out, "\n") {
		all := true
		for _, w := range words {
			all = all && strings.Contains(l, w)
		}
		if all {
			return l
		}
	}
	return ""
}

// README ("Operating it", Disputes): the timeline shows "`payment_withdrawn`
// (with why: `replaced`, with `replaced_by`, or `dropped`), `status_changed`
// (with a `cause` such as `reorg` or `payment_withdrawn`)". Payments
// detected in the mempool, then replaced, or dropped, and a settled payment
// a reorg takes away: GET /v1/orders/{id}/events and `paywatch orders show`
// (table and --json) carry these details.
func TestTimelineShowsWhyPaymentsWereWithdrawnAndWhatCausedStatusChanges(t *testing.T) {
	d := newCLIAPI(t)
	replaced, dropped, reorged := d.order("withdrawn-replaced"), d.order("withdrawn-dropped"), d.order("reorged")

	// Two payments detected in the mempool.
	d.sight(replaced, "mpt_replaced", "txreplaced")
	d.sight(dropped, "mpt_dropped", "txdropped")
	// A payment mined and confirmed.
	pgtest.Exec(t, d.db, `INSERT INTO transfers (id, network, asset, tx_hash, tx_key, idx, to_address, amount,
		block_number, block_hash, block_time, state, first_seen_at, updated_at)
		VALUES ('trf_reorged', 'bitcoin', 'BTC', 'txreorged', 'vout:0', 0, $1, $2, 1, '0xb1', now(), 'confirmed', now(), now())`,
		reorged.PayAddress, reorged.PayAmount.String())
	pgtest.Exec(t, d.db, `UPDATE chain_cursors SET head = 1, block_number = 1 WHERE network = 'bitcoin'`)
	d.pass()
	for o, want := range map[*paywatch.Order]paywatch.Status{replaced: paywatch.StatusConfirming, dropped: paywatch.StatusConfirming,
		reorged: paywatch.StatusSettled} {
		if got := d.status(o); got != want {
			t.Fatalf("order %s is %s before the withdrawals and the reorg, want %s", o.ExternalID, got, want)
		}
	}

	// One is replaced by a transaction paying elsewhere (RBF); the other
	// leaves the mempool and stays away for a block and over a minute; a
	// reorg takes the third one's payment away.
	d.gone("txreplaced", "txelsewhere", 0)
	d.gone("txdropped", "", 2*reconcile.DroppedAfter)
	pgtest.Exec(t, d.db, `UPDATE chain_cursors SET head = 2, block_number = 2 WHERE network = 'bitcoin'`)
	pgtest.Exec(t, d.db, `UPDATE transfers SET state = 'orphaned', ledger_dirty = true WHERE id = 'trf_reorged'`)
	d.pass()
	for o, want := range map[*paywatch.Order]paywatch.Status{replaced: paywatch.StatusAwaitingPayment,
		dropped: paywatch.StatusAwaitingPayment, reorged: paywatch.StatusDisputed} {
		if got := d.status(o); got != want {
			t.Fatalf("order %s is %s after the withdrawals and the reorg, want %s", o.ExternalID, got, want)
		}
	}
	if err := reconcile.CheckInvariants(context.Background(), d.db); err != nil {
		t.Fatalf("invariants: %v", err)
	}

	// The API's timelines.
	for _, c := range []struct {
		o              *paywatch.Order
		why, replaceBy string
	}{{replaced, "replaced", "txelsewhere"}, {dropped, "dropped", ""}} {
		evs, raw := d.events(c.o)
		w := find(evs, "payment_withdrawn", "", "")
		if w == nil || text(w.Detail.Why) != c.why || text(w.Detail.TxHash) != "tx"+c.why ||
			(c.replaceBy == "") != (w.Detail.ReplacedBy == nil) || (c.replaceBy != "" && *w.Detail.ReplacedBy != c.replaceBy) {
			t.Fatalf("%s: the timeline's payment_withdrawn does not say why %q (replaced_by %q):\n%s", c.o.ExternalID, c.why, c.replaceBy, raw)
		}
		if s := find(evs, "status_changed", "confirming", "awaiting_payment"); s == nil || text(s.Detail.Cause) != "payment_withdrawn" {
			t.Fatalf("%s: the timeline's move back to awaiting_payment does not give the cause payment_withdrawn:\n%s", c.o.ExternalID, raw)
		}
	}
	evs, raw := d.events(reorged)
	if s := find(evs, "status_changed", "settled", "disputed"); s == nil || text(s.Detail.Cause) != "reorg" ||
		text(s.Detail.Reason) != "orphaned_payment" {
		t.Fatalf("reorged: the timeline's move from settled does not give the cause reorg:\n%s", raw)
	}

	// The operator's terminal: the same details, in the table and in --json.
	vars := map[string]string{"PAYWATCH_API": d.url, "PAYWATCH_API_KEY": e2eOperatorKey}
	out, code := cli(vars, "orders", "show", replaced.ID)
	if code != exitOK || lineWith(out, "payment_withdrawn", `"why":"replaced"`, `"replaced_by":"txelsewhere"`) == "" ||
		lineWith(out, "status_changed", "confirming → awaiting_payment", `"cause":"payment_withdrawn"`) == "" {
		t.Fatalf("paywatch orders show %s (exit %d) lacks why the payment was withdrawn or the cause of the move:\n%s", replaced.ExternalID, code, out)
	}
	out, code = cli(vars, "orders", "show", dropped.ID)
	if l := lineWith(out, "payment_withdrawn", `"why":"dropped"`); code != exitOK || l == "" || strings.Contains(l, "replaced_by") {
		t.Fatalf("paywatch orders show %s (exit %d) lacks why the payment was withdrawn:\n%s", dropped.ExternalID, code, out)
	}
	out, code = cli(vars, "orders", "show", reorged.ID)
	if code != exitOK || lineWith(out, "status_changed", "settled → disputed", `"cause":"reorg"`) == "" {
		t.Fatalf("paywatch orders show %s (exit %d) lacks the cause reorg:\n%s", reorged.ExternalID, code, out)
	}
	var shown struct {
		Events []timelineEvent `json:"events"`
	}
	out, code = cli(vars, "orders", "show", reorged.ID, "--json")
	if err := json.Unmarshal([]byte(out), &shown); code != exitOK || err != nil {
		t.Fatalf("paywatch orders show --json (exit %d): %v\n%s", code, err, out)
	}
	if s := find(shown.Events, "status_changed", "settled", "disputed"); s == nil || text(s.Detail.Cause) != "reorg" {
		t.Fatalf("paywatch orders show --json lacks the cause reorg:\n%s", out)
	}
}
