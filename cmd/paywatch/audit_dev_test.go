//go:build !nodev

package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// adDev is a running `paywatch dev`, started by adStartDev.
type adDev struct {
	t       *testing.T
	cmd     *exec.Cmd
	mu      sync.Mutex // guards out and logs
	out     bytes.Buffer
	logs    bytes.Buffer
	orderID string // the demo order
	api     string
	stopped bool
}

var (
	adStorefrontLine = regexp.MustCompile(`storefront +Authorization: Bearer (\S+)`)
	adOperatorLine   = regexp.MustCompile(`operator +Authorization: Bearer (\S+)`)
	adDatabaseLine   = regexp.MustCompile(`database +(\S+) \(([^)]*)\)`)
)

// adStartDev starts `paywatch dev --listen 127.0.0.1:0 args...` in dir (the
// package's directory when empty), with this process's environment less
// its PAYWATCH_ variables, plus env; it returns once dev printed its demo
// order.
func adStartDev(t *testing.T, dir string, args []string, env ...string) *adDev {
	t.Helper()
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	d := &adDev{t: t, cmd: exec.Command(bin, append([]string{"dev", "--listen", "127.0.0.1:0"}, args...)...)}
	d.cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PAYWATCH_") {
			d.cmd.Env = append(d.cmd.Env, kv)
		}
	}
	d.cmd.Env = append(d.cmd.Env, env...)
	d.cmd.Stderr = &lockedWriter{w: &d.logs, mu: &d.mu}
	stdout, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	found, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			d.mu.Lock()
			d.out.WriteString(sc.Text() + "\n")
			if m := devAPILine.FindStringSubmatch(sc.Text()); m != nil {
				d.api = m[1]
			}
			if m := devOrderLine.FindStringSubmatch(sc.Text()); m != nil && d.orderID == "" {
				d.orderID = m[1]
				close(found)
			}
			d.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		text := d.stop()
		if t.Failed() {
			t.Logf("paywatch dev output:\n%s", text)
		}
	})
	select {
	case <-found:
	case <-exited:
		t.Fatalf("paywatch dev exited before printing its demo order:\n%s", d.stop())
	case <-time.After(3 * time.Minute):
		t.Fatalf("paywatch dev printed no demo order within 3 minutes:\n%s", d.stop())
	}
	return d
}

// stdout is what dev printed so far.
func (d *adDev) stdout() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.String()
}

// stop sends SIGTERM, waits for dev to exit, and returns all it printed,
// logs included.
func (d *adDev) stop() string {
	if !d.stopped {
		d.stopped = true
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		_ = d.cmd.Wait()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.String() + d.logs.String()
}

// database is the database dev announced and what it said of it.
func (d *adDev) database() (string, string) {
	d.t.Helper()
	m := adDatabaseLine.FindStringSubmatch(d.stdout())
	if m == nil {
		d.t.Fatalf("paywatch dev names no database:\n%s", d.stdout())
	}
	return m[1], m[2]
}

// adCount runs a count query on the database at dsn.
func adCount(t *testing.T, dsn, query string, args ...any) int {
	t.Helper()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s on %s: %v", query, dsn, err)
	}
	return n
}

// README ("Run it"): "With Go 1.26 and PostgreSQL's server programs
// installed (a server already running on `127.0.0.1:5432` with trust auth
// is used if there is one)" and "a database of its own (a fresh one on the
// local server, dropped on exit ...)". With nothing set, dev looks for the
// server at 127.0.0.1:5432 as user postgres without a password; there is
// one here, so dev makes a paywatch_dev_ database on it (no throwaway
// cluster), keeps its demo order there, and drops it on exit.
func TestDevUsesTheServerOn127001Port5432ByDefault(t *testing.T) {
	const want = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	if localServer != want {
		t.Fatalf("paywatch dev looks for a server at %s, README says 127.0.0.1:5432 with trust auth (%s)", localServer, want)
	}
	d := adStartDev(t, "", nil, "PAYWATCH_DEV_STATE="+filepath.Join(t.TempDir(), "dev.json"))
	dsn, note := d.database()
	m := regexp.MustCompile(`^postgres://postgres@127\.0\.0\.1:5432/(paywatch_dev_[0-9a-f]{12})\?sslmode=disable$`).FindStringSubmatch(dsn)
	if m == nil || note != "dropped on exit" {
		t.Fatalf("with nothing set, paywatch dev uses %s (%s); want a fresh paywatch_dev_ database on 127.0.0.1:5432, dropped on exit", dsn, note)
	}
	if n := adCount(t, dsn, `SELECT count(*) FROM orders WHERE id = $1`, d.orderID); n != 1 {
		t.Fatalf("the demo order %s is not in %s (%d rows)", d.orderID, dsn, n)
	}
	logs := d.stop()
	if strings.Contains(logs, "throwaway") {
		t.Fatalf("paywatch dev started a throwaway cluster although 127.0.0.1:5432 answers:\n%s", logs)
	}
	if n := adCount(t, want, `SELECT count(*) FROM pg_database WHERE datname = $1`, m[1]); n != 0 {
		t.Fatalf("database %s is left on 127.0.0.1:5432 after dev exited", m[1])
	}
}

