-- The key table becomes the idempotency engine's (crates/idempotency), whose
-- own migration creates it in this exact shape on a database that has none.
--
-- What changes: the key no longer points at `orders` by a foreign key (the
-- engine knows no table of the service's, and a distributed table could not
-- keep the reference): `order_id` becomes the generic `effect`, the id of
-- the effect still settling, as text. The stored answer keeps its headers
-- as they were sent instead of as flags only this service could read:
-- `response_content_type` and `response_location`.
--
-- Every stored answer stays replayable byte for byte: the flags are turned
-- back into the headers they meant. As with V2, the table is rebuilt (so the
-- columns keep the engine's alignment order) under a lock that holds off
-- every request until it is done; instances of the previous version fail
-- their key statements once this has run (500s, storing nothing): replace
-- them all.

LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE;

CREATE TABLE idempotency_keys_engine (
    created_at            timestamptz NOT NULL DEFAULT now(),
    lease_expires_at      timestamptz NOT NULL,
    claim_token           bigint NOT NULL,
    response_status       smallint,
    user_id               text NOT NULL,
    key                   text NOT NULL,
    request_hash          bytea NOT NULL,
    effect                text,
    response_content_type text,
    response_location     text,
    response_body         bytea
);

INSERT INTO idempotency_keys_engine (
    created_at, lease_expires_at, claim_token, response_status, user_id, key,
    request_hash, effect, response_content_type, response_location, response_body)
SELECT created_at, lease_expires_at, claim_token, response_status, user_id, key,
       request_hash, order_id::text,
       CASE WHEN response_status IS NULL THEN NULL
            WHEN response_is_problem THEN 'application/problem+json'
            ELSE 'application/json' END,
       CASE WHEN response_locates_order THEN '/orders/' || order_id::text END,
       response_body
FROM idempotency_keys;

DROP TABLE idempotency_keys;
ALTER TABLE idempotency_keys_engine RENAME TO idempotency_keys;

ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (user_id, key);
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_answer_complete
    CHECK ((response_status IS NULL) = (response_content_type IS NULL));
CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys (created_at);
