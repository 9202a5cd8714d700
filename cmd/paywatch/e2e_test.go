package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

const (
	e2eStorefrontKey = "sf_e2e_0123456789abcdef"
	e2eOperatorKey   = "op_e2e_0123456789abcdef"
)

// buildBinary compiles paywatch once per test run; buildNodevBinary the
// production build, without development mode.
var (
	buildBinary      = sync.OnceValues(func() (string, error) { return build() })
	buildNodevBinary = sync.OnceValues(func() (string, error) { return build("-tags", "nodev") })
)

// build compiles paywatch with the go build flags given into a directory
// of its own.
func build(flags ...string) (string, error) {
	dir, err := os.MkdirTemp("", "paywatch-e2e-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "paywatch")
	out, err := exec.Command("go", append(append([]string{"build"}, flags...), "-o", bin, ".")...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", strings.Join(flags, " "), err, out)
	}
	return bin, nil
}

type daemonProcess struct {
	t    testing.TB
	cmd  *exec.Cmd
	url  string
	logs *bytes.Buffer
	mu   sync.Mutex // guards logs
	done chan error
}

// writeConfig writes the example configuration with the listen address
// replaced by port 0 and rpc nodes that are not running.
func writeConfig(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("paywatch.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(string(data), "listen: 127.0.0.1:8080", "listen: 127.0.0.1:0", 1)
	doc = strings.ReplaceAll(doc, "http://127.0.0.1:8545", "http://127.0.0.1:9") // nothing listens there
	path := filepath.Join(t.TempDir(), "paywatch.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func daemonEnv(dbURL string) []string {
	return append(os.Environ(),
		"PAYWATCH_DATABASE_URL="+dbURL,
		"PAYWATCH_STOREFRONT_KEY="+e2eStorefrontKey,
		"PAYWATCH_OPERATOR_KEY="+e2eOperatorKey,
		"PAYWATCH_WEBHOOK_SECRET=whsec_e2e",
		"PAYWATCH_BTC_RPC_USER=user",
		"PAYWATCH_BTC_RPC_PASS=pass")
}

var listenLine = regexp.MustCompile(`msg="paywatch listening" addr=(\S+)`)

func startDaemon(t testing.TB, configPath, dbURL string) *daemonProcess {
	t.Helper()
	return startBuilt(t, buildBinary, configPath, dbURL)
}

// startBuilt is startDaemon with the binary that built gives.
func startBuilt(t testing.TB, built func() (string, error), configPath, dbURL string) *daemonProcess {
	t.Helper()
	bin, err := built()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", configPath)
	cmd.Env = daemonEnv(dbURL)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemonProcess{t: t, cmd: cmd, logs: &bytes.Buffer{}, done: make(chan error, 1)}
	addr := make(chan string, 1)
	mu := &d.mu
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			d.logs.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if m := listenLine.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		d.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
		if t.Failed() {
			mu.Lock()
			t.Logf("daemon logs:\n%s", d.logs)
			mu.Unlock()
		}
	})
	select {
	case a := <-addr:
		d.url = "http://" + a
	case err := <-d.done:
		t.Fatalf("daemon exited before listening: %v\n%s", err, d.logs)
	case <-time.After(60 * time.Second):
		t.Fatalf("daemon did not start:\n%s", d.logs)
	}
	return d
}

// stop sends SIGTERM and returns the exit code.
func (d *daemonProcess) stop() int {
	d.t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(40 * time.Second):
		d.t.Fatal("daemon did not stop after SIGTERM")
	}
	return d.cmd.ProcessState.ExitCode()
}

