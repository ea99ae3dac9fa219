-- A caller that settles its linked effect and stores the intent's answer
-- in one transaction says how the effect settled with the answer
-- (`idempotency_store`'s `p_keep_answer`), so that the key row is written
-- once, not first by `idempotency_settled` and then again by the store.
-- The store's body lives in migrations/functions/idempotency.sql, applied
-- after the versioned migrations; this form is dropped because its
-- arguments change (on a new database it is not made yet).
DROP FUNCTION IF EXISTS idempotency_store(text, text, bigint, smallint, text, text, bytea, text);
