package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paywatch/paywatch/migrations/pgtest"
)

// The API's requests share a pool of database_api_conns connections of
// their own (README, "Configuration"): under a burst of 32 concurrent
// readers every request is answered, and the daemon never holds more than
// that many sessions named paywatch-api, while the leases keep theirs.
func TestAPIRequestsShareAPoolOfTheirOwn(t *testing.T) {
	db, dbURL := pgtest.NewWithURL(t)
	d := startDaemon(t, withAPIConns(t, 2), dbURL)
	code, o := d.call("POST", "/v1/orders", e2eStorefrontKey, `{"external_id":"pool-1","network":"ethereum","asset":"USDT","amount":"5"}`)
	if code != 201 {
		t.Fatalf("create: %d %v", code, o)
	}
	id := o["id"].(string)

	sessions := func(name string) int {
		var n int
		if err := db.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`, name); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var most atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if n := int64(sessions("paywatch-api")); n > most.Load() {
				most.Store(n)
			}
		}
	}()
	var wg sync.WaitGroup
	var answered, failed atomic.Int64
	for range 32 {
		wg.Go(func() {
			for range 25 {
				req, _ := http.NewRequest("GET", d.url+"/v1/orders/"+id, nil)
				req.Header.Set("Authorization", "Bearer "+e2eStorefrontKey)
				res, err := http.DefaultClient.Do(req)
				if err != nil || res.StatusCode != 200 {
					failed.Add(1)
				} else {
					answered.Add(1)
				}
				if res != nil {
					res.Body.Close()
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	if answered.Load() != 32*25 || failed.Load() != 0 {
		t.Fatalf("%d requests answered, %d failed, want all 800 answered", answered.Load(), failed.Load())
	}
	if n := most.Load(); n < 1 || n > 2 {
		t.Fatalf("the API held %d sessions at most under load, want 1 or 2 (database_api_conns: 2)", n)
	}
	if n := sessions("paywatch-api"); n > 2 {
		t.Fatalf("%d API sessions after the load, want at most 2", n)
	}
	if n := sessions("paywatch-control"); n == 0 {
		t.Fatal("no paywatch-control session: the leases and probes have no pool of their own")
	}
	if n := sessions("paywatch"); n == 0 {
		t.Fatal("no paywatch session: the reconciler and the scanners have no pool of their own")
	}
	// /metrics tells each pool's size and its waits (README, Metrics).
	text := apMetrics(t, d.url)
	for _, want := range []string{`go_sql_max_open_connections{db_name="paywatch-api"} 2`,
		`go_sql_max_open_connections{db_name="paywatch"} 20`, `go_sql_wait_count_total{db_name="paywatch-api"} `,
		`go_sql_wait_duration_seconds_total{db_name="paywatch-api"} `, `go_sql_in_use_connections{db_name="paywatch-control"} `} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	var waits float64
	if _, err := fmt.Sscan(strings.SplitN(strings.SplitN(text, `go_sql_wait_count_total{db_name="paywatch-api"} `, 2)[1], "\n", 2)[0], &waits); err != nil || waits == 0 {
		t.Errorf("800 requests from 32 clients through 2 connections, and %v waits for one counted (%v)", waits, err)
	}
}

// withAPIConns writes the test configuration with database_api_conns: n.
func withAPIConns(t *testing.T, n int) string {
	t.Helper()
	path := writeConfig(t)
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, fmt.Appendf(doc, "database_api_conns: %d\n", n), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A request never waits for a second connection of the API's pool while
// it holds one: with a pool of one connection, every kind of request,
// many at once, is answered. (A creation that prepared its statements on
// the pool from inside its transaction waited forever once the pool's
// every connection was held by a creation doing the same: with 4
// connections and 50 clients, wrk saw no answer in 10 s.)
func TestEveryRequestIsAnsweredWithOneAPIConnection(t *testing.T) {
	d := startDaemon(t, withAPIConns(t, 1), pgtest.NewURL(t))
	client := &http.Client{Timeout: 20 * time.Second}
	call := func(method, path, key, body string) (int, string) {
		req, _ := http.NewRequest(method, d.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(raw)
	}
	// One order of each kind first, for the requests about an order.
	code, body := call("POST", "/v1/orders", e2eStorefrontKey, `{"external_id":"one-usdt","network":"ethereum","asset":"USDT","amount":"5"}`)
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	usdt := strings.Split(strings.Split(body, `"id":"`)[1], `"`)[0]
	code, body = call("POST", "/v1/orders", e2eStorefrontKey, `{"external_id":"one-btc","network":"bitcoin","asset":"BTC","amount":"0.001"}`)
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	btc := strings.Split(strings.Split(body, `"id":"`)[1], `"`)[0]

	type request struct {
		method, path, key, body string
		want                    int
	}
	var requests []request
	for i := range 12 {
		requests = append(requests,
			request{"POST", "/v1/orders", e2eStorefrontKey, fmt.Sprintf(`{"external_id":"usdt-%d","network":"ethereum","asset":"USDT","amount":"5"}`, i), 201},
			request{"POST", "/v1/orders", e2eStorefrontKey, fmt.Sprintf(`{"external_id":"eth-%d","network":"ethereum","asset":"ETH","amount":"0.01"}`, i), 201},
			request{"POST", "/v1/orders", e2eStorefrontKey, fmt.Sprintf(`{"external_id":"btc-%d","network":"bitcoin","asset":"BTC","amount":"0.001"}`, i), 201},
			request{"POST", "/v1/orders", e2eStorefrontKey, `{"external_id":"one-usdt","network":"ethereum","asset":"USDT","amount":"5"}`, 200},
			request{"GET", "/v1/orders/" + usdt, e2eStorefrontKey, "", 200},
			request{"GET", "/v1/orders/" + btc + "?wait=0s", e2eStorefrontKey, "", 200},
			request{"GET", "/v1/orders?network=ethereum&limit=5", e2eStorefrontKey, "", 200},
			request{"GET", "/v1/orders/" + usdt + "/events", e2eOperatorKey, "", 200},
			request{"GET", "/v1/transfers?matched=false", e2eOperatorKey, "", 200},
			request{"GET", "/v1/ledger/balances", e2eOperatorKey, "", 200},
			request{"GET", "/v1/networks", e2eOperatorKey, "", 200},
			request{"GET", "/v1/webhooks/deliveries", e2eOperatorKey, "", 200},
		)
	}
	// The operator's writes, on orders and ids that refuse them: answered
	// all the same (want 0: any answer).
	requests = append(requests,
		request{"POST", "/v1/orders/" + usdt + "/paid", e2eStorefrontKey, `{"tx_hash":"0x` + strings.Repeat("2e", 32) + `"}`, 200},
		request{"POST", "/v1/orders/" + btc + "/cancel", e2eStorefrontKey, "", 200},
		request{"POST", "/v1/orders/" + usdt + "/resolve", e2eOperatorKey, `{"outcome":"cancelled","note":"test"}`, 0},
		request{"POST", "/v1/transfers/trf_missing/attach", e2eOperatorKey, `{"order_id":"` + usdt + `","note":"test"}`, 0},
		request{"POST", "/v1/webhooks/events/1/redeliver", e2eOperatorKey, "", 0},
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	failures := make(chan string, len(requests))
	for _, r := range requests {
		wg.Go(func() {
			if code, body := call(r.method, r.path, r.key, r.body); code == 0 || (r.want != 0 && code != r.want) {
				failures <- fmt.Sprintf("%s %s: %d %s, want %d", r.method, r.path, code, body, r.want)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("requests still unanswered after two minutes")
	}
	close(failures)
	for f := range failures {
		t.Error(f)
	}
}
