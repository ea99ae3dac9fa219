//! The engine on its own, against a real PostgreSQL (a database per test):
//! a toy effect table, the engine's migration and nothing of any service.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use idempotency::cleanup::{Cleanup, Swept};
use idempotency::{
    Claim, ClaimKind, Committed, Done, Engine, Error, Fence, IdempotencyKey, Opening, Outcome,
    Policy, Reply, RequestHash, RunError, StoredResponse, Storing, Unit,
};
use test_support::db::TestDatabase;
use test_support::paused::Paused;
use tokio::sync::Barrier;

const DAY: Duration = Duration::from_secs(86_400);

struct Toy {
    _db: Arc<TestDatabase>,
    pool: Pool,
}

/// A fresh database with the engine's table and a toy effect: one row per
/// `bump`, which a retry must never add twice.
async fn toy() -> Toy {
    let db = TestDatabase::create().await;
    let mut client = db.client().await;
    assert_eq!(idempotency::migrate(&mut client).await.unwrap(), 8);
    assert_eq!(idempotency::migrate(&mut client).await.unwrap(), 0);
    client
        .batch_execute(
            "CREATE TABLE bumps (bump_id bigint GENERATED ALWAYS AS IDENTITY, note text)",
        )
        .await
        .unwrap();
    let pool = db.pool(16);
    Toy { _db: db, pool }
}

impl Toy {
    fn engine(&self, lease: Duration, ttl: Duration) -> Engine {
        Engine::new(self.pool.clone(), Policy { ttl, lease })
    }

    async fn bumps(&self) -> i64 {
        let client = self.pool.get().await.unwrap();
        client
            .query_one("SELECT count(*) FROM bumps", &[])
            .await
            .unwrap()
            .get(0)
    }

    /// The toy endpoint's work: one row and its answer, in one unit.
    async fn bump(&self, claim: &Claim) -> Result<Done, Error> {
        let mut client = self.pool.get().await?;
        let unit = Unit::begin(claim, &mut client).await?;
        let row = unit
            .tx()
            .query_one(
                "INSERT INTO bumps (note) VALUES ('bump') RETURNING bump_id",
                &[],
            )
            .await?;
        let id: i64 = row.get(0);
        let answer =
            StoredResponse::new(201, "application/json", format!("{{\"bump\":{id}}}").into())
                .with_location(format!("/bumps/{id}"));
        let fence = unit.store(&answer).await?;
        Ok(unit.finish(fence).await?.answered(answer))
    }
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::parse(text.as_bytes()).unwrap()
}

fn hash(body: &str) -> RequestHash {
    RequestHash::of("POST", "/bumps", body.as_bytes())
}

#[tokio::test]
async fn a_retry_gets_the_first_answer_byte_for_byte_and_the_work_runs_once() {
    let toy = &toy().await;
    let engine = toy.engine(Duration::from_secs(30), DAY);
    let (k, h) = (key("click-1"), hash("{}"));
    let first = engine
        .run("alice", &k, &h, None, Duration::ZERO, |claim| async move {
            toy.bump(&claim).await
        })
        .await
        .map(|ran| ran.reply)
        .unwrap();
    let Reply::First(answer) = first else {
        panic!("the first request does the work: {first:?}");
    };
    assert_eq!(answer.location.as_deref(), Some("/bumps/1"));
    let again = engine
        .run("alice", &k, &h, None, Duration::ZERO, |claim| async move {
            toy.bump(&claim).await
        })
        .await
        .map(|ran| ran.reply)
        .unwrap();
    assert!(
        matches!(again, Reply::Replay(ref replay) if *replay == answer),
        "{again:?}"
    );
    assert_eq!(toy.bumps().await, 1);
}

