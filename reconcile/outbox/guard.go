package outbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"
)

// ErrRefused marks a delivery the SSRF guard stopped: the webhook URL
// resolved to an address paywatch must not reach.
var ErrRefused = errors.New("address refused")

// blocked are the ranges beyond the standard library's own tests (loopback,
// private, link-local, multicast, unspecified) that a webhook must not
// reach: shared (carrier-grade NAT) space, IETF protocol assignments,
// benchmarking, reserved and broadcast addresses, and NAT64 (which can
// reach any IPv4 address, private ones included).
var blocked = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("2002::/16"), // 6to4 embeds any IPv4 address
}

// Forbidden reports why a webhook must not connect to addr, or "" when it
// may. Cloud metadata endpoints (169.254.169.254, fd00:ec2::254) are
// link-local or private and so covered.
func Forbidden(addr netip.Addr) string {
	addr = addr.Unmap()
	switch {
	case !addr.IsValid():
		return "invalid"
	case addr.IsLoopback():
		return "loopback"
	case addr.IsPrivate():
		return "private"
	case addr.IsLinkLocalUnicast(), addr.IsLinkLocalMulticast():
		return "link-local"
	case addr.IsUnspecified(), addr.IsMulticast(), addr.IsInterfaceLocalMulticast():
		return "not unicast"
	}
	for _, p := range blocked {
		if p.Contains(addr) {
			return "reserved (" + p.String() + ")"
		}
	}
	return ""
}

// Client returns the HTTP client webhooks are sent with. Unless
// allowPrivate, the dialer checks each address it is about to connect to
// (after name resolution, so what is checked is what is reached: a name
// that resolves differently the second time gains nothing). It never uses
// a proxy from the environment and never follows redirects (a 3xx is a
// failed delivery).
func Client(allowPrivate bool, timeout time.Duration) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		dialer.Control = func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: cannot parse %q", ErrRefused, address)
			}
			if why := Forbidden(ap.Addr()); why != "" {
				return fmt.Errorf("%w: %s is %s (webhooks.allow_private_networks is false)", ErrRefused, ap.Addr(), why)
			}
			return nil
		}
	}
	transport := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, addr)
		},
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: timeout,
	}
	return &http.Client{
		Transport: transport,
		Timeout:   timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}
