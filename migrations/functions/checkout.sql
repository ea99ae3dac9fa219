-- The checkout's functions, as they are now: every body lives here alone
-- and is applied with CREATE OR REPLACE after the versioned migrations
-- (which keep the tables, indexes and types), whenever this file changed
-- (`db::migrate`). A change of a function's arguments or result needs a
-- versioned migration that drops the old form first.
--
-- A click's writing steps are functions because they touch both the
-- buyer's rows (`orders`, `order_events`, `idempotency_keys`) and the seat
-- side (`holds`, `seats`). On Citus the buyer's rows live on the buyer's
-- shard and the seat side on its event's (scripts/citus-distribute.sql):
-- in a function each statement goes whole to the node of its rows, and
-- the commit spans those two workers alone, where one CTE over both was
-- planned as subplans sent to every worker. On one
-- PostgreSQL each step is one call, one round trip and one commit. The
-- key's own writes are the engine's functions
-- (crates/idempotency/migrations/functions/idempotency.sql).

-- The slot of a new event: 0 on one PostgreSQL; once the seat side is
-- distributed by slot (scripts/citus-distribute.sql), 12 bits of the
-- hash of its id, which the service computes the same way to route a
-- request naming the event (`idempotency::hashtext`). An event keeps the
-- slot it was made with.
CREATE OR REPLACE FUNCTION checkout_event_slot(p_event_id text)
RETURNS integer
LANGUAGE plpgsql
STABLE
AS $$
BEGIN
    -- Nested: a condition on a catalog table one PostgreSQL does not have
    -- must not be planned there.
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
                   WHERE logicalrelid = 'events'::regclass AND partmethod = 'h') THEN
            RETURN hashtext(p_event_id) & 4095;
        END IF;
    END IF;
    RETURN 0;
END
$$;

-- The id of a new seat or hold of slot `p_slot` from `p_number`, what the
-- table's sequence gave: the slot in bits 40-51, so that the id alone
-- routes a request, and the number under it. On a Citus worker a sequence
-- starts at the worker's group << 48 (where it would make ids past 2^53,
-- which a browser's JSON cannot hold): the group goes to bits 32-39, and
-- a worker numbers 2^32 ids before it would meet another's (the key
-- (slot, id) refuses it then). On one PostgreSQL, and for the seats the
-- coordinator numbers, slot and group are 0 and the id is the number.
CREATE OR REPLACE FUNCTION checkout_seat_side_id(p_slot integer, p_number bigint)
RETURNS bigint
LANGUAGE sql
IMMUTABLE
AS $$
    SELECT (p_slot::bigint << 40) | (((p_number >> 48) << 32) + (p_number & 281474976710655))
$$;

-- The slots of seat-side ids, each once, in order.
CREATE OR REPLACE FUNCTION checkout_slots(p_ids bigint[])
RETURNS integer[]
LANGUAGE sql
IMMUTABLE
AS $$
    SELECT array_agg(DISTINCT (id >> 40)::integer ORDER BY (id >> 40)::integer)
    FROM unnest(p_ids) AS id
$$;

-- Holds `p_seat_id` (of slot `p_slot`) for `p_user_id` for `p_ttl_secs`, unless the buyer
-- already has `p_max` seats of the seat's event: live holds no order has
-- taken, plus holds in orders still waiting for their payment (whatever
-- their `expires_at`: an order keeps its seats until it settles). Then one
-- row with `over_limit` and nothing written. No row when there is no such
-- seat. A seat held by someone else raises the exclusion violation of
-- `holds_one_per_seat`, as a plain insert does.
--
-- Racers for one seat queue on its row lock first (src/checkout/holds.rs
-- says why). Then one buyer's holds on one event queue on an advisory lock
-- of that pair, held to the end of the transaction (a keyed hold's unit
-- commits its answer with it): the count runs after it is granted, and a
-- function's statement takes a fresh snapshot under READ COMMITTED, so it
-- sees every hold of that buyer committed before. The two-key form keeps
-- these locks apart from the single-key ones of migrations and cleanup.
--
-- A hold is in a pending order exactly when it has an `order_id` and is
-- not `sold`, so the count reads holds alone, never `orders` (the buyer's
-- rows, which on Citus are on another shard), each part through its
-- partial index on the buyer; every statement names the slot, so that on
-- Citus the call runs whole on the slot's shard.
CREATE OR REPLACE FUNCTION checkout_place_hold(
    p_slot integer, p_seat_id bigint, p_user_id text, p_ttl_secs float8, p_max bigint
)
RETURNS TABLE (new_hold_id bigint, new_expires_at timestamptz, over_limit boolean)
LANGUAGE plpgsql
AS $$
DECLARE
    v_event_id text;
