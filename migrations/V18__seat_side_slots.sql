-- The seat side gets the key a distributed database spreads it by, so that
-- one event's seats and holds, and every decision about them, are in one
-- place: each event has a `slot` (0-4095), and its seats and their holds
-- carry it. A seat's or a hold's id carries its slot too, in bits 40-51
-- (`checkout_seat_side_id`, migrations/functions/checkout.sql), so that a
-- request naming either is routed with no lookup.
--
-- On one PostgreSQL every slot is 0 (`checkout_event_slot`) and every id
-- is what its sequence gave, as before: nothing changes for a request. The
-- columns are added with a constant default, which rewrites no table.
-- On Citus the seat side stays on the coordinator for now
-- (scripts/citus-distribute.sql), every slot 0 there too.
ALTER TABLE events ADD COLUMN slot integer NOT NULL DEFAULT 0;
ALTER TABLE seats ADD COLUMN slot integer NOT NULL DEFAULT 0;
ALTER TABLE holds ADD COLUMN slot integer NOT NULL DEFAULT 0;

-- The hold's function takes the seat's slot first (on Citus, the argument
-- it is delegated by); its body lives in migrations/functions/checkout.sql.
DROP FUNCTION checkout_place_hold(bigint, text, float8, bigint);
