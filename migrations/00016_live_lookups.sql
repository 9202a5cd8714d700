-- +goose Up
-- The look-ups the scanner has yet to see, by block: what each scan commit
-- reads to orphan those it passed without seeing. Orphaned look-ups stay
-- provisional (the scanner never took them), so with every provisional
-- transfer in the index each commit read all the look-ups ever orphaned
-- (a reorg's, a lying node's answers) to orphan none of them.
CREATE INDEX transfers_live_lookups_idx ON transfers (network, block_number)
    WHERE provisional AND state <> 'orphaned';
DROP INDEX transfers_provisional_idx;

-- +goose Down
CREATE INDEX transfers_provisional_idx ON transfers (network, block_number) WHERE provisional;
DROP INDEX transfers_live_lookups_idx;
