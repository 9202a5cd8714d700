package evmtest

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy stands between a scanner and a chain's endpoint to misbehave on
// purpose: refuse wide eth_getLogs ranges the way hosted providers do
// (-32005), answer slowly, hang, or be down altogether.
type Proxy struct {
	URL string
	// MaxLogRange, when non-zero, is the widest eth_getLogs range served.
	MaxLogRange atomic.Uint64
	// Down makes every request fail at the HTTP level.
	Down atomic.Bool
	// Hang makes every request wait, unanswered, until the caller gives up:
	// a node that accepts connections and never replies. Hung counts them.
	Hang atomic.Bool
	Hung atomic.Int64
	// NoLogTimes strips blockTimestamp from the logs eth_getLogs returns,
	// as many nodes do.
	NoLogTimes atomic.Bool
	// ResetEvery, when non-zero, drops one request in n, at random,
	// without an answer (a TCP reset, as a load balancer in trouble does).
	// Resets counts them.
	ResetEvery atomic.Int64
	Resets     atomic.Int64
	// Lag makes the node answer as if it were that many blocks behind the
	// chain: "latest" and eth_blockNumber mean the head less Lag.
	Lag atomic.Int64
	// FailCalls makes every eth_call answer an internal error: a node
	// that serves logs but cannot run contract calls.
	FailCalls atomic.Bool
	// Delay is added to every request, like the round trip to a hosted node.
	Delay atomic.Int64 // nanoseconds
	// CallDelay is added per call a request carries (a batch of 200 calls
	// waits 200 times as long), like a node's work on each.
	CallDelay atomic.Int64 // nanoseconds
	// Refused counts refused eth_getLogs calls; LogCalls the served ones.
	Refused, LogCalls atomic.Int64
	target            string
	stop              chan struct{}
}

// NewProxy starts a proxy in front of target; it stops when t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	p := &Proxy{target: target, stop: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(p.stop) }) // runs first: hung requests end

	p.URL = srv.URL
	return p
}

