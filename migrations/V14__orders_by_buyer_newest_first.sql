-- `GET /orders` and `orders list`: a buyer's orders, newest first, a page
-- at a time, each page starting after the last (created_at, order_id) of
-- the one before. This index hands them over in that order from the
-- buyer's first entry, so a page costs its own rows whatever the buyer's
-- history; on Citus it is made on every shard of `orders`.
CREATE INDEX orders_by_buyer_newest_idx ON orders (user_id, created_at DESC, order_id DESC);
