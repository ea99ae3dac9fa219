-- Smaller key rows: one is written for every click and kept for a day.
--
-- The answer's headers are no longer kept as text. Its Content-Type is one
-- of the two this service sends (JSON, or a problem), so a flag says which;
-- its Location, when it has one, names the order that the row already holds
-- in `order_id`, so a flag says whether it has one. The claim token becomes
-- 64 bits instead of 128: it only has to tell apart the claims of one key.
-- The columns are ordered by alignment, widest first, so that no row pays
-- for padding between them.
--
-- PostgreSQL cannot reorder columns in place: the table is rebuilt, with its
-- rows, under a lock that holds off every request until it is done.
-- Instances of the previous version fail their key statements once this has
-- run (with 500s, storing nothing): replace them all.

LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE;

CREATE TABLE idempotency_keys_compact (
    created_at             timestamptz NOT NULL DEFAULT now(),
    -- Who may finish the intent, and until when (lease and takeover).
    lease_expires_at       timestamptz NOT NULL,
    claim_token            bigint NOT NULL,
    -- The order this intent made, once it exists: a takeover resumes it.
    order_id               uuid,
    -- NULL while in progress; then the answer, replayed byte for byte:
    -- status, body, `Content-Type: application/problem+json` (else
    -- `application/json`), and `Location: /orders/{order_id}` or none.
    response_status        smallint,
    response_is_problem    boolean,
    response_locates_order boolean,
    user_id                text NOT NULL,
    key                    text NOT NULL,
    request_hash           bytea NOT NULL,
    response_body          bytea,
    CONSTRAINT idempotency_keys_location_names_order
        CHECK (NOT response_locates_order OR order_id IS NOT NULL)
);

INSERT INTO idempotency_keys_compact (
    created_at, lease_expires_at, claim_token, order_id, response_status,
    response_is_problem, response_locates_order, user_id, key, request_hash,
    response_body)
SELECT created_at, lease_expires_at,
       -- Any value will do for a claim's new token, as long as no two claims
       -- of a key share one: the upper half of the old one, as a number.
       ('x' || left(replace(claim_token::text, '-', ''), 16))::bit(64)::bigint,
       order_id, response_status,
       response_content_type = 'application/problem+json',
       response_location IS NOT NULL,
       user_id, key, request_hash, response_body
FROM idempotency_keys;

DROP TABLE idempotency_keys;
ALTER TABLE idempotency_keys_compact RENAME TO idempotency_keys;

-- Constraints after the copy: checked once over all rows, not row by row.
-- One row per (buyer, key): the primary key decides every race.
ALTER TABLE idempotency_keys ADD PRIMARY KEY (user_id, key);
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_order_id_fkey
    FOREIGN KEY (order_id) REFERENCES orders (order_id) DEFERRABLE INITIALLY DEFERRED;
CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys (created_at);
