package evm_test

import (
	"math/big"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"
)

// README's claims about the EVM scanner, each shown by a test that fails
// when the behaviour breaks.

// A node on another chain than the configured chain_id is never read:
// every step fails saying so, and nothing is recorded, not even a cursor.
func TestWrongChainIDIsRefused(t *testing.T) {
	e := newEnv(t)
	e.network.StartBlock = e.chain.Head()
	e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(5_000_000))
	e.chain.Mine(1)
	e.network.ChainID = 999
	s := e.scanner()
	for range 3 {
		_, err := s.Step(t.Context())
		if err == nil || !strings.Contains(err.Error(), "the configuration says 999") {
			t.Fatalf("step on a node of another chain: %v", err)
		}
	}
	var cursors int
	if err := e.db.Get(&cursors, `SELECT count(*) FROM chain_cursors WHERE block_number IS NOT NULL`); err != nil || cursors != 0 {
		t.Fatalf("%d cursors (%v)", cursors, err)
	}
	if n := len(e.transfers()); n != 0 {
		t.Fatalf("%d transfers recorded from the wrong chain", n)
	}
}

// start_block: latest scans from the head it first sees: a payment mined
// before is not recorded, one mined after is.
func TestStartLatestSkipsHistory(t *testing.T) {
	e := newEnv(t)
	e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(5_000_000))
	e.chain.Mine(3)
	e.network.StartLatest = true
	s := e.scanner()
	e.sync(s)
	if n := len(e.transfers()); n != 0 {
		t.Fatalf("%d transfers recorded from before the start", n)
	}
	after := e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(6_000_000))
	e.chain.Mine(1)
	e.sync(s)
	e.expect(want{after, "USDT", "6000000", "", ""})
}

// confirmations: finalized confirms only what the node calls finalized,
// however many blocks are mined on top (the simulated node finalizes
// nothing past genesis).
func TestConfirmationsFinalized(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	e.network.StartBlock = e.chain.Head()
	e.network.UseFinalized = true
	pay := e.usdt.Transfer(e.chain.Payer, e.shop, big.NewInt(5_000_000))
	e.chain.Mine(1)
	paidIn := e.chain.Head()
	e.chain.Mine(5)
	s := e.scanner()
	e.sync(s)
	var finalized uint64
	head, err := e.chain.Client.HeaderByNumber(t.Context(), big.NewInt(int64(rpc.FinalizedBlockNumber)))
	if err != nil {
		t.Fatal(err)
	}
	finalized = head.Number.Uint64()
	if finalized >= paidIn {
		t.Fatalf("setup: the node finalized block %d, the payment's %d too: nothing tells finality from depth", finalized, paidIn)
	}
	// Five blocks deep (three confirmations would do), not finalized: seen.
	e.expect(want{pay, "USDT", "5000000", "seen", ""})
	var recorded int64
	if err := e.db.Get(&recorded, `SELECT finalized FROM chain_cursors`); err != nil || uint64(recorded) != finalized {
		t.Fatalf("recorded finalized %d (%v), the node says %d", recorded, err, finalized)
	}
}

// A native payment counts only if its transaction succeeded: ETH sent to
// a watched address that refuses it (a contract without a payable
// fallback) is mined, reverted, and never recorded; a plain payment is.
func TestRevertedNativePaymentIsNotRecorded(t *testing.T) {
	e := newEnv(t)
	e.network.StartBlock = e.chain.Head()
	refusing := e.usdt.Address // the token contract takes no ETH
	for _, a := range e.network.Assets {
		if a.Native {
			a.Addresses = append(a.Addresses, refusing.Hex())
		}
	}
	reverted := e.chain.Send(e.chain.Payer, &refusing, big.NewInt(1e15), nil, 100_000)
	paid := e.chain.SendETH(e.chain.Payer, e.shop, big.NewInt(2e15))
	e.chain.Mine(1)
	if r := e.chain.Receipt(reverted); r.Status != 0 {
		t.Fatal("setup: the payment to the contract did not revert")
	}
	e.sync(e.scanner())
	e.expect(want{paid, "ETH", "2000000000000000", "", ""})
}

// The balance check counts what leaves the address in the same block: a
// shop that receives 10 and sends 3 in one block moved by 7, and its
// payment checks out.
func TestBalanceCheckCountsOutgoingTransfers(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	shopKey := e.chain.Keys[1]
	shop := crypto.PubkeyToAddress(shopKey.PublicKey)
	for _, a := range e.network.Assets {
		a.Addresses = []string{shop.Hex()}
	}
	e.network.StartBlock = e.chain.Head() + 1 // after the test tokens were minted to the key
	in := e.usdt.Transfer(e.chain.Payer, shop, big.NewInt(10_000_000))
	e.usdt.Transfer(shopKey, e.other, big.NewInt(3_000_000))
	e.chain.Mine(1)
	e.sync(e.scanner())
	e.expect(want{in, "USDT", "10000000", "", ""})
}
