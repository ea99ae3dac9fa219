-- The engine's writes of a one-statement unit, as functions that an
-- endpoint's own PL/pgSQL function calls (`Linking::function`,
-- `Storing::function`): for a step whose tables live on different nodes
-- (Citus: the buyer's rows on a worker, a shared table on the
-- coordinator). A CTE over both is planned as subplans whose intermediate
-- results go to every node of the step; a function's statements are each
-- sent whole to the node of their rows, and its commit spans only those
-- nodes. On one PostgreSQL it is still one call, one round trip and one
-- commit.
--
-- The same fences as the CTE form (`statement.rs`), in the same order:
-- the key row is locked before any write of a linking step, and written
-- last in a storing step.

-- Locks the key row while this claim holds it and has linked nothing yet;
-- false when it was lost, and then the caller writes nothing.
CREATE OR REPLACE FUNCTION idempotency_lock_claim(p_user_id text, p_key text, p_claim_token bigint)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM idempotency_keys
    WHERE user_id = p_user_id AND key = p_key AND claim_token = p_claim_token
      AND response_status IS NULL AND effect IS NULL
    FOR UPDATE;
    RETURN FOUND;
END
$$;

-- Links the effect the caller made, after `idempotency_lock_claim` held.
CREATE OR REPLACE FUNCTION idempotency_link(
    p_user_id text, p_key text, p_claim_token bigint, p_effect text
)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE idempotency_keys SET effect = p_effect
    WHERE user_id = p_user_id AND key = p_key AND claim_token = p_claim_token
      AND response_status IS NULL AND effect IS NULL;
    RETURN FOUND;
END
$$;

-- Stores the intent's answer while the claim holds; the outcome settled
-- the effect, so the key forgets its link. False when the claim was lost.
CREATE OR REPLACE FUNCTION idempotency_store(
    p_user_id text, p_key text, p_claim_token bigint,
    p_status smallint, p_content_type text, p_location text, p_body bytea
)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE idempotency_keys
    SET response_status = p_status, response_content_type = p_content_type,
        response_location = p_location, response_body = p_body,
        claim_token = NULL, lease_expires_at = NULL, effect = NULL
    WHERE user_id = p_user_id AND key = p_key AND claim_token = p_claim_token
      AND response_status IS NULL;
    RETURN FOUND;
END
$$;
