-- +goose Up
-- The EVM fake-deposit balance check runs after a transfer is recorded,
-- off the path that advances the cursor: the scanner stores token transfers
-- flagged balance_pending, and a verifier replaces the flag with its
-- verdict. A pending transfer never confirms. The scanner keeps the height
-- at or below which blocks are confirmed, so that a verdict confirms at
-- once what is deep enough.
ALTER TABLE chain_cursors ADD COLUMN confirmed_height BIGINT;

-- The transfers not confirmed yet: the confirmation step's work and the
-- verifier's queue. It stays the size of what waits, however long the
-- history grows.
CREATE INDEX transfers_unconfirmed_idx ON transfers (network, block_number) WHERE state = 'seen';

-- A transfer's flags show on its order: a verdict wakes the order's
-- long-polls.
DROP TRIGGER transfers_notify_update ON transfers;
CREATE TRIGGER transfers_notify_update AFTER UPDATE ON transfers FOR EACH ROW
    WHEN ((OLD.order_id IS NOT NULL OR NEW.order_id IS NOT NULL) AND (OLD.order_id IS DISTINCT FROM NEW.order_id
        OR OLD.state IS DISTINCT FROM NEW.state OR OLD.amount IS DISTINCT FROM NEW.amount
        OR OLD.block_number IS DISTINCT FROM NEW.block_number OR OLD.tx_hash IS DISTINCT FROM NEW.tx_hash
        OR OLD.flags IS DISTINCT FROM NEW.flags))
    EXECUTE FUNCTION paywatch_notify_order();

-- +goose Down
DROP TRIGGER transfers_notify_update ON transfers;
CREATE TRIGGER transfers_notify_update AFTER UPDATE ON transfers FOR EACH ROW
    WHEN ((OLD.order_id IS NOT NULL OR NEW.order_id IS NOT NULL) AND (OLD.order_id IS DISTINCT FROM NEW.order_id
        OR OLD.state IS DISTINCT FROM NEW.state OR OLD.amount IS DISTINCT FROM NEW.amount
        OR OLD.block_number IS DISTINCT FROM NEW.block_number OR OLD.tx_hash IS DISTINCT FROM NEW.tx_hash))
    EXECUTE FUNCTION paywatch_notify_order();
DROP INDEX transfers_unconfirmed_idx;
ALTER TABLE chain_cursors DROP COLUMN confirmed_height;