func (d *daemonProcess) call(method, path, key, body string) (int, map[string]any) {
	d.t.Helper()
	req, _ := http.NewRequest(method, d.url+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var v map[string]any
	if err := json.Unmarshal(raw, &v); err != nil {
		d.t.Fatalf("%s %s: %d %s", method, path, res.StatusCode, raw)
	}
	return res.StatusCode, v
}

func TestEndToEnd(t *testing.T) {
	dbURL, _ := pgtest.UnusedURL(t) // migrate creates it
	configPath := writeConfig(t)
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	migrate := exec.Command(bin, "migrate", "--config", configPath)
	migrate.Env = daemonEnv(dbURL)
	if out, err := migrate.CombinedOutput(); err != nil || !strings.Contains(string(out), "up to date") {
		t.Fatalf("migrate: %v\n%s", err, out)
	}

	d := startDaemon(t, configPath, dbURL)
	if code, _ := d.call("GET", "/healthz", "", ""); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	code, o := d.call("POST", "/v1/orders", e2eStorefrontKey,
		`{"external_id":"kd-1","network":"ethereum","asset":"USDT","amount":"1234.00","metadata":{"plan":"L40S-7d"}}`)
	payAmount, _ := o["pay_amount"].(string) // 1234 plus one of 10,000 increments of 0.000001, drawn at random
	if units, err := paywatch.ParseUnits(payAmount, 6, "USDT", nil); code != 201 || err != nil ||
		units.Int64() < 1_234_000_000 || units.Int64() >= 1_234_010_000 || o["status"] != "awaiting_payment" {
		t.Fatalf("create: %d %v", code, o)
	}
	id := o["id"].(string)
	code, b1 := d.call("POST", "/v1/orders", e2eStorefrontKey, `{"external_id":"btc-1","network":"bitcoin","asset":"BTC","amount":"0.001"}`)
	if code != 201 {
		t.Fatalf("bitcoin order: %d %v", code, b1)
	}
	if code, e := d.call("POST", "/v1/orders", e2eStorefrontKey, `{"external_id":"x","network":"ethereum","asset":"USDT","amount":"1.0000001"}`); code != 400 {
		t.Fatalf("bad amount: %d %v", code, e)
	}
	if code, p := d.call("POST", "/v1/orders/"+id+"/paid", e2eStorefrontKey, `{"tx_hash":"0x`+strings.Repeat("1f", 32)+`"}`); code != 200 || p["customer_marked_paid_at"] == nil {
		t.Fatalf("paid: %d %v", code, p)
	}
	// Both networks' nodes are dead: each shows it, with the error, while
	// the API answers (the orders above were created meanwhile).
	waitUntil(t, 30*time.Second, "both networks to show their dead node", func() bool {
		code, n := d.call("GET", "/v1/networks", e2eOperatorKey, "")
		nets, _ := n["data"].([]any)
		if code != 200 || len(nets) != 2 {
			t.Fatalf("networks: %d %v", code, n)
		}
		for _, x := range nets {
			v := x.(map[string]any)
			if msg, _ := v["last_error"].(string); v["health"] != "error" || msg == "" {
				return false
			}
		}
		return true
	})
	if code := d.stop(); code != 0 {
		t.Fatalf("exit code after SIGTERM: %d", code)
	}

	// A restart loses nothing and continues the derivation index.
	d2 := startDaemon(t, configPath, dbURL)
	code, got := d2.call("GET", "/v1/orders/"+id, e2eStorefrontKey, "")
	if code != 200 || got["customer_marked_paid_at"] == nil || got["pay_amount"] != payAmount {
		t.Fatalf("after restart: %d %v", code, got)
	}
	code, b2 := d2.call("POST", "/v1/orders", e2eStorefrontKey, `{"external_id":"btc-2","network":"bitcoin","asset":"BTC","amount":"0.001"}`)
	if code != 201 || b2["pay_address"] == b1["pay_address"] {
		t.Fatalf("second bitcoin order reuses an address: %v / %v", b1["pay_address"], b2["pay_address"])
	}
	db, err := sql.Open("postgres", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var indexes string
	if err := db.QueryRow(`SELECT string_agg(derivation_index::text, ',' ORDER BY derivation_index) FROM orders WHERE network = 'bitcoin'`).Scan(&indexes); err != nil || indexes != "0,1" {
		t.Fatalf("derivation indexes %q (%v), want 0,1", indexes, err)
	}
	if code := d2.stop(); code != 0 {
		t.Fatalf("exit code: %d", code)
	}
	check := exec.Command(bin, "check", "--config", configPath)
	check.Env = daemonEnv(dbURL)
	if out, err := check.CombinedOutput(); err != nil || !strings.Contains(string(out), "invariants hold") {
		t.Fatalf("check: %v\n%s", err, out)
	}
	// A dossier settled with nothing paid breaks an invariant: check says so.
	if _, err := db.Exec(`UPDATE orders SET status = 'settled' WHERE external_id = 'btc-2'`); err != nil {
		t.Fatal(err)
	}
	broken := exec.Command(bin, "check", "--config", configPath)
	broken.Env = daemonEnv(dbURL)
	if out, _ := broken.CombinedOutput(); broken.ProcessState.ExitCode() != 1 ||
		!strings.Contains(string(out), "settled order without exact confirmed payment") {
		t.Fatalf("check on a broken database: %s", out)
	}
	if _, err := db.Exec(`UPDATE orders SET status = 'awaiting_payment' WHERE external_id = 'btc-2'`); err != nil {
		t.Fatal(err)
	}
	once := exec.Command(bin, "reconcile", "--config", configPath, "--once")
	once.Env = daemonEnv(dbURL)
	if out, err := once.CombinedOutput(); err != nil || !strings.Contains(string(out), "reconciled: matched=0") {
		t.Fatalf("reconcile --once: %v\n%s", err, out)
	}
}

// SIGTERM (and SIGINT) lets a request in flight finish before the process
// exits 0. The request is in flight for sure: the server has read its
// first bytes (its socket holds none unread) before the signal, and the
// daemon says it is draining before the rest of the body is sent.
func TestGracefulShutdownDrains(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			dbURL := pgtest.NewURL(t)
			d := startDaemon(t, writeConfig(t), dbURL)
			var clientPort atomic.Int64
			client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err == nil {
					clientPort.Store(int64(c.LocalAddr().(*net.TCPAddr).Port))
				}
				return c, err
			}}}
			pr, pw := io.Pipe()
			req, _ := http.NewRequest("POST", d.url+"/v1/orders", pr)
			req.Header.Set("Authorization", "Bearer "+e2eStorefrontKey)
			result := make(chan int, 1)
			go func() {
				res, err := client.Do(req)
				if err != nil {
					result <- -1
					return
				}
				res.Body.Close()
				result <- res.StatusCode
			}()
			fmt.Fprint(pw, `{"external_id":"slow","network":"ethereum",`)
			u, _ := url.Parse(d.url)
			serverPort, _ := strconv.Atoi(u.Port())
			waitUntil(t, 10*time.Second, "the server to read the request's first bytes", func() bool {
				return serverHasRead(t, serverPort, int(clientPort.Load()))
			})
			_ = d.cmd.Process.Signal(sig)
			waitUntil(t, 10*time.Second, "the daemon to start draining", func() bool {
				return strings.Contains(d.logText(), "shutting down: draining requests")
			})
			fmt.Fprint(pw, `"asset":"USDT","amount":"5"}`)
			pw.Close()
			if code := <-result; code != 201 {
				t.Fatalf("in-flight request got %d, want 201", code)
			}
			select {
			case <-d.done:
			case <-time.After(30 * time.Second):
				t.Fatal("no exit")
			}
			if code := d.cmd.ProcessState.ExitCode(); code != 0 {
				t.Fatalf("exit code %d", code)
			}
		})
	}
}

