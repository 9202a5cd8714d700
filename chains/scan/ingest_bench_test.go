package scan

import (
	"context"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// BenchmarkIngest stores batches of 10,000 transfers as the scanner does
// (one INSERT … SELECT FROM unnest per batch, with the upsert), beside
// COPY of the same rows into the same table: the rate of paywatch's
// ingestion against PostgreSQL's fastest way in (README "Benchmarks").
func BenchmarkIngest(b *testing.B) {
	const rows = 10_000
	db := pgtest.New(b)
	asset := &paywatch.Asset{Network: "ethereum", Symbol: "USDT", Contract: "0xdAC17F958D2ee523a2206206994597C13D831ec7", Decimals: 6}
	batch := func(tag string) []Found {
		found := make([]Found, rows)
		for i := range found {
			found[i] = Found{Asset: asset, TxHash: fmt.Sprintf("0x%s%058d", tag, i), TxKey: "log:0", Index: int64(i % 50),
				From: "0x9999999999999999999999999999999999999999", To: "0x1111111111111111111111111111111111111111",
				Amount: big.NewInt(int64(1_000_000 + i)), BlockNumber: uint64(1000 + i/20), BlockHash: fmt.Sprintf("0xb%d", i/20),
				BlockTime: time.Unix(1_800_000_000, 0)}
		}
		return found
	}
	ctx := context.Background()
	run := 0
	b.Run("paywatch", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			run++
			found := batch(fmt.Sprintf("%06d", run))
			b.StartTimer()
			if err := pg.Tx(ctx, db, func(tx *sqlx.Tx) error {
				return upsertTransfers(ctx, tx, "ethereum", found, time.Now(), 0)
			}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(rows*b.N)/b.Elapsed().Seconds(), "rows/s")
	})
	b.Run("copy", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			run++
			found := batch(fmt.Sprintf("%06d", run))
			b.StartTimer()
			if err := pg.Tx(ctx, db, func(tx *sqlx.Tx) error {
				stmt, err := tx.Prepare(pq.CopyIn("transfers", "id", "network", "asset", "asset_contract", "tx_hash", "tx_key", "idx",
					"from_address", "to_address", "amount", "block_number", "block_hash", "block_time", "state", "flags",
					"first_seen_at", "updated_at", "provisional"))
				if err != nil {
					return err
				}
				now := time.Now()
				for _, f := range found {
					if _, err := stmt.Exec(paywatch.NewSortableID("trf", now), "ethereum", f.Asset.Symbol, f.Asset.Contract, f.TxHash, f.TxKey,
						f.Index, f.From, f.To, f.Amount.String(), int64(f.BlockNumber), f.BlockHash, f.BlockTime, "seen",
						pq.Array([]string{}), now, now, false); err != nil {
						return err
					}
				}
				if _, err := stmt.Exec(); err != nil {
					return err
				}
				return stmt.Close()
			}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(rows*b.N)/b.Elapsed().Seconds(), "rows/s")
	})
}
