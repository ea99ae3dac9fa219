-- The checkout's layout on a Citus cluster, applied after the migrations
-- (scripts/citus.sh; the Citus test profile). Running it again changes
-- nothing.
--
-- A click's rows are the buyer's: `orders` and `idempotency_keys` are
-- distributed by `user_id`, co-located, so the claim, the order, the
-- settlement and the answer of one click are on one shard of one worker.
-- The engine's claim function goes with them, delegated by the buyer, and
-- so does the outbox of order events (`order_events`), which the
-- settlement writes with the order.
--
-- The seat side is the events': `events`, `seats` and `holds` are
-- distributed by the event's `slot` (migrations/V18), co-located, so that a
-- seat's exclusion constraint, a buyer's hold cap on an event and an
-- event's seat map are each decided on one shard of one worker, and the
-- hold's function goes there whole, delegated by the slot. Every key of
-- theirs leads with the slot: the primary keys, a seat's label, the
-- exclusion constraint and the foreign keys from holds to seats to events,
-- which Citus keeps within a shard group. A click's two steps then commit
-- on the buyer's worker and the event's, with a two-phase commit that one
-- of them coordinates when they differ
-- (docs/decisions/0018-seat-side-by-event.md).
--
-- A cluster laid out before that (the seat side as Citus-managed local
-- tables on the coordinator, decisions/0006) is left as it is, said in a
-- NOTICE: it keeps working, every slot 0, with its seat side on the
-- coordinator.
DO $$
DECLARE
    signature text;
BEGIN
    -- One connection per worker for all of it: Citus refuses a local
    -- table's takeover after the parallel shard creation of the tables
    -- before it, in one transaction.
    PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'orders'::regclass) THEN
        PERFORM create_distributed_table('orders', 'user_id');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'idempotency_keys'::regclass) THEN
        PERFORM create_distributed_table('idempotency_keys', 'user_id', colocate_with => 'orders');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'order_events'::regclass) THEN
        PERFORM create_distributed_table('order_events', 'user_id', colocate_with => 'orders');
    END IF;
    -- The seat side, by slot, before the functions: the hold's is
    -- delegated by its slot, co-located with the holds.
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'holds'::regclass) THEN
        ALTER TABLE holds DROP CONSTRAINT holds_seat_id_fkey;
        ALTER TABLE seats DROP CONSTRAINT seats_event_id_fkey;
        ALTER TABLE holds DROP CONSTRAINT holds_pkey, ADD PRIMARY KEY (slot, hold_id);
        ALTER TABLE holds DROP CONSTRAINT holds_one_per_seat,
            ADD CONSTRAINT holds_one_per_seat EXCLUDE USING gist (
                slot WITH =,
                seat_id WITH =,
                tstzrange(created_at, CASE WHEN order_id IS NULL THEN expires_at ELSE 'infinity' END) WITH &&
            );
        ALTER TABLE seats DROP CONSTRAINT seats_pkey, ADD PRIMARY KEY (slot, seat_id);
        ALTER TABLE seats DROP CONSTRAINT seats_event_id_label_key,
            ADD CONSTRAINT seats_event_id_label_key UNIQUE (slot, event_id, label);
        ALTER TABLE events DROP CONSTRAINT events_pkey, ADD PRIMARY KEY (slot, event_id);
        ALTER TABLE seats ADD CONSTRAINT seats_event_id_fkey
            FOREIGN KEY (slot, event_id) REFERENCES events (slot, event_id);
        ALTER TABLE holds ADD CONSTRAINT holds_seat_id_fkey
            FOREIGN KEY (slot, seat_id) REFERENCES seats (slot, seat_id);
        PERFORM create_distributed_table('events', 'slot');
        PERFORM create_distributed_table('seats', 'slot', colocate_with => 'events');
        PERFORM create_distributed_table('holds', 'slot', colocate_with => 'events');
    ELSIF EXISTS (SELECT 1 FROM pg_dist_partition
                  WHERE logicalrelid = 'holds'::regclass AND partmethod = 'n') THEN
        RAISE NOTICE 'the seat side is on the coordinator (the layout of decisions/0006): left as it is';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_dist_partition
               WHERE logicalrelid = 'holds'::regclass AND partmethod = 'h')
       AND NOT EXISTS (SELECT 1 FROM pg_dist_object
                       WHERE objid = 'checkout_place_hold(integer,bigint,text,float8,bigint)'::regprocedure
                         AND distribution_argument_index IS NOT NULL) THEN
        PERFORM create_distributed_function(
            'checkout_place_hold(integer,bigint,text,float8,bigint)'::regprocedure, '$1',
            colocate_with => 'holds');
    END IF;
    -- The claim runs whole on the worker that holds the buyer's shard: its
    -- first argument is the key's `user_id`. So do what it calls there:
    -- the insert and read it shares with a step's opening, and the fence
    -- of a claim won by its token; and so does an answer's write called on
    -- its own (a refusal's answer, outside any transaction). A step that
    -- opens the claim (checkout_place_order) or stores its answer calls
    -- them from the coordinator, where each statement goes to the worker
    -- of its rows. (The engine's functions,
    -- crates/idempotency/migrations/functions/idempotency.sql.)
    FOREACH signature IN ARRAY ARRAY[
        'idempotency_claim(text,text,bytea,bigint,float8,float8)',
        'idempotency_open(text,text,bytea,bigint,float8,float8)',
        'idempotency_lock_claim(text,text,bigint)',
        'idempotency_store(text,text,bigint,smallint,text,text,bytea,text,boolean)'
    ] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_object
                       WHERE objid = signature::regprocedure
                         AND distribution_argument_index IS NOT NULL) THEN
            PERFORM create_distributed_function(signature::regprocedure, '$1',
                                                colocate_with => 'idempotency_keys');
        END IF;
    END LOOP;
    -- Every other function of the service and of the engine is on every
    -- node too, undelegated: a buyer's step is sent to the buyer's worker
    -- (database.route_to_workers) and called there. Citus copies a
    -- function to the workers by itself only when nothing it depends on
    -- stops it (checkout_settle_order returns rows of `orders`).
    FOR signature IN
        SELECT p.oid::regprocedure::text FROM pg_proc p
         WHERE p.pronamespace = 'public'::regnamespace
           AND (p.proname LIKE 'checkout\_%' OR p.proname LIKE 'idempotency\_%')
           AND NOT EXISTS (SELECT 1 FROM pg_dist_object o
                            WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid)
    LOOP
        PERFORM create_distributed_function(signature::regprocedure);
    END LOOP;
END
$$;
