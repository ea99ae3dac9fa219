-- The claim's row as one type: what the claim and a step's opening return
-- (`won`, then the key's row as the claim read it), declared once. The
-- functions themselves now live in migrations/functions/idempotency.sql,
-- applied after the versioned migrations; the forms below are dropped
-- because their results change (a row of this type, and the answer's write
-- also fenced by the effect it settles), which CREATE OR REPLACE cannot do.
CREATE TYPE idempotency_claim_row AS (
    won boolean,
    request_hash bytea,
    claim_token bigint,
    response_status smallint,
    response_content_type text,
    response_location text,
    response_body bytea,
    expired boolean,
    lease_over boolean,
    life_secs float8
);

DROP FUNCTION idempotency_claim(text, text, bytea, bigint, float8, float8);
DROP FUNCTION idempotency_open(text, text, bytea, bigint, float8, float8);
DROP FUNCTION idempotency_store(text, text, bigint, smallint, text, text, bytea);
