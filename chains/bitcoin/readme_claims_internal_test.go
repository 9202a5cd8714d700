package bitcoin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// README: "Every 2 s (or `poll_interval`, if shorter) a mempool watcher
// reads the node's mempool". The rule, the watcher a network gets with its
// default poll interval (5 s) and a shorter one, and the watcher's loop
// waiting that long between reads.
func TestMempoolReadsEvery2sOrPollIntervalIfShorter(t *testing.T) {
	if DefaultMempoolInterval != 2*time.Second {
		t.Fatalf("DefaultMempoolInterval is %s, the README says 2 s", DefaultMempoolInterval)
	}
	for _, c := range []struct{ poll, want time.Duration }{
		{5 * time.Second, 2 * time.Second}, // poll_interval's default
		{time.Hour, 2 * time.Second},
		{2 * time.Second, 2 * time.Second},
		{1500 * time.Millisecond, 1500 * time.Millisecond},
		{100 * time.Millisecond, 100 * time.Millisecond}, // the shortest poll_interval allowed
		{0, 2 * time.Second},                             // none set
	} {
		if got := mempoolInterval(c.poll); got != c.want {
			t.Errorf("poll_interval %s: the mempool is read every %s, want %s", c.poll, got, c.want)
		}
	}

	// A node that answers the watcher's reads with an empty mempool, and
	// notes when each read came.
	var mu sync.Mutex
	var reads []time.Time
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var reqs []struct {
			ID     int    `json:"id"`
			Method string `json:"method"`
		}
		if !bytes.HasPrefix(bytes.TrimSpace(body), []byte("[")) {
			body = append(append([]byte("["), body...), ']')
		}
		_ = json.Unmarshal(body, &reqs)
		var out []map[string]any
		for _, q := range reqs {
			var result any
			switch q.Method {
			case "getmempoolinfo":
				result = map[string]any{"loaded": true}
			case "getrawmempool":
				mu.Lock()
				reads = append(reads, time.Now())
				mu.Unlock()
				result = []string{}
			case "getblockcount":
				result = 200
			}
			out = append(out, map[string]any{"id": q.ID, "result": result, "error": nil})
		}
		_ = json.NewEncoder(w).Encode(out)
	}))
	defer node.Close()
	db := pgtest.New(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	watcher := func(poll time.Duration) *Mempool {
		n := &paywatch.Network{Name: "btc", Family: paywatch.FamilyBitcoin, Chain: "regtest", RPCURLs: []string{node.URL},
			PollInterval: poll, Assets: []*paywatch.Asset{{Network: "btc", Symbol: "BTC", Native: true, Decimals: 8}}}
		watch, err := NewWatchSet("regtest", nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		src, err := NewSource(n, Credentials{}, watch, log)
		if err != nil {
			t.Fatal(err)
		}
		src.nodes.Check = nil
		return NewMempool(src, db, log)
	}
	if got := watcher(5 * time.Second).Interval; got != 2*time.Second {
		t.Fatalf("with poll_interval's default (5 s) the mempool watcher reads every %s, want 2 s", got)
	}
	m := watcher(300 * time.Millisecond)
	if m.Interval != 300*time.Millisecond {
		t.Fatalf("with poll_interval 300ms the mempool watcher reads every %s, want 300ms", m.Interval)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(reads)
	}
	deadline := time.Now().Add(10 * time.Second)
	for count() < 4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the watcher stopped with %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reads) < 4 {
		t.Fatalf("%d mempool reads in 10 s, every 300ms expected", len(reads))
	}
	for i := 1; i < 4; i++ {
		if gap := reads[i].Sub(reads[i-1]); gap < m.Interval || gap > m.Interval+time.Second {
			t.Errorf("mempool read %d came %s after the one before, want 300ms (and not much more)", i+1, gap)
		}
	}
}
