-- The shop hears every outcome: each order that becomes `paid`, `declined`
-- or `failed` makes one event row, written by the statement that settles
-- it, so the event commits with the state or not at all (a transactional
-- outbox). `jobs::outcomes` delivers the rows to `outcomes.webhook_url`.
--
-- - Keyed by the buyer first, like `orders`: on Citus the table is
--   distributed by `user_id` beside `orders` (scripts/citus-distribute.sql),
--   so the settlement's insert goes to the buyer's worker with the order's
--   update, and every write of one event is routed to one shard.
-- - `(user_id, order_id)` is the key: one event per order, whatever calls
--   the settlement how many times. `event_id` is made once, here, and is
--   the id of every delivery of the event.
-- - Delivery state: `attempts` (the backoff's exponent), `next_attempt_at`
--   (due, or leased until then), `lease_token` (who holds the attempt in
--   progress: a result is written only under the token that claimed it),
--   `delivered_at` / `given_up_at` (the ends), `last_error` (the last
--   failure, for the operator). `retry_from` is when the retries began
--   (the settlement, or a later `outcomes resend`): an event is given up
--   `outcomes.retry_for_secs` after it.

CREATE TABLE order_events (
    user_id         text        NOT NULL,
    order_id        uuid        NOT NULL,
    event_id        text        NOT NULL,
    type            text        NOT NULL
                    CHECK (type IN ('order.paid', 'order.declined', 'order.failed')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    retry_from      timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_token     bigint      NOT NULL DEFAULT 0,
    delivered_at    timestamptz,
    given_up_at     timestamptz,
    last_error      text,
    PRIMARY KEY (user_id, order_id)
);

-- What the delivery job reads: the events still to deliver, oldest due first.
CREATE INDEX order_events_due_idx ON order_events (next_attempt_at)
    WHERE delivered_at IS NULL AND given_up_at IS NULL;

-- V7's settlement, now with its event: when, and only when, the update
-- moved the order out of `payment_pending`, the event is inserted in the
-- same call, hence the same transaction, on every path that settles (the
-- click, a takeover, Payrail's event, reconciliation, the give-up).
CREATE OR REPLACE FUNCTION checkout_settle_order(
    p_user_id text, p_order_id uuid, p_status text, p_charge_id text
)
RETURNS SETOF orders
LANGUAGE plpgsql
AS $$
DECLARE
    settled orders;
BEGIN
    UPDATE orders SET status = p_status, charge_id = p_charge_id, updated_at = now()
    WHERE user_id = p_user_id AND order_id = p_order_id AND status = 'payment_pending'
      AND (cancel_requested_at IS NULL) = (p_status <> 'failed')
    RETURNING * INTO settled;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE holds
    SET order_id = CASE WHEN p_status = 'paid' THEN order_id END,
        sold = p_status = 'paid'
    WHERE order_id = p_order_id;
    INSERT INTO order_events (user_id, order_id, event_id, type)
    VALUES (p_user_id, p_order_id, 'evt_' || replace(gen_random_uuid()::text, '-', ''),
            'order.' || p_status);
    RETURN NEXT settled;
END
$$;