#[tokio::test]
async fn the_same_key_with_another_request_or_of_another_user_is_no_replay() {
    let toy = &toy().await;
    let engine = toy.engine(Duration::from_secs(30), DAY);
    let k = key("click-1");
    let run = |user: &'static str, body: &'static str| {
        let (engine, toy, k) = (&engine, &toy, &k);
        async move {
            engine
                .run(
                    user,
                    k,
                    &hash(body),
                    None,
                    Duration::ZERO,
                    |claim| async move { toy.bump(&claim).await },
                )
                .await
                .map(|ran| ran.reply)
                .unwrap()
        }
    };
    assert!(matches!(run("alice", "{}").await, Reply::First(_)));
    assert!(matches!(run("alice", "{\"x\":1}").await, Reply::KeyReused));
    assert!(
        matches!(run("bob", "{}").await, Reply::First(_)),
        "bob's key is his own"
    );
    assert_eq!(toy.bumps().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_run_the_work_once() {
    let toy = Arc::new(toy().await);
    let engine = toy.engine(Duration::from_secs(30), DAY);
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let seen = outcomes.clone();
    let engine = engine.on_outcome(move |outcome| seen.lock().unwrap().push(outcome));
    let barrier = Arc::new(Barrier::new(32));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (toy, engine, barrier) = (toy.clone(), engine.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                engine
                    .run(
                        "alice",
                        &key("storm"),
                        &hash("{}"),
                        None,
                        Duration::ZERO,
                        |claim| async move {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            toy.bump(&claim).await
                        },
                    )
                    .await
                    .map(|ran| ran.reply)
                    .unwrap()
            })
        })
        .collect();
    let mut first = 0;
    for task in tasks {
        match task.await.unwrap() {
            Reply::First(_) => first += 1,
            Reply::Replay(_) | Reply::InProgress { .. } => {}
            Reply::KeyReused | Reply::Limited(_) => panic!("neither reused nor limited"),
        }
    }
    assert_eq!(first, 1);
    assert_eq!(toy.bumps().await, 1);
    let outcomes = outcomes.lock().unwrap();
    assert_eq!(outcomes.len(), 32, "one outcome per request");
    assert_eq!(outcomes.iter().filter(|o| **o == Outcome::First).count(), 1);
}

/// The claim's function (`idempotency_claim`) decides every case: a new
/// key, its replay, a reused key, a storm of duplicates, a lease run out, a
/// TTL run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_claims_function_decides_every_case() {
    let toy = Arc::new(toy().await);
    let engine = toy.engine(Duration::from_secs(1), DAY);
    let (k, h) = (key("click-1"), hash("{}"));
    let bump = |claim: Claim| {
        let toy = toy.clone();
        async move { toy.bump(&claim).await }
    };
    let Reply::First(answer) = engine
        .run("alice", &k, &h, None, Duration::ZERO, bump)
        .await
        .map(|ran| ran.reply)
        .unwrap()
    else {
        panic!("a new key does the work");
    };
    let again = engine
        .run("alice", &k, &h, None, Duration::ZERO, bump)
        .await
        .map(|ran| ran.reply)
        .unwrap();
    assert!(
        matches!(again, Reply::Replay(ref r) if *r == answer),
        "{again:?}"
    );
    let reused = engine
        .run("alice", &k, &hash("{\"x\":1}"), None, Duration::ZERO, bump)
        .await
        .map(|ran| ran.reply);
    assert!(matches!(reused.unwrap(), Reply::KeyReused));

    // Copies of the answered request at once, and one different request
    // among them: every copy is a replay (copies share their key's read),
    // the other one is refused.
    let barrier = Arc::new(Barrier::new(17));
    let retries: Vec<_> = (0..17)
        .map(|n| {
            let (engine, barrier, k) = (engine.clone(), barrier.clone(), k.clone());
            let h = if n == 16 { hash("{\"x\":1}") } else { h };
            tokio::spawn(async move {
                barrier.wait().await;
                let never = |_| async { Err::<Done, _>("an answered key does no work") };
                engine
                    .run("alice", &k, &h, None, Duration::ZERO, never)
                    .await
                    .map(|ran| ran.reply)
                    .unwrap()
            })
        })
        .collect();
    for (n, retry) in retries.into_iter().enumerate() {
        match retry.await.unwrap() {
            Reply::Replay(ref r) if n < 16 && *r == answer => {}
            Reply::KeyReused if n == 16 => {}
            other => panic!("copy {n} answered {other:?}"),
        }
    }

    let barrier = Arc::new(Barrier::new(16));
    let storm: Vec<_> = (0..16)
        .map(|_| {
            let (engine, barrier) = (engine.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                Paused::start(&engine, "alice", &key("storm"), &hash("{}"))
                    .await
                    .map(Paused::crash)
            })
        })
        .collect();
    let mut claimed = Vec::new();
    for task in storm {
        if let Ok(claim) = task.await.unwrap() {
            claimed.push(claim);
        }
    }
    assert_eq!(claimed.len(), 1, "one claim of 16 duplicates");

    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let Ok(taker) = Paused::start(&engine, "alice", &key("storm"), &hash("{}"))
        .await
        .map(Paused::crash)
    else {
        panic!("a takeover after the lease");
    };
    assert_eq!(taker.kind, ClaimKind::Abandoned);
    assert!(matches!(toy.bump(&claimed[0]).await.unwrap(), Done::Fenced));

    let short = toy.engine(Duration::from_secs(30), Duration::from_secs(1));
    let Ok(expired) = Paused::start(&short, "alice", &k, &hash("{\"y\":2}"))
        .await
        .map(Paused::crash)
    else {
        panic!("a key past its TTL is a new intent");
    };
    assert_eq!(expired.kind, ClaimKind::Expired);
    assert_eq!(toy.bumps().await, 1);
}