// README ("Run it"): "without a server, a throwaway cluster ... started
// with `initdb`/`pg_ctl` from `PATH` or `/usr/lib/postgresql/*/bin`". The
// look-up takes PATH first, then the newest version directory under
// /usr/lib/postgresql; and dev, with no server to use, runs the initdb on
// PATH (here a wrapper that notes each run) rather than the one in
// /usr/lib/postgresql, and finds pg_ctl, on no PATH directory, there.
func TestDevFindsInitdbAndPgCtlOnPathThenInUsrLibPostgresql(t *testing.T) {
	if postgresBinDirs != "/usr/lib/postgresql/*/bin" {
		t.Fatalf("PostgreSQL's programs are looked for in %s, README says /usr/lib/postgresql/*/bin", postgresBinDirs)
	}
	exe := func(path string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("lookup order", func(t *testing.T) {
		root := t.TempDir()
		// Versions 9, 13 and 16: the newest is 16 (not "9", last by name).
		for _, v := range []string{"9", "13", "16"} {
			exe(filepath.Join(root, "lib", v, "bin", "initdb"))
		}
		exe(filepath.Join(root, "path", "initdb"))
		saved := postgresBinDirs
		postgresBinDirs = filepath.Join(root, "lib", "*", "bin")
		defer func() { postgresBinDirs = saved }()

		t.Setenv("PATH", filepath.Join(root, "path"))
		if got, err := postgresBin("initdb"); err != nil || got != filepath.Join(root, "path", "initdb") {
			t.Fatalf("with initdb on PATH and in the version directories, the look-up gives %s (%v), want the one on PATH", got, err)
		}
		t.Setenv("PATH", filepath.Join(root, "empty"))
		if got, err := postgresBin("initdb"); err != nil || got != filepath.Join(root, "lib", "16", "bin", "initdb") {
			t.Fatalf("with no initdb on PATH, the look-up gives %s (%v), want the newest version's (16)", got, err)
		}
		if got, err := postgresBin("pg_ctl"); err == nil || !strings.Contains(err.Error(), "pg_ctl not found on PATH or in "+postgresBinDirs) {
			t.Fatalf("with pg_ctl nowhere, the look-up gives %s (%v), want an error that says where it looked", got, err)
		}
	})

	real, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(real) == 0 {
		t.Fatal("PostgreSQL's server programs are not in /usr/lib/postgresql/*/bin on this machine")
	}
	// dev runs PostgreSQL's programs as postgres (or nobody) when run as
	// root: the wrapper and its notes must be reachable by that user.
	root := t.TempDir()
	wrappers, notes := filepath.Join(root, "bin"), filepath.Join(root, "notes")
	for _, dir := range []string{root, wrappers, notes} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	_ = os.Chmod(filepath.Dir(root), 0o755)
	used := filepath.Join(notes, "initdb")
	script := fmt.Sprintf("#!/bin/sh\necho \"$0 $*\" >> %q\nexec %q \"$@\"\n", used, real[len(real)-1])
	if err := os.WriteFile(filepath.Join(wrappers, "initdb"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	path := []string{wrappers}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if !fileExists(filepath.Join(dir, "initdb")) && !fileExists(filepath.Join(dir, "pg_ctl")) {
			path = append(path, dir)
		}
	}
	d := adStartDev(t, "", nil, "PATH="+strings.Join(path, string(os.PathListSeparator)),
		"PAYWATCH_DEV_LOCAL_SERVER=postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1",
		"PAYWATCH_DEV_STATE="+filepath.Join(t.TempDir(), "dev.json"))
	if _, note := d.database(); note != "a throwaway cluster, removed on exit" {
		t.Fatalf("paywatch dev without a server uses no throwaway cluster (%s)", note)
	}
	ran, err := os.ReadFile(used)
	if err != nil || !strings.HasPrefix(string(ran), filepath.Join(wrappers, "initdb")+" -D ") {
		t.Fatalf("paywatch dev did not run the initdb on PATH (%v): %q", err, ran)
	}
}

// README ("Run it"): "`PAYWATCH_DATABASE_URL` overrides both". With the
// variable set to an empty database, while a server answers on
// 127.0.0.1:5432, dev makes no database of its own there and starts no
// cluster: it works in the given database (its demo order and its devnet
// cursor are there), and leaves it, with what it wrote, when it exits.
func TestDevDatabaseURLOverridesTheLocalServerAndIsKept(t *testing.T) {
	_, dsn := pgtest.NewWithURL(t)
	d := adStartDev(t, "", nil, "PAYWATCH_DATABASE_URL="+dsn, "PAYWATCH_DEV_STATE="+filepath.Join(t.TempDir(), "dev.json"))
	if got, note := d.database(); got != redact(dsn) || note != "PAYWATCH_DATABASE_URL" {
		t.Fatalf("with PAYWATCH_DATABASE_URL set, paywatch dev uses %s (%s), want %s (PAYWATCH_DATABASE_URL)", got, note, redact(dsn))
	}
	waitUntil(t, 30*time.Second, "dev's devnet cursor in the database of PAYWATCH_DATABASE_URL", func() bool {
		return adCount(t, dsn, `SELECT count(*) FROM chain_cursors WHERE network = 'devnet'`) == 1
	})
	logs := d.stop()
	if strings.Contains(logs, "paywatch_dev_") || strings.Contains(logs, "throwaway") {
		t.Fatalf("with PAYWATCH_DATABASE_URL set, paywatch dev made a database of its own:\n%s", logs)
	}
	if n := adCount(t, dsn, `SELECT count(*) FROM orders WHERE id = $1 AND network = 'devnet'`, d.orderID); n != 1 {
		t.Fatalf("after dev exited, the demo order %s is not in the database of PAYWATCH_DATABASE_URL", d.orderID)
	}
	if n := adCount(t, dsn, `SELECT count(*) FROM chain_cursors WHERE network = 'devnet'`); n != 1 {
		t.Fatalf("after dev exited, the database of PAYWATCH_DATABASE_URL has %d devnet cursors, want 1", n)
	}
}

// README ("Run it"): "`paywatch dev` ... generates API keys ... and prints
// the keys and a demo order ready to pay". Without PAYWATCH_STOREFRONT_KEY
// and PAYWATCH_OPERATOR_KEY, dev prints a storefront key and an operator
// key it made up (random, sf_dev_ and op_dev_ then 24 hex digits), the
// ones dev pay is given; each works against the API for its role.
func TestDevPrintsTheKeysItGeneratesAndTheyWork(t *testing.T) {
	state := filepath.Join(t.TempDir(), "dev.json")
	d := adStartDev(t, "", nil, "PAYWATCH_DEV_LOCAL_SERVER="+pgtest.ServerURL(), "PAYWATCH_DEV_STATE="+state)
	out := d.stdout()
	sfm, opm := adStorefrontLine.FindStringSubmatch(out), adOperatorLine.FindStringSubmatch(out)
	if sfm == nil || opm == nil {
		t.Fatalf("paywatch dev prints no storefront or operator key:\n%s", out)
	}
	sf, op := sfm[1], opm[1]
	if !regexp.MustCompile(`^sf_dev_[0-9a-f]{24}$`).MatchString(sf) || !regexp.MustCompile(`^op_dev_[0-9a-f]{24}$`).MatchString(op) {
		t.Fatalf("paywatch dev printed the keys %q and %q, want sf_dev_ and op_dev_ with 24 random hex digits", sf, op)
	}
	if st := readDevState(t, state); st.StorefrontKey != sf || st.OperatorKey != op {
		t.Fatalf("dev pay is given other keys (%s, %s) than those printed (%s, %s)", st.StorefrontKey, st.OperatorKey, sf, op)
	}
	api := &daemonProcess{t: t, url: d.api}
	if code, o := api.call("GET", "/v1/orders/"+d.orderID, sf, ""); code != 200 || o["id"] != d.orderID {
		t.Fatalf("the demo order with the printed storefront key: %d %v", code, o)
	}
	if code, o := api.call("POST", "/v1/orders", sf, `{"external_id":"printed-key","network":"devnet","asset":"ETH","amount":"1"}`); code != 201 {
		t.Fatalf("an order with the printed storefront key: %d %v", code, o)
	}
	if code, o := api.call("GET", "/v1/networks", op, ""); code != 200 {
		t.Fatalf("GET /v1/networks with the printed operator key: %d %v", code, o)
	}
	if code, o := api.call("GET", "/v1/networks", sf, ""); code != 403 {
		t.Fatalf("GET /v1/networks with the printed storefront key: %d %v, want 403", code, o)
	}
}

// README ("Run it"): "What `dev pay` needs is in `paywatch/dev.json` in
// the user's cache directory (`PAYWATCH_DEV_STATE` elsewhere), removed on
// exit." With PAYWATCH_DEV_STATE unset and XDG_CACHE_HOME set, dev writes
// $XDG_CACHE_HOME/paywatch/dev.json (for this user alone: the file 0600 in
// a 0700 directory), nothing under $HOME; dev pay finds it there with the
// same environment; the file is gone once dev exits.
func TestDevStateFileIsPaywatchDevJSONInTheUserCacheDirectory(t *testing.T) {
	cache, home := t.TempDir(), t.TempDir()
	env := []string{"XDG_CACHE_HOME=" + cache, "HOME=" + home}
	d := adStartDev(t, "", nil, append(env, "PAYWATCH_DEV_LOCAL_SERVER="+pgtest.ServerURL())...)
	state := filepath.Join(cache, "paywatch", "dev.json")
	fi, err := os.Stat(state)
	if err != nil {
		found, _ := filepath.Glob(filepath.Join(home, "*", "paywatch", "*"))
		t.Fatalf("no %s while dev runs (%v); under HOME: %v", state, err, found)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s is %s, want -rw------- (it holds the keys)", state, fi.Mode())
	}
	if dir, err := os.Stat(filepath.Dir(state)); err != nil || dir.Mode().Perm() != 0o700 {
		t.Fatalf("%s is not a directory for this user alone: %v %v", filepath.Dir(state), dir.Mode(), err)
	}
	if st := readDevState(t, state); st.API != d.api {
		t.Fatalf("%s names the API %s, dev serves it at %s", state, st.API, d.api)
	}
	if found, _ := filepath.Glob(filepath.Join(home, "*", "paywatch")); len(found) > 0 {
		t.Fatalf("with XDG_CACHE_HOME set, dev wrote under HOME: %v", found)
	}

	bin, _ := buildBinary()
	pay := exec.Command(bin, "dev", "pay", d.orderID, "--no-follow")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PAYWATCH_") {
			pay.Env = append(pay.Env, kv)
		}
	}
	pay.Env = append(pay.Env, env...)
	if out, err := pay.CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "sent ") {
		t.Fatalf("dev pay with XDG_CACHE_HOME=%s does not find dev's state (%v):\n%s", cache, err, out)
	}
	d.stop()
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Fatalf("%s is left after dev exited: %v", state, err)
	}
}

