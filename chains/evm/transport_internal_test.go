package evm

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
)

// A node on the loopback interface is asked for uncompressed answers (the
// bytes never leave the machine: compressing them only costs both sides'
// CPU); a node elsewhere for compressed ones. The connections to a node
// are kept for the calls a catch-up makes at once, not closed and opened
// again between them.
func TestNodeConnections(t *testing.T) {
	var mu sync.Mutex
	encodings, conns := map[string]bool{}, map[string]bool{}
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		encodings[r.Header.Get("Accept-Encoding")] = true
		conns[r.RemoteAddr] = true
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":1,"result":"0x7a69"}`))
	}))
	defer node.Close()
	for _, u := range []string{node.URL, strings.Replace(node.URL, "127.0.0.1", "localhost", 1)} {
		n := &paywatch.Network{Name: "devnet", Family: paywatch.FamilyEVM, RPCURLs: []string{u}, ChainID: 0x7a69}
		src, err := NewSource(n, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		// Rounds of calls at once, as a catch-up's reads ahead, head reads
		// and balance checks make them.
		for range 5 {
			var wg sync.WaitGroup
			for range idleConnsPerNode {
				wg.Go(func() {
					if err := src.nodes.Endpoints[0].rpc.CallContext(context.Background(), new(string), "eth_chainId"); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			time.Sleep(20 * time.Millisecond) // the connections are back in the pool
		}
		src.Close()
	}
	if len(encodings) != 1 || !encodings[""] {
		t.Fatalf("a node on the loopback interface was asked for encodings %v, want none", encodings)
	}
	// 8 a URL when they are kept (a few more when one is late back in the
	// pool); 32 a URL when 2 are kept, as by Go's default.
	if len(conns) > 3*idleConnsPerNode {
		t.Fatalf("%d connections for 5 rounds of %d calls at once to each of two URLs: connections were closed between rounds",
			len(conns), idleConnsPerNode)
	}
	for url, want := range map[string]bool{
		"http://127.0.0.1:8545": true, "http://127.9.0.1:8545": true, "http://[::1]:8545": true,
		"http://LOCALHOST:8545": true, "ws://127.0.0.1:8546": true,
		"http://10.0.0.5:8545": false, "https://mainnet.example.com/v3/key": false, "http://[::ffff:10.0.0.1]:8545": false,
		"http://localhost.example.com:8545": false, "not a url\x7f": false,
	} {
		if got := loopback(url); got != want {
			t.Errorf("loopback(%q) = %v, want %v", url, got, want)
		}
		if got := httpClient(url).Transport.(*http.Transport).DisableCompression; got != want {
			t.Errorf("%s: compression disabled %v, want %v", url, got, want)
		}
	}
}
