-- The order's two writing steps as functions (src/checkout/orders):
-- making the order and settling it each touch the buyer's rows (`orders`,
-- `idempotency_keys`) and the seat side (`holds`, `seats`). On Citus the
-- buyer's rows live on a worker and the seat side on the coordinator
-- (scripts/citus-distribute.sql); one CTE over both was planned as
-- subplans whose intermediate results went to both workers, each of which
-- then took part in the two-phase commit. In a function each statement
-- goes whole to the node of its rows, and the commit spans the coordinator
-- and the buyer's worker alone. On one PostgreSQL each step is still one
-- call. The key's own writes are the engine's functions (its V4).

-- Settles a pending order (a declined or failed one gives its holds back)
-- and returns it; no row when it was settled already, or is being canceled
-- and this is a charge answer, or is not and this is `failed`. The order
-- row is locked first, its holds next, as every writer of both does.
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
    RETURN NEXT settled;
END
$$;

-- A claimed click's order (`Linking::function`): the buyer's live holds
-- locked in id order and claimed, the order written and linked to the key,
-- all or nothing, and nothing at all once the claim is lost. `all_held`
-- is false, and nothing written, when a hold is not the buyer's to order.
CREATE OR REPLACE FUNCTION checkout_place_order(
    p_user_id text, p_key text, p_claim_token bigint, p_effect text,
    p_order_id uuid, p_hold_ids bigint[], p_currency text, p_payment_method text
)
RETURNS TABLE (held boolean, all_held boolean, created_at timestamptz,
               amount_cents bigint, seats text[])
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    n_held bigint;
    amount bigint;
    labels text[];
BEGIN
    held := idempotency_lock_claim(p_user_id, p_key, p_claim_token);
    IF NOT held THEN
        RETURN NEXT;
        RETURN;
    END IF;
    WITH mine AS (
        SELECT h.hold_id, s.label, s.price_cents
        FROM holds h JOIN seats s ON s.seat_id = h.seat_id
        WHERE h.hold_id = ANY (p_hold_ids) AND h.user_id = p_user_id
          AND h.order_id IS NULL AND h.expires_at > now()
        ORDER BY h.hold_id
        FOR UPDATE OF h
    )
    SELECT count(*), sum(price_cents)::bigint,
           array_agg(label ORDER BY array_position(p_hold_ids, hold_id))
    INTO n_held, amount, labels
    FROM mine;
    all_held := n_held = cardinality(p_hold_ids);
    IF all_held THEN
        UPDATE holds SET order_id = p_order_id WHERE hold_id = ANY (p_hold_ids);
        INSERT INTO orders (order_id, user_id, status, amount_cents, currency,
                            payment_method, hold_ids, seats, idempotency_key)
        VALUES (p_order_id, p_user_id, 'payment_pending', amount, p_currency,
                p_payment_method, p_hold_ids, labels, p_key)
        RETURNING orders.created_at, orders.amount_cents, orders.seats
        INTO created_at, amount_cents, seats;
        PERFORM idempotency_link(p_user_id, p_key, p_claim_token, p_effect);
    END IF;
    RETURN NEXT;
END
$$;

-- A claimed click's settlement (`Storing::function`): the order settled
-- with Payrail's decision whoever holds the key now, and the answer stored
-- on the key last, only if this call settled it and while the claim holds.
CREATE OR REPLACE FUNCTION checkout_settle_claimed(
    p_user_id text, p_key text, p_claim_token bigint,
    p_status smallint, p_content_type text, p_location text, p_body bytea,
    p_order_id uuid, p_order_status text, p_charge_id text
)
RETURNS TABLE (held boolean, settled boolean)
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM checkout_settle_order(p_user_id, p_order_id, p_order_status, p_charge_id);
    settled := FOUND;
    held := false;
    IF settled THEN
        held := idempotency_store(p_user_id, p_key, p_claim_token,
                                  p_status, p_content_type, p_location, p_body);
    END IF;
    RETURN NEXT;
END
$$;
