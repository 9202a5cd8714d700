package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// inProcessDaemon builds serve's daemon in this process over a fresh
// database, with the example configuration (nodes not running), logging
// to log; it is closed when the test ends.
func inProcessDaemon(t *testing.T, log *slog.Logger) *daemon {
	t.Helper()
	vars := map[string]string{}
	for _, kv := range daemonEnv(pgtest.NewURL(t)) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	cfg, err := config.Load(writeConfig(t), func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	d, err := newDaemon(context.Background(), log, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// README: "SIGTERM or SIGINT drain in-flight requests (up to 30 s), stop
// the watchers and exit 0." The bound is 30 s in the daemon serve builds;
// with it set to 1 s here, a request that never finishes (its body never
// comes) is cut when the bound is reached, and the daemon stops cleanly
// instead of waiting for it.
func TestShutdownDrainBoundedAt30s(t *testing.T) {
	var logs syncBuffer
	d := inProcessDaemon(t, slog.New(slog.NewTextHandler(&logs, nil)))
	if d.drainTimeout != 30*time.Second {
		t.Fatalf("serve drains requests for up to %s at shutdown, README says 30 s", d.drainTimeout)
	}
	const bound = time.Second
	d.drainTimeout = bound
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()

	// A request whose body never ends, in flight for sure: the server has
	// read its first bytes.
	base := "http://" + d.listener.Addr().String()
	var clientPort atomic.Int64
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			clientPort.Store(int64(c.LocalAddr().(*net.TCPAddr).Port))
		}
		return c, err
	}}}
	pr, pw := io.Pipe()
	defer pw.Close()
	req, _ := http.NewRequest("POST", base+"/v1/orders", pr)
	req.Header.Set("Authorization", "Bearer "+e2eStorefrontKey)
	answered := make(chan string, 1) // the status, or the client's error
	go func() {
		res, err := client.Do(req)
		if err != nil {
			answered <- "error: " + err.Error()
			return
		}
		res.Body.Close()
		answered <- res.Status
	}()
	fmt.Fprint(pw, `{"external_id":"never-ends","network":"ethereum",`)
	u, _ := url.Parse(base)
	serverPort, _ := strconv.Atoi(u.Port())
	waitUntil(t, 10*time.Second, "the server to read the request's first bytes", func() bool {
		return serverHasRead(t, serverPort, int(clientPort.Load()))
	})

	stopped := time.Now()
	stop()
	select {
	case err := <-ran:
		took := time.Since(stopped)
		if err != nil {
			t.Fatalf("the daemon stopped with %v after %s, want a clean stop (exit 0)", err, took.Round(time.Millisecond))
		}
		if took < bound {
			t.Fatalf("the daemon stopped %s after it was told to, before the drain bound of %s", took, bound)
		}
		t.Logf("the daemon stopped %s after it was told to, with a request still in flight", took.Round(time.Millisecond))
	case <-time.After(bound + 10*time.Second):
		t.Fatalf("the daemon is still running %s after it was told to stop, with a drain bound of %s; log:\n%s",
			time.Since(stopped).Round(time.Millisecond), bound, logs.String())
	}
	// The server's end of the request's connection is closed; the client,
	// sending the rest of its body now, gets no answer.
	waitUntil(t, 5*time.Second, "the server to close the request's connection", func() bool {
		return !tcpEstablished(t, serverPort, int(clientPort.Load()))
	})
	fmt.Fprint(pw, `"asset":"USDT","amount":"5"}`)
	pw.Close()
	select {
	case got := <-answered:
		if !strings.HasPrefix(got, "error: ") {
			t.Fatalf("the request cut at shutdown was answered %s, want its connection closed", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request in flight is still waiting after the daemon stopped")
	}
	if !strings.Contains(logs.String(), `msg="requests still in flight at the end of the drain were cut"`) ||
		!strings.Contains(logs.String(), `msg=stopped`) {
		t.Fatalf("the log does not say the request was cut and the daemon stopped:\n%s", logs.String())
	}
}

// tcpEstablished reports whether the loopback TCP connection from
// remotePort to localPort is established at localPort's end (from
// /proc/net/tcp).
func tcpEstablished(t *testing.T, localPort, remotePort int) bool {
	t.Helper()
	raw, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	local, remote := fmt.Sprintf("0100007F:%04X", localPort), fmt.Sprintf("0100007F:%04X", remotePort)
	for _, line := range strings.Split(string(raw), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 3 && f[1] == local && f[2] == remote && f[3] == "01" {
			return true
		}
	}
	return false
}

// README: "`paywatch dev` ... serves the API on `127.0.0.1:8080`
// (`--listen`)". With 127.0.0.1:8080 held by someone else, dev started
// without --listen fails on that very address.
func TestDevListensOn127001Port8080ByDefault(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:8080")
	if err == nil {
		defer held.Close()
	} else {
		t.Logf("127.0.0.1:8080 is already in use (%v): dev must fail on it all the same", err)
	}
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "dev")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PAYWATCH_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "PAYWATCH_DEV_LOCAL_SERVER="+pgtest.ServerURL(), "PAYWATCH_DEV_STATE="+t.TempDir()+"/dev.json")
	var output syncBuffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	deadline := time.After(90 * time.Second)
	for running := true; running; {
		select {
		case <-exited:
			running = false
		case <-time.After(100 * time.Millisecond):
			if strings.Contains(output.String(), "paywatch dev is running") {
				_ = cmd.Process.Signal(syscall.SIGTERM) // it drops its database
				<-exited
				if held == nil && regexp.MustCompile(`API +http://127\.0\.0\.1:8080\n`).MatchString(output.String()) {
					// Another program held the port when the test tried,
					// and let it go before dev started: dev took it.
					t.Logf("127.0.0.1:8080 was freed before dev started; dev serves on it:\n%s", output.String())
					return
				}
				t.Fatalf("paywatch dev without --listen serves elsewhere with 127.0.0.1:8080 taken:\n%s", output.String())
			}
		case <-deadline:
			_ = cmd.Process.Kill()
			<-exited
			t.Fatalf("paywatch dev without --listen still runs after 90 s with 127.0.0.1:8080 taken:\n%s", output.String())
		}
	}
	out := []byte(output.String())
	want := regexp.MustCompile(`paywatch dev: listen on 127\.0\.0\.1:8080: .*address already in use`)
	if cmd.ProcessState.ExitCode() != 1 || !want.Match(out) {
		t.Fatalf("paywatch dev without --listen, with 127.0.0.1:8080 taken, exited %d; want 1 and %q:\n%s",
			cmd.ProcessState.ExitCode(), want, out)
	}
}

