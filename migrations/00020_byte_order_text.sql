-- +goose Up
-- paywatch's text columns hold identifiers, hashes, addresses, states and
-- names: compared for equality, and ordered only to walk them in pages.
-- Byte order (the "C" collation) is what every query means; equality is
-- byte for byte under any collation a database can have as its default,
-- so nothing compares differently. A database whose default collation
-- follows a language's rules (en_US.UTF-8, the default of many managed
-- services) made every comparison in their indexes costlier: storing a
-- catch-up's batch of 400 transfers took 1.3–1.5× as long under the C
-- library's en_US.UTF-8 as under "C", 1.2× under ICU's English, and 3–7%
-- longer under C.UTF-8 (BenchmarkStoreCollation). Their indexes are built
-- again, and the tables holding rows analyzed (a column's change drops its
-- statistics).
--
-- Only paywatch's tables are changed (a shop's own tables in the same
-- schema are left as they are), and only their columns of type text or
-- text[] under the database's default collation (not a domain's, not one
-- given a collation of its own); nothing, on a database whose default is
-- "C" already. The tables are locked at once, in one statement, waiting
-- at most 10 s.
-- PostgreSQL refuses to change a column that a trigger's condition or
-- column list reads: the triggers of these tables are dropped and created
-- again as they were (enabled or not, with their comments), around the
-- change, in the migration's transaction. The Down calls the same
-- function with the database's default collation, then drops it.
-- +goose StatementBegin
CREATE FUNCTION paywatch_text_collation(target TEXT) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    tables TEXT[] := ARRAY['amount_slots', 'chain_blocks', 'chain_cursors', 'chain_reorgs', 'derivation_counters',
        'ledger_entries', 'ledger_postings', 'mempool_transfers', 'order_events', 'order_reviews', 'orders',
        'transfers', 'webhook_attempts', 'webhook_outbox'];
    -- The columns to change are those under this collation now.
    source OID := CASE WHEN target = 'C' THEN 100 ELSE 950 END; -- "default", "C"
    name TEXT;
    tbl RECORD;
    rels TEXT[];
    names TEXT[];
    states TEXT[];
    defs TEXT[];
    notes TEXT[];
    held BOOLEAN;
BEGIN
    FOREACH name IN ARRAY tables LOOP
        IF to_regclass(format('%I', name)) IS NULL THEN
            RAISE EXCEPTION 'table % is missing from the schema', name;
        END IF;
    END LOOP;
    IF target = 'C' AND (SELECT d.datcollate IN ('C', 'POSIX') AND coalesce(to_jsonb(d) ->> 'datlocprovider', 'c') = 'c'
            FROM pg_database d WHERE d.datname = current_database()) THEN
        RETURN; -- the database's default is byte order already
    END IF;
    -- While it waits for a lock, every later statement on that table waits
    -- behind it: a long query, or a daemon of the earlier release in the
    -- middle of a pass, would hold the whole shop. Past 10 s the migration
    -- fails, nothing changed, and the next start tries again.
    SET LOCAL lock_timeout = '10s';
    EXECUTE 'LOCK TABLE ' || (SELECT string_agg(format('%I', t), ', ') FROM unnest(tables) AS t) || ' IN ACCESS EXCLUSIVE MODE';
    SELECT array_agg(c.relname ORDER BY c.relname, t.tgname), array_agg(t.tgname ORDER BY c.relname, t.tgname),
        array_agg(t.tgenabled::text ORDER BY c.relname, t.tgname),
        array_agg(pg_get_triggerdef(t.oid) ORDER BY c.relname, t.tgname),
        array_agg(obj_description(t.oid, 'pg_trigger') ORDER BY c.relname, t.tgname)
    INTO rels, names, states, defs, notes
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ANY (tables) AND NOT t.tgisinternal;
    FOR i IN 1 .. coalesce(array_length(names, 1), 0) LOOP
        EXECUTE format('DROP TRIGGER %I ON %I', names[i], rels[i]);
    END LOOP;
    FOR tbl IN
        SELECT c.relname, string_agg(format('ALTER COLUMN %I TYPE %s COLLATE %I', a.attname,
            format_type(a.atttypid, a.atttypmod), target), ', ') AS changes
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ANY (tables) AND c.relkind = 'r'
            AND a.attnum > 0 AND NOT a.attisdropped AND a.atttypid IN ('text'::regtype, 'text[]'::regtype)
            AND a.attcollation = source
        GROUP BY c.relname ORDER BY c.relname
    LOOP
        EXECUTE format('ALTER TABLE %I %s', tbl.relname, tbl.changes);
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(names, 1), 0) LOOP
        EXECUTE defs[i];
        IF states[i] <> 'O' THEN
            EXECUTE format('ALTER TABLE %I %s TRIGGER %I', rels[i],
                CASE states[i] WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA' ELSE 'ENABLE ALWAYS' END, names[i]);
        END IF;
        IF notes[i] IS NOT NULL THEN
            EXECUTE format('COMMENT ON TRIGGER %I ON %I IS %L', names[i], rels[i], notes[i]);
        END IF;
    END LOOP;
    FOREACH name IN ARRAY tables LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I)', name) INTO held;
        IF held THEN -- an empty table is left as it was: never analyzed, on a new database
            EXECUTE format('ANALYZE %I', name);
        END IF;
    END LOOP;
END $$;
-- +goose StatementEnd
SELECT paywatch_text_collation('C');

-- +goose Down
SELECT paywatch_text_collation('default');
DROP FUNCTION paywatch_text_collation(TEXT);
