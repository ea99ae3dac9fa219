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
-- The seat side (events, seats, holds) stays on the coordinator. A seat is
-- contended by every buyer, so it cannot live on a buyer's shard; as a
-- reference table, every write of a hold or an order takes a lock on the
-- whole table on every node (another buyer waited 3.1 s behind one open
-- order); distributed by seat, the order statement and the seat map can no
-- longer be planned. They are Citus-managed local tables, not plain ones:
-- Citus then knows when a transaction wrote them, and a keyed hold (hold
-- and answer) or a settlement (order, holds, answer) commits on the
-- coordinator and the worker with two-phase commit, all or nothing
-- (docs/decisions/0006-citus-seat-side.md).
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
    -- The seat side, with seats and events by their foreign keys.
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'holds'::regclass) THEN
        PERFORM citus_add_local_table_to_metadata('holds', cascade_via_foreign_keys => true);
        -- Citus restarts the identity sequences of a table it takes over.
        PERFORM setval(pg_get_serial_sequence('holds', 'hold_id'), max(hold_id)) FROM holds
            HAVING max(hold_id) IS NOT NULL;
        PERFORM setval(pg_get_serial_sequence('seats', 'seat_id'), max(seat_id)) FROM seats
            HAVING max(seat_id) IS NOT NULL;
    END IF;
END
$$;
