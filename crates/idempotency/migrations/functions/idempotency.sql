-- The engine's functions, as they are now: every body lives here alone and
-- is applied with CREATE OR REPLACE after the versioned migrations (which
-- keep the tables, indexes and types), whenever this file changed
-- (`idempotency::migrate`). A change of a function's arguments or result
-- needs a versioned migration that drops the old form first.
--
-- Each call is one round trip on any PostgreSQL. On a table distributed by
-- `user_id` (Citus), a function distributed with `user_id` as its
-- distribution argument runs whole on the worker that holds the caller's
-- shard; from a function that is not, each statement goes whole to the
-- node of its rows, and the commit spans only those nodes.

-- The claim's insert, and when the insert lost, the read of the row it
-- lost to, as the type `idempotency_claim_row`. The read runs after the
-- insert, with a snapshot of its own: it sees the row the insert lost to,
-- which was committed by then. A row that vanished in between (cleanup)
-- reads as a row of NULLs, and the caller looks again.
--
-- A row that this very token already holds, unanswered and with nothing
-- linked yet (a key past its TTL restarted by this request, or an
-- abandoned claim it took over before anything was linked), is won as
-- well: it is locked, so that the writes of a step that opens with this
-- call (`idempotency::Opening`) are fenced as a linked effect's are.
--
-- It leaves the commit as it is: a step's effect needs the usual durable
-- commit.
CREATE OR REPLACE FUNCTION idempotency_open(
    p_user_id text,
    p_key text,
    p_request_hash bytea,
    p_claim_token bigint,
    p_lease_secs float8,
    p_ttl_secs float8
)
RETURNS idempotency_claim_row
LANGUAGE plpgsql
AS $$
DECLARE
    seen idempotency_keys;
    claim idempotency_claim_row;
BEGIN
    INSERT INTO idempotency_keys (user_id, key, request_hash, claim_token, lease_expires_at)
    VALUES (p_user_id, p_key, p_request_hash, p_claim_token,
            now() + make_interval(secs => p_lease_secs))
    ON CONFLICT (user_id, key) DO NOTHING;
    claim.won := FOUND;
    IF claim.won THEN
        RETURN claim;
    END IF;
    SELECT * INTO seen FROM idempotency_keys AS k
    WHERE k.user_id = p_user_id AND k.key = p_key;
    IF FOUND THEN
        IF seen.claim_token = p_claim_token AND seen.response_status IS NULL
           AND seen.effect IS NULL THEN
            claim.won := idempotency_lock_claim(p_user_id, p_key, p_claim_token);
        END IF;
        claim.request_hash := seen.request_hash;
        claim.claim_token := seen.claim_token;
        claim.response_status := seen.response_status;
        claim.response_content_type := seen.response_content_type;
        claim.response_location := seen.response_location;
        claim.response_body := seen.response_body;
        claim.expired := seen.created_at <= now() - make_interval(secs => p_ttl_secs);
        claim.lease_over := COALESCE(seen.lease_expires_at <= now(), false);
        claim.life_secs := extract(epoch FROM seen.created_at + make_interval(secs => p_ttl_secs)
                                              - now())::float8;
    END IF;
    RETURN claim;
END
$$;

-- The claim without a step (`store::claim`): `idempotency_open`, committed
-- without waiting for its WAL flush (`synchronous_commit` off for this
-- transaction only, on the node that writes the row). Nothing outside the
-- database acts on a claim until the work's own transaction commits, and
-- that commit waits for a flush that covers this insert's record too. A
-- crash in between loses a claim that left nothing behind, so the retry
-- starts afresh, as after a release.
CREATE OR REPLACE FUNCTION idempotency_claim(
    p_user_id text,
    p_key text,
    p_request_hash bytea,
    p_claim_token bigint,
    p_lease_secs float8,
    p_ttl_secs float8
)
RETURNS idempotency_claim_row
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN idempotency_open(p_user_id, p_key, p_request_hash, p_claim_token,
                            p_lease_secs, p_ttl_secs);
END
$$;

-- The key's writes after the claim, for a caller's step written as a
-- function (`idempotency::Opening`, `idempotency::Storing`) and for the
-- engine's own statements (`Unit::link`, `Unit::store`). The key row is
-- locked before any write of a linking step, and written last in a
-- storing step: the order every writer of both keeps.

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

-- Links the effect the caller made and that settles later, while the
-- claim holds and has none yet: a takeover then resumes this effect
-- instead of making a second one. False when the claim was lost.
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

-- Marks the effect `p_effect` that the key links as settled, in the
-- caller's transaction that settles it; `p_keep_answer` when it settled
-- without leaving anything behind (a declined payment), so that the key's
-- answer must outlive a purge until the key expires. False when the key
-- no longer links that effect.
CREATE OR REPLACE FUNCTION idempotency_settled(
    p_user_id text, p_key text, p_effect text, p_keep_answer boolean
)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE idempotency_keys SET effect_settled = true, keep_answer = p_keep_answer
    WHERE user_id = p_user_id AND key = p_key AND effect = p_effect;
    RETURN FOUND;
END
$$;

-- Stores the intent's answer, the one write of an answer: while the claim
-- `p_claim_token` holds, or, for a settlement made outside any claim (a
-- reconciliation job) with no token, while the key still links the effect
-- `p_effect` that was settled. An answered key is never taken over, fenced
-- or resumed again, so its lease goes with the write, and so does the
-- link: the outcome settled the effect. So does the token of a claim that
-- stored its own answer; an answer stored from outside keeps the token of
-- the claim that held the key then, because that claim's request, when it
-- finds its effect settled, still gives the key's first answer
-- (`idempotency_answered_while_held`), and no other request does. False
-- when there was nothing to store on.
--
-- `p_keep_answer`, from a caller that settled the linked effect in this
-- same transaction, is what it would have told `idempotency_settled` (the
-- link goes with the write, so only the answer's keeping is left to say):
-- the key row is written once. NULL leaves what the key already says.
CREATE OR REPLACE FUNCTION idempotency_store(
    p_user_id text, p_key text, p_claim_token bigint,
    p_status smallint, p_content_type text, p_location text, p_body bytea,
    p_effect text DEFAULT NULL, p_keep_answer boolean DEFAULT NULL
)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE idempotency_keys
    SET response_status = p_status, response_content_type = p_content_type,
        response_location = p_location, response_body = p_body,
        claim_token = CASE WHEN p_claim_token IS NULL THEN claim_token END,
        lease_expires_at = NULL, effect = NULL,
        keep_answer = coalesce(p_keep_answer, keep_answer)
    WHERE user_id = p_user_id AND key = p_key AND response_status IS NULL
      AND CASE WHEN p_claim_token IS NULL THEN effect = p_effect
               ELSE claim_token = p_claim_token END;
    RETURN FOUND;
END
$$;

-- Whether the key was answered from outside while the claim
-- `p_claim_token` held it (a settlement that came ahead of the claim's
-- own): then the answer is still that claim's to give first. A storing
-- step that finds its outcome made by someone else returns this as
-- `held` (`idempotency::Storing`). False for a claim that was taken over
-- first: the taker gives the first answer, and this request a replay.
CREATE OR REPLACE FUNCTION idempotency_answered_while_held(
    p_user_id text, p_key text, p_claim_token bigint
)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM idempotency_keys
    WHERE user_id = p_user_id AND key = p_key
      AND claim_token = p_claim_token AND response_status IS NOT NULL;
    RETURN FOUND;
END
$$;
