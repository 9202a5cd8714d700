-- +goose Up
-- The orders on shared addresses in a status that takes payments, by pay
-- amount and the end of their monitoring window: what deciding a
-- customer's claim reads to ask whether another waiting order could be
-- owed the payment (a range of pay amounts about the claimed one).
-- orders_pay_idx holds every order ever sold, and the tolerance was no
-- range: a claim read the whole history of its shared address.
CREATE INDEX orders_open_shared_window_idx ON orders (network, asset_contract, pay_address, pay_amount, monitor_until)
    WHERE unique_k IS NOT NULL AND status IN ('awaiting_payment', 'confirming', 'expired', 'disputed');

-- +goose Down
DROP INDEX orders_open_shared_window_idx;