// serverHasRead reports whether the server's end of the loopback TCP
// connection from clientPort to serverPort is established with nothing
// left unread in its receive queue (from /proc/net/tcp).
func serverHasRead(t *testing.T, serverPort, clientPort int) bool {
	t.Helper()
	if clientPort == 0 {
		return false
	}
	raw, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	local, remote := fmt.Sprintf("0100007F:%04X", serverPort), fmt.Sprintf("0100007F:%04X", clientPort)
	for _, line := range strings.Split(string(raw), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 5 || f[1] != local || f[2] != remote || f[3] != "01" { // 01: ESTABLISHED
			continue
		}
		queues := strings.Split(f[4], ":")
		return len(queues) == 2 && strings.Trim(queues[1], "0") == ""
	}
	return false
}

// An invalid configuration exits 2 before anything touches the database.
func TestInvalidConfigTouchesNothing(t *testing.T) {
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "bad.yaml")
	data, _ := os.ReadFile("paywatch.example.yaml")
	bad := strings.Replace(string(data), "decimals: 6", "decimals: 6\n        colour: blue", 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	dbURL, name := pgtest.UnusedURL(t)
	for _, sub := range []string{"serve", "migrate"} {
		cmd := exec.Command(bin, sub, "--config", path)
		cmd.Env = daemonEnv(dbURL)
		out, err := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "field colour not found") {
			t.Fatalf("%s: %v\n%s", sub, err, out)
		}
	}
	admin, err := sql.Open("postgres", pgtest.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var exists bool
	if err := admin.QueryRowContext(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil || exists {
		t.Fatalf("database created despite an invalid config (exists=%v, %v)", exists, err)
	}
}

// serve creates its database when the server has none by that name, and
// migrates it.
func TestServeCreatesItsDatabase(t *testing.T) {
	dbURL, name := pgtest.UnusedURL(t)
	d := startDaemon(t, writeConfig(t), dbURL)
	if code, _ := d.call("GET", "/readyz", "", ""); code != 200 {
		t.Fatalf("readyz %d on the database serve created", code)
	}
	if code, o := d.call("POST", "/v1/orders", e2eStorefrontKey,
		`{"external_id":"fresh-1","network":"ethereum","asset":"USDT","amount":"3"}`); code != 201 {
		t.Fatalf("create on database %s: %d %v", name, code, o)
	}
}

// Long-polls waiting when the daemon is told to stop answer at once (304,
// nothing changed) instead of holding the shutdown, and the daemon exits 0.
func TestLongPollsAnswerAtShutdown(t *testing.T) {
	d := startDaemon(t, writeConfig(t), pgtest.NewURL(t))
	code, o := d.call("POST", "/v1/orders", e2eStorefrontKey, `{"external_id":"wait-1","network":"ethereum","asset":"USDT","amount":"4"}`)
	if code != 201 {
		t.Fatalf("create: %d %v", code, o)
	}
	res, err := http.DefaultClient.Do(func() *http.Request {
		r, _ := http.NewRequest("GET", d.url+"/v1/orders/"+o["id"].(string), nil)
		r.Header.Set("Authorization", "Bearer "+e2eStorefrontKey)
		return r
	}())
	if err != nil {
		t.Fatal(err)
	}
	etag := res.Header.Get("ETag")
	res.Body.Close()
	answered := make(chan int, 3)
	for range 3 {
		go func() {
			r, _ := http.NewRequest("GET", d.url+"/v1/orders/"+o["id"].(string)+"?wait=60s", nil)
			r.Header.Set("Authorization", "Bearer "+e2eStorefrontKey)
			r.Header.Set("If-None-Match", etag)
			res, err := http.DefaultClient.Do(r)
			if err != nil {
				answered <- -1
				return
			}
			res.Body.Close()
			answered <- res.StatusCode
		}()
	}
	time.Sleep(500 * time.Millisecond) // the three are waiting
	stopped := time.Now()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	for range 3 {
		select {
		case code := <-answered:
			if code != 304 {
				t.Fatalf("a waiting long-poll got %d at shutdown, want 304", code)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a waiting long-poll held the shutdown")
		}
	}
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		t.Fatal("no exit")
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 0 || time.Since(stopped) > 5*time.Second {
		t.Fatalf("exit code %d after %s", code, time.Since(stopped))
	}
	t.Logf("three waiting long-polls answered and the daemon stopped %s after SIGTERM", time.Since(stopped).Round(time.Millisecond))
}
