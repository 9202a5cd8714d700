package reconciletest

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/scan"
)

// Chain is a blockchain in memory that a scan.Scanner can watch and that
// answers node look-ups of transactions: blocks of transactions whose
// outputs pay addresses, a mempool, reorgs of any depth that mine dropped
// transactions again or drop them, and, on demand, a lying node that
// answers look-ups from a replaced block. It is for tests of the money path
// that need many seeded reorgs quickly; the chain adapters are tested on
// real nodes.
type Chain struct {
	mu      sync.Mutex
	rnd     *rand.Rand
	now     func() time.Time
	blocks  []*Block          // the canonical chain, by height
	gone    map[string]*Block // blocks replaced by reorgs, by hash
	mempool []*Tx
	txs     int
	// Lying makes look-ups answer from the newest replaced block that held
	// the transaction, as a node on a stale fork would.
	Lying bool
}

// Block is one block of a Chain.
type Block struct {
	Number       uint64
	Hash, Parent string
	Time         time.Time
	Txs          []*Tx
}

// Tx is a transaction: outputs of one asset to addresses.
type Tx struct {
	Hash    string
	Asset   *paywatch.Asset
	Outputs []Output
}

// Output is one payment of a transaction.
type Output struct {
	To     string
	Amount *big.Int
}

var (
	_ scan.Source      = (*Chain)(nil)
	_ scan.HashBatcher = (*Chain)(nil)
)

// NewChain returns a chain holding its genesis block, with block times
// from now and hashes drawn from rnd.
func NewChain(rnd *rand.Rand, now func() time.Time) *Chain {
	c := &Chain{rnd: rnd, now: now, gone: map[string]*Block{}}
	c.blocks = []*Block{{Number: 0, Hash: c.hash("b"), Time: now()}}
	return c
}

func (c *Chain) hash(kind string) string {
	return fmt.Sprintf("0x%s%016x%016x", kind, c.rnd.Uint64(), c.rnd.Uint64())
}

// Send puts a transaction in the mempool; the next mined block holds it.
func (c *Chain) Send(asset *paywatch.Asset, outputs ...Output) *Tx {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.txs++
	tx := &Tx{Hash: c.hash("7"), Asset: asset, Outputs: outputs}
	c.mempool = append(c.mempool, tx)
	return tx
}

// Mine seals n blocks; the first holds the mempool.
func (c *Chain) Mine(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mine(n)
}

func (c *Chain) mine(n int) {
	for i := 0; i < n; i++ {
		parent := c.blocks[len(c.blocks)-1]
		b := &Block{Number: parent.Number + 1, Hash: c.hash("b"), Parent: parent.Hash, Time: c.now(), Txs: c.mempool}
		c.mempool = nil
		c.blocks = append(c.blocks, b)
	}
}

// Reorg replaces the last depth blocks with depth+extra new ones. Each
// transaction of the replaced blocks is mined again in the first new block
// with probability again, goes back to the mempool with probability later,
// and is dropped for good otherwise. It returns how many were dropped.
func (c *Chain) Reorg(depth, extra int, again, later float64) (dropped int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	depth = min(depth, len(c.blocks)-1)
	var txs []*Tx
	for _, b := range c.blocks[len(c.blocks)-depth:] {
		c.gone[b.Hash] = b
		txs = append(txs, b.Txs...)
	}
	c.blocks = c.blocks[:len(c.blocks)-depth]
	var mined, pending []*Tx
	for _, tx := range txs {
		switch r := c.rnd.Float64(); {
		case r < again:
			mined = append(mined, tx)
		case r < again+later:
			pending = append(pending, tx)
		default:
			dropped++
		}
	}
	waiting := c.mempool
	c.mempool = mined
	c.mine(1)
	c.mempool = append(waiting, pending...)
	c.mine(depth + extra - 1)
	return dropped
}

// Height returns the head's number.
func (c *Chain) Height() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return uint64(len(c.blocks) - 1)
}

// Canonical reports whether a block of that number and hash is on the
// chain now.
func (c *Chain) Canonical(number uint64, hash string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return number < uint64(len(c.blocks)) && c.blocks[number].Hash == hash
}

// Head implements scan.Source.
func (c *Chain) Head(context.Context) (scan.Head, error) {
	return scan.Head{Number: c.Height()}, nil
}

// BlockHash implements scan.Source.
func (c *Chain) BlockHash(_ context.Context, n uint64) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n >= uint64(len(c.blocks)) {
		return "", scan.ErrNoBlock
	}
	return c.blocks[n].Hash, nil
}

// BlockHashes implements scan.HashBatcher.
func (c *Chain) BlockHashes(_ context.Context, numbers []uint64) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(numbers))
	for i, n := range numbers {
		if n < uint64(len(c.blocks)) {
			out[i] = c.blocks[n].Hash
		}
	}
	return out, nil
}

// Scan implements scan.Source: every output of every transaction in blocks
// [from, to].
func (c *Chain) Scan(_ context.Context, from, to uint64) (*scan.Batch, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if to >= uint64(len(c.blocks)) {
		return nil, fmt.Errorf("blocks %d-%d: %w", from, to, scan.ErrNoBlock)
	}
	b := &scan.Batch{Blocks: []scan.Block{{Number: to, Hash: c.blocks[to].Hash}}}
	for n := from; n <= to; n++ {
		b.Transfers = append(b.Transfers, found(c.blocks[n])...)
	}
	return b, nil
}

// found returns the transfers of a block's transactions.
func found(b *Block) []scan.Found {
	var out []scan.Found
	for _, tx := range b.Txs {
		out = append(out, txFound(b, tx)...)
	}
	return out
}

func txFound(b *Block, tx *Tx) []scan.Found {
	out := make([]scan.Found, len(tx.Outputs))
	for i, o := range tx.Outputs {
		out[i] = scan.Found{Asset: tx.Asset, TxHash: tx.Hash, TxKey: "out:" + strconv.Itoa(i), Index: int64(i),
			From: "0xpayer", To: o.To, Amount: new(big.Int).Set(o.Amount), BlockNumber: b.Number, BlockHash: b.Hash,
			BlockTime: b.Time}
	}
	return out
}

// LookupTx answers a node look-up of a transaction (reconcile.TxLookup):
// its transfers where the canonical chain mined it, or nothing. A lying
// chain answers from a replaced block when it can.
func (c *Chain) LookupTx(_ context.Context, hash string) ([]scan.Found, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.Lying {
		var newest *Block
		for _, b := range c.gone {
			for _, tx := range b.Txs {
				if tx.Hash == hash && (newest == nil || b.Number > newest.Number || (b.Number == newest.Number && b.Hash > newest.Hash)) {
					newest = b
				}
			}
		}
		if newest != nil {
			for _, tx := range newest.Txs {
				if tx.Hash == hash {
					return txFound(newest, tx), nil
				}
			}
		}
	}
	return c.mined(hash), nil
}

// Mined returns the transfers of a transaction where the canonical chain
// mined it, or nothing: what an honest node answers.
func (c *Chain) Mined(hash string) []scan.Found {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mined(hash)
}

func (c *Chain) mined(hash string) []scan.Found {
	for _, b := range c.blocks {
		for _, tx := range b.Txs {
			if tx.Hash == hash {
				return txFound(b, tx)
			}
		}
	}
	return nil
}
