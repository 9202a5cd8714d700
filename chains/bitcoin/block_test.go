package bitcoin

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/btcsuite/btcd/blockchain"
	"github.com/btcsuite/btcd/btcutil"
	"github.com/btcsuite/btcd/chaincfg/chainhash"
	"github.com/btcsuite/btcd/wire"
)

// A node that sends the header of the block asked for with other
// transactions under it is caught by the merkle root.
func TestBlockWithForeignTransactionsRefused(t *testing.T) {
	b := wire.NewMsgBlock(wire.NewBlockHeader(0x20000000, &chainhash.Hash{1}, &chainhash.Hash{}, 0x207fffff, 7))
	coinbase := wire.NewMsgTx(2)
	coinbase.AddTxIn(wire.NewTxIn(wire.NewOutPoint(&chainhash.Hash{}, wire.MaxPrevOutIndex), []byte{1, 2}, nil))
	coinbase.AddTxOut(wire.NewTxOut(5_000_000_000, []byte{0x51}))
	pay := wire.NewMsgTx(2)
	pay.AddTxIn(wire.NewTxIn(wire.NewOutPoint(&chainhash.Hash{9}, 0), nil, nil))
	pay.AddTxOut(wire.NewTxOut(10_000, []byte{0x52}))
	_ = b.AddTransaction(coinbase)
	_ = b.AddTransaction(pay)
	b.Header.MerkleRoot = blockchain.CalcMerkleRoot([]*btcutil.Tx{btcutil.NewTx(coinbase), btcutil.NewTx(pay)}, false)
	raw := func() string {
		var buf bytes.Buffer
		if err := b.Serialize(&buf); err != nil {
			t.Fatal(err)
		}
		return hex.EncodeToString(buf.Bytes())
	}
	hash := b.BlockHash().String()
	if _, txs, err := decodeBlock(raw(), hash); err != nil || len(txs) != 2 {
		t.Fatalf("the genuine block: %d transactions, %v", len(txs), err)
	}
	pay.TxOut[0].Value = 5_000_000 // the header is unchanged: same hash
	if _, _, err := decodeBlock(raw(), hash); err == nil || !strings.Contains(err.Error(), "merkle root") {
		t.Fatalf("a block with other transactions under its header: %v", err)
	}
	if _, _, err := decodeBlock(raw(), strings.Repeat("00", 32)); err == nil {
		t.Fatal("another block than the one asked for")
	}
}

// A node's raw block, whatever its bytes, decodes or is refused with an
// error: never a panic, never a block other than the one asked for.
func FuzzDecodeBlock(f *testing.F) {
	b := wire.NewMsgBlock(wire.NewBlockHeader(0x20000000, &chainhash.Hash{1}, &chainhash.Hash{}, 0x207fffff, 7))
	coinbase := wire.NewMsgTx(2)
	coinbase.AddTxIn(wire.NewTxIn(wire.NewOutPoint(&chainhash.Hash{}, wire.MaxPrevOutIndex), []byte{1, 2}, nil))
	coinbase.AddTxOut(wire.NewTxOut(5_000_000_000, []byte{0x51}))
	_ = b.AddTransaction(coinbase)
	b.Header.MerkleRoot = blockchain.CalcMerkleRoot([]*btcutil.Tx{btcutil.NewTx(coinbase)}, false)
	var buf bytes.Buffer
	_ = b.Serialize(&buf)
	hash := b.BlockHash().String()
	f.Add(hex.EncodeToString(buf.Bytes()))
	f.Add("")
	f.Add("zz")
	f.Fuzz(func(t *testing.T, raw string) {
		block, txs, err := decodeBlock(raw, hash)
		if err != nil {
			return
		}
		if block.BlockHash().String() != hash || len(txs) != len(block.Transactions) {
			t.Fatalf("decoded another block: %s", block.BlockHash())
		}
	})
}
