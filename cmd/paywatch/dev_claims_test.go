//go:build !nodev

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/paywatch/paywatch/chains/evm/devchain"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// readDevState reads what a running paywatch dev wrote for dev pay.
func readDevState(t *testing.T, path string) devState {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var st devState
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return st
}

// README: "`paywatch dev` starts an EVM development chain in the process
// (network `devnet`, chain id 1337, a block a second, ETH and a USDT
// token)". The chain's JSON-RPC answers eth_chainId 0x539 and blocks come
// by themselves; a USDT token (6 decimals) is deployed on it, and the API
// takes orders for ETH and USDT on devnet, and for nothing else.
func TestDevChainIs1337WithETHAndUSDT(t *testing.T) {
	_, api, state, _ := runDev(t, nil, "PAYWATCH_DEV_LOCAL_SERVER="+pgtest.ServerURL(),
		"PAYWATCH_STOREFRONT_KEY="+e2eStorefrontKey, "PAYWATCH_OPERATOR_KEY="+e2eOperatorKey)
	st := readDevState(t, state)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node, err := rpc.DialContext(ctx, st.RPC)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	var chainID string
	if err := node.CallContext(ctx, &chainID, "eth_chainId"); err != nil || chainID != "0x539" {
		t.Fatalf("the development chain's eth_chainId is %q (%v), want 0x539 (1337)", chainID, err)
	}
	head := func() uint64 {
		var n hexutil.Uint64
		if err := node.CallContext(ctx, &n, "eth_blockNumber"); err != nil {
			t.Fatal(err)
		}
		return uint64(n)
	}
	first := head()
	waitUntil(t, 10*time.Second, "the development chain to seal blocks by itself", func() bool { return head() >= first+2 })
	if out := devOutput[state](); !strings.Contains(out, "(network devnet, chain id 1337, a block every 1s; USDT token "+st.Assets["USDT"].Contract+")") {
		t.Fatalf("paywatch dev does not announce devnet, chain id 1337, a block a second and its USDT token:\n%s", out)
	}

	usdt := st.Assets["USDT"]
	if usdt.Network != "devnet" || !common.IsHexAddress(usdt.Contract) || usdt.Decimals != 6 ||
		st.Assets["ETH"] != (devAsset{Network: "devnet", Decimals: 18}) {
		t.Fatalf("dev's assets: %+v", st.Assets)
	}
	token, err := devchain.TokenABI()
	if err != nil {
		t.Fatal(err)
	}
	call := func(method string) []any {
		data, err := token.Pack(method)
		if err != nil {
			t.Fatal(err)
		}
		var out hexutil.Bytes
		if err := node.CallContext(ctx, &out, "eth_call", map[string]any{"to": usdt.Contract, "data": hexutil.Bytes(data)}, "latest"); err != nil {
			t.Fatalf("eth_call %s on %s: %v", method, usdt.Contract, err)
		}
		v, err := token.Unpack(method, out)
		if err != nil || len(v) != 1 {
			t.Fatalf("%s of %s: %v %v", method, usdt.Contract, v, err)
		}
		return v
	}
	if sym, dec := call("symbol")[0], call("decimals")[0]; sym != "USDT" || dec != uint8(6) {
		t.Fatalf("the token at %s is %v with %v decimals, want USDT with 6", usdt.Contract, sym, dec)
	}

	d := &daemonProcess{t: t, url: api}
	for _, asset := range []string{"ETH", "USDT"} {
		code, o := d.call("POST", "/v1/orders", e2eStorefrontKey,
			fmt.Sprintf(`{"external_id":"chain-%s","network":"devnet","asset":"%s","amount":"1"}`, asset, asset))
		if code != 201 || o["network"] != "devnet" || o["asset"] != asset {
			t.Fatalf("an order for %s on devnet: %d %v", asset, code, o)
		}
		if asset == "USDT" && o["asset_contract"] != usdt.Contract {
			t.Fatalf("the USDT order's contract is %v, want %s", o["asset_contract"], usdt.Contract)
		}
	}
	if code, o := d.call("POST", "/v1/orders", e2eStorefrontKey, `{"external_id":"chain-dai","network":"devnet","asset":"DAI","amount":"1"}`); code != 400 {
		t.Fatalf("an order for DAI on devnet: %d %v, want 400", code, o)
	}
	code, nets := d.call("GET", "/v1/networks", e2eOperatorKey, "")
	if data, _ := nets["data"].([]any); code != 200 || len(data) != 1 || data[0].(map[string]any)["name"] != "devnet" {
		t.Fatalf("GET /v1/networks: %d %v, want devnet alone", code, nets)
	}
}