// adRate samples a height over about window and returns how many blocks
// it rose by per second.
func adRate(t *testing.T, window time.Duration, height func() int64) float64 {
	t.Helper()
	start, first := time.Now(), height()
	for time.Since(start) < window {
		time.Sleep(50 * time.Millisecond)
	}
	last := height()
	return float64(last-first) / time.Since(start).Seconds()
}

// README ("Run it"): "`paywatch dev` starts an EVM development chain ...
// (network `devnet`, chain id 1337, a block a second, ...)" and
// "`paywatch dev --bitcoin` adds a btcd regtest node (network `devbtc`,
// ..., a block every `--block-time`)". The flag defaults to 1s; with
// --block-time 250ms both chains seal about four blocks a second (devnet
// read on its node, devbtc through the API's heads), where the default
// would give one; without the flag, devnet seals about one a second.
func TestDevBlockTimeFlagSetsBothChainsBlockInterval(t *testing.T) {
	t.Run("--block-time 250ms", func(t *testing.T) {
		state := filepath.Join(t.TempDir(), "dev.json")
		d := adStartDev(t, "", []string{"--bitcoin", "--block-time", "250ms"}, "PAYWATCH_DEV_LOCAL_SERVER="+pgtest.ServerURL(),
			"PAYWATCH_STOREFRONT_KEY="+e2eStorefrontKey, "PAYWATCH_OPERATOR_KEY="+e2eOperatorKey, "PAYWATCH_DEV_STATE="+state)
		if !strings.Contains(d.stdout(), "a block every 250ms;") {
			t.Fatalf("paywatch dev --block-time 250ms does not say so:\n%s", d.stdout())
		}
		api := &daemonProcess{t: t, url: d.api}
		head := func(network string) func() int64 {
			return func() int64 {
				_, v := api.call("GET", "/v1/networks", e2eOperatorKey, "")
				data, _ := v["data"].([]any)
				for _, n := range data {
					if n := n.(map[string]any); n["name"] == network {
						h, _ := n["head"].(float64)
						return int64(h)
					}
				}
				return -1
			}
		}
		waitUntil(t, 60*time.Second, "devbtc's head in the API", func() bool { return head("devbtc")() > 0 })
		devnet := adEVMHeight(t, readDevState(t, state).RPC)
		// Both at once: devnet's node in a goroutine (its reads only report
		// errors), the API in the test's own.
		evm := make(chan float64, 1)
		go func() { evm <- adRate(t, 3*time.Second, devnet) }()
		btcRate := adRate(t, 3*time.Second, head("devbtc"))
		evmRate := <-evm
		t.Logf("with --block-time 250ms: devnet %.2f, devbtc %.2f blocks a second", evmRate, btcRate)
		for name, rate := range map[string]float64{"devnet": evmRate, "devbtc": btcRate} {
			if rate < 2 || rate > 5 {
				t.Errorf("with --block-time 250ms, %s seals %.1f blocks a second, want about 4", name, rate)
			}
		}
	})
	t.Run("default", func(t *testing.T) {
		state := filepath.Join(t.TempDir(), "dev.json")
		d := adStartDev(t, "", nil, "PAYWATCH_DEV_LOCAL_SERVER="+pgtest.ServerURL(), "PAYWATCH_DEV_STATE="+state)
		if !strings.Contains(d.stdout(), "a block every 1s;") {
			t.Fatalf("paywatch dev without --block-time does not say it seals a block a second:\n%s", d.stdout())
		}
		rate := adRate(t, 3*time.Second, adEVMHeight(t, readDevState(t, state).RPC))
		t.Logf("without --block-time: devnet %.2f blocks a second", rate)
		if rate < 0.6 || rate > 1.3 {
			t.Fatalf("without --block-time, devnet seals %.2f blocks a second, README says one", rate)
		}
	})
}

