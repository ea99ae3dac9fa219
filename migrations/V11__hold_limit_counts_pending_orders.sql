-- `holds.max_per_buyer` also counts the buyer's seats of the event in
-- orders still waiting for their payment. V8 counted only holds no order
-- had taken: a buyer could hold the limit, order it with a card whose
-- payment never comes (the order stays `payment_pending`, its seats taken,
-- until `reconcile.give_up_secs` ends it), hold the limit again, and so on.
--
-- A hold is in a pending order exactly when it has an `order_id` and is not
-- `sold`: the order statement sets `order_id`, and the settlement, in the
-- same statement as the order's status, sets `sold` (paid) or gives the
-- hold back (`order_id` cleared: declined, failed). So the count reads
-- holds alone, never `orders`: on Citus the hold's call stays on the
-- coordinator, which holds the seat side, and asks no worker.

-- The buyer's holds in pending orders, without reading the buyer's (or
-- anyone's) paid and expired ones.
CREATE INDEX holds_pending_by_buyer_idx ON holds (user_id)
    WHERE order_id IS NOT NULL AND NOT sold;

-- V8's function, its count now the buyer's live unordered holds on the
-- event plus their holds on it in pending orders (whatever their
-- `expires_at`: an order keeps its seats until it settles). Each part
-- through its index on the buyer; the locks and their order are V8's.
CREATE OR REPLACE FUNCTION checkout_place_hold(
    p_seat_id bigint, p_user_id text, p_ttl_secs float8, p_max bigint
)
RETURNS TABLE (new_hold_id bigint, new_expires_at timestamptz, over_limit boolean)
LANGUAGE plpgsql
AS $$
DECLARE
    v_event_id text;
BEGIN
    SELECT s.event_id INTO v_event_id FROM seats s
    WHERE s.seat_id = p_seat_id
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext(v_event_id), hashtext(p_user_id));
    IF (SELECT count(*) FROM holds h JOIN seats s ON s.seat_id = h.seat_id
        WHERE h.user_id = p_user_id AND h.order_id IS NULL AND h.expires_at > now()
          AND s.event_id = v_event_id)
       + (SELECT count(*) FROM holds h JOIN seats s ON s.seat_id = h.seat_id
          WHERE h.user_id = p_user_id AND h.order_id IS NOT NULL AND NOT h.sold
            AND s.event_id = v_event_id) >= p_max THEN
        RETURN QUERY SELECT NULL::bigint, NULL::timestamptz, true;
        RETURN;
    END IF;
    RETURN QUERY
    INSERT INTO holds (seat_id, user_id, expires_at)
    VALUES (p_seat_id, p_user_id, now() + make_interval(secs => p_ttl_secs))
    RETURNING holds.hold_id, holds.expires_at, false;
END
$$;
