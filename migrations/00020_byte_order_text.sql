-- +goose Up
-- paywatch's text columns hold identifiers, hashes, addresses, states and
-- names: compared for equality, and ordered only to walk them in pages.
-- Byte order (the "C" collation) is what every query means; equality is
-- byte for byte under any deterministic collation, so nothing compares
-- differently. A database whose default collation follows a language's
-- rules (en_US.UTF-8, the default of many managed services) made every
-- comparison in their indexes costlier: storing a catch-up's batch of 400
-- transfers took 1.3–1.5× as long under the C library's en_US.UTF-8 as
-- under "C", 1.2× under ICU's English, and 3–7% longer under C.UTF-8
-- (BenchmarkStoreCollation). Their indexes are built again.
--
-- Only paywatch's tables are changed (a shop's own tables in the same
-- schema are left as they are). PostgreSQL refuses to change a column that
-- a trigger's condition or column list reads: the triggers of these tables
-- are dropped and created again, as they were, around the change, in the
-- migration's transaction.
-- +goose StatementBegin
DO $$
DECLARE
    trg RECORD;
    tbl RECORD;
    defs TEXT[] := '{}';
    def TEXT;
    tables TEXT[] := ARRAY['amount_slots', 'chain_blocks', 'chain_cursors', 'chain_reorgs', 'derivation_counters',
        'ledger_entries', 'ledger_postings', 'mempool_transfers', 'order_events', 'order_reviews', 'orders',
        'transfers', 'webhook_attempts', 'webhook_outbox'];
BEGIN
    FOR trg IN
        SELECT t.oid, t.tgname, c.relname FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ANY (tables) AND NOT t.tgisinternal
        ORDER BY c.relname, t.tgname
    LOOP
        defs := defs || pg_get_triggerdef(trg.oid);
        EXECUTE format('DROP TRIGGER %I ON %I', trg.tgname, trg.relname);
    END LOOP;
    FOR tbl IN
        SELECT c.table_name, string_agg(format('ALTER COLUMN %I TYPE text COLLATE "C"', c.column_name), ', ') AS changes
        FROM information_schema.columns c
        JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name
        WHERE c.table_schema = current_schema() AND c.table_name = ANY (tables) AND t.table_type = 'BASE TABLE'
            AND c.data_type = 'text'
        GROUP BY c.table_name ORDER BY c.table_name
    LOOP
        EXECUTE format('ALTER TABLE %I %s', tbl.table_name, tbl.changes);
    END LOOP;
    FOREACH def IN ARRAY defs LOOP
        EXECUTE def;
    END LOOP;
END $$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
DECLARE
    trg RECORD;
    tbl RECORD;
    defs TEXT[] := '{}';
    def TEXT;
    tables TEXT[] := ARRAY['amount_slots', 'chain_blocks', 'chain_cursors', 'chain_reorgs', 'derivation_counters',
        'ledger_entries', 'ledger_postings', 'mempool_transfers', 'order_events', 'order_reviews', 'orders',
        'transfers', 'webhook_attempts', 'webhook_outbox'];
BEGIN
    FOR trg IN
        SELECT t.oid, t.tgname, c.relname FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ANY (tables) AND NOT t.tgisinternal
        ORDER BY c.relname, t.tgname
    LOOP
        defs := defs || pg_get_triggerdef(trg.oid);
        EXECUTE format('DROP TRIGGER %I ON %I', trg.tgname, trg.relname);
    END LOOP;
    FOR tbl IN
        SELECT c.table_name, string_agg(format('ALTER COLUMN %I TYPE text COLLATE "default"', c.column_name), ', ') AS changes
        FROM information_schema.columns c
        JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name
        WHERE c.table_schema = current_schema() AND c.table_name = ANY (tables) AND t.table_type = 'BASE TABLE'
            AND c.data_type = 'text'
        GROUP BY c.table_name ORDER BY c.table_name
    LOOP
        EXECUTE format('ALTER TABLE %I %s', tbl.table_name, tbl.changes);
    END LOOP;
    FOREACH def IN ARRAY defs LOOP
        EXECUTE def;
    END LOOP;
END $$;
-- +goose StatementEnd
