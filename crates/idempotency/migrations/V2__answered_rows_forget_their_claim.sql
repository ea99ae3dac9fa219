-- An answered key needs its claim no more: nothing takes over, fences or
-- resumes a key that has its answer, so the answer's write clears the claim
-- token, the lease and the linked effect (the answer names the effect
-- itself, if the caller's answers do). That is about a tenth of every row
-- of a table that holds a day of clicks (docs/PERFORMANCE.md of
-- stagedoor-checkout, `key_row_bytes`).
ALTER TABLE idempotency_keys ALTER COLUMN claim_token DROP NOT NULL;
ALTER TABLE idempotency_keys ALTER COLUMN lease_expires_at DROP NOT NULL;

-- A key in progress still carries both. NOT VALID: every row written so far
-- has both, and a validating scan of the whole table would hold its lock
-- for as long as the scan takes; every write from now on is checked.
ALTER TABLE idempotency_keys
    ADD CONSTRAINT idempotency_keys_claim_complete
        CHECK (response_status IS NOT NULL OR (claim_token IS NOT NULL AND lease_expires_at IS NOT NULL))
        NOT VALID;