// README: "`paywatch dev` ... generates API keys (or takes
// `PAYWATCH_STOREFRONT_KEY` and `PAYWATCH_OPERATOR_KEY`, without printing
// them)". The keys from the environment work against the API, each for
// its role, and appear nowhere in what dev prints, logs included.
func TestDevTakesKeysFromEnvironmentWithoutPrintingThem(t *testing.T) {
	sf, op := "sf_env_"+randomHex(12), "op_env_"+randomHex(12)
	id, api, _, stop := runDev(t, nil, "PAYWATCH_DEV_LOCAL_SERVER="+pgtest.ServerURL(),
		"PAYWATCH_STOREFRONT_KEY="+sf, "PAYWATCH_OPERATOR_KEY="+op)
	if !regexp.MustCompile(`^http://127\.0\.0\.1:\d+$`).MatchString(api) || strings.HasSuffix(api, ":8080") {
		t.Fatalf("with --listen 127.0.0.1:0 the API is at %s", api)
	}
	d := &daemonProcess{t: t, url: api}
	if code, o := d.call("GET", "/v1/orders/"+id, sf, ""); code != 200 || o["id"] != id {
		t.Fatalf("the demo order with PAYWATCH_STOREFRONT_KEY: %d %v", code, o)
	}
	if code, o := d.call("POST", "/v1/orders", sf, `{"external_id":"env-key","network":"devnet","asset":"USDT","amount":"2"}`); code != 201 {
		t.Fatalf("an order with PAYWATCH_STOREFRONT_KEY: %d %v", code, o)
	}
	if code, o := d.call("GET", "/v1/networks", op, ""); code != 200 {
		t.Fatalf("GET /v1/networks with PAYWATCH_OPERATOR_KEY: %d %v", code, o)
	}
	if code, o := d.call("GET", "/v1/networks", sf, ""); code != 403 {
		t.Fatalf("GET /v1/networks with the storefront key: %d %v, want 403", code, o)
	}
	if code, o := d.call("GET", "/v1/orders/"+id, "sf_dev_"+randomHex(12), ""); code != 401 {
		t.Fatalf("the demo order with another key: %d %v, want 401", code, o)
	}
	out := stop()
	for name, key := range map[string]string{"PAYWATCH_STOREFRONT_KEY": sf, "PAYWATCH_OPERATOR_KEY": op} {
		if strings.Contains(out, key) || strings.Contains(out, key[len(key)-12:]) {
			t.Fatalf("paywatch dev printed the key from %s:\n%s", name, out)
		}
		if !strings.Contains(out, "(the key in "+name+")") {
			t.Fatalf("paywatch dev does not say which key is in use for %s:\n%s", name, out)
		}
	}
}

