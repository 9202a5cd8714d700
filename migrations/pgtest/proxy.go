package pgtest

import (
	"net"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/jmoiron/sqlx"
)

// Proxy forwards TCP to a PostgreSQL server and misbehaves on demand, as
// networks do: it can go silent, or reset the connections it holds.
type Proxy struct {
	ln       net.Listener
	silent   atomic.Bool
	broken   atomic.Bool
	epoch    atomic.Int64
	accepted atomic.Int64
}

// NewProxy starts a proxy in front of the server of dbURL and returns it
// with dbURL made to go through it. It stops when t ends.
func NewProxy(t testing.TB, dbURL string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	p := &Proxy{ln: ln}
	target := u.Host
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.accepted.Add(1)
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			opened := p.epoch.Load()
			go p.pipe(s, c, func() bool {
				if p.epoch.Load() == opened && !p.broken.Load() {
					return false
				}
				_ = c.(*net.TCPConn).SetLinger(0) // close with a reset, not a goodbye
				c.Close()
				s.Close()
				return true
			})
			go p.pipe(c, s, func() bool { return false })
		}
	}()
	u.Host = ln.Addr().String()
	return p, u.String()
}

// pipe copies src to dst until either ends, unless reset says it reset the
// connection (it is asked after each read from src); while the proxy is
// silent, what is read is dropped, and an end is not passed on.
func (p *Proxy) pipe(dst, src net.Conn, reset func() bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if reset() {
			return
		}
		if n > 0 && !p.silent.Load() {
			_, _ = dst.Write(buf[:n])
		}
		if err != nil {
			if !p.silent.Load() {
				dst.Close()
			}
			return
		}
	}
}

// Silence makes the network go silent both ways, for good: nothing more
// is forwarded and no connection is closed (a half-dead network: the
// server ends its sessions, the client hears nothing).
func (p *Proxy) Silence() { p.silent.Store(true) }

// Reset has every connection open now reset when its client next speaks:
// the client's write succeeds and its read gets a TCP reset, as when a
// session ends with the client's message in flight. Connections opened
// afterwards are forwarded as before.
func (p *Proxy) Reset() { p.epoch.Add(1) }

// Break has every connection, open now or opened later, reset when its
// client next speaks: a path to the server that accepts and resets (a
// load balancer or pooler in trouble).
func (p *Proxy) Break() { p.broken.Store(true) }

// Accepted is how many connections the proxy has accepted.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// ProxiedPool returns a Proxy in front of the server of dbURL, and a pool
// of up to pooled connections to dbURL's database made through it (all of
// which it keeps when idle). Both end with t.
func ProxiedPool(t testing.TB, dbURL string, pooled int) (*Proxy, *sqlx.DB) {
	t.Helper()
	p, viaProxy := NewProxy(t, dbURL)
	db, err := sqlx.Open("postgres", viaProxy)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxIdleConns(pooled)
	db.SetMaxOpenConns(pooled)
	return p, db
}
