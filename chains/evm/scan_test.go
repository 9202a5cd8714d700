package evm_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/evm"
	"github.com/paywatch/paywatch/chains/evm/evmtest"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// env is a simulated chain with two configured tokens and the native coin,
// a fresh database and a scanner over them.
type env struct {
	t       *testing.T
	chain   *evmtest.Chain
	db      *sqlx.DB
	dbURL   string
	store   *scan.Store
	network *paywatch.Network
	usdt    *evmtest.Token // 6 decimals
	dai     *evmtest.Token // 18 decimals
	shop    common.Address
	other   common.Address
	log     *slog.Logger
}

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("PAYWATCH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newEnv(t *testing.T, opts ...evmtest.Option) *env {
	t.Helper()
	c := evmtest.New(t, opts...)
	db, dbURL := pgtest.NewWithURL(t)
	e := &env{t: t, chain: c, db: db, dbURL: dbURL, log: testLogger(t),
		shop:  common.HexToAddress("0x1111111111111111111111111111111111111111"),
		other: common.HexToAddress("0x3333333333333333333333333333333333333333")}
	e.usdt = c.DeployToken("Tether USD", "USDT", 6)
	e.dai = c.DeployToken("Dai", "DAI", 18)
	e.store = scan.NewStore(e.db)
	shop := []string{e.shop.Hex()}
	e.network = &paywatch.Network{Name: "devnet", Family: paywatch.FamilyEVM, RPCURLs: []string{c.URL},
		ChainID: evmtest.ChainID, Confirmations: 3, PollInterval: 50 * time.Millisecond,
		Assets: []*paywatch.Asset{
			{Network: "devnet", Symbol: "ETH", Native: true, Decimals: 18, Mode: paywatch.ModeShared, Addresses: shop, Dust: new(big.Int)},
			{Network: "devnet", Symbol: "USDT", Contract: e.usdt.Address.Hex(), Decimals: 6, Mode: paywatch.ModeShared,
				Addresses: shop, Dust: big.NewInt(10_000)}, // 0.01 USDT
			{Network: "devnet", Symbol: "DAI", Contract: e.dai.Address.Hex(), Decimals: 18, Mode: paywatch.ModeShared, Addresses: shop, Dust: new(big.Int)},
		}}
	return e
}

func (e *env) scanner() *scan.Scanner {
	src, err := evm.NewSource(e.network, e.log)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(src.Close)
	return scan.NewScanner(e.network, src, e.store, e.log)
}

// sync steps the scanner until it reaches the head, then has what it
// recorded verified (as Run does behind the scanner).
func (e *env) sync(s *scan.Scanner) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := 0; ; i++ {
		caughtUp, err := s.Step(ctx)
		if err != nil {
			e.t.Fatalf("step %d: %v", i, err)
		}
		if caughtUp {
			if _, err := s.VerifyPending(ctx); err != nil {
				e.t.Fatalf("verify: %v", err)
			}
			return
		}
		if i > 10000 {
			e.t.Fatal("scanner never caught up")
		}
	}
}

// recorded tells whether n transfers are recorded, each with its balance
// check's verdict.
func (e *env) recorded(n int) bool {
	got := e.transfers()
	for _, g := range got {
		if slices.Contains(g.Flags, scan.FlagBalancePending) {
			return false
		}
	}
	return len(got) == n
}

type stored struct {
	TxHash string         `db:"tx_hash"`
	TxKey  string         `db:"tx_key"`
	Asset  string         `db:"asset"`
	To     string         `db:"to_address"`
	Amount string         `db:"amount"`
	Block  uint64         `db:"block_number"`
	Hash   string         `db:"block_hash"`
	State  string         `db:"state"`
	Flags  pq.StringArray `db:"flags"`
}

func (s stored) String() string {
	return fmt.Sprintf("%s %s %s@%d %s %v", s.TxHash[:10], s.Asset, s.Amount, s.Block, s.State, []string(s.Flags))
}

func (e *env) transfers() []stored {
	e.t.Helper()
	var rows []stored
	if err := e.db.Select(&rows, `SELECT tx_hash, tx_key, asset, to_address, amount::text AS amount, block_number,
		block_hash, state, flags FROM transfers ORDER BY block_number, idx, tx_key`); err != nil {
		e.t.Fatal(err)
	}
	return rows
}

// want describes an expected transfer by tx hash.
type want struct {
	tx     common.Hash
	asset  string
	amount string
	state  string
	flags  string
}

func (e *env) expect(wants ...want) {
	e.t.Helper()
	got := e.transfers()
	var lines []string
	for _, g := range got {
		lines = append(lines, g.String())
	}
	if len(got) != len(wants) {
		e.t.Fatalf("%d transfers stored, want %d:\n%s", len(got), len(wants), strings.Join(lines, "\n"))
	}
	byTx := map[string][]stored{}
	for _, g := range got {
		byTx[g.TxHash] = append(byTx[g.TxHash], g)
	}
	for _, w := range wants {
		rows := byTx[w.tx.Hex()]
		if len(rows) == 0 {
			e.t.Fatalf("transfer %s not stored:\n%s", w.tx.Hex(), strings.Join(lines, "\n"))
		}
		g := rows[0]
		byTx[w.tx.Hex()] = rows[1:]
		flags := append([]string(nil), g.Flags...)
		sort.Strings(flags)
		if g.Asset != w.asset || g.Amount != w.amount || (w.state != "" && g.State != w.state) || strings.Join(flags, ",") != w.flags {
			e.t.Fatalf("transfer %s = %s, want %s %s %s [%s]", w.tx.Hex()[:10], g, w.asset, w.amount, w.state, w.flags)
		}
	}
}

