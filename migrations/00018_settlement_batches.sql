-- +goose Up
-- A pass writes one settlement entry for the orders a batch settles (a
-- posting per order) instead of one per order, and a reorg that takes a
-- settled order's payment moves that order's share back in an
-- unsettlement entry. An order that leaves settled must leave nothing of
-- itself in revenue: checked when its transaction commits, over the
-- order's postings in settlements, unsettlements and reversals of either
-- (kept in step with ledger.settledShareSQL). A daemon of an earlier
-- release, which undid a settlement by reversing the order's own entries,
-- finds none in a batch's: its transaction is refused rather than leaving
-- the money in revenue (stop earlier releases' daemons before this one
-- settles; do not roll back past this migration once it has).

-- +goose StatementBegin
CREATE FUNCTION ledger_check_unsettled() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bad RECORD;
BEGIN
    -- Settled again later in the same transaction: nothing to check.
    IF (SELECT status FROM orders WHERE id = NEW.id) = 'settled' THEN
        RETURN NULL;
    END IF;
    SELECT p.network, p.asset, sum(p.amount) AS total INTO bad
    FROM ledger_postings p JOIN ledger_entries e ON e.id = p.entry_id
    WHERE p.account = 'order:' || NEW.id
        AND (e.kind IN ('settlement', 'unsettlement') OR (e.kind = 'reversal' AND EXISTS (
            SELECT 1 FROM ledger_entries r WHERE r.id = e.reverses AND r.kind IN ('settlement', 'unsettlement'))))
    GROUP BY p.network, p.asset HAVING sum(p.amount) <> 0 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'order % is no longer settled, yet % % units of it are still in revenue', NEW.id, bad.total, bad.asset
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$ BEGIN
    EXECUTE format('ALTER FUNCTION ledger_check_unsettled() SET search_path = %I, pg_catalog, pg_temp', current_schema());
END $$;
-- +goose StatementEnd

CREATE CONSTRAINT TRIGGER orders_unsettled_leave_revenue AFTER UPDATE OF status ON orders
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.status = 'settled' AND NEW.status <> 'settled')
    EXECUTE FUNCTION ledger_check_unsettled();

-- +goose Down
DROP TRIGGER orders_unsettled_leave_revenue ON orders;
DROP FUNCTION ledger_check_unsettled();