// README: "without a server, a throwaway cluster in a temporary directory
// ..., listening on a unix socket in that private directory only, as the
// `postgres` or `nobody` user when run as root". With no server at
// 127.0.0.1:5432, the cluster's directory is 0700 and owned by the
// server's user, the server holds no TCP socket (listen_addresses is
// empty), its socket is in that directory, and it runs as postgres or
// nobody when dev runs as root (as this user otherwise).
func TestDevThrowawayClusterListensOnItsPrivateSocketOnly(t *testing.T) {
	_, _, state, _ := runDev(t, nil, "PAYWATCH_DEV_LOCAL_SERVER=postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1")
	m := regexp.MustCompile(`database +(postgres://\S+) \(a throwaway cluster`).FindStringSubmatch(devOutput[state]())
	if m == nil {
		t.Fatalf("paywatch dev uses no throwaway cluster:\n%s", devOutput[state]())
	}
	u, err := url.Parse(m[1])
	if err != nil {
		t.Fatal(err)
	}
	dir, port := u.Query().Get("host"), u.Query().Get("port")
	if !strings.Contains(filepath.Base(dir), "paywatch-dev-pg-") || port == "" || u.Host != "" {
		t.Fatalf("the throwaway cluster's URL %s names no socket directory and port", m[1])
	}

	// The server's process and its user.
	pidFile, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	if err != nil {
		t.Fatalf("postmaster.pid: %q", pidFile)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	uids := regexp.MustCompile(`(?m)^Uid:\s+(\d+)\s+(\d+)`).FindStringSubmatch(string(status))
	if uids == nil || uids[1] != uids[2] {
		t.Fatalf("the server's uids: %v", uids)
	}
	serverUID, _ := strconv.Atoi(uids[1])
	if os.Geteuid() == 0 {
		who, err := user.LookupId(uids[1])
		if serverUID == 0 || err != nil || (who.Username != "postgres" && who.Username != "nobody") {
			t.Fatalf("run as root, paywatch dev runs the throwaway server as uid %d (%v, %v), want postgres or nobody", serverUID, who, err)
		}
	} else if serverUID != os.Getuid() {
		t.Fatalf("the throwaway server runs as uid %d, not as this user (%d)", serverUID, os.Getuid())
	}

	// A directory of its own, private to the server's user.
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o700 || fileOwner(t, fi) != serverUID {
		t.Fatalf("the cluster's directory %s is %s owned by uid %d, want drwx------ owned by the server's user (%d)",
			dir, fi.Mode(), fileOwner(t, fi), serverUID)
	}
	if sock, err := os.Stat(filepath.Join(dir, ".s.PGSQL."+port)); err != nil || sock.Mode()&os.ModeSocket == 0 {
		t.Fatalf("no unix socket for port %s in %s: %v", port, dir, err)
	}

	// No TCP socket: none in the server's open files, none listening on
	// its port.
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if s, ok := strings.CutPrefix(target, "socket:["); ok {
			inodes[strings.TrimSuffix(s, "]")] = true
		}
	}
	if len(inodes) == 0 {
		t.Fatalf("the server (pid %d) holds no socket at all", pid)
	}
	p, _ := strconv.Atoi(port)
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		raw, err := os.ReadFile(table)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(raw), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 {
				continue
			}
			if inodes[f[9]] {
				t.Fatalf("the throwaway server holds a TCP socket (%s): %s", table, line)
			}
			if f[3] == "0A" && strings.HasSuffix(f[1], fmt.Sprintf(":%04X", p)) {
				t.Fatalf("something listens on TCP port %d (%s): %s", p, table, line)
			}
		}
	}
	db, err := sql.Open("postgres", fmt.Sprintf("host=%s port=%s user=postgres dbname=paywatch sslmode=disable", dir, port))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var listen, sockets string
	if err := db.QueryRow(`SELECT current_setting('listen_addresses'), current_setting('unix_socket_directories')`).Scan(&listen, &sockets); err != nil ||
		listen != "" || sockets != dir {
		t.Fatalf("the throwaway server: listen_addresses %q, unix_socket_directories %q (%v); want '' and %s", listen, sockets, err, dir)
	}
}