// adEVMHeight reads the head of the EVM node at url.
func adEVMHeight(t *testing.T, url string) func() int64 {
	t.Helper()
	node, err := rpc.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node.Close)
	return func() int64 {
		var n hexutil.Uint64
		if err := node.Call(&n, "eth_blockNumber"); err != nil {
			t.Errorf("eth_blockNumber on %s: %v", url, err)
		}
		return int64(n)
	}
}

// README ("Run it"): "btcd is built with the Go toolchain the first time
// ... into `paywatch/bin` of the user's cache directory (from the
// repository, or `go install`ed from the module proxy when run elsewhere)".
// Run outside the module (its directory a temporary one), with no btcd on
// PATH and none in the cache, dev --bitcoin first tries go build, which
// fails there, then runs `go install github.com/btcsuite/btcd@VERSION` (the
// version it was built with) with GOBIN in paywatch/bin of the cache, and
// runs what that installed, as paywatch/bin/btcd-VERSION. The go on PATH
// here notes each call, and does the install by building the same version
// from this module instead of fetching it.
func TestDevInstallsBtcdWithGoInstallOutsideTheModule(t *testing.T) {
	version, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/btcsuite/btcd").Output()
	if err != nil {
		t.Fatal(err)
	}
	ver := strings.TrimSpace(string(version))
	module, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatal(err)
	}
	gocache, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	realGo, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	fake, calls := t.TempDir(), filepath.Join(t.TempDir(), "calls")
	script := fmt.Sprintf(`#!/bin/sh
echo "$PWD|$GOBIN|$*" >> %q
if [ "$1" = install ]; then
	cd %q && exec %q build -o "$GOBIN/btcd" github.com/btcsuite/btcd
fi
exec %q "$@"
`, calls, strings.TrimSpace(string(module)), realGo, realGo)
	if err := os.WriteFile(filepath.Join(fake, "go"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	path := []string{fake}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if !fileExists(filepath.Join(dir, "btcd")) {
			path = append(path, dir)
		}
	}
	cache, elsewhere := t.TempDir(), t.TempDir()
	d := adStartDev(t, elsewhere, []string{"--bitcoin"}, "PAYWATCH_DEV_LOCAL_SERVER="+pgtest.ServerURL(),
		"PAYWATCH_DEV_STATE="+filepath.Join(t.TempDir(), "dev.json"), "XDG_CACHE_HOME="+cache,
		"GOCACHE="+strings.TrimSpace(string(gocache)), "PATH="+strings.Join(path, string(os.PathListSeparator)))
	waitUntil(t, 60*time.Second, "the Bitcoin demo order", func() bool { return strings.Contains(d.stdout(), "A Bitcoin demo order") })

	bin := filepath.Join(cache, "paywatch", "bin")
	raw, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	build := elsewhere + "||build -o " + filepath.Join(bin, "btcd-"+ver) + " github.com/btcsuite/btcd"
	install := regexp.MustCompile("^" + regexp.QuoteMeta(elsewhere+"|"+filepath.Join(bin, "install-")) + `[^/|]+\|install github\.com/btcsuite/btcd@` +
		regexp.QuoteMeta(ver) + "$")
	if len(lines) != 2 || lines[0] != build || !install.MatchString(lines[1]) {
		t.Fatalf("paywatch dev --bitcoin, run outside the module, called go as\n%s\nwant\n%s\n%s", raw, build, install)
	}
	t.Logf("go was called as:\n%s", raw)
	if fi, err := os.Stat(filepath.Join(bin, "btcd-"+ver)); err != nil || fi.Mode().Perm()&0o100 == 0 {
		t.Fatalf("no btcd-%s installed into %s: %v", ver, bin, err)
	}
}

