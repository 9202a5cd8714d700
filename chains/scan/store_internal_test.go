package scan

import (
	"context"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// A commit past its transfers is one statement (advance); its parts
// together must leave what they did one after another: the look-ups the cursor passed orphaned, the window's hashes
// kept and the older ones pruned (a batch's hash below the window with
// them), the transfers below the depth confirmed, none when there is no
// depth (not those of block 0), and the cursor moved.
func TestCommitAdvancesBlocksAndCursor(t *testing.T) {
	db := pgtest.New(t)
	s := NewStore(db)
	ctx := context.Background()
	asset := &paywatch.Asset{Network: "ethereum", Symbol: "USDT", Contract: "0xc", Decimals: 6}
	transfer := func(hash string, block uint64, flags ...string) Found {
		return Found{Asset: asset, TxHash: hash, TxKey: "log:0", From: "0xf", To: "0xshop", Amount: big.NewInt(5),
			BlockNumber: block, BlockHash: "0xb" + strings.Repeat("0", int(block%3)), Flags: flags}
	}
	state := func(hash string) string {
		t.Helper()
		var st string
		if err := db.Get(&st, `SELECT state FROM transfers WHERE tx_hash = $1`, hash); err != nil {
			t.Fatal(err)
		}
		return st
	}
	kept := func() []Block {
		t.Helper()
		blocks, err := s.RecentBlocks(ctx, "ethereum", 1000)
		if err != nil {
			t.Fatal(err)
		}
		return blocks
	}

	before := time.Now()
	// First commit: no depth reached (ConfirmedAtOrBelow 0), a transfer in
	// block 0 stays seen.
	c1 := Commit{Network: "ethereum", First: 0, Window: 5, Head: Head{Number: 3},
		Batch:  &Batch{Transfers: []Found{transfer("0xt0", 0)}, Blocks: []Block{{Number: 0, Hash: "0xb0"}, {Number: 3, Hash: "0xb3"}}},
		Cursor: &Block{Number: 3, Hash: "0xb3"}}
	if _, err := s.Commit(ctx, c1); err != nil {
		t.Fatal(err)
	}
	if got := state("0xt0"); got != "seen" {
		t.Errorf("transfer of block 0 with no confirmation depth: %s, want seen", got)
	}
	if got, want := kept(), []Block{{3, "0xb3"}, {0, "0xb0"}}; !slices.Equal(got, want) {
		t.Errorf("kept %v, want %v", got, want)
	}

	// A look-up records block 12 ahead of the scanner; the next commit
	// passes it without seeing it there.
	if err := s.Record(ctx, "ethereum", []Found{transfer("0xlookup", 12)}); err != nil {
		t.Fatal(err)
	}
	c2 := Commit{Network: "ethereum", Prev: c1.Cursor, First: 4, Window: 5, Head: Head{Number: 40},
		ConfirmedAtOrBelow: 29,
		Batch: &Batch{Transfers: []Found{transfer("0xt10", 10), transfer("0xt30", 30), transfer("0xpending", 11, FlagBalancePending)},
			Blocks: []Block{{Number: 10, Hash: "0xb10"}, {Number: 17, Hash: "0xb17"}, {Number: 20, Hash: "0xold20"}}},
		Cursor: &Block{Number: 20, Hash: "0xb20"}}
	if _, err := s.Commit(ctx, c2); err != nil {
		t.Fatal(err)
	}
	for hash, want := range map[string]string{"0xlookup": "orphaned", "0xt0": "confirmed", "0xt10": "confirmed",
		"0xpending": "seen", "0xt30": "seen"} {
		if got := state(hash); got != want {
			t.Errorf("%s: %s, want %s", hash, got, want)
		}
	}
	// Window 5 below cursor 20: from 15 up; the cursor's hash stands for
	// its height.
	if got, want := kept(), []Block{{20, "0xb20"}, {17, "0xb17"}}; !slices.Equal(got, want) {
		t.Errorf("kept %v, want %v", got, want)
	}
	cur, _, err := s.Cursor(ctx, "ethereum")
	if err != nil || cur == nil || *cur != *c2.Cursor {
		t.Errorf("cursor %v (%v), want %v", cur, err, c2.Cursor)
	}
	// The transfers' ids begin with the (wall clock) time they were made:
	// "trf_" and 9 characters hold its milliseconds but the last 3 bits.
	var ids []string
	if err := db.Select(&ids, `SELECT id FROM transfers`); err != nil || len(ids) != 5 {
		t.Fatalf("%d transfers (%v)", len(ids), err)
	}
	lo, hi := paywatch.NewSortableID("trf", before)[:13], paywatch.NewSortableID("trf", time.Now().Add(8*time.Millisecond))[:13]
	for _, id := range ids {
		if id[:13] < lo || id[:13] > hi {
			t.Errorf("transfer id %s does not begin with when it was made (%s to %s)", id, lo, hi)
		}
	}
	var confirmed int64
	if err := db.Get(&confirmed, `SELECT confirmed_height FROM chain_cursors WHERE network = 'ethereum'`); err != nil || confirmed != 20 {
		t.Errorf("confirmed height %d (%v), want 20 (the cursor bounds it)", confirmed, err)
	}
}

// A batch that gives one height two hashes contradicts itself: the commit
// fails and keeps nothing of it.
func TestCommitRefusesTwoHashesAtOneHeight(t *testing.T) {
	db := pgtest.New(t)
	s := NewStore(db)
	ctx := context.Background()
	for _, blocks := range [][]Block{
		{{Number: 10, Hash: "0xaaa"}, {Number: 11, Hash: "0xccc"}, {Number: 10, Hash: "0xbbb"}},
		{{Number: 1, Hash: "0xaaa"}, {Number: 300, Hash: "0xccc"}, {Number: 1, Hash: "0xbbb"}}, // below the window
	} {
		cursor := blocks[1]
		_, err := s.Commit(ctx, Commit{Network: "ethereum", Window: 128, First: 1, Head: Head{Number: 400},
			Batch: &Batch{Blocks: blocks}, Cursor: &cursor})
		kept, _ := s.RecentBlocks(ctx, "ethereum", 1000)
		if err == nil || len(kept) > 0 {
			t.Errorf("a batch with two hashes at one height: err %v, kept %v", err, kept)
		}
	}
}
