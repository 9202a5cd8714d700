package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// apMetrics scrapes the daemon at base and returns the exposition text.
func apMetrics(t *testing.T, base string) string {
	t.Helper()
	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("scrape /metrics: %v", err)
	}
	defer res.Body.Close()
	text, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("scrape /metrics: %d %v", res.StatusCode, err)
	}
	return string(text)
}

// apScanErrors matches a scan error counter of network ethereum.
var apScanErrors = regexp.MustCompile(`(?m)^paywatch_scan_errors_total\{kind="(\w+)",network="ethereum"\} (\d+)$`)

// README (Metrics): "paywatch_scan_errors_total{kind} (timeout,
// connection, …)". serve, whose EVM node refuses connections, counts its
// failed scan steps in /metrics under kind "connection".
func TestScanErrorsAppearInMetricsByKind(t *testing.T) {
	d := inProcessDaemon(t, slog.New(slog.NewTextHandler(io.Discard, nil))) // ethereum's node: 127.0.0.1:9, where nothing listens
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()
	defer func() { stop(); <-ran }()
	base := "http://" + d.listener.Addr().String()
	var text string
	waitUntil(t, 15*time.Second, "a connection error of ethereum's scanner counted in /metrics", func() bool {
		text = apMetrics(t, base)
		for _, m := range apScanErrors.FindAllStringSubmatch(text, -1) {
			if n, _ := strconv.Atoi(m[2]); m[1] == "connection" && n > 0 {
				return true
			}
		}
		return false
	})
	t.Logf("%v", apScanErrors.FindAllString(text, -1))
}

// README: "Delivery starts within a second of the event (a PostgreSQL
// notification wakes the sender; …)". serve's webhook sender listens for
// notifications on the daemon's database.
func TestServeWebhookSenderListensForNotifications(t *testing.T) {
	d := inProcessDaemon(t, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if d.sender == nil || d.sender.DSN == "" || d.sender.DSN != d.cfg.DatabaseURL {
		t.Fatalf("serve's webhook sender listens on %q, want the daemon's database (%q)", func() string {
			if d.sender == nil {
				return "(no sender)"
			}
			return d.sender.DSN
		}(), d.cfg.DatabaseURL)
	}
}

// README: "On shutdown, waiting requests answer at once." serve, told to
// stop while three long-polls wait on an unchanged order, answers each
// (304) within a second, and stops cleanly.
func TestServeAnswersWaitingLongPollsWithinASecondOfTheStop(t *testing.T) {
	d := inProcessDaemon(t, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()
	base := "http://" + d.listener.Addr().String()
	req, _ := http.NewRequest("POST", base+"/v1/orders",
		strings.NewReader(`{"external_id":"ap-stop-1","network":"ethereum","asset":"USDT","amount":"4"}`))
	req.Header.Set("Authorization", "Bearer "+e2eStorefrontKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var created struct {
		ID string `json:"id"`
	}
	err = json.NewDecoder(res.Body).Decode(&created)
	res.Body.Close()
	if res.StatusCode != http.StatusCreated || err != nil || created.ID == "" {
		t.Fatalf("create: %d (%v)", res.StatusCode, err)
	}
	id := created.ID
	req, _ = http.NewRequest("GET", base+"/v1/orders/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+e2eStorefrontKey)
	if res, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	etag := res.Header.Get("ETag")
	if res.StatusCode != http.StatusOK || etag == "" {
		t.Fatalf("read: %d (ETag %q)", res.StatusCode, etag)
	}

	u, _ := url.Parse(base)
	serverPort, _ := strconv.Atoi(u.Port())
	type answer struct {
		code int
		at   time.Time
		err  error
	}
	const waiters = 3
	answers := make(chan answer, waiters)
	var ports [waiters]atomic.Int64
	for i := range waiters {
		client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				ports[i].Store(int64(c.LocalAddr().(*net.TCPAddr).Port))
			}
			return c, err
		}}}
		go func() {
			r, _ := http.NewRequest("GET", base+"/v1/orders/"+id+"?wait=60s", nil)
			r.Header.Set("Authorization", "Bearer "+e2eStorefrontKey)
			r.Header.Set("If-None-Match", etag)
			res, err := client.Do(r)
			if err != nil {
				answers <- answer{err: err, at: time.Now()}
				return
			}
			res.Body.Close()
			answers <- answer{code: res.StatusCode, at: time.Now()}
		}()
	}
	// Each long-poll has reached the server (it read the whole request).
	for i := range waiters {
		waitUntil(t, 10*time.Second, fmt.Sprintf("long-poll %d to reach the server", i), func() bool {
			return serverHasRead(t, serverPort, int(ports[i].Load()))
		})
	}
	select {
	case a := <-answers:
		t.Fatalf("a long-poll on an unchanged order answered before the stop: %d %v", a.code, a.err)
	default:
	}
	stopped := time.Now()
	stop()
	for range waiters {
		select {
		case a := <-answers:
			if took := a.at.Sub(stopped); a.err != nil || a.code != http.StatusNotModified || took > time.Second {
				t.Fatalf("a waiting long-poll answered %d (%v) %s after the stop, want 304 within a second", a.code, a.err, took.Round(time.Millisecond))
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a waiting long-poll is still waiting 5 s after the stop")
		}
	}
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("serve stopped with %v, want a clean stop", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop within 10 s")
	}
	t.Logf("the long-polls answered and serve stopped %s after it was told to", time.Since(stopped).Round(time.Millisecond))
}