// README: "`dev pay ORDER_ID --amount 10`: another amount: claimed by its
// tx hash, then disputed or waiting". On devnet, 10 USDT sent to the demo
// order's shared address (it asks 25 and a few millionths) is tied to the
// order by the hash dev pay gives with "I've paid", and nothing else: the
// order shows the transfer and ends disputed, underpaid, as dev pay says.
// On devbtc, where each order has an address of its own, a short payment
// confirmed leaves the order waiting for the rest, and dev pay says so;
// too much ends disputed, overpaid.
func TestDevPayAnotherAmountIsClaimedByItsHash(t *testing.T) {
	id, api, state, _ := runDev(t, []string{"--bitcoin"}, "PAYWATCH_DEV_LOCAL_SERVER="+pgtest.ServerURL(),
		"PAYWATCH_STOREFRONT_KEY="+e2eStorefrontKey, "PAYWATCH_OPERATOR_KEY="+e2eOperatorKey)
	d := &daemonProcess{t: t, url: api}
	// pay runs dev pay ORDER --amount X and returns the hash it sent, the
	// rest of its output, and the order afterwards.
	pay := func(t *testing.T, id, amount, asset string) (string, string, map[string]any) {
		t.Helper()
		out := devPay(t, state, id, "--amount", amount)
		m := regexp.MustCompile(`^sent ` + regexp.QuoteMeta(amount+" "+asset) + ` to \S+ in (0x)?([0-9a-f]{64})\norder ` + id + `: awaiting_payment → (.*)\n$`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("dev pay %s --amount %s printed:\n%s", id, amount, out)
		}
		hash := m[1] + m[2]
		code, o := d.call("GET", "/v1/orders/"+id, e2eStorefrontKey, "")
		trs, _ := o["transfers"].([]any)
		if code != 200 || o["tx_hash_hint"] != hash || o["received_amount"] != amount || len(trs) != 1 ||
			trs[0].(map[string]any)["tx_hash"] != hash || trs[0].(map[string]any)["amount"] != amount {
			t.Fatalf("the order after dev pay --amount %s (claimed with %s): %d %v", amount, hash, code, o)
		}
		return hash, m[3], o
	}
	t.Run("devnet", func(t *testing.T) {
		t.Parallel()
		_, followed, o := pay(t, id, "10", "USDT")
		if followed != "confirming → disputed (underpaid)" || o["status"] != "disputed" || o["dispute_reason"] != "underpaid" {
			t.Fatalf("dev pay --amount 10 followed the demo order: %q, and it is %v (%v); want it disputed, underpaid",
				followed, o["status"], o["dispute_reason"])
		}
		matched := false
		for _, e := range d.timeline(id) {
			detail, _ := e["detail"].(map[string]any)
			matched = matched || (e["type"] == "transfer_matched" && detail["by"] == "tx_hash_hint")
		}
		if !matched {
			t.Fatalf("the timeline shows no transfer matched by the tx hash: %v", d.timeline(id))
		}
	})
	t.Run("devbtc", func(t *testing.T) {
		t.Parallel()
		var short string
		waitUntil(t, 30*time.Second, "the Bitcoin demo order", func() bool {
			m := regexp.MustCompile(`A Bitcoin demo order[^\n]*\n +id +(ord_[a-z0-9]+)`).FindStringSubmatch(devOutput[state]())
			if m != nil {
				short = m[1]
			}
			return short != ""
		})
		_, followed, o := pay(t, short, "0.0004", "BTC")
		if !regexp.MustCompile(`^confirming \(received 0\.0004 of 0\.001 BTC, confirmed; the rest may come until \S+\)$`).MatchString(followed) ||
			o["status"] != "confirming" {
			t.Fatalf("dev pay --amount 0.0004 followed the Bitcoin demo order: %q, and it is %v; want it waiting for the rest", followed, o["status"])
		}
		code, more := d.call("POST", "/v1/orders", e2eStorefrontKey, `{"external_id":"btc-more","network":"devbtc","asset":"BTC","amount":"0.001"}`)
		if code != 201 {
			t.Fatalf("create: %d %v", code, more)
		}
		_, followed, o = pay(t, more["id"].(string), "0.0025", "BTC")
		if followed != "confirming → disputed (overpaid)" || o["status"] != "disputed" || o["dispute_reason"] != "overpaid" {
			t.Fatalf("dev pay --amount 0.0025 followed a 0.001 BTC order: %q, and it is %v (%v); want it disputed, overpaid",
				followed, o["status"], o["dispute_reason"])
		}
	})
}

