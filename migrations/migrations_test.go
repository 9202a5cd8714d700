package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pressly/goose/v3/lock"

	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

func TestUpIsIdempotent(t *testing.T) {
	db := pgtest.New(t) // applies everything once
	ctx := context.Background()
	applied, err := migrations.Up(ctx, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 0 {
		t.Fatalf("second Up applied %v, want nothing", applied)
	}
	current, latest, err := migrations.Version(ctx, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	// Every SQL file of this directory is applied: the latest version is
	// the number of the last of them (they are numbered 1, 2, 3, …).
	sqlFiles, err := filepath.Glob("*.sql")
	if err != nil || len(sqlFiles) == 0 {
		t.Fatalf("no migrations found (%v)", err)
	}
	if current != latest || latest != int64(len(sqlFiles)) {
		t.Fatalf("version %d of %d, with %d migration files", current, latest, len(sqlFiles))
	}
	for _, table := range []string{"orders", "order_events", "amount_slots", "derivation_counters",
		"webhook_outbox", "transfers", "chain_cursors"} {
		var n int
		if err := db.Get(&n, "SELECT count(*) FROM "+table); err != nil {
			t.Errorf("table %s: %v", table, err)
		}
	}
}

func TestConcurrentUp(t *testing.T) {
	u := pgtest.NewURL(t)
	errs := make(chan error, 3)
	for i := 0; i < 3; i++ {
		go func() {
			db, err := openDB(u)
			if err != nil {
				errs <- err
				return
			}
			defer db.Close()
			_, err = migrations.Up(context.Background(), db)
			errs <- err
		}()
	}
	for i := 0; i < 3; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent Up: %v", err)
		}
	}
}

// Upgrading a database that holds webhook events written before delivery
// existed (before migration 7): those not delivered are marked failed, "not
// sent on upgrade" (they would carry today's order long after the fact),
// those delivered stay delivered; nothing else changes.
func TestUpgradeMarksOldUndeliveredWebhooksFailed(t *testing.T) {
	ctx := context.Background()
	db := migratedTo(t, 6)
	for _, q := range []string{
		`INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount, pay_address,
			status, created_at, expires_at, monitor_until, updated_at, earliest_block_time)
			VALUES ('ord_old', 'old-1', '\x00', 'ethereum', 'USDT', 'c', 1, 1, '0xshop', 'settled', now(), now() + interval '1 hour',
			now() + interval '2 hours', now(), now())`,
		`INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at, delivered_at)
			VALUES ('evt_sent', 'ord_old', 'order.confirming', now(), now(), now()),
			       ('evt_unsent', 'ord_old', 'order.settled', now(), now(), NULL)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(`SELECT id, status, coalesce(last_error, '') FROM webhook_outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string][2]string{}
	for rows.Next() {
		var id, status, lastErr string
		if err := rows.Scan(&id, &status, &lastErr); err != nil {
			t.Fatal(err)
		}
		got[id] = [2]string{status, lastErr}
	}
	if got["evt_sent"][0] != "delivered" || got["evt_unsent"][0] != "failed" || !strings.Contains(got["evt_unsent"][1], "not sent on upgrade") {
		t.Fatalf("after the upgrade: %v", got)
	}
}

