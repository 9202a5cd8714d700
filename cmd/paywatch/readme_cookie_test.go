package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

// README ("Configuration"): "`networks[].rpc_cookie_file` | none | Bitcoin
// Core's `.cookie` file instead of a user and password (read at each
// call)". A configuration naming a cookie file and no user reaches a node
// that wants a user and password with those the file holds, as it holds
// them at each call: a cookie rewritten wrong is refused by the node, and
// rewritten right works again.
func TestRPCCookieFileReachesTheBitcoinNode(t *testing.T) {
	node := btctest.New(t)
	dir := t.TempDir()
	cookie := filepath.Join(dir, ".cookie")
	write := func(user, pass string) {
		t.Helper()
		if err := os.WriteFile(cookie, []byte(user+":"+pass), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(node.Credentials.User, node.Credentials.Pass)
	doc := fmt.Sprintf(`
database_url_env: PAYWATCH_DATABASE_URL
api_keys:
  - {name: storefront, role: storefront, key_env: PAYWATCH_STOREFRONT_KEY}
networks:
  - name: btc
    family: bitcoin
    rpc_urls: [%s]
    rpc_cookie_file: %s
    rpc_cert_file: %s
    chain: regtest
    assets:
      - {symbol: BTC, native: true, decimals: 8, receive: {xpub: "%s"}}
`, node.URL, cookie, node.Credentials.CertFile, reconciletest.VPub)
	path := filepath.Join(dir, "paywatch.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, func(k string) string {
		return map[string]string{"PAYWATCH_DATABASE_URL": "postgres://unused", "PAYWATCH_STOREFRONT_KEY": "sf_0123456789abcdef"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	n := cfg.Network("btc")
	wallets, err := bitcoin.NewWallets(cfg.Networks)
	if err != nil {
		t.Fatal(err)
	}
	src, closeSrc, err := newSource(n, wallets, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer closeSrc()
	ctx := context.Background()
	head, err := src.Head(ctx)
	if err != nil {
		t.Fatalf("the node refused the cookie file's credentials: %v", err)
	}
	if head.Number != node.Height() {
		t.Fatalf("the source reads head %d, the node is at %d", head.Number, node.Height())
	}
	write(node.Credentials.User, "stale")
	if _, err := src.Head(ctx); err == nil {
		t.Fatal("a wrong cookie was not read: the node still answered")
	}
	write(node.Credentials.User, node.Credentials.Pass)
	if _, err := src.Head(ctx); err != nil {
		t.Fatalf("the cookie rewritten right was not read: %v", err)
	}
}
