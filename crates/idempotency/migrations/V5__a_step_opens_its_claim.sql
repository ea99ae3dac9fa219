-- The claim as the first statement of the caller's step (`Opening`): a
-- step written as a PL/pgSQL function starts with `idempotency_open`, and
-- makes its effect only when that says `won`. A first click is then one
-- call and one commit for its key, its effect and the effect's link,
-- where the claim alone used to be a call and a commit of its own.
--
-- `idempotency_open` is the claim's insert, and when the insert lost, the
-- read of the row it lost to (a row that vanished in between reads as a
-- row of NULLs, and the caller looks again). A row that this very token
-- already holds, unanswered and with nothing linked yet (a key past its
-- TTL restarted by this request, or an abandoned claim it took over
-- before anything was linked), is won as well: it is locked, so that the
-- step's writes are fenced as a linked effect's are (V4).
--
-- It leaves the commit as it is: the step's effect needs the usual
-- durable commit. `idempotency_claim`, the claim without a step, is the
-- same call with its relaxed commit (V3 says why that one may).
CREATE OR REPLACE FUNCTION idempotency_open(
    p_user_id text,
    p_key text,
    p_request_hash bytea,
    p_claim_token bigint,
    p_lease_secs float8,
    p_ttl_secs float8
)
RETURNS TABLE (
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
)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    seen idempotency_keys;
BEGIN
    INSERT INTO idempotency_keys (user_id, key, request_hash, claim_token, lease_expires_at)
    VALUES (p_user_id, p_key, p_request_hash, p_claim_token,
            now() + make_interval(secs => p_lease_secs))
    ON CONFLICT (user_id, key) DO NOTHING;
    won := FOUND;
    IF won THEN
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT * INTO seen FROM idempotency_keys AS k
    WHERE k.user_id = p_user_id AND k.key = p_key;
    IF FOUND THEN
        IF seen.claim_token = p_claim_token AND seen.response_status IS NULL
           AND seen.effect IS NULL THEN
            won := idempotency_lock_claim(p_user_id, p_key, p_claim_token);
        END IF;
        request_hash := seen.request_hash;
        claim_token := seen.claim_token;
        response_status := seen.response_status;
        response_content_type := seen.response_content_type;
        response_location := seen.response_location;
        response_body := seen.response_body;
        expired := seen.created_at <= now() - make_interval(secs => p_ttl_secs);
        lease_over := COALESCE(seen.lease_expires_at <= now(), false);
        life_secs := extract(epoch FROM seen.created_at + make_interval(secs => p_ttl_secs)
                                        - now())::float8;
    END IF;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION idempotency_claim(
    p_user_id text,
    p_key text,
    p_request_hash bytea,
    p_claim_token bigint,
    p_lease_secs float8,
    p_ttl_secs float8
)
RETURNS TABLE (
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
)
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY SELECT * FROM idempotency_open(p_user_id, p_key, p_request_hash,
                                                p_claim_token, p_lease_secs, p_ttl_secs);
END
$$;
