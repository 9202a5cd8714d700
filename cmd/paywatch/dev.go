//go:build !nodev

package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/ethereum/go-ethereum/crypto"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch/chains/evm/devchain"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
)

// devState is what `paywatch dev` tells `paywatch dev pay`: where the API
// and the development chain answer, the keys, and the faucet.
type devState struct {
	API           string              `json:"api"`
	RPC           string              `json:"rpc"`
	StorefrontKey string              `json:"storefront_key"`
	OperatorKey   string              `json:"operator_key"`
	FaucetKey     string              `json:"faucet_key"` // a development chain key, worthless elsewhere
	Assets        map[string]devAsset `json:"assets"`
	// BitcoinFaucet pays Bitcoin orders from the regtest node's wallet
	// (with --bitcoin), for the holder of the token.
	BitcoinFaucet      string `json:"bitcoin_faucet,omitempty"`
	BitcoinFaucetToken string `json:"bitcoin_faucet_token,omitempty"`
}

type devAsset struct {
	Network  string `json:"network"`
	Contract string `json:"contract,omitempty"` // empty for native coins
	Decimals int32  `json:"decimals"`
	// PerOrder: each order has an address of its own (else the orders
	// share one, told apart by their amounts).
	PerOrder bool `json:"per_order,omitempty"`
}

// devStatePath is where the running `paywatch dev` writes its state: in
// the user's cache directory (not a shared temporary one).
func devStatePath(getenv func(string) string) string {
	if p := getenv("PAYWATCH_DEV_STATE"); p != "" {
		return p
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "paywatch", "dev.json")
}

// writeDevState writes the state file, readable by this user only, through
// a new file renamed into place (never into a file someone else made).
func writeDevState(path string, st devState) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".dev-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(raw); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// devXPub is the BIP84 test vector's account key (regtest addresses): the
// development shop's per-order addresses; its private key is public.
const devXPub = "vpub5Y6cjg78GGuNLsaPhmYsiw4gYX3HoQiRBiSwDaBXKUafCt9bNwWQiitDk5VZ5BVxYnQdwoTyXSs2JHRPAgjAvtbBrf8ZhDYe2jWAqvZVnsc"

// localServer is where `paywatch dev` looks for a PostgreSQL server when
// PAYWATCH_DATABASE_URL is not set.
const localServer = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

const devUsage = `Usage:
  paywatch dev [--listen ADDR] [--block-time D] [--bitcoin]
      an embedded development chain (network devnet: ETH and USDT), a local
      database and the API; prints the API address, the keys and a demo order;
      --bitcoin adds a btcd regtest node (network devbtc: BTC, an address per
      order), built with the Go toolchain the first time (about a minute)
  paywatch dev pay ORDER_ID [--amount X] [--no-follow]
      pay an order from the development faucet and follow it to its end

Environment: PAYWATCH_DATABASE_URL (else a fresh database on the server at
127.0.0.1:5432 if one answers, else a throwaway cluster), PAYWATCH_STOREFRONT_KEY
and PAYWATCH_OPERATOR_KEY (else generated), PAYWATCH_DEV_STATE (where dev
writes what dev pay reads; default paywatch/dev.json in the user's cache
directory).
`

