// Package btctest runs real btcd regtest nodes for tests (btcd's rpctest
// harness, which builds btcd from the module's own dependencies), with a
// wallet to pay from, and the means to make reorgs.
package btctest

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/btcsuite/btcd/btcutil"
	"github.com/btcsuite/btcd/chaincfg/chainhash"
	"github.com/btcsuite/btcd/integration/rpctest"
	"github.com/btcsuite/btcd/rpcclient"
	"github.com/btcsuite/btcd/txscript"
	"github.com/btcsuite/btcd/wire"

	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/bitcoin/devnode"
)

// Params are the chain parameters of the nodes (regtest).
var Params = devnode.Params

// Node is a btcd regtest node started for a test and stopped with it.
type Node struct {
	t   testing.TB
	dev *devnode.Node
	H   *rpctest.Harness
	// URL and Credentials reach the node's JSON-RPC (TLS with the node's
	// own certificate).
	URL         string
	Credentials bitcoin.Credentials
}

// New starts a node with mature coins in its wallet and the transaction
// index on (for node look-ups of customers' transactions).
func New(t testing.TB) *Node {
	t.Helper()
	return start(t, true, true)
}

// NewWithoutTxIndex starts a node with mature coins in its wallet and no
// transaction index (btcd's default): a mined transaction is not found by
// its txid.
func NewWithoutTxIndex(t testing.TB) *Node {
	t.Helper()
	return start(t, true, false)
}

// NewPeer starts a second node, with no coins of its own, connected to n
// and synced to its chain: two nodes to mine apart and join again.
func NewPeer(t testing.TB, n *Node) *Node {
	t.Helper()
	peer := start(t, false, true)
	peer.Connect(n)
	return peer
}

func start(t testing.TB, coins, txindex bool) *Node {
	t.Helper()
	startNode := devnode.Start
	if !txindex {
		startNode = devnode.StartWithoutTxIndex
	}
	dn, err := startNode(coins)
	if err != nil {
		t.Fatalf("btctest: %v", err)
	}
	t.Cleanup(func() { _ = dn.Stop() })
	cert := filepath.Join(t.TempDir(), "rpc.cert")
	if err := os.WriteFile(cert, dn.Cert, 0o600); err != nil {
		t.Fatal(err)
	}
	return &Node{t: t, dev: dn, H: dn.H, URL: dn.URL,
		Credentials: bitcoin.Credentials{User: dn.User, Pass: dn.Pass, CertFile: cert}}
}

// Connect joins n to other as a peer and waits until both have the same
// best chain (the longer one wins: a reorg on the other side).
func (n *Node) Connect(other *Node) {
	n.t.Helper()
	if err := rpctest.ConnectNode(n.H, other.H); err != nil {
		n.t.Fatalf("btctest: connect: %v", err)
	}
	if err := rpctest.JoinNodes([]*rpctest.Harness{n.H, other.H}, rpctest.Blocks); err != nil {
		n.t.Fatalf("btctest: sync: %v", err)
	}
}

