-- The click's order step returns the claim as the engine's one type
-- (`claim idempotency_claim_row`, the engine's V6) beside its own columns.
-- Its body, with every other function's, lives in
-- migrations/functions/checkout.sql, applied after the versioned
-- migrations; this form is dropped because its result changes.
DROP FUNCTION checkout_place_order(text, text, bytea, bigint, float8, float8, uuid, bigint[],
                                   text, text);
