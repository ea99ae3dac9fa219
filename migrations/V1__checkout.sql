-- Events, seats, holds, orders and the idempotency keys that guard them.
-- Forward-only: never edit a migration once it has shipped; add the next one.

-- Lets the hold exclusion constraint mix `seat_id WITH =` with a range.
CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE events (
    event_id   text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE seats (
    seat_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id    text NOT NULL REFERENCES events (event_id),
    label       text NOT NULL,
    price_cents bigint NOT NULL CHECK (price_cents > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (event_id, label)
);

CREATE TABLE orders (
    order_id        uuid PRIMARY KEY,
    user_id         text NOT NULL,
    status          text NOT NULL CHECK (status IN ('payment_pending', 'paid', 'declined')),
    amount_cents    bigint NOT NULL CHECK (amount_cents > 0),
    currency        text NOT NULL,
    payment_method  text NOT NULL,
    hold_ids        bigint[] NOT NULL,
    seats           text[] NOT NULL,
    charge_id       text,
    -- The click that made the order: reconciliation stores its outcome there.
    idempotency_key text NOT NULL,
    -- Reconciliation's bookkeeping for orders whose charge keeps failing.
    reconcile_attempts integer NOT NULL DEFAULT 0,
    reconcile_after    timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX orders_pending_idx ON orders (reconcile_after) WHERE status = 'payment_pending';

CREATE TABLE holds (
    hold_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    seat_id    bigint NOT NULL REFERENCES seats (seat_id),
    user_id    text NOT NULL,
    expires_at timestamptz NOT NULL,
    -- Set while the hold is in a pending or paid order. Deferred so that an
    -- order and the claim of its holds can be written in one statement.
    order_id   uuid REFERENCES orders (order_id) DEFERRABLE INITIALLY DEFERRED,
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK (expires_at > created_at),
    -- The database, not the code, decides who gets a seat: a hold occupies its
    -- seat from creation until expiry, or forever once it is in an order, and
    -- no two such spans of one seat may overlap.
    CONSTRAINT holds_one_per_seat EXCLUDE USING gist (
        seat_id WITH =,
        tstzrange(created_at, CASE WHEN order_id IS NULL THEN expires_at ELSE 'infinity' END) WITH &&
    )
);

CREATE INDEX holds_order_idx ON holds (order_id) WHERE order_id IS NOT NULL;

-- One row per (buyer, key): the primary key decides every race.
CREATE TABLE idempotency_keys (
    user_id               text NOT NULL,
    key                   text NOT NULL,
    request_hash          bytea NOT NULL,
    -- Who may finish the intent, and until when (lease and takeover).
    claim_token           uuid NOT NULL,
    lease_expires_at      timestamptz NOT NULL,
    -- The order this intent made, once it exists: a takeover resumes it.
    order_id              uuid REFERENCES orders (order_id) DEFERRABLE INITIALLY DEFERRED,
    -- NULL while in progress; then the answer, replayed byte for byte.
    response_status       smallint,
    response_body         bytea,
    response_location     text,
    response_content_type text,
    created_at            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, key)
);

CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys (created_at);
