-- +goose Up
-- A reconciler pass that settles thousands of orders writes a timeline
-- event and a webhook event for each. Those rows are written in the
-- transaction that changed their order (the order row is locked or just
-- written there), and paywatch never deletes orders: the per-row foreign
-- key checks cost about a quarter of such a pass and guard nothing. The ledger keeps
-- its foreign keys.
ALTER TABLE order_events DROP CONSTRAINT order_events_order_id_fkey;
ALTER TABLE webhook_outbox DROP CONSTRAINT webhook_outbox_order_id_fkey;

-- Webhook events are written with their bodies now; fewer indexes to keep
-- per event. seq stays an increasing number (its sequence), without a
-- unique index nothing reads; an order's events by seq serve both the
-- sender (the earliest pending one) and the deliveries list of an order.
ALTER TABLE webhook_outbox DROP CONSTRAINT webhook_outbox_seq_key;
DROP INDEX webhook_outbox_order_pending_idx;
DROP INDEX webhook_outbox_order_idx;
CREATE INDEX webhook_outbox_order_idx ON webhook_outbox (order_id, seq);

-- +goose Down
DROP INDEX webhook_outbox_order_idx;
CREATE INDEX webhook_outbox_order_idx ON webhook_outbox (order_id);
CREATE INDEX webhook_outbox_order_pending_idx ON webhook_outbox (order_id, seq) WHERE status = 'pending';
ALTER TABLE webhook_outbox ADD CONSTRAINT webhook_outbox_seq_key UNIQUE (seq);
ALTER TABLE webhook_outbox ADD CONSTRAINT webhook_outbox_order_id_fkey FOREIGN KEY (order_id) REFERENCES orders (id);
ALTER TABLE order_events ADD CONSTRAINT order_events_order_id_fkey FOREIGN KEY (order_id) REFERENCES orders (id);
