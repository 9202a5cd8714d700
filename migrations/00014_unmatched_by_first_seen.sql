-- +goose Up
-- The unmatched transfers of an address, by when they were first seen: the
-- match step looks back a bounded time (the longest expiry and monitoring
-- window), and probes this index from an open order's address. Without
-- first_seen_at in it, a probe read every stray payment the address ever
-- received (wrong amounts, late payments, dust, address-poisoning spam:
-- never matched, never leaving the index) and checked the bound row by row
-- (the planner probes so when its statistics predate the open orders: a
-- morning's checkouts in a large table).
CREATE INDEX transfers_unmatched_seen_idx ON transfers (network, to_address, first_seen_at)
    WHERE order_id IS NULL AND state <> 'orphaned';
DROP INDEX transfers_unmatched_recent_idx;

-- +goose Down
CREATE INDEX transfers_unmatched_recent_idx ON transfers (network, to_address) WHERE order_id IS NULL AND state <> 'orphaned';
DROP INDEX transfers_unmatched_seen_idx;
