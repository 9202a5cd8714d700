-- +goose Up
-- Every status change writes a timeline event and a webhook event (a pass
-- settling 100,000 orders writes 100,000 of each); each index of their
-- tables is one more entry written for every one of them. Four of those
-- indexes held nothing another did not:
--
-- order_events: its primary key on id alone served no read (a timeline is
-- read by order, through (order_id, id)). The key becomes (order_id, id),
-- the index timelines are read through, and the other index goes. Ids
-- still come from the sequence, each once. The same holds of order_reviews
-- (queued and consumed by order), written for every payment matched,
-- confirmed or attributed.
--
-- webhook_outbox: the due events (status 'pending', by next_attempt_at)
-- and the backlog (every status but 'delivered') had an index each; one
-- on (status, next_attempt_at) over the undelivered serves both.
--
-- Measured on 20,000-row inserts: about 25% less time for the timeline
-- events, 15-20% less for the webhook events.
--
-- The three tables are locked at once, first: taken one after another,
-- the lock each index build holds, raised to rebuild the key, met a
-- daemon's transaction reading the timeline before writing it, and one
-- of the two was ended as a deadlock. The wait for the locks is at most
-- 10 s, past which the migration fails with nothing changed and the next
-- start tries again; once held, every statement on those tables waits
-- until the keys and the index are built (each table read once).
SET LOCAL lock_timeout = '10s';
LOCK TABLE order_events, order_reviews, webhook_outbox IN ACCESS EXCLUSIVE MODE;
CREATE UNIQUE INDEX order_events_order_key ON order_events (order_id, id);
ALTER TABLE order_events DROP CONSTRAINT order_events_pkey,
    ADD CONSTRAINT order_events_pkey PRIMARY KEY USING INDEX order_events_order_key;
DROP INDEX order_events_order_idx;
CREATE UNIQUE INDEX order_reviews_order_key ON order_reviews (order_id, id);
ALTER TABLE order_reviews DROP CONSTRAINT order_reviews_pkey,
    ADD CONSTRAINT order_reviews_pkey PRIMARY KEY USING INDEX order_reviews_order_key;
DROP INDEX order_reviews_order_idx;

DROP INDEX webhook_outbox_due_idx;
DROP INDEX webhook_outbox_undelivered_idx;
CREATE INDEX webhook_outbox_undelivered_idx ON webhook_outbox (status, next_attempt_at) WHERE status <> 'delivered';

-- +goose Down
SET LOCAL lock_timeout = '10s';
LOCK TABLE order_events, order_reviews, webhook_outbox IN ACCESS EXCLUSIVE MODE;
DROP INDEX webhook_outbox_undelivered_idx;
CREATE INDEX webhook_outbox_due_idx ON webhook_outbox (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_outbox_undelivered_idx ON webhook_outbox (status) WHERE status <> 'delivered';

CREATE INDEX order_reviews_order_idx ON order_reviews (order_id);
ALTER TABLE order_reviews DROP CONSTRAINT order_reviews_pkey, ADD CONSTRAINT order_reviews_pkey PRIMARY KEY (id);
CREATE INDEX order_events_order_idx ON order_events (order_id, id);
ALTER TABLE order_events DROP CONSTRAINT order_events_pkey, ADD CONSTRAINT order_events_pkey PRIMARY KEY (id);
