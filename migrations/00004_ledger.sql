-- +goose Up
-- The double-entry ledger, block times for lateness, and what the
-- reconciler needs.

ALTER TABLE transfers ADD COLUMN block_time TIMESTAMPTZ;
-- The transfer's live ledger entries, so that a pass finds what to post
-- through small partial indexes instead of scanning every transfer;
-- ledger_dirty is set by the scanner when a reorg orphans or moves it.
ALTER TABLE transfers ADD COLUMN receipt_entry BIGINT;
ALTER TABLE transfers ADD COLUMN attribution_entry BIGINT;
ALTER TABLE transfers ADD COLUMN ledger_dirty BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX transfers_receipt_todo_idx ON transfers (id) WHERE state = 'confirmed' AND receipt_entry IS NULL;
CREATE INDEX transfers_attribution_todo_idx ON transfers (id)
    WHERE state = 'confirmed' AND order_id IS NOT NULL AND attribution_entry IS NULL;
CREATE INDEX transfers_ledger_dirty_idx ON transfers (id) WHERE ledger_dirty;

CREATE TABLE ledger_entries (
    id   BIGSERIAL PRIMARY KEY,
    at   TIMESTAMPTZ NOT NULL,
    -- receipt, attribution, settlement, refund, release, reversal
    kind TEXT NOT NULL,
    -- What the entry is about; (kind, ref) makes posting idempotent.
    ref  TEXT NOT NULL,
    -- The entry this one reverses, for reversals.
    reverses BIGINT REFERENCES ledger_entries (id),
    -- What it concerns, for reversals and the dossier's view.
    transfer_id TEXT,
    order_id    TEXT,
    memo TEXT,
    CONSTRAINT ledger_entries_kind_ref_key UNIQUE (kind, ref)
);
CREATE UNIQUE INDEX ledger_entries_reverses_key ON ledger_entries (reverses) WHERE reverses IS NOT NULL;
CREATE INDEX ledger_entries_transfer_idx ON ledger_entries (transfer_id) WHERE transfer_id IS NOT NULL;
CREATE INDEX ledger_entries_order_idx ON ledger_entries (order_id, kind) WHERE order_id IS NOT NULL;

-- Orders the reconciler still looks at.
CREATE INDEX orders_open_idx ON orders (id)
    WHERE status IN ('awaiting_payment', 'confirming', 'expired', 'disputed');
CREATE INDEX orders_per_order_address_idx ON orders (network, pay_address) WHERE unique_k IS NULL;
CREATE INDEX transfers_orphaned_idx ON transfers (order_id) WHERE state = 'orphaned' AND order_id IS NOT NULL;
CREATE INDEX transfers_unmatched_recent_idx ON transfers (network, to_address) WHERE order_id IS NULL AND state <> 'orphaned';

CREATE TABLE ledger_postings (
    entry_id BIGINT NOT NULL REFERENCES ledger_entries (id),
    account  TEXT NOT NULL,
    network  TEXT NOT NULL,
    asset    TEXT NOT NULL,
    -- Signed base units: debits positive, credits negative.
    amount   NUMERIC(78,0) NOT NULL CHECK (amount <> 0)
);
CREATE INDEX ledger_postings_entry_idx ON ledger_postings (entry_id);
CREATE INDEX ledger_postings_account_idx ON ledger_postings (account text_pattern_ops, network, asset);

-- +goose StatementBegin
-- Every entry's postings sum to zero per asset. Checked once per INSERT
-- statement over the rows it added: the postings an INSERT adds to an entry
-- must balance by themselves, so every entry balances whatever the number of
-- statements (and all of an entry's postings go in one statement).
CREATE FUNCTION ledger_check_balanced() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER ledger_postings_balanced
    AFTER INSERT ON ledger_postings REFERENCING NEW TABLE AS new_postings
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_check_balanced();

-- +goose StatementBegin
-- The ledger is append-only: mistakes are fixed by reversing entries.
CREATE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ledger is append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $$;
-- +goose StatementEnd

CREATE TRIGGER ledger_entries_append_only BEFORE UPDATE OR DELETE ON ledger_entries
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_postings_append_only BEFORE UPDATE OR DELETE ON ledger_postings
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();

-- +goose Down
DROP INDEX transfers_unmatched_recent_idx;
DROP INDEX transfers_orphaned_idx;
DROP INDEX orders_per_order_address_idx;
DROP INDEX orders_open_idx;
DROP TABLE ledger_postings;
DROP TABLE ledger_entries;
DROP FUNCTION ledger_append_only();
DROP FUNCTION ledger_check_balanced();
ALTER TABLE transfers DROP COLUMN ledger_dirty;
ALTER TABLE transfers DROP COLUMN attribution_entry;
ALTER TABLE transfers DROP COLUMN receipt_entry;
ALTER TABLE transfers DROP COLUMN block_time;
