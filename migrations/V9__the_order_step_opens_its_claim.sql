-- A click's order step is the click's claim too (`idempotency::Opening`):
-- one call and one commit make the key, take the buyer's holds, write the
-- order and link it to the key, where the claim used to be a call and a
-- commit of its own before them. The key's insert still comes first and
-- still decides: a call that does not win the key touches no hold and no
-- order, and returns the key's row for the engine to answer from.
--
-- The one form of the step, on one PostgreSQL and on Citus alike (the
-- CTE form it replaces measured no faster on one PostgreSQL; on Citus
-- each statement here goes whole to the node of its rows, and the commit
-- spans the coordinator and the buyer's worker alone).
DROP FUNCTION checkout_place_order(text, text, bigint, text, uuid, bigint[], text, text);

-- The order itself, with no key: the buyer's live holds locked in id order
-- (as every writer of holds locks them) and claimed, and the order written,
-- all or nothing. `all_held` is false, and nothing written, when a hold is
-- not the buyer's to order.
CREATE FUNCTION checkout_make_order(
    p_user_id text, p_key text, p_order_id uuid, p_hold_ids bigint[], p_currency text,
    p_payment_method text
)
RETURNS TABLE (all_held boolean, created_at timestamptz, amount_cents bigint, seats text[])
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    n_held bigint;
    amount bigint;
    labels text[];
BEGIN
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
    END IF;
    RETURN NEXT;
END
$$;

-- The click's step: the claim (the first six arguments and the first ten
-- columns are the engine's, `idempotency_open`), then, only if it won, the
-- order, linked to the key so that a takeover resumes it.
CREATE FUNCTION checkout_place_order(
    p_user_id text, p_key text, p_request_hash bytea, p_claim_token bigint,
    p_lease_secs float8, p_ttl_secs float8,
    p_order_id uuid, p_hold_ids bigint[], p_currency text, p_payment_method text
)
RETURNS TABLE (won boolean, request_hash bytea, claim_token bigint,
               response_status smallint, response_content_type text,
               response_location text, response_body bytea,
               expired boolean, lease_over boolean, life_secs float8,
               all_held boolean, created_at timestamptz, amount_cents bigint,
               seats text[])
LANGUAGE plpgsql
AS $$
BEGIN
    SELECT * INTO won, request_hash, claim_token, response_status, response_content_type,
                  response_location, response_body, expired, lease_over, life_secs
    FROM idempotency_open(p_user_id, p_key, p_request_hash, p_claim_token,
                          p_lease_secs, p_ttl_secs);
    IF won THEN
        SELECT * INTO all_held, created_at, amount_cents, seats
        FROM checkout_make_order(p_user_id, p_key, p_order_id, p_hold_ids, p_currency,
                                 p_payment_method);
        IF all_held THEN
            PERFORM idempotency_link(p_user_id, p_key, p_claim_token, p_order_id::text);
        END IF;
    END IF;
    RETURN NEXT;
END
$$;
