package scan

import (
	"context"
	"fmt"
	"math/big"
	"testing"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// BenchmarkCommit measures one catch-up step's commit: 400 transfers of a
// 2,000-block range, its last block's hash, the cursor moved past it, the
// transfers below the confirmation depth confirmed. Its round trips are
// what a database far from paywatch multiplies. Run:
//
//	go test -run '^$' -bench BenchmarkCommit ./chains/scan/
func BenchmarkCommit(b *testing.B) {
	const perBatch, blocks = 400, 2000
	db := pgtest.New(b)
	store := NewStore(db)
	asset := &paywatch.Asset{Network: "ethereum", Symbol: "USDT", Contract: "0xdAC17F958D2ee523a2206206994597C13D831ec7", Decimals: 6}
	ctx := context.Background()
	var prev *Block
	next := uint64(1)
	for b.Loop() {
		b.StopTimer()
		from, to := next, next+blocks-1
		batch := &Batch{Blocks: []Block{{Number: to, Hash: fmt.Sprintf("0xb%d", to)}}}
		for i := range perBatch {
			n := from + uint64(i*blocks/perBatch)
			batch.Transfers = append(batch.Transfers, Found{Asset: asset, TxHash: fmt.Sprintf("0x%064d", n), TxKey: "log:0",
				From: "0x9999999999999999999999999999999999999999", To: fmt.Sprintf("0x%040d", i),
				Amount: big.NewInt(int64(1_000_000 + i)), BlockNumber: n, BlockHash: fmt.Sprintf("0xb%d", n),
				Flags: []string{FlagBalancePending}})
		}
		cursor := Block{Number: to, Hash: fmt.Sprintf("0xb%d", to)}
		head := Head{Number: to + 100_000}
		b.StartTimer()
		if _, err := store.Commit(ctx, Commit{Network: "ethereum", Prev: prev, Batch: batch, Cursor: &cursor, Head: head,
			ConfirmedAtOrBelow: head.Number - 11, Window: 128, First: from}); err != nil {
			b.Fatal(err)
		}
		prev, next = &cursor, to+1
	}
	b.ReportMetric(float64(perBatch*b.N)/b.Elapsed().Seconds(), "transfers/s")
}
