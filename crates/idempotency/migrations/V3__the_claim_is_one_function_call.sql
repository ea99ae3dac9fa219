-- The claim (`store::claim`) as one function call: the key's insert, and
-- when it lost, the read of the row it lost to.
--
-- One call is one round trip on any PostgreSQL. On a table distributed by
-- `user_id` (Citus), the function distributed with `user_id` as its
-- distribution argument, co-located with the table, runs whole on the
-- worker that holds the caller's shard: a single-statement CTE of the same
-- insert and read is planned as two subplans joined on the coordinator, and
-- a `set_config` in it reaches only the coordinator.
--
-- The insert commits without waiting for its WAL flush (`synchronous_commit`
-- off for this transaction only, on the node that writes the row): nothing
-- outside the database acts on a claim until the work's own transaction
-- commits, and that commit waits for a flush that covers this insert's
-- record too. A crash in between loses a claim that left nothing behind, so
-- the retry starts afresh, as after a release.
--
-- The read runs after the insert, with a snapshot of its own: it sees the
-- row the insert lost to, which was committed by then. A row that vanished
-- in between (cleanup) reads as a row of NULLs, and the caller looks again.
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
#variable_conflict use_column
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO idempotency_keys (user_id, key, request_hash, claim_token, lease_expires_at)
    VALUES (p_user_id, p_key, p_request_hash, p_claim_token,
            now() + make_interval(secs => p_lease_secs))
    ON CONFLICT (user_id, key) DO NOTHING;
    IF FOUND THEN
        won := true;
        RETURN NEXT;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT false, k.request_hash, k.claim_token, k.response_status,
               k.response_content_type, k.response_location, k.response_body,
               k.created_at <= now() - make_interval(secs => p_ttl_secs),
               COALESCE(k.lease_expires_at <= now(), false),
               extract(epoch FROM k.created_at + make_interval(secs => p_ttl_secs) - now())::float8
        FROM idempotency_keys AS k
        WHERE k.user_id = p_user_id AND k.key = p_key;
    IF NOT FOUND THEN
        won := false;
        RETURN NEXT;
    END IF;
END
$$;