#[tokio::test]
async fn a_claim_that_lost_its_lease_commits_nothing_and_the_taker_does_the_work() {
    let toy = &toy().await;
    let engine = toy.engine(Duration::from_secs(1), DAY);
    let (k, h) = (key("paused"), hash("{}"));
    let Ok(paused) = Paused::start(&engine, "alice", &k, &h)
        .await
        .map(Paused::crash)
    else {
        panic!("first claim");
    };
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let Ok(taker) = Paused::start(&engine, "alice", &k, &h)
        .await
        .map(Paused::crash)
    else {
        panic!("a takeover after the lease");
    };
    assert_eq!(taker.kind, ClaimKind::Abandoned);

    // The paused request wakes up: its unit rolls back, effect and all.
    assert!(matches!(toy.bump(&paused).await.unwrap(), Done::Fenced));
    assert_eq!(toy.bumps().await, 0);
    assert!(matches!(toy.bump(&taker).await.unwrap(), Done::Stored(_)));
    assert_eq!(toy.bumps().await, 1);
    assert!(matches!(
        Paused::start(&engine, "alice", &k, &h)
            .await
            .map(Paused::crash),
        Err(Reply::Replay(_))
    ));
}

#[tokio::test]
async fn a_takeover_resumes_the_linked_effect_instead_of_making_another() {
    let toy = &toy().await;
    let engine = toy.engine(Duration::from_secs(1), DAY);
    let (k, h) = (key("settling"), hash("{}"));
    let Ok(crashed) = Paused::start(&engine, "alice", &k, &h)
        .await
        .map(Paused::crash)
    else {
        panic!("first claim");
    };
    {
        let mut client = toy.pool.get().await.unwrap();
        let unit = Unit::begin(&crashed, &mut client).await.unwrap();
        unit.tx()
            .execute("INSERT INTO bumps (note) VALUES ('effect-7')", &[])
            .await
            .unwrap();
        let fence = unit.link("effect-7").await.unwrap();
        assert_eq!(fence, Fence::Held);
        assert_eq!(unit.finish(fence).await.unwrap(), Committed::Done);
    }
    // ...and the request dies here, before the effect settled.
    assert!(matches!(
        Paused::start(&engine, "alice", &k, &h)
            .await
            .map(Paused::crash),
        Err(Reply::InProgress { .. })
    ));
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let Ok(taker) = Paused::start(&engine, "alice", &k, &h)
        .await
        .map(Paused::crash)
    else {
        panic!("a takeover after the lease");
    };
    assert_eq!(taker.effect.as_deref(), Some("effect-7"));

    // A job that settles the effect outside any claim stores its answer.
    let client = toy.pool.get().await.unwrap();
    let answer = StoredResponse::new(200, "text/plain", b"settled".to_vec());
    assert!(
        idempotency::store_for_effect(&client, "alice", "settling", "effect-7", &answer)
            .await
            .unwrap()
    );
    assert!(matches!(
        Paused::start(&engine, "alice", &k, &h).await.map(Paused::crash),
        Err(Reply::Replay(ref replay)) if *replay == answer
    ));
}