// adCall is a request a recording proxy passed on.
type adCall struct {
	method, uri, ifNoneMatch string
	status                   int
	etag                     string
	start, end               time.Time
}

// adRecorder passes requests on to an API and notes each, and how many
// were in flight at once.
type adRecorder struct {
	mu          sync.Mutex
	calls       []adCall
	inFlight    int
	maxInFlight int
}

type adStatusWriter struct {
	http.ResponseWriter
	status int
}

func (w *adStatusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func adRecordingProxy(t *testing.T, api string) (string, *adRecorder) {
	t.Helper()
	target, err := url.Parse(api)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	rec := &adRecorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := adCall{method: r.Method, uri: r.URL.RequestURI(), ifNoneMatch: r.Header.Get("If-None-Match"), start: time.Now()}
		rec.mu.Lock()
		rec.inFlight++
		rec.maxInFlight = max(rec.maxInFlight, rec.inFlight)
		rec.mu.Unlock()
		sw := &adStatusWriter{ResponseWriter: w, status: http.StatusOK}
		proxy.ServeHTTP(sw, r)
		c.status, c.etag, c.end = sw.status, w.Header().Get("ETag"), time.Now()
		rec.mu.Lock()
		rec.inFlight--
		rec.calls = append(rec.calls, c)
		rec.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	return srv.URL, rec
}

// README ("Run it"): "`dev pay` ... follows the order with one long-poll
// at a time until it ends (about three seconds for the demo order: three
// confirmations)". The demo order needs three confirmations; dev pay,
// reaching the API through a proxy that notes every request, reads the
// order, sends, says "I've paid", then follows with GET ?wait=30s requests,
// never two at once, each sending the ETag of the answer before (so each
// one waits for a change) and each answered by a change; the order goes
// awaiting_payment → confirming → settled within seconds of the payment.
func TestDevPayFollowsWithOneLongPollAtATime(t *testing.T) {
	state := filepath.Join(t.TempDir(), "dev.json")
	d := adStartDev(t, "", nil, "PAYWATCH_DEV_LOCAL_SERVER="+pgtest.ServerURL(),
		"PAYWATCH_STOREFRONT_KEY="+e2eStorefrontKey, "PAYWATCH_OPERATOR_KEY="+e2eOperatorKey, "PAYWATCH_DEV_STATE="+state)
	api := &daemonProcess{t: t, url: d.api}
	if code, o := api.call("GET", "/v1/orders/"+d.orderID, e2eStorefrontKey, ""); code != 200 || o["required_confirmations"] != float64(3) {
		t.Fatalf("the demo order: %d, required_confirmations %v; README says three confirmations", code, o["required_confirmations"])
	}

	st := readDevState(t, state)
	proxied, rec := adRecordingProxy(t, st.API)
	st.API = proxied
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	viaProxy := filepath.Join(t.TempDir(), "dev.json")
	if err := os.WriteFile(viaProxy, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out := devPay(t, viaProxy, d.orderID)
	took := time.Since(start)
	if !strings.HasSuffix(out, "order "+d.orderID+": awaiting_payment → confirming → settled\n") {
		t.Fatalf("dev pay printed:\n%s", out)
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	var trace strings.Builder
	for _, c := range rec.calls {
		fmt.Fprintf(&trace, "  %s %s (If-None-Match %q) → %d %s in %s\n", c.method, c.uri, c.ifNoneMatch, c.status, c.etag,
			c.end.Sub(c.start).Round(time.Millisecond))
	}
	order := "/v1/orders/" + d.orderID
	if len(rec.calls) < 3 || rec.calls[0].method != "GET" || rec.calls[0].uri != order ||
		rec.calls[1].method != "POST" || rec.calls[1].uri != order+"/paid" {
		t.Fatalf("dev pay does not read the order, then say \"I've paid\":\n%s", trace.String())
	}
	follow := rec.calls[2:]
	if rec.maxInFlight != 1 {
		t.Fatalf("dev pay had %d requests in flight at once, README says one long-poll at a time:\n%s", rec.maxInFlight, trace.String())
	}
	for i, c := range follow {
		if c.method != "GET" || c.uri != order+"?wait=30s" {
			t.Fatalf("dev pay follows the order with %s %s, not a long-poll (?wait=30s):\n%s", c.method, c.uri, trace.String())
		}
		if i > 0 && (c.ifNoneMatch == "" || c.ifNoneMatch != follow[i-1].etag) {
			t.Fatalf("long-poll %d sends If-None-Match %q, not the ETag of the answer before (%q): it would not wait for a change:\n%s",
				i+1, c.ifNoneMatch, follow[i-1].etag, trace.String())
		}
		if c.status != http.StatusOK {
			t.Fatalf("long-poll %d was answered %d, not by a change:\n%s", i+1, c.status, trace.String())
		}
	}
	t.Logf("dev pay took %s, with %d long-polls:\n%s", took.Round(time.Millisecond), len(follow), trace.String())
	if took > 10*time.Second {
		t.Fatalf("dev pay took %s to see the demo order settled, README says about three seconds", took.Round(time.Millisecond))
	}
}

// README ("Configuration"): "`orders.default_expiry` | `1h` | how long a
// quote is valid when the request gives no `expires_in_seconds`". An order
// created through the API without expires_in_seconds expires one hour
// after it was created; with expires_in_seconds: 600, ten minutes after.
func TestOrderWithoutExpiresInSecondsExpiresAfter1h(t *testing.T) {
	d := newCLIAPI(t)
	for _, c := range []struct {
		extra string
		want  time.Duration
	}{{"", time.Hour}, {`,"expires_in_seconds":600`, 10 * time.Minute}} {
		req, _ := http.NewRequest("POST", d.url+"/v1/orders", strings.NewReader(
			`{"external_id":"expiry-`+c.want.String()+`","network":"bitcoin","asset":"BTC","amount":"0.001"`+c.extra+`}`))
		req.Header.Set("Authorization", "Bearer "+e2eStorefrontKey)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var o struct {
			CreatedAt time.Time `json:"created_at"`
			ExpiresAt time.Time `json:"expires_at"`
		}
		err = json.NewDecoder(res.Body).Decode(&o)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusCreated {
			t.Fatalf("create (%s): %d %v", c.extra, res.StatusCode, err)
		}
		if got := o.ExpiresAt.Sub(o.CreatedAt); got != c.want {
			t.Fatalf("an order created with {%s} expires %s after it was created (%s → %s), want %s",
				strings.TrimPrefix(c.extra, ","), got, o.CreatedAt, o.ExpiresAt, c.want)
		}
	}
}

// README ("Configuration"): "`webhooks.allow_private_networks` | `false` |
// allow webhook URLs on loopback, private, link-local and metadata
// addresses (refused otherwise: SSRF guard)". With a webhook URL on
// 127.0.0.1 and the key left out, serve's sender does not reach the
// receiver: the attempt is recorded refused, saying why; with the key set
// to true, the same receiver gets the event.
func TestWebhooksToLoopbackRefusedUnlessAllowPrivateNetworks(t *testing.T) {
	d := newCLIAPI(t)
	var got sync.Map
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got.Store(string(body), true)
	}))
	defer receiver.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		key       string
		delivered bool
	}{{"", false}, {"\n  allow_private_networks: true", true}} {
		cfg, err := config.Parse([]byte(cliConfig+"webhooks:\n  url: "+receiver.URL+"/hook\n  secret_env: WH"+c.key+"\n"), func(k string) string {
			return map[string]string{"DB": "unused", "SF_KEY": e2eStorefrontKey, "OP_KEY": e2eOperatorKey, "WH": "whsec_0123456789"}[k]
		})
		if err != nil {
			t.Fatal(err)
		}
		o := d.order("hook" + fmt.Sprint(c.delivered))
		if err := pg.Tx(context.Background(), d.db, func(tx *sqlx.Tx) error {
			return orders.EnqueueWebhook(context.Background(), tx, o.ID, time.Now(), orders.WebhookCancelled)
		}); err != nil {
			t.Fatal(err)
		}
		if n, err := newSender(d.db, log, cfg).Round(context.Background()); err != nil || n != 1 {
			t.Fatalf("the sender attempted %d events (%v), want 1", n, err)
		}
		var status, lastError sql.NullString
		if err := d.db.QueryRow(`SELECT status, last_error FROM webhook_outbox WHERE order_id = $1`, o.ID).Scan(&status, &lastError); err != nil {
			t.Fatal(err)
		}
		reached := false
		got.Range(func(k, _ any) bool {
			reached = reached || strings.Contains(k.(string), o.ID)
			return true
		})
		if c.delivered {
			if !reached || status.String != "delivered" {
				t.Fatalf("with allow_private_networks: true, the event to %s is %s (%s), receiver reached: %v", receiver.URL, status.String, lastError.String, reached)
			}
			continue
		}
		if reached || !strings.Contains(lastError.String, "127.0.0.1 is") || !strings.Contains(lastError.String, "(webhooks.allow_private_networks is false)") {
			t.Fatalf("with allow_private_networks left out, an event to %s reached it: %v; recorded %s, %q",
				receiver.URL, reached, status.String, lastError.String)
		}
	}
}

