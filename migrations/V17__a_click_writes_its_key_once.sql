-- A click's settlement wrote its key row twice: `checkout_settle_order`
-- told the key that its order settled (`idempotency_settled`), then the
-- store of the click's answer wrote the same row again, two versions of
-- one row in one transaction on every first click. The click's settlement
-- now says it with the answer it stores (`idempotency_store`'s
-- `p_keep_answer`, the engine's V8), and the order's settlement takes
-- whether the caller does so. Its body lives in
-- migrations/functions/checkout.sql; this form is dropped because its
-- arguments change.
DROP FUNCTION checkout_settle_order(text, uuid, text, text, text);
