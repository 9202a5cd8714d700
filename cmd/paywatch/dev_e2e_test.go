package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/paywatch/paywatch/migrations/pgtest"
)

// devOutput gives, by state file, what a running dev printed so far.
var devOutput = map[string]func() string{}

var (
	devOrderLine = regexp.MustCompile(`id +(ord_[a-z0-9]+)`)
	devAPILine   = regexp.MustCompile(`API +(http://\S+)`)
)

// runDev starts `paywatch dev` as README's first command does, and
// returns the demo order's id once it printed it.
func runDev(t *testing.T, args []string, env ...string) (orderID, api, statePath string, stop func() string) {
	t.Helper()
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	statePath = filepath.Join(t.TempDir(), "dev.json")
	cmd := exec.Command(bin, append([]string{"dev", "--listen", "127.0.0.1:0"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PAYWATCH_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, append(env, "PAYWATCH_DEV_STATE="+statePath)...)
	var logs bytes.Buffer
	var mu sync.Mutex
	cmd.Stderr = &lockedWriter{w: &logs, mu: &mu}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	found := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			mu.Lock()
			out.WriteString(sc.Text() + "\n")
			if m := devOrderLine.FindStringSubmatch(sc.Text()); m != nil && orderID == "" {
				orderID = m[1]
				close(found)
			}
			if m := devAPILine.FindStringSubmatch(sc.Text()); m != nil {
				api = m[1]
			}
			mu.Unlock()
		}
	}()
	stopped := false
	stop = func() string {
		if !stopped {
			stopped = true
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
		mu.Lock()
		defer mu.Unlock()
		return out.String() + logs.String()
	}
	devOutput[statePath] = func() string {
		mu.Lock()
		defer mu.Unlock()
		return out.String()
	}
	t.Cleanup(func() {
		text := stop()
		if t.Failed() {
			t.Logf("paywatch dev output:\n%s", text)
		}
	})
	select {
	case <-found:
	case <-time.After(90 * time.Second):
		t.Fatal("paywatch dev printed no demo order within 90 s")
	}
	t.Logf("paywatch dev printed its demo order %s after %s", orderID, time.Since(start).Round(time.Millisecond))
	mu.Lock()
	defer mu.Unlock()
	return orderID, api, statePath, stop
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// devPay runs `paywatch dev pay` and returns what it printed.
func devPay(t *testing.T, statePath string, args ...string) string {
	t.Helper()
	bin, _ := buildBinary()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"dev", "pay"}, args...)...)
	cmd.Env = append(os.Environ(), "PAYWATCH_DEV_STATE="+statePath)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dev pay %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// The smoke test of README's first command: paywatch dev on this machine's
// PostgreSQL server (a database of its own, dropped on exit), a demo
// order paid with dev pay, settled.
func TestDevSmoke(t *testing.T) {
	server := pgtest.ServerURL()
	id, api, state, stop := runDev(t, nil, "PAYWATCH_DEV_LOCAL_SERVER="+server)
	start := time.Now()
	out := devPay(t, state, id)
	if !strings.Contains(out, "awaiting_payment → confirming → settled") {
		t.Fatalf("dev pay printed:\n%s", out)
	}
	t.Logf("the demo order settled %s after dev pay started", time.Since(start).Round(time.Millisecond))
	// An underpayment of a second order ends disputed, and says so.
	d := &daemonProcess{t: t, url: api}
	key := readDevKey(t, state)
	code, o := d.call("POST", "/v1/orders", key, `{"external_id":"second","network":"devnet","asset":"ETH","amount":"0.5"}`)
	if code != 201 {
		t.Fatalf("create: %d %v", code, o)
	}
	if out := devPay(t, state, o["id"].(string), "--amount", "0.1"); !strings.Contains(out, "sent 0.1 ETH") ||
		!strings.Contains(out, "→ confirming") {
		t.Fatalf("dev pay --amount printed:\n%s", out)
	}
	logs := stop()
	dbName := regexp.MustCompile(`/(paywatch_dev_[0-9a-f]+)`).FindStringSubmatch(logs)
	if dbName == nil {
		t.Fatalf("no database named in:\n%s", logs)
	}
	db, err := sql.Open("postgres", server)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var left bool
	if err := db.QueryRow(`SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, dbName[1]).Scan(&left); err != nil || left {
		t.Fatalf("database %s left behind after exit (%v)", dbName[1], err)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Fatalf("state file left behind: %v", err)
	}
}

// On a machine with no server on 127.0.0.1:5432, paywatch dev starts a
// throwaway cluster with PostgreSQL's own programs, and removes it on exit.
func TestDevThrowawayCluster(t *testing.T) {
	id, _, state, stop := runDev(t, nil, "PAYWATCH_DEV_LOCAL_SERVER=postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1")
	if out := devPay(t, state, id); !strings.Contains(out, "→ settled") {
		t.Fatalf("dev pay printed:\n%s", out)
	}
	logs := stop()
	dir := regexp.MustCompile(`dir=(\S+paywatch-dev-pg-\S+)`).FindStringSubmatch(logs)
	if dir == nil {
		t.Fatalf("no throwaway cluster in:\n%s", logs)
	}
	if _, err := os.Stat(dir[1]); !os.IsNotExist(err) {
		t.Fatalf("cluster directory %s left behind: %v", dir[1], err)
	}
}

func readDevKey(t *testing.T, state string) string {
	raw, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`"storefront_key": "([^"]+)"`).FindSubmatch(raw)
	if m == nil {
		t.Fatalf("no storefront key in %s", raw)
	}
	return string(m[1])
}

// paywatch dev run in a shell where PAYWATCH_DATABASE_URL points at a
// daemon's database refuses it, touching nothing.
func TestDevRefusesADaemonsDatabase(t *testing.T) {
	db, url := pgtest.NewWithURL(t)
	pgtest.Exec(t, db, `INSERT INTO chain_cursors (network, updated_at) VALUES ('ethereum', now())`)
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "dev", "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "PAYWATCH_DATABASE_URL="+url, "PAYWATCH_DEV_STATE="+filepath.Join(t.TempDir(), "s.json"))
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "watches ethereum, not a development one") {
		t.Fatalf("dev on a daemon's database (%d):\n%s", cmd.ProcessState.ExitCode(), out)
	}
	var n int
	if err := db.Get(&n, `SELECT count(*) FROM chain_cursors WHERE network = 'devnet'`); err != nil || n != 0 {
		t.Fatalf("dev touched the database: %d devnet cursors (%v)", n, err)
	}
}

// paywatch dev --bitcoin adds a btcd regtest node: its demo order, paid
// with dev pay from the node's wallet, settles too.
func TestDevBitcoin(t *testing.T) {
	_, api, state, _ := runDev(t, []string{"--bitcoin"}, "PAYWATCH_DEV_LOCAL_SERVER="+pgtest.ServerURL())
	var btcOrder string
	waitUntil(t, 30*time.Second, "the Bitcoin demo order", func() bool {
		m := regexp.MustCompile(`dev pay (ord_[a-z0-9]+)\n`).FindAllStringSubmatch(devOutput[state](), -1)
		if len(m) >= 2 {
			btcOrder = m[len(m)-1][1]
		}
		return btcOrder != ""
	})
	_ = api
	if out := devPay(t, state, btcOrder); !strings.Contains(out, "BTC to bcrt1") || !strings.Contains(out, "→ settled") {
		t.Fatalf("dev pay of the Bitcoin order printed:\n%s", out)
	}
}
