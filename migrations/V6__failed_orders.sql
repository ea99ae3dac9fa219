-- A payment Payrail never decides still ends: after `reconcile.give_up_secs`
-- the service cancels the charge's key at Payrail and, once Payrail has
-- confirmed, the order is `failed` (its holds given back, its click
-- answered 402 `payment-failed`).
--
-- - `cancel_requested_at`: set, while the order is still pending, before the
--   cancel is first sent. From then on no charge answer (a late 201, an
--   event) may settle the order: only the cancel's confirmation does, so a
--   charge refunded by the cancel can never belong to a paid order.
-- - `orders_order_id_idx`: Payrail's events name an order by its id alone
--   (`reference`), without the buyer that leads the primary key.

ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check
    CHECK (status IN ('payment_pending', 'paid', 'declined', 'failed'));

ALTER TABLE orders ADD COLUMN cancel_requested_at timestamptz;

CREATE INDEX orders_order_id_idx ON orders (order_id);
