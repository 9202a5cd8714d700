-- +goose Up
-- A pass that settles thousands of orders posts thousands of entries, two
-- postings each, in one statement. The foreign key from a posting to its
-- entry was checked row by row (one lookup per posting, about half of what
-- posting cost); the statement-level trigger that already checks that every
-- entry balances now also checks, over all the rows a statement added and in
-- one set-based query, that each posting's entry exists. Entries are
-- append-only (never deleted), so an entry that existed when its postings
-- were inserted always does.
ALTER TABLE ledger_postings DROP CONSTRAINT ledger_postings_entry_id_fkey;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger_check_balanced() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bad RECORD;
BEGIN
    SELECT p.entry_id INTO bad
    FROM (SELECT DISTINCT entry_id FROM new_postings) p
    WHERE NOT EXISTS (SELECT 1 FROM ledger_entries e WHERE e.id = p.entry_id) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'ledger posting refers to entry %, which does not exist', bad.entry_id
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    SELECT entry_id, network, asset, sum(amount) AS total INTO bad
    FROM new_postings
    GROUP BY entry_id, network, asset HAVING sum(amount) <> 0 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'ledger entry % does not balance: % % sums to %', bad.entry_id, bad.network, bad.asset, bad.total
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;
-- +goose StatementEnd

-- The check names ledger_entries: it must find the ledger's own table,
-- never one a session puts first on its search_path (a temporary table of
-- that name would otherwise vouch for entries that do not exist).
-- +goose StatementBegin
DO $$ BEGIN
    EXECUTE format('ALTER FUNCTION ledger_check_balanced() SET search_path = %I, pg_catalog, pg_temp', current_schema());
END $$;
-- +goose StatementEnd

-- Append-only covers TRUNCATE too: emptying the entries would leave their
-- postings to whatever entries take their ids next.
CREATE TRIGGER ledger_entries_no_truncate BEFORE TRUNCATE ON ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_postings_no_truncate BEFORE TRUNCATE ON ledger_postings
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

-- +goose Down
DROP TRIGGER ledger_postings_no_truncate ON ledger_postings;
DROP TRIGGER ledger_entries_no_truncate ON ledger_entries;
ALTER FUNCTION ledger_check_balanced() RESET search_path;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger_check_balanced() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bad RECORD;
BEGIN
    SELECT entry_id, network, asset, sum(amount) AS total INTO bad
    FROM new_postings
    GROUP BY entry_id, network, asset HAVING sum(amount) <> 0 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'ledger entry % does not balance: % % sums to %', bad.entry_id, bad.network, bad.asset, bad.total
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;
-- +goose StatementEnd
ALTER TABLE ledger_postings ADD CONSTRAINT ledger_postings_entry_id_fkey FOREIGN KEY (entry_id) REFERENCES ledger_entries (id);
