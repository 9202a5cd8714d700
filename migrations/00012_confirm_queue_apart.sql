-- +goose Up
-- The transfers the scanner may confirm and the transfers waiting for a
-- balance check's verdict, in an index each. Both queues were one index of
-- every unconfirmed transfer, so each scan commit's confirmation step read
-- every transfer still waiting for its verdict to confirm none of them:
-- during a catch-up, the verifier runs at each poll interval, and a
-- commit read all that the catch-up had recorded since (about 14 ms a
-- commit at 50,000 waiting). A transfer is in at most one of the two.
CREATE INDEX transfers_confirmable_idx ON transfers (network, block_number)
    WHERE state = 'seen' AND NOT provisional AND NOT ('balance_pending' = ANY (flags));
CREATE INDEX transfers_balance_pending_idx ON transfers (network, block_number, id)
    WHERE state = 'seen' AND 'balance_pending' = ANY (flags);
DROP INDEX transfers_unconfirmed_idx;

-- +goose Down
CREATE INDEX transfers_unconfirmed_idx ON transfers (network, block_number) WHERE state = 'seen';
DROP INDEX transfers_balance_pending_idx;
DROP INDEX transfers_confirmable_idx;