// README: "`PAYWATCH_LOG_LEVEL` sets the log level". By default the logs
// carry the INFO lines (a database created, migrations applied); with
// PAYWATCH_LOG_LEVEL=warn they are left out, and with debug they stay.
func TestLogLevelFromEnvironment(t *testing.T) {
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	configPath := writeConfig(t)
	migrate := func(level string) string {
		t.Helper()
		dbURL, _ := pgtest.UnusedURL(t) // migrate creates it, and says so
		cmd := exec.Command(bin, "migrate", "--config", configPath)
		cmd.Env = append(daemonEnv(dbURL), "PAYWATCH_LOG_LEVEL="+level)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil || !strings.Contains(stdout.String(), "database schema is up to date") {
			t.Fatalf("migrate with PAYWATCH_LOG_LEVEL=%q: %v\n%s%s", level, err, stdout.String(), stderr.String())
		}
		return stderr.String()
	}
	for _, level := range []string{"", "info", "debug"} {
		if logs := migrate(level); !strings.Contains(logs, `level=INFO msg="created database"`) ||
			!strings.Contains(logs, `level=INFO msg="applied migrations"`) {
			t.Fatalf("PAYWATCH_LOG_LEVEL=%q: the INFO lines are missing from the log:\n%s", level, logs)
		}
	}
	for _, level := range []string{"warn", "error", "WARN"} {
		if logs := migrate(level); strings.Contains(logs, "level=INFO") {
			t.Fatalf("PAYWATCH_LOG_LEVEL=%s: INFO lines in the log:\n%s", level, logs)
		}
	}
}

// README: "`PAYWATCH_LOG_LEVEL=debug` makes the logs louder": the daemon
// logs each reconciler pass (and each scanned batch) at debug, which the
// default level leaves out.
func TestDebugLevelLogsEachReconcilerPass(t *testing.T) {
	for _, level := range []string{"", "info"} {
		if l, err := logLevel(level); err != nil || l <= slog.LevelDebug {
			t.Fatalf("PAYWATCH_LOG_LEVEL=%q logs debug lines (level %s, %v), want info", level, l, err)
		}
	}
	debug, err := logLevel("debug")
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	d := inProcessDaemon(t, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: debug})))
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()
	pass := regexp.MustCompile(`level=DEBUG msg="reconciler pass" result="matched=0 `)
	for deadline := time.Now().Add(10 * time.Second); !pass.MatchString(logs.String()) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatalf("the daemon stopped with %v", err)
	}
	if !pass.MatchString(logs.String()) {
		t.Fatalf("PAYWATCH_LOG_LEVEL=debug: no debug line for the reconciler's passes:\n%s", logs.String())
	}
}
