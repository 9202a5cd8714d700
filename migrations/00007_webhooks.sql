-- +goose Up
-- Webhook delivery: each outbox event carries its body, sealed in the
-- transaction that wrote the event (the order as it was then), a delivery
-- status and a log of every attempt. Events of one order are delivered in
-- the order they were written (seq). Order changes are announced on the
-- channel paywatch_order (payload: the order id) for long-polling clients,
-- and new events on paywatch_webhook for the sender.

ALTER TABLE webhook_outbox
    ADD COLUMN seq BIGSERIAL,
    ADD COLUMN body TEXT,
    ADD COLUMN status TEXT NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'delivered', 'failed', 'refused')),
    ADD COLUMN last_status_code INTEGER,
    ADD COLUMN last_attempt_at TIMESTAMPTZ,
    ADD COLUMN last_latency_ms INTEGER,
    -- Retries stop once an event is max_retry_age older than this: the
    -- operator's last redelivery, or (when NULL) its creation.
    ADD COLUMN retry_from TIMESTAMPTZ,
    -- The last attempt was stopped by the SSRF guard: given up, the event
    -- is refused rather than failed.
    ADD COLUMN last_refused BOOLEAN NOT NULL DEFAULT false,
    -- Counts redeliveries: an attempt in flight when an operator queues
    -- the event again does not record itself over the redelivery.
    ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
-- Events written before delivery existed are not sent on upgrade (they
-- would carry today's order, long after the fact): an operator may
-- redeliver one on purpose.
UPDATE webhook_outbox SET status = CASE WHEN delivered_at IS NULL THEN 'failed' ELSE 'delivered' END,
    last_error = CASE WHEN delivered_at IS NULL THEN 'written before webhook delivery existed; not sent on upgrade' END;
ALTER TABLE webhook_outbox ADD CONSTRAINT webhook_outbox_seq_key UNIQUE (seq);

DROP INDEX webhook_outbox_pending_idx;
CREATE INDEX webhook_outbox_due_idx ON webhook_outbox (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_outbox_order_pending_idx ON webhook_outbox (order_id, seq) WHERE status = 'pending';
CREATE INDEX webhook_outbox_unsealed_idx ON webhook_outbox (seq) WHERE body IS NULL AND status = 'pending';
CREATE INDEX webhook_outbox_list_idx ON webhook_outbox (created_at DESC, id DESC);
CREATE INDEX webhook_outbox_order_idx ON webhook_outbox (order_id);
CREATE INDEX webhook_outbox_undelivered_idx ON webhook_outbox (status) WHERE status <> 'delivered';

CREATE TABLE webhook_attempts (
    event_id    TEXT NOT NULL REFERENCES webhook_outbox (id),
    attempt     INTEGER NOT NULL,
    at          TIMESTAMPTZ NOT NULL,
    url         TEXT NOT NULL,
    status_code INTEGER,
    latency_ms  INTEGER NOT NULL,
    error       TEXT,
    PRIMARY KEY (event_id, attempt)
);

-- +goose StatementBegin
CREATE FUNCTION paywatch_notify_webhook() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('paywatch_webhook', '');
    RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER webhook_outbox_notify AFTER INSERT ON webhook_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION paywatch_notify_webhook();

-- +goose StatementBegin
CREATE FUNCTION paywatch_notify_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'orders' THEN
        PERFORM pg_notify('paywatch_order', NEW.id);
        RETURN NULL;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.order_id IS NOT NULL THEN
        PERFORM pg_notify('paywatch_order', NEW.order_id);
    END IF;
    IF TG_OP <> 'INSERT' AND OLD.order_id IS NOT NULL AND (TG_OP = 'DELETE' OR OLD.order_id IS DISTINCT FROM NEW.order_id) THEN
        PERFORM pg_notify('paywatch_order', OLD.order_id);
    END IF;
    RETURN NULL;
END $$;
-- +goose StatementEnd
-- Only changes an order's view shows notify (the conditions are checked
-- before the function is called: bulk writes of unmatched transfers cost
-- nothing).
CREATE TRIGGER orders_notify AFTER UPDATE ON orders FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.dispute_reason IS DISTINCT FROM NEW.dispute_reason
        OR OLD.customer_marked_paid_at IS DISTINCT FROM NEW.customer_marked_paid_at
        OR OLD.tx_hash_hint IS DISTINCT FROM NEW.tx_hash_hint OR OLD.settled_at IS DISTINCT FROM NEW.settled_at
        OR OLD.expires_at IS DISTINCT FROM NEW.expires_at)
    EXECUTE FUNCTION paywatch_notify_order();
CREATE TRIGGER transfers_notify_insert AFTER INSERT ON transfers FOR EACH ROW
    WHEN (NEW.order_id IS NOT NULL)
    EXECUTE FUNCTION paywatch_notify_order();
CREATE TRIGGER transfers_notify_update AFTER UPDATE ON transfers FOR EACH ROW
    WHEN ((OLD.order_id IS NOT NULL OR NEW.order_id IS NOT NULL) AND (OLD.order_id IS DISTINCT FROM NEW.order_id
        OR OLD.state IS DISTINCT FROM NEW.state OR OLD.amount IS DISTINCT FROM NEW.amount
        OR OLD.block_number IS DISTINCT FROM NEW.block_number OR OLD.tx_hash IS DISTINCT FROM NEW.tx_hash))
    EXECUTE FUNCTION paywatch_notify_order();
CREATE TRIGGER mempool_transfers_notify_insert AFTER INSERT ON mempool_transfers FOR EACH ROW
    WHEN (NEW.order_id IS NOT NULL)
    EXECUTE FUNCTION paywatch_notify_order();
CREATE TRIGGER mempool_transfers_notify_update AFTER UPDATE ON mempool_transfers FOR EACH ROW
    WHEN ((OLD.order_id IS NOT NULL OR NEW.order_id IS NOT NULL) AND (OLD.order_id IS DISTINCT FROM NEW.order_id
        OR OLD.left_at IS DISTINCT FROM NEW.left_at OR OLD.amount IS DISTINCT FROM NEW.amount))
    EXECUTE FUNCTION paywatch_notify_order();

-- +goose Down
DROP TRIGGER mempool_transfers_notify_update ON mempool_transfers;
DROP TRIGGER mempool_transfers_notify_insert ON mempool_transfers;
DROP TRIGGER transfers_notify_update ON transfers;
DROP TRIGGER transfers_notify_insert ON transfers;
DROP TRIGGER orders_notify ON orders;
DROP FUNCTION paywatch_notify_order();
DROP TRIGGER webhook_outbox_notify ON webhook_outbox;
DROP FUNCTION paywatch_notify_webhook();
DROP TABLE webhook_attempts;
DROP INDEX webhook_outbox_undelivered_idx;
DROP INDEX webhook_outbox_order_idx;
DROP INDEX webhook_outbox_list_idx;
DROP INDEX webhook_outbox_unsealed_idx;
DROP INDEX webhook_outbox_order_pending_idx;
DROP INDEX webhook_outbox_due_idx;
CREATE INDEX webhook_outbox_pending_idx ON webhook_outbox (next_attempt_at) WHERE delivered_at IS NULL;
ALTER TABLE webhook_outbox DROP CONSTRAINT webhook_outbox_seq_key;
ALTER TABLE webhook_outbox DROP COLUMN generation, DROP COLUMN last_refused, DROP COLUMN retry_from, DROP COLUMN last_latency_ms, DROP COLUMN last_attempt_at,
    DROP COLUMN last_status_code, DROP COLUMN status, DROP COLUMN body, DROP COLUMN seq;
