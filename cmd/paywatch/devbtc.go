//go:build !nodev

package main

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/paywatch/paywatch/chains/bitcoin/devnode"
)

// devBitcoin is the regtest node `paywatch dev --bitcoin` runs, and the
// faucet `dev pay` asks to pay Bitcoin orders (the node's wallet lives in
// the dev process).
type devBitcoin struct {
	node     *devnode.Node
	certFile string
	faucet   *http.Server
	// FaucetURL and token go into the state file for dev pay.
	FaucetURL string
	token     string
}

// startDevBitcoin builds btcd if needed (the first time takes about a
// minute), starts a regtest node with mature coins, mines a block every
// blockTime and serves the faucet on a loopback port.
func startDevBitcoin(ctx context.Context, log *slog.Logger, dir string, blockTime time.Duration) (*devBitcoin, error) {
	log.Info("starting a btcd regtest node (building btcd the first time takes about a minute)")
	node, err := devnode.Start(true)
	if err != nil {
		return nil, fmt.Errorf("bitcoin: %w (it needs the Go toolchain and this module's sources to build btcd)", err)
	}
	b := &devBitcoin{node: node, certFile: filepath.Join(dir, "btcd.cert"), token: randomHex(16)}
	if err := os.WriteFile(b.certFile, node.Cert, 0o600); err != nil {
		node.Stop()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		node.Stop()
		return nil, err
	}
	b.FaucetURL = "http://" + ln.Addr().String()
	b.faucet = &http.Server{Handler: http.HandlerFunc(b.pay), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = b.faucet.Serve(ln) }()
	go func() {
		tick := time.NewTicker(blockTime)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if err := node.Mine(1); err != nil && ctx.Err() == nil {
					log.Warn("bitcoin: mine", "err", err)
				}
			}
		}
	}()
	return b, nil
}

// Stop stops the faucet and the node.
func (b *devBitcoin) Stop() {
	_ = b.faucet.Close()
	_ = b.node.Stop()
}

type faucetRequest struct {
	Address string `json:"address"`
	Sats    int64  `json:"sats"`
}

// pay answers POST {"address", "sats"} with {"txid"}, for the holder of
// the token (from the state file, readable by this user alone).
func (b *devBitcoin) pay(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost ||
		subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+b.token)) != 1 {
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	var req faucetRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil || req.Sats <= 0 {
		http.Error(w, "want {\"address\", \"sats\" > 0}", http.StatusBadRequest)
		return
	}
	txid, err := b.node.Pay(devnode.Output{Address: req.Address, Sats: req.Sats})
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]string{"txid": txid})
}

// devPayBitcoin asks the running dev's faucet to pay sats to address.
func devPayBitcoin(ctx context.Context, st devState, address string, sats int64) (string, error) {
	if st.BitcoinFaucet == "" {
		return "", errors.New("paywatch dev runs no Bitcoin node (start it with --bitcoin)")
	}
	body, _ := json.Marshal(faucetRequest{Address: address, Sats: sats})
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, st.BitcoinFaucet, strings.NewReader(string(body)))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+st.BitcoinFaucetToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		TxID string `json:"txid"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&out) != nil {
		return "", fmt.Errorf("the Bitcoin faucet answered %s", resp.Status)
	}
	return out.TxID, nil
}
