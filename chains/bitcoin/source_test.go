package bitcoin_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"math/big"
	"os"
	"testing"
	"time"

	"github.com/btcsuite/btcd/btcutil"
	"github.com/btcsuite/btcd/btcutil/hdkeychain"
	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

func testLog() *slog.Logger {
	if os.Getenv("PAYWATCH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// accountKey returns a regtest account extended public key (seeded, so
// the same in every run) with the given version bytes.
func accountKey(t *testing.T, seed byte, version string) string {
	t.Helper()
	master, err := hdkeychain.NewMaster(sha256.New().Sum([]byte{seed, 1, 2, 3}), btctest.Params)
	if err != nil {
		t.Fatal(err)
	}
	k := master
	for _, i := range []uint32{84, 1, 0} {
		if k, err = k.Derive(hdkeychain.HardenedKeyStart + i); err != nil {
			t.Fatal(err)
		}
	}
	pub, err := k.Neuter()
	if err != nil {
		t.Fatal(err)
	}
	v, _ := hex.DecodeString(version)
	if pub, err = pub.CloneWithVersion(v); err != nil {
		t.Fatal(err)
	}
	return pub.String()
}

// env is a btcd node, a fresh database and a scanner of the node.
type env struct {
	t       *testing.T
	node    *btctest.Node
	db      *sqlx.DB
	store   *scan.Store
	network *paywatch.Network
	asset   *paywatch.Asset
	watch   *bitcoin.WatchSet
}

func newEnv(t *testing.T, shared []string, keys map[string]string) *env {
	t.Helper()
	node := btctest.New(t)
	db := pgtest.New(t)
	asset := &paywatch.Asset{Network: "btc", Symbol: "BTC", Native: true, Decimals: 8, Dust: big.NewInt(546)}
	n := &paywatch.Network{Name: "btc", Family: paywatch.FamilyBitcoin, Chain: "regtest", RPCURLs: []string{node.URL},
		Confirmations: 2, PollInterval: 50 * time.Millisecond, StartBlock: node.Height(), Assets: []*paywatch.Asset{asset}}
	derivers := map[string]*bitcoin.Deriver{}
	for key, script := range keys {
		d, err := bitcoin.NewDeriver(key, "regtest", script)
		if err != nil {
			t.Fatal(err)
		}
		derivers[key] = d
	}
	watch, err := bitcoin.NewWatchSet("regtest", shared, derivers, nil)
	if err != nil {
		t.Fatal(err)
	}
	watch.Lookahead = 5
	return &env{t: t, node: node, db: db, store: scan.NewStore(db), network: n, asset: asset, watch: watch}
}

func (e *env) scanner() *scan.Scanner {
	src, err := bitcoin.NewSource(e.network, e.node.Credentials, e.watch, testLog())
	if err != nil {
		e.t.Fatal(err)
	}
	return scan.NewScanner(e.network, src, e.store, testLog())
}

// sync steps the scanner until it reaches the head.
func (e *env) sync(s *scan.Scanner) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 0; ; i++ {
		caughtUp, err := s.Step(ctx)
		if err != nil {
			e.t.Fatalf("step %d: %v", i, err)
		}
		if caughtUp {
			return
		}
		if i > 5000 {
			e.t.Fatal("never caught up")
		}
	}
}

type row struct {
	TxHash string `db:"tx_hash"`
	TxKey  string `db:"tx_key"`
	To     string `db:"to_address"`
	Amount string `db:"amount"`
	Block  uint64 `db:"block_number"`
	Hash   string `db:"block_hash"`
	State  string `db:"state"`
}

func (e *env) transfers() []row {
	e.t.Helper()
	var rows []row
	if err := e.db.Select(&rows, `SELECT tx_hash, tx_key, to_address, amount::text AS amount, block_number, block_hash, state
		FROM transfers ORDER BY block_number, tx_hash, tx_key`); err != nil {
		e.t.Fatal(err)
	}
	return rows
}

// Payments to an address of each kind paywatch derives (P2PKH, P2SH-P2WPKH,
// P2WPKH, P2TR) and to shared P2WSH and P2PKH addresses are found, one
// transfer per output, with the address and amount they paid; nothing else
// is.
func TestPaymentToEachAddressType(t *testing.T) {
	keys := map[string]string{
		accountKey(t, 1, "043587cf"): bitcoin.P2PKH,      // tpub
		accountKey(t, 2, "044a5262"): bitcoin.P2SHP2WPKH, // upub
		accountKey(t, 3, "045f1cf6"): bitcoin.P2WPKH,     // vpub
		accountKey(t, 4, "043587cf"): bitcoin.P2TR,       // tpub, BIP86
	}
	witnessScript := sha256.Sum256([]byte("a shop's 2-of-3 multisig, say"))
	p2wsh, err := btcutil.NewAddressWitnessScriptHash(witnessScript[:], btctest.Params)
	if err != nil {
		t.Fatal(err)
	}
	p2pkh, err := btcutil.NewAddressPubKeyHash(make([]byte, 20), btctest.Params)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, []string{p2wsh.EncodeAddress(), p2pkh.EncodeAddress()}, keys)
	want := map[string]int64{p2wsh.EncodeAddress(): 70_000, p2pkh.EncodeAddress(): 80_000}
	i := int64(0)
	for key, script := range keys {
		d, _ := bitcoin.NewDeriver(key, "regtest", script)
		addr, err := d.Address(1)
		if err != nil {
			t.Fatal(err)
		}
		i++
		want[addr] = 100_000 * i
	}
	s := e.scanner()
	e.sync(s)
	var outs []btctest.Output
	for addr, sats := range want {
		outs = append(outs, btctest.Output{Address: addr, Sats: sats})
	}
	txid := e.node.Pay(outs[:3]...)
	other := e.node.Pay(append(outs[3:], btctest.Output{Address: p2wsh.EncodeAddress(), Sats: 1_000}, // a second output to one address
		btctest.Output{Address: "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080", Sats: 5_000})...) // not watched
	e.node.Mine(1)
	e.sync(s)
	got := map[string]int64{}
	for _, r := range e.transfers() {
		sats, _ := new(big.Int).SetString(r.Amount, 10)
		got[r.To] += sats.Int64()
		if r.TxHash != txid && r.TxHash != other {
			t.Errorf("a transfer of tx %s, which paid nothing watched", r.TxHash)
		}
	}
	want[p2wsh.EncodeAddress()] += 1_000
	for addr, sats := range want {
		if got[addr] != sats {
			t.Errorf("%s received %d, want %d", addr, got[addr], sats)
		}
	}
	if len(got) != len(want) {
		t.Errorf("transfers to %d addresses, want %d: %v", len(got), len(want), got)
	}
	if n := len(e.transfers()); n != len(want)+1 {
		t.Errorf("%d transfers, want one per watched output (%d)", n, len(want)+1)
	}
}
