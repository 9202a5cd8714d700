-- +goose Up
-- Order dossiers, their timeline, the webhook outbox, amount slots and
-- derivation counters.

CREATE TABLE orders (
    id                      TEXT PRIMARY KEY,
    external_id             TEXT NOT NULL,
    -- sha256 of the normalized create request: a replay with another body
    -- is a conflict.
    request_hash            BYTEA NOT NULL,
    idempotency_scope       TEXT,
    idempotency_key         TEXT,
    network                 TEXT NOT NULL,
    asset                   TEXT NOT NULL,
    asset_contract          TEXT NOT NULL DEFAULT '',
    amount                  NUMERIC(78,0) NOT NULL CHECK (amount > 0),
    pay_amount              NUMERIC(78,0) NOT NULL CHECK (pay_amount >= amount),
    pay_address             TEXT NOT NULL,
    unique_k                INTEGER CHECK (unique_k >= 0),
    derivation_key          TEXT,
    derivation_index        BIGINT CHECK (derivation_index >= 0),
    status                  TEXT NOT NULL CHECK (status IN ('awaiting_payment', 'confirming',
                                'settled', 'disputed', 'expired', 'cancelled', 'refunded')),
    dispute_reason          TEXT CHECK (dispute_reason IN ('underpaid', 'overpaid', 'late_payment',
                                'no_payment_found', 'multiple_payments', 'orphaned_payment',
                                'wrong_asset', 'ambiguous')),
    customer_marked_paid_at TIMESTAMPTZ,
    tx_hash_hint            TEXT,
    metadata                JSONB,
    created_at              TIMESTAMPTZ NOT NULL,
    expires_at              TIMESTAMPTZ NOT NULL,
    monitor_until           TIMESTAMPTZ NOT NULL,
    settled_at              TIMESTAMPTZ,
    updated_at              TIMESTAMPTZ NOT NULL,
    CONSTRAINT orders_external_id_key UNIQUE (external_id),
    CONSTRAINT orders_idempotency_key UNIQUE (idempotency_scope, idempotency_key),
    CONSTRAINT orders_derivation_key UNIQUE (derivation_key, derivation_index),
    CONSTRAINT orders_dispute_reason_only_when_disputed
        CHECK ((status = 'disputed') = (dispute_reason IS NOT NULL)),
    CONSTRAINT orders_expiry_order CHECK (expires_at > created_at AND monitor_until >= expires_at)
);

CREATE INDEX orders_created_idx ON orders (created_at DESC, id DESC);
CREATE INDEX orders_status_idx ON orders (status, created_at DESC, id DESC);
CREATE INDEX orders_pay_idx ON orders (network, asset_contract, pay_address, pay_amount);

-- One row per (network, asset, address, pay_amount) ever drawn in shared
-- address mode. The primary key is what makes pay amounts unique: a slot is
-- held until held_until (the order's monitoring window end) and only then
-- taken over by a new order.
CREATE TABLE amount_slots (
    network     TEXT NOT NULL,
    asset       TEXT NOT NULL,
    address     TEXT NOT NULL,
    pay_amount  NUMERIC(78,0) NOT NULL,
    order_id    TEXT NOT NULL REFERENCES orders (id),
    held_until  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (network, asset, address, pay_amount)
);

-- The next derivation index per extended public key (per-order mode).
CREATE TABLE derivation_counters (
    derivation_key TEXT PRIMARY KEY,
    next_index     BIGINT NOT NULL CHECK (next_index >= 0)
);

-- The dossier's timeline: append-only.
CREATE TABLE order_events (
    id          BIGSERIAL PRIMARY KEY,
    order_id    TEXT NOT NULL REFERENCES orders (id),
    at          TIMESTAMPTZ NOT NULL,
    type        TEXT NOT NULL,
    from_status TEXT,
    to_status   TEXT,
    actor       TEXT NOT NULL,
    detail      JSONB
);
CREATE INDEX order_events_order_idx ON order_events (order_id, id);

-- Webhooks to deliver, written in the same transaction as the change they
-- announce, drained by the webhook sender.
CREATE TABLE webhook_outbox (
    id              TEXT PRIMARY KEY,
    order_id        TEXT NOT NULL REFERENCES orders (id),
    type            TEXT NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ NOT NULL,
    delivered_at    TIMESTAMPTZ,
    last_error      TEXT
);
CREATE INDEX webhook_outbox_pending_idx ON webhook_outbox (next_attempt_at) WHERE delivered_at IS NULL;

-- +goose Down
DROP TABLE webhook_outbox;
DROP TABLE order_events;
DROP TABLE derivation_counters;
DROP TABLE amount_slots;
DROP TABLE orders;