BEGIN
    SELECT s.event_id INTO v_event_id FROM seats s
    WHERE s.slot = p_slot AND s.seat_id = p_seat_id
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext(v_event_id), hashtext(p_user_id));
    IF (SELECT count(*) FROM holds h JOIN seats s ON s.slot = h.slot AND s.seat_id = h.seat_id
        WHERE h.slot = p_slot AND h.user_id = p_user_id AND h.order_id IS NULL
          AND h.expires_at > now() AND s.event_id = v_event_id)
       + (SELECT count(*) FROM holds h JOIN seats s ON s.slot = h.slot AND s.seat_id = h.seat_id
          WHERE h.slot = p_slot AND h.user_id = p_user_id AND h.order_id IS NOT NULL
            AND NOT h.sold AND s.event_id = v_event_id) >= p_max THEN
        RETURN QUERY SELECT NULL::bigint, NULL::timestamptz, true;
        RETURN;
    END IF;
    RETURN QUERY
    INSERT INTO holds (slot, hold_id, seat_id, user_id, expires_at)
    OVERRIDING SYSTEM VALUE
    VALUES (p_slot, checkout_seat_side_id(p_slot, nextval('holds_hold_id_seq')), p_seat_id,
            p_user_id, now() + make_interval(secs => p_ttl_secs))
    RETURNING holds.hold_id, holds.expires_at, false;
END
$$;

-- The order itself, with no key: the buyer's live holds locked in id order
-- (as every writer of holds locks them) and claimed, and the order written,
-- all or nothing. `all_held` is false, and nothing written, when a hold is
-- not the buyer's to order. The holds are locked a slot at a time, in
-- slot order, which is id order too (an id carries its slot in its high
-- bits): on Citus a statement that locks rows must stay on one shard.
CREATE OR REPLACE FUNCTION checkout_make_order(
    p_user_id text, p_key text, p_order_id uuid, p_hold_ids bigint[], p_currency text,
    p_payment_method text
)
RETURNS TABLE (all_held boolean, created_at timestamptz, amount_cents bigint, seats text[])
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_slots integer[] := checkout_slots(p_hold_ids);
    v_slot integer;
    n_held bigint := 0;
    amount bigint := 0;
    held_ids bigint[] := '{}';
    labels text[] := '{}';
    slot_held bigint;
    slot_amount bigint;
    slot_ids bigint[];
    slot_labels text[];
BEGIN
    FOREACH v_slot IN ARRAY v_slots LOOP
        WITH mine AS (
            SELECT h.hold_id, s.label, s.price_cents
            FROM holds h JOIN seats s ON s.slot = h.slot AND s.seat_id = h.seat_id
            WHERE h.slot = v_slot AND h.hold_id = ANY (p_hold_ids) AND h.user_id = p_user_id
              AND h.order_id IS NULL AND h.expires_at > now()
            ORDER BY h.hold_id
            FOR UPDATE OF h
        )
        SELECT count(*), sum(price_cents)::bigint, array_agg(hold_id), array_agg(label)
        INTO slot_held, slot_amount, slot_ids, slot_labels
        FROM mine;
        n_held := n_held + slot_held;
        amount := amount + coalesce(slot_amount, 0);
        held_ids := held_ids || slot_ids;
        labels := labels || slot_labels;
    END LOOP;
    all_held := n_held = cardinality(p_hold_ids);
    IF all_held THEN
        -- The seats' labels in the order's own order (on Citus an insert
        -- into a distributed table takes no subquery).
        labels := ARRAY(SELECT l FROM unnest(held_ids, labels) AS h (id, l)
                        ORDER BY array_position(p_hold_ids, id));
        UPDATE holds SET order_id = p_order_id
        WHERE slot = ANY (v_slots) AND hold_id = ANY (p_hold_ids);
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

