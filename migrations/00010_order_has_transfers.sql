-- +goose Up
-- A GET of an order lists its transfers: those matched to it and its
-- mempool sightings still in view. Most orders read (a checkout page
-- polling one awaiting payment) have none, and probing both tables on every
-- read costs about a quarter of the read. has_transfers says whether the
-- order ever had one: set, by the triggers below, in the statement that
-- ties a transfer or a sighting to the order, and never cleared. It may be
-- true when nothing is listed (a payment detached, a sighting mined); it is
-- never false when something is. Every path that ties a transfer to an
-- order holds the order's row lock already, so the update takes no new
-- lock, and it happens once per order.
ALTER TABLE orders ADD COLUMN has_transfers BOOLEAN NOT NULL DEFAULT false;

UPDATE orders o SET has_transfers = true
WHERE EXISTS (SELECT 1 FROM transfers t WHERE t.order_id = o.id)
   OR EXISTS (SELECT 1 FROM mempool_transfers m WHERE m.order_id = o.id);

-- +goose StatementBegin
CREATE FUNCTION paywatch_order_has_transfers() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE orders SET has_transfers = true WHERE id = NEW.order_id AND NOT has_transfers;
    RETURN NULL;
END $$;
-- +goose StatementEnd

CREATE TRIGGER transfers_order_has_transfers_insert AFTER INSERT ON transfers FOR EACH ROW
    WHEN (NEW.order_id IS NOT NULL)
    EXECUTE FUNCTION paywatch_order_has_transfers();
CREATE TRIGGER transfers_order_has_transfers_update AFTER UPDATE OF order_id ON transfers FOR EACH ROW
    WHEN (NEW.order_id IS NOT NULL AND NEW.order_id IS DISTINCT FROM OLD.order_id)
    EXECUTE FUNCTION paywatch_order_has_transfers();
CREATE TRIGGER mempool_transfers_order_has_transfers_insert AFTER INSERT ON mempool_transfers FOR EACH ROW
    WHEN (NEW.order_id IS NOT NULL)
    EXECUTE FUNCTION paywatch_order_has_transfers();
CREATE TRIGGER mempool_transfers_order_has_transfers_update AFTER UPDATE OF order_id ON mempool_transfers FOR EACH ROW
    WHEN (NEW.order_id IS NOT NULL AND NEW.order_id IS DISTINCT FROM OLD.order_id)
    EXECUTE FUNCTION paywatch_order_has_transfers();

-- +goose Down
DROP TRIGGER mempool_transfers_order_has_transfers_update ON mempool_transfers;
DROP TRIGGER mempool_transfers_order_has_transfers_insert ON mempool_transfers;
DROP TRIGGER transfers_order_has_transfers_update ON transfers;
DROP TRIGGER transfers_order_has_transfers_insert ON transfers;
DROP FUNCTION paywatch_order_has_transfers();
ALTER TABLE orders DROP COLUMN has_transfers;