#[tokio::test]
async fn a_failure_that_is_no_answer_gives_the_key_back_unless_an_effect_is_linked() {
    let toy = &toy().await;
    let engine = toy.engine(Duration::from_secs(30), DAY);
    let (k, h) = (key("flaky"), hash("{}"));
    let failed = engine
        .run("alice", &k, &h, None, Duration::ZERO, |_| async {
            Err::<Done, _>("payment timeout")
        })
        .await
        .map(|ran| ran.reply);
    assert!(matches!(failed, Err(RunError::Work("payment timeout"))));
    let calls = AtomicUsize::new(0);
    let retried = engine
        .run("alice", &k, &h, None, Duration::ZERO, |claim| {
            calls.fetch_add(1, Ordering::SeqCst);
            let toy = &toy;
            async move { toy.bump(&claim).await }
        })
        .await
        .map(|ran| ran.reply)
        .unwrap();
    assert!(
        matches!(retried, Reply::First(_)),
        "the retry starts afresh"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // With an effect linked, a failure leaves the key in progress.
    let (k, h) = (key("linked"), hash("{}"));
    let failed = engine
        .run("alice", &k, &h, None, Duration::ZERO, |claim| async move {
            let mut client = toy.pool.get().await.unwrap();
            let unit = Unit::begin(&claim, &mut client).await.unwrap();
            let fence = unit.link("effect-1").await.unwrap();
            unit.finish(fence).await.unwrap();
            Err::<Done, _>("payment timeout")
        })
        .await
        .map(|ran| ran.reply);
    assert!(failed.is_err());
    assert!(matches!(
        Paused::start(&engine, "alice", &k, &h)
            .await
            .map(Paused::crash),
        Err(Reply::InProgress { .. })
    ));
}

#[tokio::test]
async fn a_key_past_its_ttl_is_a_new_intent_and_the_cleanup_deletes_it() {
    let toy = &toy().await;
    let engine = toy.engine(Duration::from_secs(30), Duration::from_secs(1));
    for n in 0..5 {
        let reply = engine
            .run(
                "alice",
                &key(&format!("old-{n}")),
                &hash("{}"),
                None,
                Duration::ZERO,
                |claim| async move { toy.bump(&claim).await },
            )
            .await
            .map(|ran| ran.reply)
            .unwrap();
        assert!(matches!(reply, Reply::First(_)));
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let reply = engine
        .run(
            "alice",
            &key("old-0"),
            &hash("{\"another\":true}"),
            None,
            Duration::ZERO,
            |claim| async move {
                assert_eq!(claim.kind, ClaimKind::Expired);
                toy.bump(&claim).await
            },
        )
        .await
        .map(|ran| ran.reply)
        .unwrap();
    assert!(
        matches!(reply, Reply::First(_)),
        "never a 422 nor a stale replay"
    );

    let cleanup = Cleanup::new(toy.pool.clone(), Duration::from_secs(1));
    assert_eq!(cleanup.run().await.unwrap(), Swept::Deleted(4));
    assert_eq!(cleanup.run().await.unwrap(), Swept::Deleted(0));
    assert!(
        matches!(
            Paused::start(&engine, "alice", &key("old-0"), &hash("{\"another\":true}"))
                .await
                .map(Paused::crash),
            Err(Reply::Replay(_))
        ),
        "the key restarted a moment ago survives"
    );
}

const BUMP: &str = "SELECT (step.claim).*, step.* FROM bump($1, $2, $3, $4, $5, $6, $7) AS step";

/// The toy's effect as steps of one call: `bump` opens the claim and links
/// the bump it makes, `note` records an outcome and stores the answer.
async fn one_call_steps(toy: &Toy) -> (Opening, Storing) {
    toy.pool
        .get()
        .await
        .unwrap()
        .batch_execute(
            "CREATE FUNCTION bump(p_user_id text, p_key text, p_request_hash bytea,
                                  p_claim_token bigint, p_lease_secs float8,
                                  p_ttl_secs float8, p_note text)
             RETURNS TABLE (claim idempotency_claim_row, bump_id bigint)
             LANGUAGE plpgsql AS $$
             BEGIN
                 claim := idempotency_open(p_user_id, p_key, p_request_hash, p_claim_token,
                                           p_lease_secs, p_ttl_secs);
                 IF claim.won THEN
                     INSERT INTO bumps (note) VALUES (p_note) RETURNING bumps.bump_id INTO bump_id;
                     PERFORM idempotency_link(p_user_id, p_key, p_claim_token,
                                              'bump-' || bump_id);
                 END IF;
                 RETURN NEXT;
             END $$;
             CREATE FUNCTION note(p_user_id text, p_key text, p_claim_token bigint,
                                  p_status smallint, p_content_type text, p_location text,
                                  p_body bytea, p_note text)
             RETURNS TABLE (held boolean, noted bigint) LANGUAGE plpgsql AS $$
             BEGIN
                 UPDATE bumps SET note = p_note;
                 GET DIAGNOSTICS noted = ROW_COUNT;
                 IF noted > 0 THEN
                     held := idempotency_store(p_user_id, p_key, p_claim_token,
                                               p_status, p_content_type, p_location, p_body);
                 ELSE
                     held := idempotency_answered_while_held(p_user_id, p_key, p_claim_token);
                 END IF;
                 RETURN NEXT;
             END $$;",
        )
        .await
        .unwrap();
    (
        Opening::new(BUMP, vec![Box::new("opened")]),
        Storing::new("SELECT * FROM note($1, $2, $3, $4, $5, $6, $7, $8)"),
    )
}

/// A first request's claim and its first step are one call: the bump is
/// made and linked with the key, and a duplicate's call, which loses the
/// insert, makes nothing and is told the key is in progress.
#[tokio::test]
async fn an_opening_step_is_made_with_the_claim_and_not_by_a_duplicate() {
    let toy = &toy().await;
    let (bump, _) = one_call_steps(toy).await;
    let engine = toy.engine(Duration::from_secs(30), DAY);
    let (k, h) = (key("opened"), hash("{}"));
    let (opened_tx, opened_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (engine, bump, k) = (engine.clone(), &bump, k.clone());
        async move {
            engine
                .run(
                    "alice",
                    &k,
                    &h,
                    Some(bump),
                    Duration::ZERO,
                    |claim| async move {
                        let row = claim.opened().expect("the claim's call ran the step");
                        let _ = opened_tx.send(row.get::<_, Option<i64>>("bump_id"));
                        let _ = go_rx.await;
                        Ok::<_, Error>(Done::Answer(StoredResponse::new(200, "text/plain", vec![])))
                    },
                )
                .await
                .map(|ran| ran.reply)
                .unwrap()
        }
    };
    let duplicate = async {
        let bump_id = opened_rx.await.unwrap();
        assert!(bump_id.is_some(), "the first call made the bump");
        assert_eq!(toy.bumps().await, 1);
        let reply = engine
            .run("alice", &k, &h, Some(&bump), Duration::ZERO, |_| async {
                Ok::<_, Error>(Done::Answer(StoredResponse::new(500, "text/plain", vec![])))
            })
            .await
            .map(|ran| ran.reply)
            .unwrap();
        assert!(matches!(reply, Reply::InProgress { .. }), "{reply:?}");
        assert_eq!(toy.bumps().await, 1, "a lost insert makes nothing");
        let _ = go_tx.send(());
    };
    let (first, ()) = tokio::join!(first, duplicate);
    assert!(matches!(first, Reply::First(_)), "{first:?}");
}

/// An opening step run by claims won another way, raced by a takeover,
/// then a storing step: the same fences as a unit's.
#[tokio::test]
async fn steps_of_one_call_are_fenced_by_the_claim() {
    let toy = &toy().await;
    let (bump, settle) = one_call_steps(toy).await;
    let engine = toy.engine(Duration::from_secs(1), DAY);
    let (k, h) = (key("one-call"), hash("{}"));
    let Ok(paused) = Paused::start(&engine, "alice", &k, &h)
        .await
        .map(Paused::crash)
    else {
        panic!("first claim");
    };
    assert!(paused.opened().is_none(), "no opening was given");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let Ok(taker) = Paused::start(&engine, "alice", &k, &h)
        .await
        .map(Paused::crash)
    else {
        panic!("a takeover after the lease");
    };
    let client = toy.pool.get().await.unwrap();
    let (fence, _) = paused.open(&client, &bump).await.unwrap();
    assert_eq!(fence, Fence::Lost);
    assert_eq!(toy.bumps().await, 0, "a lost claim makes nothing");
    let (fence, row) = taker.open(&client, &bump).await.unwrap();
    assert_eq!(fence, Fence::Held);
    let bump_id: i64 = row.get("bump_id");
    assert_eq!(toy.bumps().await, 1);
    let effect: Option<String> = client
        .query_one(
            "SELECT effect FROM idempotency_keys WHERE user_id = 'alice' AND key = $1",
            &[&k.as_str()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(effect, Some(format!("bump-{bump_id}")));
    let (fence, _) = taker.open(&client, &bump).await.unwrap();
    assert_eq!(fence, Fence::Lost, "a linked claim opens no second effect");
    assert_eq!(toy.bumps().await, 1);

    // The outcome and the answer, in one call too: the outcome is written
    // whoever holds the key, the answer only by the claim that holds it.
    let answer = StoredResponse::new(200, "text/plain", b"noted".to_vec());
    let (fence, _) = paused
        .store_with(&client, &settle, &answer, &[&"noted by the paused"])
        .await
        .unwrap();
    assert_eq!(fence, Fence::Lost);
    let (fence, _) = taker
        .store_with(&client, &settle, &answer, &[&"settled"])
        .await
        .unwrap();
    assert_eq!(fence, Fence::Held);
    assert!(matches!(
        Paused::start(&engine, "alice", &k, &h).await.map(Paused::crash),
        Err(Reply::Replay(ref replay)) if *replay == answer
    ));
}

#[tokio::test]
async fn past_the_limit_nothing_is_read_or_written_and_a_retry_is_answered_once_it_refills() {
    let toy = &toy().await;
    let one = std::num::NonZeroU32::MIN;
    let engine = toy
        .engine(Duration::from_secs(30), DAY)
        .with_limit(idempotency::Limit::new(one, one));
    let engine = &engine;
    let bump = |k: &'static str| async move {
        engine
            .run(
                "alice",
                &key(k),
                &hash("{}"),
                None,
                Duration::ZERO,
                |claim| async move { toy.bump(&claim).await },
            )
            .await
            .map(|ran| ran.reply)
            .unwrap()
    };
    let Reply::First(answer) = bump("first").await else {
        panic!("the first intent fits the burst");
    };
    // Every connection of the pool is taken: a refusal that sent a
    // statement would wait for one.
    let mut taken = Vec::new();
    for _ in 0..toy.pool.status().max_size {
        taken.push(toy.pool.get().await.unwrap());
    }
    let refused = tokio::time::timeout(Duration::from_secs(1), bump("second"))
        .await
        .expect("refused without waiting for a connection");
    let Reply::Limited(wait) = refused else {
        panic!("past the limit: {refused:?}");
    };
    assert!(wait > Duration::ZERO);
    let retry = tokio::time::timeout(Duration::from_secs(1), bump("first"))
        .await
        .expect("a retry past the limit is refused without a statement too");
    assert!(matches!(retry, Reply::Limited(_)), "{retry:?}");
    drop(taken);
    let rows: i64 = toy
        .pool
        .get()
        .await
        .unwrap()
        .query_one(
            "SELECT count(*) FROM idempotency_keys WHERE key = 'second'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "nothing is written for a refused intent");
    tokio::time::sleep(wait).await;
    assert!(
        matches!(bump("first").await, Reply::Replay(ref replay) if *replay == answer),
        "once the bucket refills, the retry gets its answer"
    );
    let other = engine
        .run(
            "bob",
            &key("second"),
            &hash("{}"),
            None,
            Duration::ZERO,
            |claim| async move { toy.bump(&claim).await },
        )
        .await
        .map(|ran| ran.reply)
        .unwrap();
    assert!(
        matches!(other, Reply::First(_)),
        "another scope has a bucket of its own"
    );
    assert_eq!(toy.bumps().await, 2);
}