func units(n int64, decimals int) *big.Int {
	return new(big.Int).Mul(big.NewInt(n), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(decimals)), nil))
}

func TestPaymentsFoundOnce(t *testing.T) {
	e := newEnv(t)
	c := e.chain
	e.network.StartBlock = c.Head() // tokens are deployed; start here
	payer := c.Payer

	usdtPay := e.usdt.Transfer(payer, e.shop, big.NewInt(1_234_000_317))
	daiPay := e.dai.Transfer(payer, e.shop, units(5, 18))
	ethPay := c.SendETH(payer, e.shop, units(2, 18))
	batch := e.usdt.BatchTransfer(payer, []common.Address{e.shop, e.other, e.shop}, []*big.Int{big.NewInt(7), big.NewInt(8), big.NewInt(20_000)})
	c.Mine(1)
	dust := e.usdt.Transfer(payer, e.shop, big.NewInt(9_999))
	notOurs := e.usdt.Transfer(payer, e.other, big.NewInt(50))
	zero := e.usdt.Transfer(payer, e.shop, big.NewInt(0))
	c.Mine(1)
	// A fake event in its own block: a real payment in the same block to the
	// same address would be flagged with it (the balance cannot tell them apart).
	fake := e.usdt.FakeTransfer(payer, e.shop, big.NewInt(1_000_000))
	reverted := e.usdt.TransferThenRevert(payer, e.shop, big.NewInt(3_000_000))
	spoof := c.DeployToken("Tether USD", "USDT", 6) // same symbol, not configured
	c.Mine(1)
	spoofed := spoof.Transfer(payer, e.shop, big.NewInt(1_234_000_317))
	c.Mine(1)
	if r := c.Receipt(reverted); r.Status != 0 {
		t.Fatal("the reverting transfer did not revert")
	}
	_, _, _ = notOurs, zero, spoofed

	s := e.scanner()
	e.sync(s)
	e.expect(
		want{usdtPay, "USDT", "1234000317", "", ""},
		want{daiPay, "DAI", "5000000000000000000", "", ""},
		want{ethPay, "ETH", "2000000000000000000", "", ""},
		want{batch, "USDT", "7", "", "dust"},
		want{batch, "USDT", "20000", "", ""},
		want{dust, "USDT", "9999", "", "dust"},
		want{fake, "USDT", "1000000", "", "balance_mismatch"},
	)
	var untimed int
	if err := e.db.Get(&untimed, `SELECT count(*) FROM transfers WHERE block_time IS NULL OR block_time < now() - interval '1 hour'`); err != nil || untimed != 0 {
		t.Fatalf("%d transfers without a plausible block time (%v)", untimed, err)
	}
	// Scanning again, or from a fresh scanner, records nothing twice.
	e.sync(s)
	e.sync(e.scanner())
	if n := len(e.transfers()); n != 7 {
		t.Fatalf("%d transfers after rescans", n)
	}
	// Confirmations come from the head: three blocks make them confirmed.
	c.Mine(3)
	e.sync(s)
	for _, g := range e.transfers() {
		if g.State != "confirmed" {
			t.Fatalf("after 3 more blocks: %s", g)
		}
	}
	var head, cursor int64
	if err := e.db.QueryRow(`SELECT head, block_number FROM chain_cursors WHERE network = 'devnet'`).Scan(&head, &cursor); err != nil || head != int64(c.Head()) || cursor != head {
		t.Fatalf("cursor %d head %d (%v), chain head %d", cursor, head, err, c.Head())
	}
}

func isTooDeep(err error) bool { return errors.Is(err, scan.ErrReorgTooDeep) }

// On a pruned node, old blocks' balances cannot be checked: those transfers
// are recorded and flagged, recent ones are checked as usual.
func TestPrunedNodeBalanceChecks(t *testing.T) {
	e := newEnv(t, evmtest.Pruned())
	e.network.StartBlock = e.chain.Head()
	old := e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(4_000_000))
	e.chain.Mine(300)
	recent := e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(5_000_000))
	e.chain.Mine(1)
	e.sync(e.scanner())
	e.expect(want{old, "USDT", "4000000", "", "balance_unchecked"}, want{recent, "USDT", "5000000", "", ""})
}

// An operator may turn the fake-deposit check off for a token they trust
// (verify_balance: false): its transfers are recorded unflagged and cost no
// balance calls; the other tokens are still checked.
func TestBalanceCheckOffForATrustedToken(t *testing.T) {
	e := newEnv(t)
	e.network.StartBlock = e.chain.Head()
	for _, a := range e.network.Assets {
		if a.Symbol == "USDT" {
			a.SkipBalanceCheck = true
		}
	}
	fakeUSDT := e.usdt.FakeTransfer(e.chain.Payer, e.shop, big.NewInt(1_000_000))
	e.chain.Mine(1)
	fakeDAI := e.dai.FakeTransfer(e.chain.Payer, e.shop, units(1, 18))
	e.chain.Mine(1)
	e.sync(e.scanner())
	e.expect(want{fakeUSDT, "USDT", "1000000", "", ""}, want{fakeDAI, "DAI", "1000000000000000000", "", "balance_mismatch"})
}
