package evm_test

import (
	"context"
	"fmt"
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/common"

	"github.com/paywatch/paywatch/chains/scan"
)

// Reorgs of depth 1 to confirmations + 2 orphan exactly the transfers of
// the replaced blocks, keep the others, and find the new chain's payments.
func TestReorgOrphansExactly(t *testing.T) {
	for depth := 1; depth <= 5; depth++ { // confirmations are 3
		t.Run(fmt.Sprintf("depth %d", depth), func(t *testing.T) {
			e := newEnv(t)
			c := e.chain
			e.network.StartBlock = c.Head()
			s := e.scanner()
			// One payment per block, for depth+2 blocks.
			var txs []common.Hash
			for i := 0; i < depth+2; i++ {
				txs = append(txs, e.usdt.Transfer(c.Payer, e.shop, big.NewInt(int64(1_000_000+i))))
				c.Mine(1)
			}
			e.sync(s)
			if n := len(e.transfers()); n != depth+2 {
				t.Fatalf("%d transfers before the reorg", n)
			}
			// Replace the last depth blocks (their transactions dropped) with a
			// longer chain holding one new payment.
			var replacement common.Hash
			c.Reorg(depth, 1, false, func() {
				replacement = e.usdt.Transfer(c.Keys[1], e.shop, big.NewInt(42_000_000))
			})
			e.sync(s)
			var wants []want
			for i, tx := range txs {
				w := want{tx, "USDT", fmt.Sprint(1_000_000 + i), "", ""}
				if i >= 2 {
					w.state = "orphaned"
				}
				wants = append(wants, w)
			}
			wants = append(wants, want{replacement, "USDT", "42000000", "", ""})
			e.expect(wants...)
			for _, g := range e.transfers() {
				if g.State != "orphaned" && g.Hash != c.HashAt(g.Block).Hex() {
					t.Fatalf("live transfer %s is not on the canonical chain", g)
				}
			}
			var reorgs, orphaned int
			if err := e.db.QueryRow(`SELECT count(*), coalesce(sum(orphaned_count), 0) FROM chain_reorgs`).Scan(&reorgs, &orphaned); err != nil || reorgs != 1 || orphaned != depth {
				t.Fatalf("recorded %d reorgs orphaning %d (%v), want 1 and %d", reorgs, orphaned, err, depth)
			}
		})
	}
}

// A transaction mined again in the new chain is the same transfer: it moves
// to its new block and is counted once.
func TestReorgRemined(t *testing.T) {
	e := newEnv(t)
	c := e.chain
	e.network.StartBlock = c.Head()
	s := e.scanner()
	e.usdt.Transfer(c.Keys[2], e.other, big.NewInt(5)) // shifts log indexes in the old block
	tx := e.usdt.BatchTransfer(c.Payer, []common.Address{e.shop, e.shop}, []*big.Int{big.NewInt(11_000_000), big.NewInt(11_000_000)})
	c.Mine(1)
	c.Mine(1)
	e.sync(s)
	before := e.transfers()
	c.Reorg(2, 2, true, nil) // the dropped transactions are mined again, in a later block
	e.sync(s)
	after := e.transfers()
	e.expect(want{tx, "USDT", "11000000", "", ""}, want{tx, "USDT", "11000000", "", ""})
	for i := range after {
		if after[i].State == "orphaned" {
			t.Fatalf("re-mined transfer left orphaned: %s", after[i])
		}
		if after[i].Hash == before[i].Hash {
			t.Fatalf("transfer did not move to its new block: %s", after[i])
		}
	}
	var ids int
	if err := e.db.QueryRow(`SELECT count(DISTINCT id) FROM transfers`).Scan(&ids); err != nil || ids != 2 {
		t.Fatalf("%d transfer ids", ids)
	}
}

// A reorg deeper than the kept window halts the scanner loudly.
func TestReorgDeeperThanWindowHalts(t *testing.T) {
	e := newEnv(t)
	c := e.chain
	e.network.StartBlock = c.Head()
	s := e.scanner()
	s.Window = 4
	for i := 0; i < 8; i++ {
		e.usdt.Transfer(c.Payer, e.shop, big.NewInt(int64(2_000_000+i)))
		c.Mine(1)
		e.sync(s)
	}
	c.Reorg(7, 1, false, nil)
	_, err := s.Step(t.Context())
	if err == nil || !isTooDeep(err) {
		t.Fatalf("step after a deep reorg: %v", err)
	}
	for _, g := range e.transfers() {
		if g.State == "orphaned" {
			t.Fatalf("a halted scanner guessed: %s", g)
		}
	}
	// Run waits while halted, and goes on once an operator rewinds.
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	waitFor(t, func() bool {
		var halted bool
		_ = e.db.Get(&halted, `SELECT halted FROM chain_cursors WHERE network = 'devnet'`)
		return halted
	}, "the halt recorded")
	fork := c.Head() - 8
	if _, err := e.store.Rewind(t.Context(), "devnet", scan.Block{Number: fork, Hash: c.HashAt(fork).Hex()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		var cursor int64
		_ = e.db.Get(&cursor, `SELECT block_number FROM chain_cursors WHERE network = 'devnet'`)
		return uint64(cursor) == c.Head()
	}, "the rescan after the rewind")
	cancel()
	<-done
	live, orphaned := 0, 0
	for _, g := range e.transfers() {
		if g.State == "orphaned" {
			orphaned++
		} else if g.Hash != c.HashAt(g.Block).Hex() {
			t.Fatalf("live transfer %s is not canonical", g)
		} else {
			live++
		}
	}
	if orphaned != 7 || live != 1 {
		t.Fatalf("after the rescan: %d orphaned, %d live; want 7 and 1", orphaned, live)
	}
}
