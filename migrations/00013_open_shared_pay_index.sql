-- +goose Up
-- The open orders on shared addresses, by address and pay amount: what the
-- reconciler's mempool step pairs a sighting with. orders_pay_idx leads
-- with the asset's contract, which a sighting does not carry; probed
-- without it, each open sighting read every order of its network ever
-- sold (when the planner chose a nested loop, as it does when the
-- statistics have not seen the sightings yet). This one stays the size of
-- the orders still waiting.
CREATE INDEX orders_open_shared_pay_idx ON orders (network, pay_address, pay_amount)
    WHERE unique_k IS NOT NULL AND status IN ('awaiting_payment', 'confirming');

-- +goose Down
DROP INDEX orders_open_shared_pay_idx;
