package main

import (
	"net/http"
	"os"
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
	path := writeConfig(t)
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(doc, "database_api_conns: 2\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, path, dbURL)
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
}