// README ("Operating it"): the operator commands "exit 1 on an error the
// API answers (its code and message printed)". For errors of several
// kinds (an unknown order or transfer, a storefront key, an order in the
// wrong state, a bad filter), the command exits 1 and prints the API's
// own code and message, as the API gave them, after the command's name.
func TestOperatorCommandErrorsPrintTheAPIsCodeAndMessage(t *testing.T) {
	d := newCLIAPI(t)
	o := d.order("cli-errors")
	// A proxy notes the API's error answers as they are.
	target, _ := url.Parse(d.url)
	var mu sync.Mutex
	var answers []string
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(res *http.Response) error {
		if res.StatusCode/100 != 2 {
			body, err := io.ReadAll(res.Body)
			if err != nil {
				return err
			}
			res.Body = io.NopCloser(bytes.NewReader(body))
			mu.Lock()
			answers = append(answers, string(body))
			mu.Unlock()
		}
		return nil
	}
	srv := httptest.NewServer(proxy)
	defer srv.Close()
	for _, c := range []struct {
		key  string
		args []string
		code string
	}{
		{e2eOperatorKey, []string{"orders", "show", "ord_nope"}, "not_found"},
		{e2eOperatorKey, []string{"transfers", "show", "trf_nope"}, "not_found"},
		{e2eStorefrontKey, []string{"transfers", "list"}, "forbidden"},
		{e2eOperatorKey, []string{"resolve", o.ID, "--outcome", "refunded", "--note", "nothing came"}, "invalid_state"},
		{e2eOperatorKey, []string{"orders", "list", "--status", "lost"}, "invalid_request"},
	} {
		mu.Lock()
		answers = nil
		mu.Unlock()
		out, code := cli(map[string]string{"PAYWATCH_API": srv.URL, "PAYWATCH_API_KEY": c.key}, c.args...)
		mu.Lock()
		seen := answers
		mu.Unlock()
		if len(seen) != 1 {
			t.Fatalf("paywatch %v: the API answered %d errors (%v), want one", c.args, len(seen), seen)
		}
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(seen[0]), &e); err != nil || e.Error.Code != c.code || e.Error.Message == "" {
			t.Fatalf("paywatch %v: the API answered %s (%v), want a %s error", c.args, seen[0], err, c.code)
		}
		want := fmt.Sprintf("paywatch %s: %s: %s\n", c.args[0], e.Error.Code, e.Error.Message)
		if code != exitError || out != want {
			t.Fatalf("paywatch %v exited %d and printed\n  %q\nwant exit 1 and\n  %q", c.args, code, out, want)
		}
		t.Logf("paywatch %v: %s", c.args, strings.TrimSpace(out))
	}
}
