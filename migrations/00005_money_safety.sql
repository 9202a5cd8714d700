-- +goose Up
-- Which payment may pay which order: the height a network had reached when
-- an order was created, customers' tx hash claims, provisional transfers
-- from node look-ups, how each transfer came to its order, and the queue of
-- orders whose payments changed.

-- Only transfers in blocks above created_height can pay the order (NULL
-- until the network's head is known: the scanner fills it in).
-- earliest_block_time is a second bound for a head recorded late: the
-- order's creation minus the clock slack of its network's family.
ALTER TABLE orders ADD COLUMN created_height BIGINT;
ALTER TABLE orders ADD COLUMN earliest_block_time TIMESTAMPTZ;
-- What an operator accepted when resolving a dispute as settled: a reorg
-- that leaves exactly this confirmed keeps the order settled.
ALTER TABLE orders ADD COLUMN accepted_amount NUMERIC(78,0) CHECK (accepted_amount >= 0);
-- The customer's tx hash claim ("I've paid" with tx_hash): pending until it
-- links a transfer or is rejected; node look-ups back off per order.
ALTER TABLE orders ADD COLUMN hint_state TEXT CHECK (hint_state IN ('pending', 'linked', 'rejected'));
ALTER TABLE orders ADD COLUMN hint_lookups INTEGER NOT NULL DEFAULT 0;
ALTER TABLE orders ADD COLUMN hint_next_lookup_at TIMESTAMPTZ;

-- Orders that exist already: a matched payment shows how far back the
-- order reached; otherwise the network's head now (nothing older pays it).
UPDATE orders o SET created_height = coalesce(
        (SELECT min(t.block_number) - 1 FROM transfers t WHERE t.order_id = o.id),
        (SELECT c.head FROM chain_cursors c WHERE c.network = o.network)),
    earliest_block_time = o.created_at - interval '10 minutes';
UPDATE orders SET tx_hash_hint = lower(tx_hash_hint) WHERE tx_hash_hint IS NOT NULL;
UPDATE orders SET hint_state = 'pending', hint_next_lookup_at = updated_at
WHERE tx_hash_hint IS NOT NULL AND status NOT IN ('settled', 'cancelled', 'refunded');
ALTER TABLE orders ALTER COLUMN earliest_block_time SET NOT NULL;

CREATE INDEX orders_created_height_todo_idx ON orders (network) WHERE created_height IS NULL;
CREATE INDEX orders_hint_pending_idx ON orders (customer_marked_paid_at, id) WHERE hint_state = 'pending';
CREATE INDEX orders_hint_lookup_idx ON orders (hint_next_lookup_at) WHERE hint_state = 'pending';
-- The orders a pass looks at because time passed: awaiting payment past
-- expiry or past the paid grace, and per-order addresses past expiry.
CREATE INDEX orders_awaiting_expiry_idx ON orders (expires_at, id)
    WHERE status = 'awaiting_payment' AND customer_marked_paid_at IS NULL;
CREATE INDEX orders_awaiting_marked_idx ON orders (customer_marked_paid_at, id)
    WHERE status = 'awaiting_payment' AND customer_marked_paid_at IS NOT NULL;
CREATE INDEX orders_confirming_expiry_idx ON orders (expires_at, id) WHERE status = 'confirming';

-- How a transfer came to its order: its exact pay amount, the order's own
-- address, the customer's tx hash, or an operator's attach.
ALTER TABLE transfers ADD COLUMN match_kind TEXT CHECK (match_kind IN ('amount', 'address', 'hint', 'operator'));
UPDATE transfers t SET match_kind = CASE WHEN o.unique_k IS NULL THEN 'address' ELSE 'amount' END
FROM orders o WHERE o.id = t.order_id;
-- A transfer recorded from a node look-up ahead of the scanner: it can be
-- matched, but it confirms only once the scanner has seen it in a canonical
-- block; if the scanner passes its block without seeing it, it is orphaned.
ALTER TABLE transfers ADD COLUMN provisional BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX transfers_provisional_idx ON transfers (network, block_number) WHERE provisional;

-- Orders whose payments, claims or ledger account changed: the reconciler
-- decides each again. Rows are consumed in the same statement that reads
-- what the decision rests on, so a change committed after that read leaves
-- its row for the next pass. No key and no foreign key: adding a review
-- never waits on another transaction.
CREATE TABLE order_reviews (
    id       BIGSERIAL PRIMARY KEY,
    order_id TEXT NOT NULL,
    at       TIMESTAMPTZ NOT NULL
);
CREATE INDEX order_reviews_order_idx ON order_reviews (order_id);
INSERT INTO order_reviews (order_id, at)
SELECT id, now() FROM orders WHERE status IN ('awaiting_payment', 'confirming', 'expired', 'disputed');

-- +goose Down
DROP TABLE order_reviews;
ALTER TABLE transfers DROP COLUMN provisional;
ALTER TABLE transfers DROP COLUMN match_kind;
DROP INDEX orders_confirming_expiry_idx;
DROP INDEX orders_awaiting_marked_idx;
DROP INDEX orders_awaiting_expiry_idx;
ALTER TABLE orders DROP COLUMN hint_next_lookup_at;
ALTER TABLE orders DROP COLUMN hint_lookups;
ALTER TABLE orders DROP COLUMN hint_state;
ALTER TABLE orders DROP COLUMN accepted_amount;
ALTER TABLE orders DROP COLUMN earliest_block_time;
ALTER TABLE orders DROP COLUMN created_height;