func devCommand(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 && args[0] == "pay" {
		return devPayCommand(ctx, e, args[1:])
	}
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() { fmt.Fprint(e.stderr, devUsage) }
	listen := fs.String("listen", "127.0.0.1:8080", "API address")
	blockTime := fs.Duration("block-time", time.Second, "how often the development chain seals a block")
	withBitcoin := fs.Bool("bitcoin", false, "also run a btcd regtest node (network devbtc)")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments: %v", fs.Args())}
	}
	if *blockTime < 10*time.Millisecond {
		return usageError{errors.New("--block-time must be at least 10ms")}
	}

	dsn, dbNote, cleanup, err := devDatabase(ctx, e)
	if err != nil {
		return err
	}
	defer cleanup()

	chain, err := devchain.New(devchain.Config{})
	if err != nil {
		return err
	}
	defer chain.Close()
	usdt, err := chain.DeployToken(ctx, "Tether USD (development)", "USDT", 6)
	if err != nil {
		return fmt.Errorf("development chain: %w", err)
	}
	// The shop receives on an address of its own (no coins minted to it),
	// whose key paywatch never holds, like a real shop's.
	shopKey, err := crypto.GenerateKey()
	if err != nil {
		return err
	}
	shop := devchain.Address(shopKey)
	// The miner stops before the chain closes, whatever ends dev.
	mining, stopMining := context.WithCancel(ctx)
	mined := make(chan struct{})
	go func() {
		defer close(mined)
		tick := time.NewTicker(*blockTime)
		defer tick.Stop()
		for {
			select {
			case <-mining.Done():
				return
			case <-tick.C:
				chain.Mine(1)
			}
		}
	}()
	defer func() {
		stopMining()
		<-mined
	}()

	state := devState{RPC: chain.URL, StorefrontKey: e.getenv("PAYWATCH_STOREFRONT_KEY"),
		OperatorKey: e.getenv("PAYWATCH_OPERATOR_KEY"),
		FaucetKey:   hex.EncodeToString(crypto.FromECDSA(chain.Keys[0])),
		Assets: map[string]devAsset{"ETH": {Network: "devnet", Decimals: 18},
			"USDT": {Network: "devnet", Contract: usdt.Address.Hex(), Decimals: 6}}}
	btcNetwork := ""
	vars := map[string]string{}
	if *withBitcoin {
		dir, err := os.MkdirTemp("", "paywatch-dev-btc-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		btc, err := startDevBitcoin(ctx, e.log, dir, *blockTime)
		if err != nil {
			return err
		}
		defer btc.Stop()
		state.BitcoinFaucet, state.BitcoinFaucetToken = btc.FaucetURL, btc.token
		state.Assets["BTC"] = devAsset{Network: "devbtc", Decimals: 8, PerOrder: true}
		vars["PAYWATCH_DEV_BTC_USER"], vars["PAYWATCH_DEV_BTC_PASS"] = btc.node.User, btc.node.Pass
		// A published test key (BIP84 test vectors): development only.
		btcNetwork = fmt.Sprintf(`  - name: devbtc
    family: bitcoin
    rpc_urls: [%s]
    rpc_user_env: PAYWATCH_DEV_BTC_USER
    rpc_pass_env: PAYWATCH_DEV_BTC_PASS
    rpc_cert_file: %q
    chain: regtest
    confirmations: 2
    poll_interval: 250ms
    start_block: 0
    assets:
      - {symbol: BTC, native: true, decimals: 8, receive: {xpub: "%s"}}
`, btc.node.URL, btc.certFile, devXPub)
	}
	if state.StorefrontKey == "" {
		state.StorefrontKey = "sf_dev_" + randomHex(12)
	}
	if state.OperatorKey == "" {
		state.OperatorKey = "op_dev_" + randomHex(12)
	}
	doc := fmt.Sprintf(`listen: %q
database_url_env: PAYWATCH_DATABASE_URL
api_keys:
  - {name: storefront, role: storefront, key_env: PAYWATCH_STOREFRONT_KEY}
  - {name: operator, role: operator, key_env: PAYWATCH_OPERATOR_KEY}
reconciler:
  schedule: "@every 2s"
networks:
  - name: devnet
    family: evm
    rpc_urls: [%s]
    chain_id: %d
    confirmations: 3
    poll_interval: 250ms
    start_block: 0
    assets:
      - {symbol: ETH, native: true, decimals: 18, unique_step: "0.000001", receive: {addresses: ["%s"]}}
      - {symbol: USDT, contract: "%s", decimals: 6, unique_step: "0.000001", receive: {addresses: ["%s"]}}
%s`, *listen, chain.URL, devchain.ChainID, shop.Hex(), usdt.Address.Hex(), shop.Hex(), btcNetwork)
	vars["PAYWATCH_DATABASE_URL"] = dsn
	vars["PAYWATCH_STOREFRONT_KEY"], vars["PAYWATCH_OPERATOR_KEY"] = state.StorefrontKey, state.OperatorKey
	cfg, err := config.Parse([]byte(doc), func(k string) string { return vars[k] })
	if err != nil {
		return fmt.Errorf("development configuration: %w", err)
	}
	d, err := newDaemon(ctx, e.log, cfg)
	if err != nil {
		return err
	}
	defer d.Close()
	state.API = "http://" + d.listener.Addr().String()
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()

	order, err := devCall(ctx, state.API, state.StorefrontKey, "POST", "/v1/orders",
		fmt.Sprintf(`{"external_id":"demo-%d","network":"devnet","asset":"USDT","amount":"25","metadata":{"plan":"demo"}}`,
			time.Now().Unix()))
	if err != nil {
		return fmt.Errorf("create the demo order: %w", err)
	}
	statePath := devStatePath(e.getenv)
	if err := writeDevState(statePath, state); err != nil {
		return fmt.Errorf("write %s: %w", statePath, err)
	}
	defer os.Remove(statePath)
	// Keys that came from the environment are not printed.
	shownSF, shownOP := state.StorefrontKey, state.OperatorKey
	if e.getenv("PAYWATCH_STOREFRONT_KEY") != "" {
		shownSF = "(the key in PAYWATCH_STOREFRONT_KEY)"
	}
	if e.getenv("PAYWATCH_OPERATOR_KEY") != "" {
		shownOP = "(the key in PAYWATCH_OPERATOR_KEY)"
	}

	id, _ := order["id"].(string)
	fmt.Fprintf(e.stdout, `paywatch dev is running (Ctrl-C stops it and removes what it made).

  API          %s
  storefront   Authorization: Bearer %s
  operator     Authorization: Bearer %s
  chain        %s  (network devnet, chain id %d, a block every %s; USDT token %s)
  database     %s

A demo order waits for payment:
  id           %s
  pay          %s %s to %s

Pay it from the development faucet and watch it settle (in another terminal):
  go run ./cmd/paywatch dev pay %s

Follow it as a checkout page would (answers as soon as it changes):
  curl -s '%s/v1/orders/%s?wait=30s' -H 'Authorization: Bearer %s'
`, state.API, shownSF, shownOP, chain.URL, devchain.ChainID, *blockTime, usdt.Address.Hex(),
		dbNote, id, order["pay_amount"], order["asset"], order["pay_address"], id, state.API, id, shownSF)
	if state.BitcoinFaucet != "" {
		btcOrder, err := devCall(ctx, state.API, state.StorefrontKey, "POST", "/v1/orders",
			fmt.Sprintf(`{"external_id":"demo-btc-%d","network":"devbtc","asset":"BTC","amount":"0.001"}`, time.Now().Unix()))
		if err != nil {
			return fmt.Errorf("create the Bitcoin demo order: %w", err)
		}
		fmt.Fprintf(e.stdout, `
A Bitcoin demo order (network devbtc, btcd regtest, an address per order):
  id           %s
  pay          %s BTC to %s
  go run ./cmd/paywatch dev pay %s
`, btcOrder["id"], btcOrder["pay_amount"], btcOrder["pay_address"], btcOrder["id"])
	}
	return <-runErr
}

