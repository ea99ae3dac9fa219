-- What the caller's settlement of a linked effect says, kept on the key
-- row itself (`idempotency_settled`, called in the settlement's
-- transaction), so that the engine's own statements decide from the row
-- alone whether an expired key may be restarted or deleted, and whether a
-- purge may forget it:
--
-- - `effect_settled`: the linked effect has its outcome. Until then the
--   key outlives its TTL: the cleanup keeps it, a new request does not
--   restart it, a purge refuses it.
-- - `keep_answer`: the effect settled without leaving anything behind (a
--   declined payment), so the key's answer is all that stops a retry from
--   making it again: a purge refuses it until the key expires.
--
-- A row written before this migration has no such word from its caller:
-- its answer is kept until the key expires (the column's default for the
-- rows already there, read from the catalog without rewriting the table,
-- then false for every new row), and an effect it still links counts as
-- settling until the key is answered.
ALTER TABLE idempotency_keys
    ADD COLUMN effect_settled boolean NOT NULL DEFAULT false,
    ADD COLUMN keep_answer boolean NOT NULL DEFAULT true;
ALTER TABLE idempotency_keys ALTER COLUMN keep_answer SET DEFAULT false;