// An upgrade marks the orders that already have a transfer or a mempool
// sighting (has_transfers, which a GET reads instead of probing both
// tables), and only those.
func TestUpgradeMarksOrdersThatHaveTransfers(t *testing.T) {
	ctx := context.Background()
	db := migratedTo(t, 9)
	for _, q := range []string{
		`INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount, pay_address,
			status, created_at, expires_at, monitor_until, updated_at, earliest_block_time)
			SELECT id, id, '\x00', 'bitcoin', 'BTC', '', 1, 1, 'bc1q' || id, 'awaiting_payment', now(), now() + interval '1 hour',
			now() + interval '2 hours', now(), now()
			FROM unnest(ARRAY['ord_paid', 'ord_seen', 'ord_bare']) AS id`,
		`INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address, amount, block_number,
			block_hash, state, order_id, first_seen_at, updated_at)
			VALUES ('trf_1', 'bitcoin', 'BTC', '', 'aa', 'vout:0', 0, 'bc1qord_paid', 1, 10, 'bb', 'seen', 'ord_paid', now(), now()),
			       ('trf_2', 'bitcoin', 'BTC', '', 'ab', 'vout:0', 0, 'bc1qord_bare', 1, 10, 'bb', 'seen', NULL, now(), now())`,
		`INSERT INTO mempool_transfers (id, network, asset, tx_hash, tx_key, idx, to_address, amount, order_id, first_seen_at, updated_at)
			VALUES ('mtx_1', 'bitcoin', 'BTC', 'ac', 'vout:0', 0, 'bc1qord_seen', 1, 'ord_seen', now(), now())`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	rows, err := db.Query(`SELECT id, has_transfers FROM orders`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var has bool
		if err := rows.Scan(&id, &has); err != nil {
			t.Fatal(err)
		}
		got[id] = has
	}
	if want := map[string]bool{"ord_paid": true, "ord_seen": true, "ord_bare": false}; !maps.Equal(got, want) {
		t.Fatalf("after the upgrade, has_transfers is %v, want %v", got, want)
	}
}

// migratedTo returns a fresh database migrated up to version, closed when
// t ends.
func migratedTo(t *testing.T, version int64) *sql.DB { return migratedWith(t, version, "") }

// migratedWith is migratedTo with the database created with options
// (CREATE DATABASE's: a template, a locale).
func migratedWith(t *testing.T, version int64, options string) *sql.DB {
	t.Helper()
	dbURL, name := pgtest.UnusedURL(t)
	admin, err := sql.Open("postgres", pgtest.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec("CREATE DATABASE " + name + " " + options); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("postgres", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := migrations.UpTo(context.Background(), db, version); err != nil {
		t.Fatal(err)
	}
	return db
}

// The schema's version (what /readyz checks) is read without the migration
// lock: while another process holds it (a new release migrating), a daemon
// asking at once is answered at once.
func TestVersionIsReadWhileAnotherProcessMigrates(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	holder, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	var took bool
	if err := holder.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, lock.DefaultLockID).Scan(&took); err != nil || !took {
		t.Fatalf("take the migration lock: %v %v", took, err)
	}
	start := time.Now()
	versionCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	current, latest, err := migrations.Version(versionCtx, db.DB)
	if err != nil || current != latest || current == 0 {
		t.Fatalf("version while the lock is held: %d of %d (%v)", current, latest, err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Fatalf("the version took %s to read while the lock was held", took)
	}
}

// A release started on a schema a later release migrated refuses it: it
// would misread what the later release writes.
func TestUpRefusesASchemaNewerThanThisRelease(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	_, latest, err := migrations.Version(ctx, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db, `INSERT INTO goose_db_version (version_id, is_applied) VALUES ($1, true)`, latest+1)
	_, err = migrations.Up(ctx, db.DB)
	if !errors.Is(err, migrations.ErrSchemaNewer) || !strings.Contains(err.Error(), fmt.Sprintf("at version %d", latest+1)) {
		t.Fatalf("Up on a schema at version %d (this release knows %d): %v, want ErrSchemaNewer naming both", latest+1, latest, err)
	}
}

// Every text column of paywatch's tables compares in byte order (the "C"
// collation), whatever the database's default (here ICU's English, where
// "a" sorts before "B"); the triggers the change had to drop and create
// again are as they were (enabled or not, with their comments); a shop's
// own table in the same schema, and its own columns of a domain's type or
// with a collation of their own on paywatch's tables, are left alone.
func TestTextColumnsCompareInByteOrder(t *testing.T) {
	db := migratedWith(t, 19, "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'")
	x := sqlx.NewDb(db, "postgres")
	var linguistic bool
	if err := x.Get(&linguistic, `SELECT 'a' < 'B'`); err != nil || !linguistic {
		t.Fatalf("the database's default collation orders 'a' after 'B' (%v): the test needs one that does not", err)
	}
	ctx := context.Background()
	triggers := func() []string {
		var defs []string
		if err := x.Select(&defs, `SELECT pg_get_triggerdef(oid) || ' ' || tgenabled::text || ' ' || coalesce(obj_description(oid, 'pg_trigger'), '')
			FROM pg_trigger
			WHERE NOT tgisinternal AND tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = current_schema()::regnamespace)
			ORDER BY 1`); err != nil {
			t.Fatal(err)
		}
		return defs
	}
	// One trigger disabled (as an operator might, for a bulk load) and one
	// always enabled: they stay so. A shop's own columns on paywatch's
	// table, of a domain's type and with a collation of their own, stay
	// as they are; statistics survive.
	for _, q := range []string{
		`ALTER TABLE orders DISABLE TRIGGER orders_notify`,
		`ALTER TABLE ledger_postings ENABLE ALWAYS TRIGGER ledger_postings_balanced`,
		`CREATE DOMAIN shop_email AS text CHECK (VALUE LIKE '%@%')`,
		`ALTER TABLE orders ADD COLUMN shop_email shop_email, ADD COLUMN shop_name text COLLATE "en-US-x-icu"`,
		`INSERT INTO chain_blocks (network, block_number, block_hash) VALUES ('ethereum', 1, '0xb1'), ('ethereum', 2, '0xb2')`,
		`ANALYZE chain_blocks`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(q, err)
		}
	}
	before := triggers()
	// A shop's own table beside paywatch's, with a view over it: left as
	// it is.
	if _, err := db.Exec(`CREATE TABLE shop_notes (title text); CREATE VIEW shop_titles AS SELECT title FROM shop_notes`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	var shops []string
	if err := x.Select(&shops, `SELECT table_name || '.' || column_name || ' ' || COALESCE(collation_name, 'default')
		FROM information_schema.columns WHERE table_schema = current_schema() AND table_name LIKE 'shop_%' ORDER BY 1`); err != nil {
		t.Fatal(err)
	}
	if want := []string{"shop_notes.title default", "shop_titles.title default"}; !slices.Equal(shops, want) {
		t.Fatalf("the shop's table and view became %v, want %v", shops, want)
	}
	var others []string
	if err := x.Select(&others, `SELECT c.relname || '.' || a.attname || ' ' || coll.collname
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_collation coll ON coll.oid = a.attcollation
		WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
			AND a.atttypid IN ('text'::regtype, 'text[]'::regtype) AND c.relname NOT IN ('goose_db_version', 'shop_notes')
			AND a.attname NOT LIKE 'shop_%' AND coll.collname <> 'C'`); err != nil {
		t.Fatal(err)
	}
	if len(others) > 0 {
		t.Fatalf("text columns not in byte order: %v", others)
	}
	var shopColumns []string
	if err := x.Select(&shopColumns, `SELECT column_name || ' ' || COALESCE(domain_name, data_type) || ' ' || COALESCE(collation_name, 'default')
		FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'orders' AND column_name LIKE 'shop_%'
		ORDER BY 1`); err != nil {
		t.Fatal(err)
	}
	if want := []string{"shop_email shop_email default", "shop_name text en-US-x-icu"}; !slices.Equal(shopColumns, want) {
		t.Fatalf("the shop's columns on orders became %v, want %v", shopColumns, want)
	}
	var stats int
	if err := x.Get(&stats, `SELECT count(*) FROM pg_stats WHERE schemaname = current_schema() AND tablename = 'chain_blocks'
		AND attname IN ('network', 'block_hash')`); err != nil || stats != 2 {
		t.Fatalf("%d of chain_blocks' text columns have statistics (%v), want 2", stats, err)
	}
	if after := triggers(); !slices.Equal(before, after) || len(after) < 10 {
		t.Fatalf("the triggers changed:\nbefore: %v\nafter:  %v", before, after)
	}
	var ids []string
	if _, err := db.Exec(`INSERT INTO order_reviews (order_id, at) VALUES ('ord_a', now()), ('ord_B', now()), ('ord_0', now())`); err != nil {
		t.Fatal(err)
	}
	if err := x.Select(&ids, `SELECT order_id FROM order_reviews ORDER BY order_id`); err != nil {
		t.Fatal(err)
	}
	if want := []string{"ord_0", "ord_B", "ord_a"}; !slices.Equal(ids, want) {
		t.Fatalf("order ids sort as %v, want %v", ids, want)
	}
}

// A view of a shop's own over paywatch's tables stops migration 00020
// with PostgreSQL's reason and nothing changed (README "Upgrading past
// migration 00020").
func TestByteOrderMigrationStopsAtAViewOverItsTables(t *testing.T) {
	db := migratedTo(t, 19)
	if _, err := db.Exec(`CREATE VIEW shop_revenue AS SELECT id, status FROM orders`); err != nil {
		t.Fatal(err)
	}
	_, err := migrations.Up(context.Background(), db)
	if err == nil || !strings.Contains(err.Error(), "cannot alter type of a column used by a view or rule") {
		t.Fatalf("migrating with a view over orders: %v", err)
	}
	x := sqlx.NewDb(db, "postgres")
	var changed int
	if err := x.Get(&changed, `SELECT count(*) FROM information_schema.columns
		WHERE table_schema = current_schema() AND collation_name = 'C'`); err != nil || changed != 0 {
		t.Fatalf("%d columns changed (%v), want none", changed, err)
	}
	if current, _, err := migrations.Version(context.Background(), db); err != nil || current != 19 {
		t.Fatalf("schema at version %d (%v), want 19", current, err)
	}
}

// On a database whose default collation is byte order already, migration
// 00020 changes nothing: no index is built again.
func TestByteOrderMigrationLeavesACDatabaseAlone(t *testing.T) {
	db := migratedWith(t, 19, "TEMPLATE template0 LOCALE 'C'")
	ctx := context.Background()
	x := sqlx.NewDb(db, "postgres")
	files := func() []string {
		var f []string
		if err := x.Select(&f, `SELECT relname || ' ' || relfilenode FROM pg_class
			WHERE relnamespace = current_schema()::regnamespace AND relkind = 'i' ORDER BY 1`); err != nil {
			t.Fatal(err)
		}
		return f
	}
	before := files()
	if err := migrations.UpTo(ctx, db, 20); err != nil {
		t.Fatal(err)
	}
	if after := files(); !slices.Equal(before, after) {
		t.Fatalf("indexes were built again:\nbefore: %v\nafter:  %v", before, after)
	}
}

// Migrations 00020 and 00021 wait at most 10 s for their tables' locks
// (every later statement on a table waits behind them meanwhile), then
// fail with nothing changed; the next try, once the table is free, goes
// through. Each is held back by a long query on a table it changes.
func TestMigrationsWaitForLocksAtMost10s(t *testing.T) {
	for _, m := range []struct {
		version int64 // the migration's
		table   string
	}{{20, "orders"}, {21, "order_events"}} {
		t.Run(fmt.Sprintf("%05d", m.version), func(t *testing.T) {
			t.Parallel()
			before := m.version - 1
			db := migratedTo(t, before)
			ctx := context.Background()
			holder, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback()
			if _, err := holder.Exec(`SELECT count(*) FROM ` + m.table); err != nil { // a long query's lock
				t.Fatal(err)
			}
			start := time.Now()
			waiting, cancel := context.WithTimeout(ctx, 30*time.Second) // without the limit, it would wait for good
			err = migrations.UpTo(waiting, db, m.version)
			cancel()
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), "lock timeout") {
				t.Fatalf("migrating beside a held lock: %v", err)
			}
			if took < 9*time.Second || took > 30*time.Second {
				t.Fatalf("gave up after %v, want about 10 s", took)
			}
			if current, _, err := migrations.Version(ctx, db); err != nil || current != before {
				t.Fatalf("schema at version %d (%v), want %d", current, err, before)
			}
			if err := holder.Rollback(); err != nil {
				t.Fatal(err)
			}
			if _, err := migrations.Up(ctx, db); err != nil {
				t.Fatalf("once the lock is gone: %v", err)
			}
		})
	}
}

// Migration 00021 leaves each timeline event, review and webhook event one
// index entry fewer to write, and every read those indexes served is
// served by what stays: a timeline (by order, in the order written) through
// the timeline's primary key, the reviews queued (by order) through theirs,
// due webhook events and the backlog through the undelivered events'
// index. What was there before is kept as it was.
func TestTimelineAndOutboxIndexesServeEveryRead(t *testing.T) {
	ctx := context.Background()
	db := migratedTo(t, 20)
	x := sqlx.NewDb(db, "postgres")
	now := time.Now().UTC().Truncate(time.Microsecond)
	for _, q := range []string{
		`INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
			pay_address, unique_k, status, created_at, expires_at, monitor_until, updated_at, created_height, earliest_block_time)
		SELECT 'ord_' || g, 'ext-' || g, '\x00', 'ethereum', 'USDT', 'c', 1000000 + g, 1000000 + g,
			'0xshop', g, 'awaiting_payment', $1, $1::timestamptz + interval '1 hour', $1::timestamptz + interval '25 hours', $1, 0, $1
		FROM generate_series(1, 3) g`,
		`INSERT INTO order_events (order_id, at, type, actor)
		SELECT 'ord_' || (g % 3 + 1), $1, 'note_' || g, 'test' FROM generate_series(1, 30) g`,
		`INSERT INTO order_reviews (order_id, at) SELECT 'ord_' || (g % 3 + 1), $1 FROM generate_series(1, 9) g`,
		`INSERT INTO webhook_outbox (id, order_id, type, created_at, next_attempt_at, body, status)
		SELECT 'evt_' || g, 'ord_' || (g % 3 + 1), 'order.settled', $1, $1::timestamptz - g * interval '1 second', 'x',
			(ARRAY['pending', 'failed', 'refused', 'delivered'])[g % 4 + 1] FROM generate_series(1, 40) g`,
	} {
		if _, err := x.Exec(q, now); err != nil {
			t.Fatal(err)
		}
	}
	type ev struct {
		ID   int64  `db:"id"`
		Type string `db:"type"`
	}
	timeline := func() []ev {
		var got []ev
		if err := x.Select(&got, `SELECT id, type FROM order_events WHERE order_id = 'ord_2' ORDER BY id`); err != nil {
			t.Fatal(err)
		}
		return got
	}
	before := timeline()
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	if after := timeline(); len(before) != 10 || !slices.Equal(before, after) {
		t.Fatalf("timeline after the migration %v, before %v", after, before)
	}
	var reviews int
	if err := x.Get(&reviews, `SELECT count(*) FROM order_reviews`); err != nil || reviews != 9 {
		t.Fatalf("%d reviews queued after the migration (%v), want 9", reviews, err)
	}
	indexes := func(table string) []string {
		var got []string
		if err := x.Select(&got, `SELECT indexname || ': ' || regexp_replace(indexdef, '.* USING ', '') FROM pg_indexes
			WHERE schemaname = current_schema() AND tablename = $1 ORDER BY 1`, table); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got, want := indexes("order_events"), []string{
		"order_events_pkey: btree (order_id, id)",
		"order_events_unmatched_idx: btree (order_id) WHERE (type = 'transfer_unmatched'::text)",
	}; !slices.Equal(got, want) {
		t.Fatalf("order_events indexes %q, want %q", got, want)
	}
	if got, want := indexes("order_reviews"), []string{"order_reviews_pkey: btree (order_id, id)"}; !slices.Equal(got, want) {
		t.Fatalf("order_reviews indexes %q, want %q", got, want)
	}
	if got := indexes("webhook_outbox"); !slices.Contains(got,
		"webhook_outbox_undelivered_idx: btree (status, next_attempt_at) WHERE (status <> 'delivered'::text)") || len(got) != 5 {
		t.Fatalf("webhook_outbox indexes %q", got)
	}
	// Each read, with the planner told to use an index where one serves
	// (these tables are small), goes through the index that stays.
	tx, err := x.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(`SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	for _, read := range []struct{ sql, index string }{
		{`SELECT id, type FROM order_events WHERE order_id = 'ord_2' ORDER BY id`, "order_events_pkey"},
		{`SELECT DISTINCT order_id FROM order_reviews WHERE order_id > 'ord_1' ORDER BY order_id LIMIT 2`, "order_reviews_pkey"},
		{`DELETE FROM order_reviews WHERE order_id = ANY ('{ord_2,ord_3}')`, "order_reviews_pkey"},
		{`SELECT order_id FROM webhook_outbox WHERE status = 'pending' AND next_attempt_at <= now() ORDER BY next_attempt_at`,
			"webhook_outbox_undelivered_idx"},
		{`SELECT count(*) FILTER (WHERE status = 'failed') FROM webhook_outbox WHERE status <> 'delivered'`,
			"webhook_outbox_undelivered_idx"},
	} {
		_, plan := pgtest.Explain(t, tx, read.sql)
		if !strings.Contains(plan, read.index) || strings.Contains(plan, "Sort") {
			t.Fatalf("%s\nnot read in order through %s:\n%s", read.sql, read.index, plan)
		}
	}
	// The sequence goes on: the next event is the last of its timeline.
	var id int64
	if err := tx.Get(&id, `INSERT INTO order_events (order_id, at, type, actor) VALUES ('ord_2', now(), 'later', 'test') RETURNING id`); err != nil {
		t.Fatal(err)
	}
	if last := before[len(before)-1].ID; id <= last {
		t.Fatalf("new event id %d, the timeline's last was %d", id, last)
	}
}
