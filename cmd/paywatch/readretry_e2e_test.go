package main

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// The API's reads outlive the pooled connections under them. After every
// connection of the daemon's pools died while idle (a load balancer dropped
// them, the server restarted), each read and /readyz answer at once, from a
// new connection, and each read run again is counted in /metrics
// (paywatch_database_reads_retried_total) and logged. (The look-ups of a
// creation's replay and the gauges of /metrics are tested where they are
// made: TestReplayLooksUpAgainAfterItsConnectionDied,
// TestGaugesOutliveDeadConnections.)
func TestAPIReadsOutliveDeadConnections(t *testing.T) {
	p, viaProxy := pgtest.NewProxy(t, pgtest.NewURL(t))
	d := startDaemon(t, writeConfig(t), viaProxy)
	code, o := d.call("POST", "/v1/orders", e2eStorefrontKey,
		`{"external_id":"dead-conn-1","network":"ethereum","asset":"USDT","amount":"12.5"}`)
	if code != 201 {
		t.Fatalf("create: %d %v", code, o)
	}
	id := o["id"].(string)
	reads := []struct{ path, key string }{
		{"/v1/orders/" + id, e2eStorefrontKey},
		{"/v1/orders?external_id=dead-conn-1", e2eStorefrontKey},
		{"/v1/orders/" + id + "/events", e2eOperatorKey},
		{"/v1/transfers", e2eOperatorKey},
		{"/v1/transfers?matched=false", e2eOperatorKey},
		{"/v1/networks", e2eOperatorKey},
		{"/v1/ledger/balances", e2eOperatorKey},
		{"/v1/webhooks/deliveries", e2eOperatorKey},
	}
	get := func(path, key string) (int, string) {
		req, _ := http.NewRequest("GET", d.url+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(raw)
	}
	for _, r := range reads {
		// The read once on a live connection, which it leaves idle in
		// the pool; then every connection dies.
		if code, body := get(r.path, r.key); code != 200 {
			t.Fatalf("GET %s: %d %s", r.path, code, body)
		}
		p.Reset()
		if code, body := get(r.path, r.key); code != 200 {
			t.Fatalf("GET %s after its connection died: %d %s", r.path, code, body)
		}
	}
	// Readiness too: a load balancer asking /readyz is not told "not
	// ready" because an idle connection was dropped.
	p.Reset()
	if code, body := get("/readyz", ""); code != 200 {
		t.Fatalf("/readyz after the connections died: %d %s", code, body)
	}
	res, err := http.Get(d.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	m := regexp.MustCompile(`(?m)^paywatch_database_reads_retried_total (\d+)$`).FindSubmatch(raw)
	if m == nil {
		t.Fatalf("no paywatch_database_reads_retried_total in /metrics:\n%s", raw)
	}
	// About one for each read (the connection it had used). The daemon's
	// own work may take a dead connection first and lose it mid-transaction,
	// which is not a read run again: at least half.
	if n, _ := strconv.Atoi(string(m[1])); n < len(reads)/2 {
		t.Errorf("paywatch_database_reads_retried_total %d, want at least %d", n, len(reads)/2)
	}
	if logs := d.logText(); !strings.Contains(logs, "a database connection had died; the read runs again on another") {
		t.Errorf("no retry logged:\n%s", logs)
	}
}

// /readyz's two reads (the ping, the schema's version) run again on another
// connection when theirs had died while idle: a load balancer asking is not
// told "not ready" because it dropped an idle connection.
func TestReadinessReadsOutliveDeadConnections(t *testing.T) {
	_, dbURL := pgtest.NewWithURL(t)
	const pooled = 3
	p, db := pgtest.ProxiedPool(t, dbURL, pooled)
	for round := range 3 {
		pgtest.FillPool(t, db, pooled)
		p.Reset()
		if err := scan.NewStore(db).Ping(t.Context()); err != nil {
			t.Fatalf("round %d: the ping after the connections died: %v", round, err)
		}
		pgtest.FillPool(t, db, pooled)
		p.Reset()
		current, latest, err := schemaVersion(db)(t.Context())
		if err != nil || current != latest || current == 0 {
			t.Fatalf("round %d: the schema's version after the connections died: %d of %d (%v)", round, current, latest, err)
		}
	}
}
