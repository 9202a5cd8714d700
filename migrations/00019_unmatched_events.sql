-- +goose Up
-- The payments taken from an order since they were matched: every batch of
-- the reconciler counts them (transfer_unmatched on the order's timeline)
-- for each order it reads. Through order_events_order_idx, the count
-- fetched every event of each order's timeline to look at its type; here
-- it is a probe of an index that holds only those events.
CREATE INDEX order_events_unmatched_idx ON order_events (order_id) WHERE type = 'transfer_unmatched';

-- +goose Down
DROP INDEX order_events_unmatched_idx;
