package api_test

import (
	"bytes"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// lines is a log destination the server writes to while the test reads.
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// requests returns the request lines logged so far.
func (l *lines) requests() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.buf.String(), "\n") {
		if strings.Contains(line, "msg=request ") {
			out = append(out, line)
		}
	}
	return out
}

// README: "Every request is logged (method, path, status, the key that
// made it, duration) at info level, but a storefront's successful read of
// one order"; PAYWATCH_LOG_LEVEL "debug adds a line per such read". At
// info level, a write, a failure, a list and an operator's read are
// logged, with the key's name; a storefront's successful read of one order
// (what a checkout page polls) is not. At debug level it is.
func TestRequestLinesAtInfoButAStorefrontsReadOfOneOrder(t *testing.T) {
	info := &lines{}
	f := newFixtureLogged(t, testConfig, slog.New(slog.NewTextHandler(info, &slog.HandlerOptions{Level: slog.LevelInfo})))
	var o orderJSON
	f.do("POST", "/v1/orders", storefrontKey, `{"external_id":"log-1","network":"ethereum","asset":"USDT","amount":"1"}`).decode(t, &o)
	for _, c := range []struct {
		key, path string
		status    int
	}{
		{storefrontKey, "/v1/orders/" + o.ID, 200},
		{storefrontKey, "/v1/orders/ord_missing", 404},
		{storefrontKey, "/v1/orders", 200},
		{operatorKey, "/v1/orders/" + o.ID, 200},
		{"sf_not_a_key", "/v1/orders/" + o.ID, 401},
	} {
		if r := f.do("GET", c.path, c.key, ""); r.status != c.status {
			t.Fatalf("GET %s: %d, want %d", c.path, r.status, c.status)
		}
	}
	waitForLines(t, info, []string{
		"method=POST path=/v1/orders status=201 key=shop",
		"method=GET path=/v1/orders/ord_missing status=404 key=shop",
		"method=GET path=/v1/orders status=200 key=shop",
		"method=GET path=/v1/orders/" + o.ID + " status=200 key=alice",
		"method=GET path=/v1/orders/" + o.ID + " status=401 key=\"\"",
	})
	for _, line := range info.requests() {
		if strings.Contains(line, "path=/v1/orders/"+o.ID+" status=200 key=shop") {
			t.Fatalf("a storefront's successful read of one order was logged at info level: %s", line)
		}
		if !durationField.MatchString(line) {
			t.Fatalf("a request line without its duration: %s", line)
		}
	}

	debug := &lines{}
	f = newFixtureLogged(t, testConfig, slog.New(slog.NewTextHandler(debug, &slog.HandlerOptions{Level: slog.LevelDebug})))
	f.do("POST", "/v1/orders", storefrontKey, `{"external_id":"log-2","network":"ethereum","asset":"USDT","amount":"1"}`).decode(t, &o)
	f.do("GET", "/v1/orders/"+o.ID, storefrontKey, "")
	waitForLines(t, debug, []string{"level=DEBUG msg=request method=GET path=/v1/orders/" + o.ID + " status=200 key=shop"})
}

// durationField is how a request line gives its duration.
var durationField = regexp.MustCompile(` duration=[0-9.]+(µs|ms|s)( |$)`)

// waitForLines waits up to a second until every wanted fragment is in a
// logged request line (each line is written as its request ends).
func waitForLines(t *testing.T, l *lines, want []string) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		missing := ""
		for _, w := range want {
			found := false
			for _, line := range l.requests() {
				found = found || strings.Contains(line, w)
			}
			if !found {
				missing = w
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request line with %q; logged: %q", missing, l.requests())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