-- A click's order step, which is the click's claim too
-- (`idempotency::Opening`): one call and one commit make the key, take the
-- buyer's holds, write the order and link it to the key. The key's insert
-- comes first and decides (the first six arguments and `claim` are the
-- engine's `idempotency_open`): a call that does not win the key touches
-- no hold and no order, and returns the key's row for the engine to answer
-- from. The order is linked so that a takeover resumes it.
CREATE OR REPLACE FUNCTION checkout_place_order(
    p_user_id text, p_key text, p_request_hash bytea, p_claim_token bigint,
    p_lease_secs float8, p_ttl_secs float8,
    p_order_id uuid, p_hold_ids bigint[], p_currency text, p_payment_method text
)
RETURNS TABLE (claim idempotency_claim_row, all_held boolean, created_at timestamptz,
               amount_cents bigint, seats text[])
LANGUAGE plpgsql
AS $$
BEGIN
    claim := idempotency_open(p_user_id, p_key, p_request_hash, p_claim_token,
                              p_lease_secs, p_ttl_secs);
    IF claim.won THEN
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

-- Settles a pending order (a declined or failed one gives its holds back,
-- a declined one keeps Payrail's reason) and returns it; no row when it
-- was settled already, or is being canceled and this is a charge answer,
-- or is not and this is `failed`. The order row is locked first, its holds
-- next, as every writer of both does.
--
-- The shop hears every outcome: when, and only when, the update moved the
-- order out of `payment_pending`, its event (`order_events`) is inserted
-- in the same call, hence the same transaction, on every path that settles
-- (the click, a takeover, Payrail's event, reconciliation, the give-up): a
-- transactional outbox that `jobs::outcomes` delivers.
--
-- The click's key, which links the order until its answer is stored, is
-- told last (`idempotency_settled`): from then on it no longer outlives
-- its TTL for the order's sake, and an order that was not paid gave its
-- holds back, so the key's answer is all that stops a retry of the click
-- from ordering and charging again: a purge keeps it until it expires.
-- Not when `p_key_told_by_caller`: the caller stores the click's answer
-- next and says it there, so the key row is written once.
CREATE OR REPLACE FUNCTION checkout_settle_order(
    p_user_id text, p_order_id uuid, p_status text, p_charge_id text,
    p_decline_code text DEFAULT NULL, p_key_told_by_caller boolean DEFAULT false
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
    WHERE slot = ANY (checkout_slots(settled.hold_ids)) AND hold_id = ANY (settled.hold_ids)
      AND order_id = p_order_id;
    INSERT INTO order_events (user_id, order_id, event_id, type)
    VALUES (p_user_id, p_order_id, 'evt_' || replace(gen_random_uuid()::text, '-', ''),
            'order.' || p_status);
    IF NOT p_key_told_by_caller THEN
        PERFORM idempotency_settled(p_user_id, settled.idempotency_key, p_order_id::text,
                                    p_status <> 'paid');
    END IF;
    RETURN NEXT settled;
END
$$;

-- A claimed click's settlement (`idempotency::Storing`): the order settled
-- as above, then, only if this call moved it, the click's answer stored on
-- its key while the claim holds (`held`), with what the settlement says of
-- the key. The key row is written last, and once; told apart only when the
-- claim was lost, so that the key stops outliving its TTL for the order.
-- An order someone else settled first leaves `held` saying whether its
-- answer was stored on the key while this claim held it (Payrail's event
-- ahead of Payrail's answer): the click then answers first; otherwise it
-- stores the answer itself if it still can, or replays the taker's.
CREATE OR REPLACE FUNCTION checkout_settle_claimed(
    p_user_id text, p_key text, p_claim_token bigint,
    p_status smallint, p_content_type text, p_location text, p_body bytea,
    p_order_id uuid, p_order_status text, p_charge_id text,
    p_decline_code text DEFAULT NULL
)
RETURNS TABLE (held boolean, settled boolean)
LANGUAGE plpgsql
AS $$
DECLARE
    order_key text;
    keep_answer boolean := p_order_status <> 'paid';
BEGIN
    SELECT o.idempotency_key INTO order_key
    FROM checkout_settle_order(p_user_id, p_order_id, p_order_status, p_charge_id,
                               p_decline_code, true) o;
    settled := FOUND;
    IF settled THEN
        held := idempotency_store(p_user_id, p_key, p_claim_token,
                                  p_status, p_content_type, p_location, p_body,
                                  p_keep_answer => keep_answer);
        IF NOT held THEN
            PERFORM idempotency_settled(p_user_id, order_key, p_order_id::text, keep_answer);
        END IF;
    ELSE
        held := idempotency_answered_while_held(p_user_id, p_key, p_claim_token);
    END IF;
    RETURN NEXT;
END
$$;
