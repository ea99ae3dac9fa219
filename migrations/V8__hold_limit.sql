-- A buyer's live holds on one event are capped (`holds.max_per_buyer`),
-- across instances: otherwise one buyer holds every seat of an event and
-- re-holds each as it expires. The cap is decided here, in the statement
-- that makes the hold, so that two holds racing at the limit cannot both
-- pass.

-- Counts a buyer's live, unordered holds without reading every hold.
CREATE INDEX holds_live_by_buyer_idx ON holds (user_id, expires_at) WHERE order_id IS NULL;

-- Holds `p_seat_id` for `p_user_id` for `p_ttl_secs`, unless the buyer has
-- `p_max` live holds on the seat's event that no order has taken yet: then
-- one row with `over_limit` and nothing written. No row when there is no
-- such seat. A seat held by someone else raises the exclusion violation of
-- `holds_one_per_seat`, as a plain insert does.
--
-- Racers for one seat queue on its row lock first (src/checkout/holds.rs
-- says why). Then one buyer's holds on one event queue on an advisory lock
-- of that pair, held to the end of the transaction (a keyed hold's unit
-- commits its answer with it): the count runs after it is granted, and a
-- function's statement takes a fresh snapshot under READ COMMITTED, so it
-- sees every hold of that buyer committed before. The two-key form keeps
-- these locks apart from the single-key ones of migrations and cleanup.
CREATE FUNCTION checkout_place_hold(
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
