package btctest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards TCP connections to a node, and can play a node that is
// down (connections refused at once) or hung (accepted, never answered).
type Proxy struct {
	// URL reaches the node through the proxy (https: the node's own TLS
	// passes through).
	URL  string
	Down atomic.Bool
	Hung atomic.Bool
	// Delay holds each piece of the node's answers back that long, as a
	// node far away would (nanoseconds).
	Delay atomic.Int64

	target string
	ln     net.Listener
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

// NewProxy starts a proxy in front of the node, closed with the test.
func NewProxy(t testing.TB, n *Node) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{URL: "https://" + ln.Addr().String(), target: n.H.RPCConfig().Host, ln: ln, conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// Drop closes every open connection (as a node that restarts does).
func (p *Proxy) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

func (p *Proxy) close() {
	p.ln.Close()
	p.Drop()
}

func (p *Proxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns[c] = struct{}{}
	p.mu.Unlock()
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		switch {
		case p.Down.Load():
			c.Close()
			continue
		case p.Hung.Load():
			p.track(c) // held open, never answered, until Drop
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.track(c)
		p.track(up)
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		go func() { p.copySlowly(c, up); c.Close() }()
	}
}

// copySlowly copies the node's answers to the client, each piece after
// Delay.
func (p *Proxy) copySlowly(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := p.Delay.Load(); d > 0 {
				time.Sleep(time.Duration(d))
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
