// Package devnode runs a btcd regtest node in-process for development and
// tests: btcd's integration/rpctest harness (which builds btcd with the Go
// toolchain from the module's own dependencies), with a wallet in memory
// holding mature coins to pay from. `paywatch dev --bitcoin` and btctest use
// it; the daemon (`serve`) never imports it.
package devnode

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"

	"github.com/btcsuite/btcd/btcutil"
	"github.com/btcsuite/btcd/chaincfg"
	"github.com/btcsuite/btcd/integration/rpctest"
	"github.com/btcsuite/btcd/txscript"
	"github.com/btcsuite/btcd/wire"
)

// Params are the chain parameters of the nodes (regtest).
var Params = &chaincfg.RegressionNetParams

// setUp serialises harness start-ups: rpctest builds btcd once per
// process and hands out ports from shared state.
var setUp sync.Mutex

// Node is a running btcd regtest node.
type Node struct {
	H *rpctest.Harness
	// URL, User, Pass and Cert (PEM) reach the node's JSON-RPC (TLS with
	// the node's own certificate).
	URL, User, Pass string
	Cert            []byte
}

// Start builds btcd if needed and starts a node with the transaction index
// on; with coins, its wallet holds mature coins to pay from.
func Start(coins bool) (*Node, error) { return start(coins, true) }

// StartWithoutTxIndex starts a node as btcd and Bitcoin Core run by
// default: with no index of transactions, so that a mined transaction is
// not found by its txid.
func StartWithoutTxIndex(coins bool) (*Node, error) { return start(coins, false) }

func start(coins, txindex bool) (*Node, error) {
	setUp.Lock()
	defer setUp.Unlock()
	btcd, err := btcdPath()
	if err != nil {
		return nil, err
	}
	// rpctest's own ports count up from 8333 in every process: several
	// processes at once would collide. The kernel's free ports do not (and
	// a set-up that loses a race for one is tried again).
	rpctest.ListenAddressGenerator = freeAddresses
	mature := uint32(0)
	if coins {
		mature = 30
	}
	for attempt := 1; ; attempt++ {
		var args []string
		if txindex {
			args = append(args, "--txindex")
		}
		h, err := rpctest.New(Params, nil, args, btcd)
		if err != nil {
			return nil, fmt.Errorf("btcd: %w", err)
		}
		if err = h.SetUp(coins, mature); err == nil {
			cfg := h.RPCConfig()
			return &Node{H: h, URL: "https://" + cfg.Host, User: cfg.User, Pass: cfg.Pass, Cert: cfg.Certificates}, nil
		}
		_ = h.TearDown()
		if attempt == 3 {
			return nil, fmt.Errorf("set up btcd: %w", err)
		}
	}
}

// btcdPath returns a btcd to run: one on PATH, else the version this
// binary was built with, built (from this module) or installed (from the
// module proxy) once into a directory of the user's cache that only the
// user can write, never into a shared temporary directory where another
// user could swap it.
func btcdPath() (string, error) {
	if p, err := exec.LookPath("btcd"); err == nil {
		return p, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no btcd on PATH, and no cache directory to build one into: %w", err)
	}
	dir := filepath.Join(cache, "paywatch", "bin")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm()&0o022 != 0 || !ownedByMe(fi) {
		return "", fmt.Errorf("%s must be a directory only you can write to", dir)
	}
	version := ""
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path == "github.com/btcsuite/btcd" {
				version = m.Version
			}
		}
	}
	if version == "" { // a test binary: ask the module
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/btcsuite/btcd").Output()
		if err != nil {
			return "", fmt.Errorf("no btcd on PATH, and no btcd version known to build: %w", err)
		}
		version = strings.TrimSpace(string(out))
	}
	bin := filepath.Join(dir, "btcd-"+version)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	build := exec.Command("go", "build", "-o", bin, "github.com/btcsuite/btcd")
	if out, err := build.CombinedOutput(); err != nil {
		// Outside this module: install the same version from the proxy.
		install := exec.Command("go", "install", "github.com/btcsuite/btcd@"+version)
		tmp, terr := os.MkdirTemp(dir, "install-")
		if terr != nil {
			return "", terr
		}
		defer os.RemoveAll(tmp)
		install.Env = append(os.Environ(), "GOBIN="+tmp)
		if out2, err2 := install.CombinedOutput(); err2 != nil {
			return "", fmt.Errorf("no btcd on PATH; go build failed (%v: %s) and go install github.com/btcsuite/btcd@%s failed: %v\n%s",
				err, out, version, err2, out2)
		}
		if err := os.Rename(filepath.Join(tmp, "btcd"), bin); err != nil {
			return "", err
		}
	}
	return bin, nil
}

func ownedByMe(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return !ok || int(st.Uid) == os.Getuid()
}

// Stop stops the node and removes its data.
func (n *Node) Stop() error { return n.H.TearDown() }

// freeAddresses returns two listening addresses on ports the kernel has
// free now.
func freeAddresses() (string, string) {
	port := func() string {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			panic(fmt.Sprintf("devnode: no free port: %v", err))
		}
		defer l.Close()
		return l.Addr().String()
	}
	return port(), port()
}

// Output is a payment of sats to an address.
type Output struct {
	Address string
	Sats    int64
}

// Pay sends one transaction from the wallet paying the outputs, in this
// order (to the mempool; the next block mines it), and returns its id.
func (n *Node) Pay(outputs ...Output) (string, error) {
	outs := make([]*wire.TxOut, 0, len(outputs))
	for _, o := range outputs {
		addr, err := btcutil.DecodeAddress(o.Address, Params)
		if err != nil {
			return "", fmt.Errorf("address %q: %w", o.Address, err)
		}
		script, err := txscript.PayToAddrScript(addr)
		if err != nil {
			return "", err
		}
		outs = append(outs, wire.NewTxOut(o.Sats, script))
	}
	txid, err := n.H.SendOutputs(outs, 10)
	if err != nil {
		return "", fmt.Errorf("pay: %w", err)
	}
	return txid.String(), nil
}

// Mine seals k blocks.
func (n *Node) Mine(k int) error {
	_, err := n.H.Client.Generate(uint32(k))
	return err
}
