package migrations_test

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// Every migration's Down runs, over a schema that holds rows, one version
// at a time down to nothing, and leaves a schema that Up brings back to
// the same tables, indexes and functions: a release rolled back with goose
// undoes what it did.
func TestEveryMigrationRollsBackAndForth(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	// Rows in the tables the Downs alter: an order with its slot and event,
	// a transfer paying it, a ledger entry, a webhook event.
	pgtest.Exec(t, db, `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
		pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, earliest_block_time)
		VALUES ('ord_a', 'a', '\x00', 'ethereum', 'USDT', 'c', 10, 10, '0xshop', 0, 'confirming', now(), now() + interval '1 hour',
			now() + interval '1 day', now(), now())`)
	pgtest.Exec(t, db, `INSERT INTO amount_slots (network, asset, address, pay_amount, order_id, held_until)
		VALUES ('ethereum', 'USDT', '0xshop', 10, 'ord_a', now() + interval '1 day')`)
	pgtest.Exec(t, db, `INSERT INTO order_events (order_id, at, type, actor) VALUES ('ord_a', now(), 'created', 'shop')`)
	pgtest.Exec(t, db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address, amount,
		block_number, block_hash, state, order_id, first_seen_at, updated_at)
		VALUES ('trf_a', 'ethereum', 'USDT', 'c', '0xaa', 'k', 0, '0xshop', 10, 5, '0xb5', 'seen', 'ord_a', now(), now())`)
	pgtest.Exec(t, db, `INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at)
		VALUES ('evt_a', 'ord_a', 'order.confirming', now(), now())`)
	_, latest, err := migrations.Version(ctx, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	// The schema at each version, as Up leaves it, one version at a time on
	// an empty database.
	fresh, err := sql.Open("postgres", pgtest.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	at := map[int64][]string{0: schemaObjects(t, sqlx.NewDb(fresh, "postgres"))}
	for v := int64(1); v <= latest; v++ {
		if err := migrations.UpTo(ctx, fresh, v); err != nil {
			t.Fatal(err)
		}
		at[v] = schemaObjects(t, sqlx.NewDb(fresh, "postgres"))
	}
	before := schemaObjects(t, db)
	if !slices.Equal(before, at[latest]) {
		t.Fatalf("the schema Up made at once differs from the one made a version at a time")
	}
	for v := latest - 1; v >= 0; v-- {
		if err := migrations.DownTo(ctx, db.DB, v); err != nil {
			t.Fatalf("down from %d: %v", v+1, err)
		}
		if got := schemaObjects(t, db); !slices.Equal(got, at[v]) {
			t.Fatalf("down from %d to %d leaves a schema other than version %d's:\n%s", v+1, v, v, diff(got, at[v]))
		}
	}
	applied, err := migrations.Up(ctx, db.DB)
	if err != nil || int64(len(applied)) != latest {
		t.Fatalf("up again applied %v (%v), want all %d", applied, err, latest)
	}
	if after := schemaObjects(t, db); !slices.Equal(before, after) {
		t.Fatalf("up, down and up again: the schema differs\nbefore: %v\nafter:  %v", before, after)
	}
}

// diff lists what only got, and only want, holds.
func diff(got, want []string) string {
	var out []string
	for _, g := range got {
		if !slices.Contains(want, g) {
			out = append(out, "+ "+g)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			out = append(out, "- "+w)
		}
	}
	return strings.Join(out, "\n")
}

// schemaObjects lists the schema's tables (with their columns' types and
// collations), indexes, constraints, triggers and functions, with their
// definitions, but goose's own.
func schemaObjects(t *testing.T, db interface {
	Select(dest any, query string, args ...any) error
}) []string {
	t.Helper()
	var objects []string
	if err := db.Select(&objects, `
		SELECT 'table ' || c.relname || ': ' || string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
			|| COALESCE(' collate ' || NULLIF(coll.collname, 'default'), '')
			|| CASE WHEN a.attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY a.attnum)
		FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		LEFT JOIN pg_collation coll ON coll.oid = a.attcollation
		WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' AND c.relname <> 'goose_db_version'
		GROUP BY c.relname
		UNION ALL
		SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename <> 'goose_db_version'
		UNION ALL
		SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ': ' || pg_get_constraintdef(oid)
		FROM pg_constraint WHERE connamespace = current_schema()::regnamespace AND conrelid <> 0
			AND conrelid::regclass::text <> 'goose_db_version'
		UNION ALL
		SELECT 'trigger ' || pg_get_triggerdef(oid) FROM pg_trigger
		WHERE NOT tgisinternal AND tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = current_schema()::regnamespace)
		UNION ALL
		SELECT 'function ' || pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace
		ORDER BY 1`); err != nil {
		t.Fatal(err)
	}
	return objects
}
