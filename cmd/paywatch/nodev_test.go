package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paywatch/paywatch/migrations/pgtest"
)

// devPackages are the development chains and what only they bring in.
var devPackages = []string{
	"github.com/paywatch/paywatch/chains/evm/devchain",
	"github.com/paywatch/paywatch/chains/bitcoin/devnode",
	"github.com/ethereum/go-ethereum/ethclient/simulated",
	"github.com/btcsuite/btcd/integration/rpctest",
}

// README: "build production binaries with `go build -tags nodev
// ./cmd/paywatch`, which leaves development mode out". The nodev binary
// carries none of the development chains' code (the default build does),
// is less than half the size, refuses `dev` and `dev pay` with a message
// that says why (exit 2), and still serves its commands (migrate here).
func TestNodevBuildLeavesDevelopmentModeOut(t *testing.T) {
	bin, err := buildNodevBinary()
	if err != nil {
		t.Fatal(err)
	}
	full, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	nodev, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range devPackages {
		if !bytes.Contains(dev, []byte(pkg+".")) {
			t.Fatalf("the default build carries no %s: nothing to compare with", pkg)
		}
		if bytes.Contains(nodev, []byte(pkg+".")) {
			t.Fatalf("the nodev build carries %s", pkg)
		}
	}
	if len(nodev)*2 >= len(dev) {
		t.Fatalf("the nodev build is %d bytes, the default one %d: not less than half", len(nodev), len(dev))
	}
	t.Logf("nodev build: %.1f MB; default build: %.1f MB", float64(len(nodev))/1e6, float64(len(dev))/1e6)

	for _, args := range [][]string{{"dev"}, {"dev", "--listen", "127.0.0.1:0"}, {"dev", "pay", "ord_x"}} {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "PAYWATCH_DEV_STATE="+filepath.Join(t.TempDir(), "dev.json"))
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != exitUsage ||
			!strings.Contains(string(out), "paywatch dev: this paywatch was built without the development mode (build tag nodev)") {
			t.Fatalf("paywatch %s from a nodev build exited %d:\n%s", strings.Join(args, " "), cmd.ProcessState.ExitCode(), out)
		}
	}
	dbURL, _ := pgtest.UnusedURL(t)
	migrate := exec.Command(bin, "migrate", "--config", writeConfig(t))
	migrate.Env = daemonEnv(dbURL)
	if out, err := migrate.CombinedOutput(); err != nil || !strings.Contains(string(out), "database schema is up to date") {
		t.Fatalf("migrate from a nodev build: %v\n%s", err, out)
	}
}
