package api_test

import (
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// BenchmarkGetOrder16 reads orders by id over 16 connections at once, as a
// checkout page's traffic would, and reports the rate and the p50/p99
// latency (README "Benchmarks": beside pgbench -S with 16 clients).
func BenchmarkGetOrder16(b *testing.B) {
	f := newFixture(b)
	var ids []string
	for i := 0; i < 100; i++ {
		var o orderJSON
		f.do("POST", "/v1/orders", storefrontKey, fmt.Sprintf(`{"external_id":"g-%d","network":"ethereum","asset":"USDT","amount":"1"}`, i)).decode(b, &o)
		ids = append(ids, o.ID)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, MaxConnsPerHost: 16}}
	var mu sync.Mutex
	var lat []time.Duration
	var n atomic.Int64
	b.SetParallelism((16 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			i := n.Add(1)
			req, _ := http.NewRequest("GET", f.srv.URL+"/v1/orders/"+ids[int(i)%len(ids)], nil)
			req.Header.Set("Authorization", "Bearer "+storefrontKey)
			t0 := time.Now()
			res, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			mine = append(mine, time.Since(t0))
			if res.StatusCode != 200 {
				b.Errorf("status %d", res.StatusCode)
				return
			}
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "gets/s")
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	}
}

// BenchmarkCreate1000 creates 1,000 orders at once from 50 clients, on one
// shared address and on four, and reports the rate and the p50/p99
// latency of a creation (README "Benchmarks"). Run it with -benchtime 1x.
func BenchmarkCreate1000(b *testing.B) {
	four := `receive: {addresses: ["0x1111111111111111111111111111111111111111", "0x3333333333333333333333333333333333333333",
          "0x4444444444444444444444444444444444444444", "0x5555555555555555555555555555555555555555"]}`
	for _, c := range []struct {
		name string
		doc  string
	}{
		{"addresses=1", testConfig},
		{"addresses=4", strings.Replace(testConfig, `receive: {addresses: ["0x1111111111111111111111111111111111111111"]}`, four, 1)},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				f := newFixtureWith(b, c.doc)
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 50, MaxConnsPerHost: 50}}
				lat := make([]time.Duration, 1000)
				var next atomic.Int64
				var wg sync.WaitGroup
				b.StartTimer()
				start := time.Now()
				for range 50 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							i := next.Add(1) - 1
							if i >= int64(len(lat)) {
								return
							}
							t0 := time.Now()
							post(b, client, f.srv.URL+"/v1/orders", fmt.Sprintf(
								`{"external_id":"c-%d","network":"ethereum","asset":"USDT","amount":"%d.50"}`, i, 10+i%20))
							lat[i] = time.Since(t0)
						}
					}()
				}
				wg.Wait()
				elapsed := time.Since(start)
				slices.Sort(lat)
				b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "orders/s")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			}
		})
	}
}