// devDatabase picks the database: PAYWATCH_DATABASE_URL; else a fresh
// database on a server at 127.0.0.1:5432, dropped on exit; else a
// throwaway cluster, removed on exit.
func devDatabase(ctx context.Context, e *env) (dsn, note string, cleanup func(), err error) {
	if dsn := e.getenv("PAYWATCH_DATABASE_URL"); dsn != "" {
		if err := refuseServingDatabase(ctx, dsn); err != nil {
			return "", "", nil, err
		}
		return dsn, redact(dsn) + " (PAYWATCH_DATABASE_URL)", func() {}, nil
	}
	server := e.getenv("PAYWATCH_DEV_LOCAL_SERVER")
	if server == "" {
		server = localServer
	}
	if serverAnswers(ctx, server) {
		// A database of its own: the chain is new each time, and a database
		// that watched another chain would see a reorg deeper than any.
		u, err := url.Parse(server)
		if err != nil {
			return "", "", nil, err
		}
		name := "paywatch_dev_" + randomHex(6)
		u.Path = "/" + name
		dsn := u.String()
		return dsn, redact(dsn) + " (dropped on exit)", func() { dropDatabase(server, name) }, nil
	}
	pg, err := startLocalPostgres(ctx, e.log)
	if err != nil {
		return "", "", nil, fmt.Errorf("no PostgreSQL server answers at 127.0.0.1:5432 and none could be started: %w", err)
	}
	return pg.URL, pg.URL + " (a throwaway cluster, removed on exit)", pg.Stop, nil
}

// refuseServingDatabase refuses a database that holds anything of a
// network other than dev's own (devnet, devbtc): PAYWATCH_DATABASE_URL set for a real daemon
// in the same shell must not get a development chain, its demo orders and
// its migrations.
func refuseServingDatabase(ctx context.Context, dsn string) error {
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var other sql.NullString
	err = db.QueryRowContext(ctx, `SELECT CASE WHEN to_regclass('orders') IS NULL THEN NULL
		ELSE (SELECT min(network) FROM (SELECT network FROM orders WHERE network NOT IN ('devnet', 'devbtc')
			UNION ALL SELECT network FROM chain_cursors WHERE network NOT IN ('devnet', 'devbtc')) x) END`).Scan(&other)
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && pqErr.Code == "3D000" { // no such database yet: it will be made
		return nil
	}
	if err != nil {
		return fmt.Errorf("check PAYWATCH_DATABASE_URL: %w", err)
	}
	if other.Valid {
		return fmt.Errorf("PAYWATCH_DATABASE_URL points at a database that watches %s, not a development one: "+
			"paywatch dev will not touch it (unset the variable, or point it at an empty database)", other.String)
	}
	return nil
}

func dropDatabase(server, name string) {
	db, err := sql.Open("postgres", server)
	if err != nil {
		return
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+pq.QuoteIdentifier(name)+" WITH (FORCE)")
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// devCall calls the API and decodes a JSON object answer; a non-2xx
// answer is an error carrying the API's message.
func devCall(ctx context.Context, api, key, method, path, body string) (map[string]any, error) {
	var payload any
	if body != "" {
		payload = json.RawMessage(body)
	}
	raw, err := (&opClient{api: api, key: key}).raw(ctx, method, path, payload)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	var v map[string]any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return v, nil
}
