-- +goose Up
-- Payments seen in a node's mempool, before any block holds them: they show
-- an order as "payment detected" (confirming, 0 confirmations) and never
-- pay anything. The ledger and the matching of transfers never read them.

CREATE TABLE mempool_transfers (
    id            TEXT PRIMARY KEY,
    network       TEXT NOT NULL,
    asset         TEXT NOT NULL,
    tx_hash       TEXT NOT NULL,
    -- The same identity the transfer will have once mined ("vout:3").
    tx_key        TEXT NOT NULL,
    idx           BIGINT NOT NULL,
    to_address    TEXT NOT NULL,
    amount        NUMERIC(78,0) NOT NULL CHECK (amount > 0),
    flags         TEXT[] NOT NULL DEFAULT '{}',
    -- The outpoints the transaction spends, and the transaction seen
    -- spending one of them instead (a replacement).
    spends        TEXT[] NOT NULL DEFAULT '{}',
    replaced_by   TEXT,
    order_id      TEXT REFERENCES orders (id),
    first_seen_at TIMESTAMPTZ NOT NULL,
    -- The node's height when the transaction was first missing from its
    -- mempool: once the scanner has passed it, the transaction either is a
    -- transfer (mined) or was replaced or dropped.
    missing_at_height BIGINT,
    missing_since TIMESTAMPTZ,
    left_at       TIMESTAMPTZ,
    left_reason   TEXT CHECK (left_reason IN ('mined', 'replaced', 'dropped')),
    -- Set by every change the reconciler should look at; it clears it.
    dirty         BOOLEAN NOT NULL DEFAULT true,
    updated_at    TIMESTAMPTZ NOT NULL,
    CONSTRAINT mempool_transfers_identity_key UNIQUE (network, tx_hash, tx_key),
    CONSTRAINT mempool_transfers_left CHECK ((left_at IS NULL) = (left_reason IS NULL))
);
CREATE INDEX mempool_transfers_open_idx ON mempool_transfers (network, tx_hash) WHERE left_at IS NULL;
CREATE INDEX mempool_transfers_order_idx ON mempool_transfers (order_id) WHERE order_id IS NOT NULL;
CREATE INDEX mempool_transfers_dirty_idx ON mempool_transfers (id) WHERE dirty;

-- Which derived addresses were paid: the gap of unpaid ones per key.
CREATE INDEX transfers_to_idx ON transfers (network, to_address);

-- +goose Down
DROP INDEX transfers_to_idx;
DROP TABLE mempool_transfers;
