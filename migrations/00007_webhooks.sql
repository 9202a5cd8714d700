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
    ADD COLUMN retry_from TIMESTAMPTZ;
UPDATE webhook_outbox SET status = 'delivered' WHERE delivered_at IS NOT NULL;
ALTER TABLE webhook_outbox ADD CONSTRAINT webhook_outbox_seq_key UNIQUE (seq);

DROP INDEX webhook_outbox_pending_idx;
CREATE INDEX webhook_outbox_due_idx ON webhook_outbox (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_outbox_order_pending_idx ON webhook_outbox (order_id, seq) WHERE status = 'pending';
CREATE INDEX webhook_outbox_unsealed_idx ON webhook_outbox (seq) WHERE body IS NULL;
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
    PERFORM pg_notify('paywatch_order', NEW.id);
    RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER orders_notify AFTER UPDATE ON orders
    FOR EACH ROW EXECUTE FUNCTION paywatch_notify_order();

-- Transfers and sightings are written in bulk: one notification per order
-- a statement touched.
-- +goose StatementBegin
CREATE FUNCTION paywatch_notify_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('paywatch_order', o) FROM (SELECT DISTINCT order_id AS o FROM new_rows WHERE order_id IS NOT NULL) x;
    RETURN NULL;
END $$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE FUNCTION paywatch_notify_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('paywatch_order', o) FROM (
        SELECT order_id AS o FROM new_rows WHERE order_id IS NOT NULL
        UNION SELECT order_id FROM old_rows WHERE order_id IS NOT NULL) x;
    RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER transfers_notify_insert AFTER INSERT ON transfers REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION paywatch_notify_inserted();
CREATE TRIGGER transfers_notify_update AFTER UPDATE ON transfers REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION paywatch_notify_updated();
CREATE TRIGGER mempool_transfers_notify_insert AFTER INSERT ON mempool_transfers REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION paywatch_notify_inserted();
CREATE TRIGGER mempool_transfers_notify_update AFTER UPDATE ON mempool_transfers REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION paywatch_notify_updated();

-- +goose Down
DROP TRIGGER mempool_transfers_notify_update ON mempool_transfers;
DROP TRIGGER mempool_transfers_notify_insert ON mempool_transfers;
DROP TRIGGER transfers_notify_update ON transfers;
DROP TRIGGER transfers_notify_insert ON transfers;
DROP FUNCTION paywatch_notify_updated();
DROP FUNCTION paywatch_notify_inserted();
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
ALTER TABLE webhook_outbox DROP COLUMN retry_from, DROP COLUMN last_latency_ms, DROP COLUMN last_attempt_at,
    DROP COLUMN last_status_code, DROP COLUMN status, DROP COLUMN body, DROP COLUMN seq;
