-- +goose Up
-- What the chain watchers see: per-network scan state and the transfers
-- found.

CREATE TABLE chain_cursors (
    network      TEXT PRIMARY KEY,
    block_number BIGINT,
    block_hash   TEXT,
    head         BIGINT,
    finalized    BIGINT,
    last_error   TEXT,
    updated_at   TIMESTAMPTZ NOT NULL
);

CREATE TABLE transfers (
    id             TEXT PRIMARY KEY,
    network        TEXT NOT NULL,
    asset          TEXT NOT NULL,
    asset_contract TEXT NOT NULL DEFAULT '',
    tx_hash        TEXT NOT NULL,
    -- The adapter's identity of the movement within its transaction; stable
    -- when the transaction is mined again in another block.
    tx_key         TEXT NOT NULL,
    idx            BIGINT NOT NULL,
    from_address   TEXT NOT NULL DEFAULT '',
    to_address     TEXT NOT NULL,
    amount         NUMERIC(78,0) NOT NULL CHECK (amount >= 0),
    block_number   BIGINT NOT NULL,
    block_hash     TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('seen', 'confirmed', 'orphaned')),
    order_id       TEXT REFERENCES orders (id),
    flags          TEXT[] NOT NULL DEFAULT '{}',
    first_seen_at  TIMESTAMPTZ NOT NULL,
    updated_at     TIMESTAMPTZ NOT NULL,
    CONSTRAINT transfers_identity_key UNIQUE (network, tx_hash, tx_key)
);
CREATE INDEX transfers_seen_idx ON transfers (first_seen_at DESC, id DESC);
CREATE INDEX transfers_unmatched_idx ON transfers (first_seen_at DESC, id DESC) WHERE order_id IS NULL;
CREATE INDEX transfers_order_idx ON transfers (order_id) WHERE order_id IS NOT NULL;
CREATE INDEX transfers_block_idx ON transfers (network, block_number);

-- +goose Down
DROP TABLE transfers;
DROP TABLE chain_cursors;
