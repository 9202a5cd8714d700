package api_test

import (
	"bytes"
	"log/slog"
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

// README: "Every request that writes or fails is logged"; PAYWATCH_LOG_LEVEL
// "debug adds a line per successful read".
// At info level, a request that writes and one that fails are logged, a
// successful read (a checkout page polling its order) is not; at debug
// level it is.
func TestRequestLinesAtInfoForWritesAndErrorsAtDebugForSuccessfulReads(t *testing.T) {
	info := &lines{}
	f := newFixtureLogged(t, testConfig, slog.New(slog.NewTextHandler(info, &slog.HandlerOptions{Level: slog.LevelInfo})))
	var o orderJSON
	f.do("POST", "/v1/orders", storefrontKey, `{"external_id":"log-1","network":"ethereum","asset":"USDT","amount":"1"}`).decode(t, &o)
	if r := f.do("GET", "/v1/orders/"+o.ID, storefrontKey, ""); r.status != 200 {
		t.Fatalf("GET: %d", r.status)
	}
	if r := f.do("GET", "/v1/orders/ord_missing", storefrontKey, ""); r.status != 404 {
		t.Fatalf("GET of a missing order: %d", r.status)
	}
	want := []string{"method=POST path=/v1/orders status=201", "method=GET path=/v1/orders/ord_missing status=404"}
	waitForLines(t, info, want)
	for _, line := range info.requests() {
		if strings.Contains(line, "path=/v1/orders/"+o.ID) {
			t.Fatalf("a successful read was logged at info level: %s", line)
		}
	}

	debug := &lines{}
	f = newFixtureLogged(t, testConfig, slog.New(slog.NewTextHandler(debug, &slog.HandlerOptions{Level: slog.LevelDebug})))
	f.do("POST", "/v1/orders", storefrontKey, `{"external_id":"log-2","network":"ethereum","asset":"USDT","amount":"1"}`).decode(t, &o)
	f.do("GET", "/v1/orders/"+o.ID, storefrontKey, "")
	waitForLines(t, debug, []string{"level=DEBUG msg=request method=GET path=/v1/orders/" + o.ID + " status=200"})
}

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
