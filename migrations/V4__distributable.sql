-- A schema a distributed PostgreSQL (Citus) can spread by buyer: orders and
-- idempotency keys distributed by `user_id` (scripts/citus-distribute.sql),
-- the seat side wherever it is best kept. On a single PostgreSQL nothing
-- changes for a request: every statement already names the buyer.
--
-- - `orders` is keyed by `(user_id, order_id)`: a distributed table's
--   unique keys must include its distribution column. An order id is still
--   made by the service (a random UUID) and never reused.
-- - `holds` no longer references `orders`: a table on the coordinator
--   cannot reference a distributed one. The order statement, which claims
--   the holds and writes the order in one statement, keeps them consistent.
-- - `holds.sold`: whether the hold's order is paid, so that the seat map
--   tells `sold` from `held` without reading orders, which would ask every
--   shard. Settlement sets it with the order's status.
--
-- Every stored answer stays as it is: the key table does not change.

ALTER TABLE holds DROP CONSTRAINT holds_order_id_fkey;

ALTER TABLE orders DROP CONSTRAINT orders_pkey;
ALTER TABLE orders ADD CONSTRAINT orders_pkey PRIMARY KEY (user_id, order_id);

ALTER TABLE holds ADD COLUMN sold boolean NOT NULL DEFAULT false;
UPDATE holds h SET sold = true
FROM orders o
WHERE o.user_id = h.user_id AND o.order_id = h.order_id AND o.status = 'paid';