// Disconnect parts n from other, so that they mine apart.
func (n *Node) Disconnect(other *Node) {
	n.t.Helper()
	if err := n.H.Client.AddNode(other.H.P2PAddress(), rpcclient.ANRemove); err != nil {
		n.t.Fatalf("btctest: disconnect: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		a, err := n.H.Client.GetPeerInfo()
		if err != nil {
			n.t.Fatal(err)
		}
		b, err := other.H.Client.GetPeerInfo()
		if err != nil {
			n.t.Fatal(err)
		}
		if len(a) == 0 && len(b) == 0 {
			return
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("btctest: still %d and %d peers", len(a), len(b))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Mine seals n blocks and returns their hashes.
func (n *Node) Mine(k int) []*chainhash.Hash {
	n.t.Helper()
	hashes, err := n.H.Client.Generate(uint32(k))
	if err != nil {
		n.t.Fatalf("btctest: mine: %v", err)
	}
	return hashes
}

// Height returns the node's best height.
func (n *Node) Height() uint64 {
	n.t.Helper()
	_, h, err := n.H.Client.GetBestBlock()
	if err != nil {
		n.t.Fatalf("btctest: best block: %v", err)
	}
	return uint64(h)
}

// Output is a payment of sats to an address.
type Output = devnode.Output

// Pay sends one transaction paying the outputs (to the mempool; Mine puts
// it in a block) and returns its id.
func (n *Node) Pay(outputs ...Output) string {
	n.t.Helper()
	txid, err := n.dev.Pay(outputs...)
	if err != nil {
		n.t.Fatalf("btctest: %v", err)
	}
	return txid
}

// Invalidate marks the block at a height invalid: the node falls back to
// its parent (mine again to make the new chain longer).
func (n *Node) Invalidate(height uint64) {
	n.t.Helper()
	hash, err := n.H.Client.GetBlockHash(int64(height))
	if err != nil {
		n.t.Fatalf("btctest: %v", err)
	}
	if err := n.H.Client.InvalidateBlock(hash); err != nil {
		n.t.Fatalf("btctest: invalidate block %d: %v", height, err)
	}
}

// Coin is an output whose key the test holds, so that it can spend it as
// a customer would: with a replaceable transaction, then a replacement.
type Coin struct {
	OutPoint wire.OutPoint
	Sats     int64
	key      *btcec.PrivateKey
	script   []byte
}

// Coin pays sats from the node's wallet to a new key (P2PKH) and mines the
// payment, so that the coin can be spent at once.
func (n *Node) Coin(sats int64) *Coin {
	n.t.Helper()
	key, err := btcec.NewPrivateKey()
	if err != nil {
		n.t.Fatal(err)
	}
	addr, err := btcutil.NewAddressPubKeyHash(btcutil.Hash160(key.PubKey().SerializeCompressed()), Params)
	if err != nil {
		n.t.Fatal(err)
	}
	script, err := txscript.PayToAddrScript(addr)
	if err != nil {
		n.t.Fatal(err)
	}
	txid, err := n.H.SendOutputs([]*wire.TxOut{wire.NewTxOut(sats, script)}, 10)
	if err != nil {
		n.t.Fatalf("btctest: fund a coin: %v", err)
	}
	n.Mine(1)
	tx, err := n.H.Client.GetRawTransaction(txid)
	if err != nil {
		n.t.Fatalf("btctest: %v", err)
	}
	for i, out := range tx.MsgTx().TxOut {
		if bytes.Equal(out.PkScript, script) {
			return &Coin{OutPoint: *wire.NewOutPoint(txid, uint32(i)), Sats: sats, key: key, script: script}
		}
	}
	n.t.Fatal("btctest: the funding transaction does not pay the coin")
	return nil
}

// Spend sends a transaction spending the coin to outputs, leaving fee sats
// to the miner and the rest back to the coin's key, and signalling that it
// may be replaced (BIP 125). Spending a coin again is a replacement: the
// node takes it if it pays a higher fee. It returns the txid, or the
// node's refusal.
func (n *Node) Spend(c *Coin, fee int64, outputs ...Output) (string, error) {
	n.t.Helper()
	return n.SpendCoins([]*Coin{c}, fee, outputs...)
}

// SpendCoins is Spend of several coins in one transaction, one input each;
// the rest goes back to the first coin's key.
func (n *Node) SpendCoins(coins []*Coin, fee int64, outputs ...Output) (string, error) {
	n.t.Helper()
	tx := wire.NewMsgTx(2)
	rest := -fee
	for _, c := range coins {
		in := wire.NewTxIn(&c.OutPoint, nil, nil)
		in.Sequence = wire.MaxTxInSequenceNum - 2 // replaceable
		tx.AddTxIn(in)
		rest += c.Sats
	}
	for _, o := range outputs {
		addr, err := btcutil.DecodeAddress(o.Address, Params)
		if err != nil {
			n.t.Fatalf("btctest: %v", err)
		}
		script, err := txscript.PayToAddrScript(addr)
		if err != nil {
			n.t.Fatalf("btctest: %v", err)
		}
		tx.AddTxOut(wire.NewTxOut(o.Sats, script))
		rest -= o.Sats
	}
	if rest < 0 {
		n.t.Fatalf("btctest: the coins hold %d sats too few for the outputs and fee", -rest)
	}
	if rest >= 1000 {
		tx.AddTxOut(wire.NewTxOut(rest, coins[0].script))
	}
	for i, c := range coins {
		sig, err := txscript.SignatureScript(tx, i, c.script, txscript.SigHashAll, c.key, true)
		if err != nil {
			n.t.Fatalf("btctest: sign: %v", err)
		}
		tx.TxIn[i].SignatureScript = sig
	}
	hash, err := n.H.Client.SendRawTransaction(tx, true)
	if err != nil {
		return "", err
	}
	return hash.String(), nil
}

// InMempool reports whether the node's mempool holds the transaction.
func (n *Node) InMempool(txid string) bool {
	n.t.Helper()
	ids, err := n.H.Client.GetRawMempool()
	if err != nil {
		n.t.Fatalf("btctest: %v", err)
	}
	for _, id := range ids {
		if id.String() == txid {
			return true
		}
	}
	return false
}