type rpcRequest struct {
	ID     json.RawMessage   `json:"id"`
	Method string            `json:"method"`
	Params []json.RawMessage `json:"params"`
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	if n := p.ResetEvery.Load(); n > 0 && rand.Int64N(n) == 0 {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				if tc, ok := conn.(*net.TCPConn); ok {
					_ = tc.SetLinger(0) // close with a reset, not a goodbye
				}
				conn.Close()
				p.Resets.Add(1)
				return
			}
		}
	}
	if p.Down.Load() {
		http.Error(w, "node down", http.StatusBadGateway)
		return
	}
	if p.Hang.Load() {
		p.Hung.Add(1)
		select {
		case <-r.Context().Done():
		case <-p.stop:
		}
		return
	}
	if d := p.Delay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	body, _ := io.ReadAll(r.Body)
	lagged := map[string]string{} // eth_blockNumber answers to rewrite
	if lag := p.Lag.Load(); lag > 0 {
		body, lagged = p.lagBehind(body, lag)
	}
	var reqs []rpcRequest
	batch := len(bytes.TrimSpace(body)) > 0 && bytes.TrimSpace(body)[0] == '['
	if batch {
		_ = json.Unmarshal(body, &reqs)
	} else {
		var one rpcRequest
		_ = json.Unmarshal(body, &one)
		reqs = []rpcRequest{one}
	}
	if d := p.CallDelay.Load(); d > 0 {
		time.Sleep(time.Duration(d * int64(len(reqs))))
	}
	refused, logs, failed := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, req := range reqs {
		if req.Method == "eth_call" && p.FailCalls.Load() {
			failed[string(req.ID)] = true
		}
		if p.tooWide(req) {
			refused[string(req.ID)] = true
		}
		if req.Method == "eth_getLogs" && p.NoLogTimes.Load() {
			logs[string(req.ID)] = true
		}
	}
	res, err := http.Post(p.target, "application/json", bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	if len(refused) > 0 || len(logs) > 0 || len(failed) > 0 || len(lagged) > 0 {
		var answers []map[string]json.RawMessage
		if batch {
			_ = json.Unmarshal(out, &answers)
		} else {
			var one map[string]json.RawMessage
			_ = json.Unmarshal(out, &one)
			answers = []map[string]json.RawMessage{one}
		}
		for _, a := range answers {
			if h, ok := lagged[string(a["id"])]; ok && a["result"] != nil {
				a["result"] = json.RawMessage(`"` + h + `"`)
			}
			if failed[string(a["id"])] {
				delete(a, "result")
				a["error"] = json.RawMessage(`{"code":-32603,"message":"internal error"}`)
			}
			if refused[string(a["id"])] {
				delete(a, "result")
				a["error"] = json.RawMessage(`{"code":-32005,"message":"query returned more than 10000 results"}`)
			}
			if logs[string(a["id"])] && a["result"] != nil {
				var ls []map[string]json.RawMessage
				_ = json.Unmarshal(a["result"], &ls)
				for _, l := range ls {
					delete(l, "blockTimestamp")
				}
				a["result"], _ = json.Marshal(ls)
			}
		}
		if batch {
			out, _ = json.Marshal(answers)
		} else {
			out, _ = json.Marshal(answers[0])
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(out)
}

// tooWide reports whether req is an eth_getLogs over more than MaxLogRange
// blocks, and counts it.
func (p *Proxy) tooWide(req rpcRequest) bool {
	limit := p.MaxLogRange.Load()
	if req.Method != "eth_getLogs" || len(req.Params) != 1 {
		return false
	}
	var f struct{ FromBlock, ToBlock string }
	_ = json.Unmarshal(req.Params[0], &f)
	from, _ := strconv.ParseUint(strings.TrimPrefix(f.FromBlock, "0x"), 16, 64)
	to, err := strconv.ParseUint(strings.TrimPrefix(f.ToBlock, "0x"), 16, 64)
	if limit > 0 && err == nil && to-from+1 > limit {
		p.Refused.Add(1)
		return true
	}
	p.LogCalls.Add(1)
	return false
}

// lagBehind rewrites a request so that it reads the chain as a node lag
// blocks behind would: "latest" becomes the head less lag, and the ids of
// eth_blockNumber calls are returned with the number to answer.
func (p *Proxy) lagBehind(body []byte, lag int64) ([]byte, map[string]string) {
	res, err := http.Post(p.target, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}`))
	if err != nil {
		return body, nil
	}
	defer res.Body.Close()
	var answer struct{ Result string }
	if json.NewDecoder(res.Body).Decode(&answer) != nil {
		return body, nil
	}
	head, err := strconv.ParseInt(strings.TrimPrefix(answer.Result, "0x"), 16, 64)
	if err != nil {
		return body, nil
	}
	behind := "0x" + strconv.FormatInt(max(head-lag, 0), 16)
	var reqs []map[string]json.RawMessage
	batch := len(bytes.TrimSpace(body)) > 0 && bytes.TrimSpace(body)[0] == '['
	if batch {
		_ = json.Unmarshal(body, &reqs)
	} else {
		var one map[string]json.RawMessage
		_ = json.Unmarshal(body, &one)
		reqs = []map[string]json.RawMessage{one}
	}
	numbers := map[string]string{}
	for _, q := range reqs {
		if string(q["method"]) == `"eth_blockNumber"` {
			numbers[string(q["id"])] = behind
		}
		if len(q["params"]) > 0 {
			q["params"] = json.RawMessage(strings.ReplaceAll(string(q["params"]), `"latest"`, `"`+behind+`"`))
		}
	}
	var out []byte
	if batch {
		out, _ = json.Marshal(reqs)
	} else {
		out, _ = json.Marshal(reqs[0])
	}
	return out, numbers
}
