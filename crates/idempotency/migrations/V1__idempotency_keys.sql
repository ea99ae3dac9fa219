-- The key table: one row per (scope, key), where the scope is the caller's
-- user or tenant. The primary key decides every race.
--
-- IF NOT EXISTS: a service that kept this table under its own migrations
-- before the engine had any (stagedoor-checkout's V3 rebuilt it into exactly
-- this shape) records this migration as applied without a change.
--
-- Ready to be distributed by `user_id` (Citus): the scope is in the primary
-- key and in every statement, and nothing here references another table.
-- Columns are ordered by alignment, widest first, so no row pays for padding.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    created_at            timestamptz NOT NULL DEFAULT now(),
    -- Who may finish the intent, and until when (lease and takeover).
    lease_expires_at      timestamptz NOT NULL,
    claim_token           bigint NOT NULL,
    -- NULL while in progress; then the answer, replayed byte for byte.
    response_status       smallint,
    user_id               text NOT NULL,
    key                   text NOT NULL,
    request_hash          bytea NOT NULL,
    -- The durable effect this intent made that is still settling (an order's
    -- id, say): a takeover resumes it instead of making another.
    effect                text,
    response_content_type text,
    response_location     text,
    response_body         bytea,
    CONSTRAINT idempotency_keys_pkey PRIMARY KEY (user_id, key),
    CONSTRAINT idempotency_keys_answer_complete
        CHECK ((response_status IS NULL) = (response_content_type IS NULL))
);

CREATE INDEX IF NOT EXISTS idempotency_keys_created_at_idx ON idempotency_keys (created_at);
