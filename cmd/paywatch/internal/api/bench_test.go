package api_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func post(b *testing.B, client *http.Client, url, body string) {
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+storefrontKey)
	res, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		b.Fatalf("status %d", res.StatusCode)
	}
}

// benchmarkCreate creates b.N orders over HTTP from the given number of
// concurrent clients, all on one shared address and a handful of amounts,
// so that unique pay amounts are contended for as in a busy shop.
func benchmarkCreate(b *testing.B, clients int) {
	f := newFixture(b)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				post(b, client, f.srv.URL+"/v1/orders", fmt.Sprintf(
					`{"external_id":"bench-%d","network":"ethereum","asset":"USDT","amount":"%d.50"}`, i, 10+i%20))
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "orders/s")
}

func BenchmarkCreateOrder1(b *testing.B) { benchmarkCreate(b, 1) }
func BenchmarkCreateOrder8(b *testing.B) { benchmarkCreate(b, 8) }

func BenchmarkGetOrder(b *testing.B) {
	f := newFixture(b)
	client := &http.Client{}
	var ids []string
	for i := 0; i < 100; i++ {
		var o orderJSON
		f.do("POST", "/v1/orders", storefrontKey, fmt.Sprintf(`{"external_id":"g-%d","network":"ethereum","asset":"USDT","amount":"1"}`, i)).decode(b, &o)
		ids = append(ids, o.ID)
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		req, _ := http.NewRequest("GET", f.srv.URL+"/v1/orders/"+ids[i%len(ids)], nil)
		req.Header.Set("Authorization", "Bearer "+storefrontKey)
		res, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			b.Fatalf("status %d", res.StatusCode)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "gets/s")
}
