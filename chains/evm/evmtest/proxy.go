package evmtest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// Proxy stands between a scanner and a chain's endpoint to misbehave on
// purpose: refuse wide eth_getLogs ranges the way hosted providers do
// (-32005), or be down altogether.
type Proxy struct {
	URL string
	// MaxLogRange, when non-zero, is the widest eth_getLogs range served.
	MaxLogRange atomic.Uint64
	// Down makes every request fail at the HTTP level.
	Down atomic.Bool
	// Refused counts refused eth_getLogs calls; LogCalls the served ones.
	Refused, LogCalls atomic.Int64
	target            string
}

// NewProxy starts a proxy in front of target; it stops when t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	p := &Proxy{target: target}
	srv := httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

type rpcRequest struct {
	ID     json.RawMessage   `json:"id"`
	Method string            `json:"method"`
	Params []json.RawMessage `json:"params"`
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	if p.Down.Load() {
		http.Error(w, "node down", http.StatusBadGateway)
		return
	}
	body, _ := io.ReadAll(r.Body)
	if limit := p.MaxLogRange.Load(); limit > 0 {
		var req rpcRequest
		if json.Unmarshal(body, &req) == nil && req.Method == "eth_getLogs" && len(req.Params) == 1 {
			var f struct{ FromBlock, ToBlock string }
			_ = json.Unmarshal(req.Params[0], &f)
			from, _ := strconv.ParseUint(strings.TrimPrefix(f.FromBlock, "0x"), 16, 64)
			to, err := strconv.ParseUint(strings.TrimPrefix(f.ToBlock, "0x"), 16, 64)
			if err == nil && to-from+1 > limit {
				p.Refused.Add(1)
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(req.ID) +
					`,"error":{"code":-32005,"message":"query returned more than 10000 results"}}`))
				return
			}
			p.LogCalls.Add(1)
		}
	}
	res, err := http.Post(p.target, "application/json", bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer res.Body.Close()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(res.StatusCode)
	_, _ = io.Copy(w, res.Body)
}
