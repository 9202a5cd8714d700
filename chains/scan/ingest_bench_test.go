package scan

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/big"
	"slices"
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

// BenchmarkStoreCollation stores batches of 400 transfers (a catch-up
// range's) as the scanner does, taking turns between copies of the
// transfers table (with its indexes) whose text columns compare under
// different collations: what a database's default collation costs the
// scanner, which compares identifiers, hashes and addresses byte by byte
// whatever the collation. "C" is how paywatch creates its database;
// "default" is this server's default; en-US-x-icu is ICU's English and
// en_US.utf8 the C library's, each measured where the server has it.
// <collation>-ms/batch is the median time of a batch under it. Run:
//
//	go test -run '^$' -bench BenchmarkStoreCollation -benchtime 60x ./chains/scan/
func BenchmarkStoreCollation(b *testing.B) {
	db := pgtest.New(b)
	collations := []string{"default", "C"}
	for _, c := range []struct{ name, create string }{
		{"en-US-x-icu", ""},
		{"en_US.utf8", `CREATE COLLATION "en_US.utf8" (provider = libc, locale = 'en_US.utf8')`},
	} {
		var known bool
		if err := db.Get(&known, `SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = $1)`, c.name); err != nil {
			b.Fatal(err)
		}
		if !known && c.create != "" {
			// The collation is not imported, but the machine may have the
			// locale.
			_, err := db.Exec(c.create)
			known = err == nil
		}
		if known {
			collations = append(collations, c.name)
		}
	}
	var columns []string
	if err := db.Select(&columns, `SELECT column_name FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = 'transfers' AND data_type = 'text'`); err != nil {
		b.Fatal(err)
	}
	for i, c := range collations {
		schema := fmt.Sprintf("collation_%d", i)
		pgtest.Exec(b, db, `CREATE SCHEMA `+schema+`; CREATE TABLE `+schema+`.transfers (LIKE transfers INCLUDING ALL)`)
		for _, col := range columns {
			pgtest.Exec(b, db, `ALTER TABLE `+schema+`.transfers ALTER COLUMN `+pq.QuoteIdentifier(col)+` TYPE text COLLATE `+pq.QuoteIdentifier(c))
		}
	}
	asset := &paywatch.Asset{Network: "ethereum", Symbol: "USDT", Contract: "0xdAC17F958D2ee523a2206206994597C13D831ec7", Decimals: 6}
	const rows = 400
	made := 0
	batch := func() []Found {
		found := make([]Found, rows)
		for i := range found {
			made++
			// Hashes and recipients scattered as real ones are.
			h := sha256.Sum256(binary.BigEndian.AppendUint64(nil, uint64(made)))
			found[i] = Found{Asset: asset, TxHash: "0x" + hex.EncodeToString(h[:]), TxKey: "log:0", Index: int64(i % 50),
				From: "0x9999999999999999999999999999999999999999", To: "0x" + hex.EncodeToString(h[12:]),
				Amount: big.NewInt(int64(1_000_000 + i)), BlockNumber: uint64(made / 5), BlockHash: fmt.Sprintf("0xb%d", made/5),
				BlockTime: time.Unix(1_800_000_000, 0), Flags: []string{FlagBalancePending}}
		}
		return found
	}
	ctx := context.Background()
	took := make([][]float64, len(collations))
	for b.Loop() {
		for i := range collations {
			found := batch()
			start := time.Now()
			if err := pg.Tx(ctx, db, func(tx *sqlx.Tx) error {
				if _, err := tx.ExecContext(ctx, fmt.Sprintf(`SET LOCAL search_path = collation_%d, public`, i)); err != nil {
					return err
				}
				return upsertTransfers(ctx, tx, "ethereum", found, time.Now(), 0)
			}); err != nil {
				b.Fatal(err)
			}
			took[i] = append(took[i], time.Since(start).Seconds()*1000)
		}
	}
	for i, c := range collations {
		slices.Sort(took[i])
		b.ReportMetric(took[i][len(took[i])/2], c+"-ms/batch")
	}
}
