-- A declined order keeps Payrail's reason (`decline_code`, bounded by the
-- service to the codes it knows, or `other`; NULL when none was heard, as
-- from Payrail's event). A click's answer is made from its order alone, so
-- every settlement path makes the same bytes: the click whose settlement
-- lost to reconciliation's answers what reconciliation stored on its key,
-- and a takeover that finds its order settled answers with the reason the
-- first holder heard. Before, an answer made again from the order had lost
-- the reason, and a click's first answer could differ from its replays.
ALTER TABLE orders ADD COLUMN decline_code text;

-- V10's settlement, recording the reason with the status. Its callers
-- outside a claim that have no reason (the give-up's `failed`) leave it out.
DROP FUNCTION checkout_settle_order(text, uuid, text, text);
CREATE FUNCTION checkout_settle_order(
    p_user_id text, p_order_id uuid, p_status text, p_charge_id text,
    p_decline_code text DEFAULT NULL
)
RETURNS SETOF orders
LANGUAGE plpgsql
AS $$
DECLARE
    settled orders;
BEGIN
    UPDATE orders
    SET status = p_status, charge_id = p_charge_id, decline_code = p_decline_code,
        updated_at = now()
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

-- V7's settlement of a claimed click, passing the reason on.
DROP FUNCTION checkout_settle_claimed(text, text, bigint, smallint, text, text, bytea,
                                      uuid, text, text);
CREATE FUNCTION checkout_settle_claimed(
    p_user_id text, p_key text, p_claim_token bigint,
    p_status smallint, p_content_type text, p_location text, p_body bytea,
    p_order_id uuid, p_order_status text, p_charge_id text,
    p_decline_code text DEFAULT NULL
)
RETURNS TABLE (held boolean, settled boolean)
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM checkout_settle_order(p_user_id, p_order_id, p_order_status, p_charge_id,
                                         p_decline_code);
    settled := FOUND;
    held := false;
    IF settled THEN
        held := idempotency_store(p_user_id, p_key, p_claim_token,
                                  p_status, p_content_type, p_location, p_body);
    END IF;
    RETURN NEXT;
END
$$;
