-- +goose Up
-- The unmatched transfers of an address, by amount, then by when they were
-- first seen. The match step probes this index from an open order: on a
-- shared address, for its exact pay amount within the lookback (a range
-- of the index, whatever the address received otherwise); on an address
-- of its own, for everything the address received. Keyed by address and
-- first seen alone, a probe from a shared address read every stray payment
-- of the lookback (wrong amounts, dust, address-poisoning spam, which
-- anyone can send) once per open order: when the planner's statistics
-- predate the open orders, 499 checkouts and 20,000 strays cost a match
-- statement 6,000,000 pages.
CREATE INDEX transfers_unmatched_amount_idx ON transfers (network, to_address, amount, first_seen_at)
    WHERE order_id IS NULL AND state <> 'orphaned';
DROP INDEX transfers_unmatched_seen_idx;

-- +goose Down
CREATE INDEX transfers_unmatched_seen_idx ON transfers (network, to_address, first_seen_at)
    WHERE order_id IS NULL AND state <> 'orphaned';
DROP INDEX transfers_unmatched_amount_idx;
