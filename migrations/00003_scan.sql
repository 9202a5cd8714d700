-- +goose Up
-- Recent block hashes of each network, for reorg detection, and the record
-- of reorgs the watchers handled.

CREATE TABLE chain_blocks (
    network      TEXT NOT NULL,
    block_number BIGINT NOT NULL,
    block_hash   TEXT NOT NULL,
    PRIMARY KEY (network, block_number)
);

CREATE TABLE chain_reorgs (
    id             BIGSERIAL PRIMARY KEY,
    network        TEXT NOT NULL,
    at             TIMESTAMPTZ NOT NULL,
    fork_block     BIGINT NOT NULL,
    old_cursor     BIGINT NOT NULL,
    orphaned_count INTEGER NOT NULL
);

ALTER TABLE chain_cursors ADD COLUMN halted BOOLEAN NOT NULL DEFAULT false;
-- The first block this network was scanned from: a reorg reaching below
-- every kept hash is handled by rescanning from it only while scanning began
-- less than a window ago.
ALTER TABLE chain_cursors ADD COLUMN first_block BIGINT;
ALTER TABLE transfers ADD COLUMN orphaned_at TIMESTAMPTZ;

-- +goose Down
ALTER TABLE transfers DROP COLUMN orphaned_at;
ALTER TABLE chain_cursors DROP COLUMN first_block;
ALTER TABLE chain_cursors DROP COLUMN halted;
DROP TABLE chain_reorgs;
DROP TABLE chain_blocks;