// README: "btcd is built with the Go toolchain the first time ... into
// `paywatch/bin` of the user's cache directory ... unless one is on
// `PATH`". With no btcd on PATH, dev --bitcoin builds one into
// paywatch/bin of the cache directory (a directory only the user can
// write) and runs it; with a btcd on PATH, it runs that one and builds
// nothing.
func TestDevBuildsBtcdIntoUserCacheUnlessOnPath(t *testing.T) {
	version, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/btcsuite/btcd").Output()
	if err != nil {
		t.Fatal(err)
	}
	gocache, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	// PATH as it is, without any btcd on it; the Go build cache as it is
	// (its default lives in the cache directory moved here).
	var path []string
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if _, err := os.Stat(filepath.Join(dir, "btcd")); err != nil {
			path = append(path, dir)
		}
	}
	env := func(cache string, pathDirs ...string) []string {
		return []string{"PAYWATCH_DEV_LOCAL_SERVER=" + pgtest.ServerURL(), "XDG_CACHE_HOME=" + cache,
			"GOCACHE=" + strings.TrimSpace(string(gocache)), "PATH=" + strings.Join(append(pathDirs, path...), string(os.PathListSeparator))}
	}
	bitcoinOrder := func(state string) {
		t.Helper()
		waitUntil(t, 30*time.Second, "the Bitcoin demo order", func() bool {
			return strings.Contains(devOutput[state](), "A Bitcoin demo order")
		})
	}

	cache := t.TempDir()
	_, _, state, stop := runDev(t, []string{"--bitcoin"}, env(cache)...)
	bitcoinOrder(state)
	stop()
	built := filepath.Join(cache, "paywatch", "bin", "btcd-"+strings.TrimSpace(string(version)))
	fi, err := os.Stat(built)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o100 == 0 {
		t.Fatalf("no btcd built at %s: %v", built, err)
	}
	if bin, err := os.Stat(filepath.Dir(built)); err != nil || bin.Mode().Perm() != 0o700 {
		t.Fatalf("%s is not a directory only the user can write: %v %v", filepath.Dir(built), bin.Mode(), err)
	}

	// A btcd on PATH (here one that notes each start, then runs the one
	// built above) is run instead, and nothing is built.
	onPath, used := t.TempDir(), filepath.Join(t.TempDir(), "used")
	script := fmt.Sprintf("#!/bin/sh\necho \"$@\" >> %q\nexec %q \"$@\"\n", used, built)
	if err := os.WriteFile(filepath.Join(onPath, "btcd"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	otherCache := t.TempDir()
	_, _, state, stop = runDev(t, []string{"--bitcoin"}, env(otherCache, onPath)...)
	bitcoinOrder(state)
	stop()
	if args, err := os.ReadFile(used); err != nil || !strings.Contains(string(args), "--regtest") {
		t.Fatalf("the btcd on PATH was not run (%v): %q", err, args)
	}
	if found, _ := filepath.Glob(filepath.Join(otherCache, "paywatch", "bin", "*")); len(found) > 0 {
		t.Fatalf("with a btcd on PATH, dev still built one: %v", found)
	}
}

// fileOwner is the uid that owns a file.
func fileOwner(t *testing.T, fi os.FileInfo) int {
	t.Helper()
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Fatalf("no owner for %s", fi.Name())
	}
	return int(st.Uid)
}
