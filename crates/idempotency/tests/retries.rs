//! What a retry costs, against a real PostgreSQL and the machine's Redis:
//! no token of the new-click limit, no lock left behind or taken from the
//! request that holds the key, no spinning while it waits, and no loss of a
//! key whose effect is still settling when its TTL runs out.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Hook, Manager, ManagerConfig, Pool, RecyclingMethod};
use idempotency::cleanup::{Cleanup, Swept};
use idempotency::{
    Claim, ClaimKind, Done, Engine, Error, Gate, IdempotencyKey, Limit, Opening, Policy, Reply,
    RequestHash, StoredResponse,
};
use test_support::db::TestDatabase;
use test_support::paused::Paused;
use tokio::sync::Notify;
use uuid::Uuid;

const DAY: Duration = Duration::from_secs(86_400);
const REDIS: &str = "redis://127.0.0.1:6379";

struct Toy {
    _db: Arc<TestDatabase>,
    pool: Pool,
    /// How many connections the pool has handed out.
    gets: Arc<AtomicUsize>,
}

async fn toy() -> Toy {
    let db = TestDatabase::create().await;
    let mut client = db.client().await;
    idempotency::migrate(&mut client).await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE effects (effect_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                                   pending boolean NOT NULL);
             CREATE FUNCTION link_pending(
                 p_user_id text, p_key text, p_request_hash bytea, p_claim_token bigint,
                 p_lease_secs float8, p_ttl_secs float8, p_effect_id bigint)
             RETURNS TABLE (claim idempotency_claim_row, linked boolean)
             LANGUAGE plpgsql AS $$
             BEGIN
                 claim := idempotency_open(p_user_id, p_key, p_request_hash, p_claim_token,
                                           p_lease_secs, p_ttl_secs);
                 IF claim.won THEN
                     INSERT INTO effects (effect_id, pending) OVERRIDING SYSTEM VALUE
                     VALUES (p_effect_id, true);
                     linked := idempotency_link(p_user_id, p_key, p_claim_token,
                                                p_effect_id::text);
                 END IF;
                 RETURN NEXT;
             END $$;",
        )
        .await
        .unwrap();
    let gets = Arc::new(AtomicUsize::new(0));
    let counted = |gets: &Arc<AtomicUsize>| {
        let gets = gets.clone();
        Hook::sync_fn(move |_, _| {
            gets.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    };
    let manager = Manager::from_config(
        db.url.parse().unwrap(),
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(8)
        .post_create(counted(&gets))
        .pre_recycle(counted(&gets))
        .build()
        .unwrap();
    Toy {
        _db: db,
        pool,
        gets,
    }
}

impl Toy {
    fn engine(&self, lease: Duration, ttl: Duration) -> Engine {
        Engine::new(self.pool.clone(), Policy { ttl, lease })
    }

    /// A plain answer that no effect stands behind.
    async fn answer(&self, _claim: &Claim) -> Result<Done, Error> {
        Ok(Done::Answer(StoredResponse::new(
            200,
            "text/plain",
            b"ok".to_vec(),
        )))
    }

    /// Makes a pending effect and links it to the key, in one call.
    async fn link_pending(&self, claim: &Claim) -> i64 {
        let id = rand_id();
        const LINK: &str = "SELECT (step.claim).*, step.*
                            FROM link_pending($1, $2, $3, $4, $5, $6, $7) AS step";
        let opening = Opening::new(LINK, vec![Box::new(id)]);
        let client = self.pool.get().await.unwrap();
        let (fence, _) = claim.open(&client, &opening).await.unwrap();
        assert_eq!(fence, idempotency::Fence::Held);
        id
    }

    async fn count(&self, sql: &str) -> i64 {
        let client = self.pool.get().await.unwrap();
        client.query_one(sql, &[]).await.unwrap().get(0)
    }
}

fn rand_id() -> i64 {
    (Uuid::new_v4().as_u64_pair().0 >> 2) as i64
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::parse(text.as_bytes()).unwrap()
}

fn hash(body: &str) -> RequestHash {
    RequestHash::of("POST", "/bumps", body.as_bytes())
}

/// A scope of this test's own: the Redis server is shared.
fn scope() -> String {
    format!("buyer-{}", Uuid::new_v4().simple())
}

async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(REDIS)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("Redis must run (scripts/services.sh starts it)")
}

async fn lock_of(user: &str, k: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(format!("idem:{user}:{k}"))
        .query_async(&mut redis().await)
        .await
        .unwrap()
}

#[tokio::test]
async fn replays_409s_and_422s_spend_no_token_of_the_new_click_limit() {
    let toy = &toy().await;
    let (one, two) = (NonZeroU32::MIN, NonZeroU32::new(2).unwrap());
    let engine = toy
        .engine(Duration::from_secs(30), DAY)
        .with_limit(Limit::new(one, two));
    let engine = &engine;
    let run = |k: &'static str, body: &'static str| async move {
        engine
            .run(
                "alice",
                &key(k),
                &hash(body),
                None,
                Duration::ZERO,
                |claim| async move { toy.answer(&claim).await },
            )
            .await
            .map(|ran| ran.reply)
            .unwrap()
    };
    assert!(matches!(run("a", "{}").await, Reply::First(_)));
    for _ in 0..5 {
        assert!(matches!(run("a", "{}").await, Reply::Replay(_)));
        assert!(matches!(run("a", "{\"x\":1}").await, Reply::KeyReused));
    }
    // A click in progress (its request on another instance), retried: 409s,
    // none of which spends a token.
    let elsewhere = toy.engine(Duration::from_secs(30), DAY);
    let Ok(_) = Paused::start(&elsewhere, "alice", &key("busy"), &hash("{}"))
        .await
        .map(Paused::crash)
    else {
        panic!("a new key is claimed");
    };
    for _ in 0..5 {
        assert!(matches!(run("busy", "{}").await, Reply::InProgress { .. }));
    }
    assert!(
        matches!(run("b", "{}").await, Reply::First(_)),
        "the burst's second token is still there for a second click"
    );
    assert!(matches!(run("c", "{}").await, Reply::Limited(_)));
}

#[tokio::test]
async fn an_abandoned_key_is_taken_over_once_its_scope_is_under_the_limit_again() {
    let toy = &toy().await;
    let lease = Duration::from_secs(1);
    let engine = toy
        .engine(lease, DAY)
        .with_limit(Limit::new(NonZeroU32::MIN, NonZeroU32::MIN));
    let elsewhere = toy.engine(lease, DAY);
    let Ok(_) = Paused::start(&elsewhere, "alice", &key("a"), &hash("{}"))
        .await
        .map(Paused::crash)
    else {
        panic!("a new key is claimed");
    };
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let run = |k: &'static str| {
        let engine = &engine;
        async move {
            engine
                .run(
                    "alice",
                    &key(k),
                    &hash("{}"),
                    None,
                    Duration::ZERO,
                    |claim| async move {
                        assert_eq!(claim.kind, ClaimKind::Abandoned, "{k} is a takeover");
                        toy.answer(&claim).await
                    },
                )
                .await
                .map(|ran| ran.reply)
                .unwrap()
        }
    };
    let fresh = |k: &'static str| {
        let engine = &engine;
        async move {
            engine
                .run(
                    "alice",
                    &key(k),
                    &hash("{}"),
                    None,
                    Duration::ZERO,
                    |claim| async move { toy.answer(&claim).await },
                )
                .await
                .map(|ran| ran.reply)
                .unwrap()
        }
    };
    // The bucket's one token goes to a new click. Past the limit the
    // takeover is refused like any request that would need a statement...
    assert!(matches!(fresh("b").await, Reply::First(_)));
    let Reply::Limited(wait) = run("a").await else {
        panic!("refused past the limit");
    };
    // ... and once a token is back, it is taken over without spending it:
    // a new click still finds it.
    tokio::time::sleep(wait).await;
    let taken = run("a").await;
    assert!(matches!(taken, Reply::First(_)), "{taken:?}");
    assert!(matches!(fresh("c").await, Reply::First(_)));
}

#[tokio::test]
async fn redis_mode_a_claim_that_fails_after_the_lock_gives_the_lock_back() {
    let toy = &toy().await;
    let engine = toy
        .engine(Duration::from_secs(30), DAY)
        .with_gate(Gate::redis(REDIS).await.unwrap());
    let user = scope();
    let client = toy.pool.get().await.unwrap();
    // The claim statement fails after the gate's SET NX: its table is away.
    client
        .batch_execute("ALTER TABLE idempotency_keys RENAME TO away")
        .await
        .unwrap();
    let failed = engine
        .run(
            &user,
            &key("a"),
            &hash("{}"),
            None,
            Duration::ZERO,
            |claim| async move { toy.answer(&claim).await },
        )
        .await
        .map(|ran| ran.reply);
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(
        lock_of(&user, "a").await,
        None,
        "no lock for a claim nobody works on"
    );
    client
        .batch_execute("ALTER TABLE away RENAME TO idempotency_keys")
        .await
        .unwrap();
    let retried = engine
        .run(
            &user,
            &key("a"),
            &hash("{}"),
            None,
            Duration::ZERO,
            |claim| async move { toy.answer(&claim).await },
        )
        .await
        .map(|ran| ran.reply)
        .unwrap();
    assert!(matches!(retried, Reply::First(_)), "{retried:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_mode_a_request_that_lost_its_claim_leaves_the_takers_lock_alone() {
    let toy = &toy().await;
    let lease = Duration::from_secs(1);
    let engine = toy
        .engine(lease, DAY)
        .with_gate(Gate::redis(REDIS).await.unwrap());
    let user = scope();
    let (taker_in, taker_go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));

    // The zombie: it stalls past its lease, then tries to store its answer.
    let zombie = {
        let (engine, user) = (engine.clone(), user.clone());
        let taker_in = taker_in.clone();
        tokio::spawn(async move {
            engine
                .run(
                    &user,
                    &key("a"),
                    &hash("{}"),
                    None,
                    Duration::ZERO,
                    |_claim| async move {
                        taker_in.notified().await;
                        Ok::<_, Error>(Done::Answer(StoredResponse::new(
                            200,
                            "text/plain",
                            b"zombie".to_vec(),
                        )))
                    },
                )
                .await
                .map(|ran| ran.reply)
                .unwrap()
        })
    };
    // The taker: after the lease (and the lock's expiry), it takes the key
    // over, and works until told to finish.
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    let taker = {
        let (engine, user) = (engine.clone(), user.clone());
        let (taker_in, taker_go) = (taker_in.clone(), taker_go.clone());
        tokio::spawn(async move {
            engine
                .run(
                    &user,
                    &key("a"),
                    &hash("{}"),
                    None,
                    Duration::ZERO,
                    |claim| async move {
                        assert_eq!(claim.kind, ClaimKind::Abandoned);
                        taker_in.notify_one();
                        taker_go.notified().await;
                        Ok::<_, Error>(Done::Answer(StoredResponse::new(
                            200,
                            "text/plain",
                            b"taker".to_vec(),
                        )))
                    },
                )
                .await
                .map(|ran| ran.reply)
                .unwrap()
        })
    };
    let zombie = zombie.await.unwrap();
    assert!(matches!(zombie, Reply::InProgress { .. }), "{zombie:?}");
    assert!(
        lock_of(&user, "a").await.is_some(),
        "the taker's lock is still there while it works"
    );
    taker_go.notify_one();
    let Reply::First(answer) = taker.await.unwrap() else {
        panic!("the taker stores its answer");
    };
    assert_eq!(answer.body, b"taker");
    assert_eq!(
        lock_of(&user, "a").await,
        None,
        "the taker opens its own gate"
    );
}

#[tokio::test]
async fn a_waiter_turned_away_by_the_lock_backs_off_instead_of_spinning() {
    let toy = &toy().await;
    let lease = Duration::from_millis(1_000);
    let engine = toy
        .engine(lease, DAY)
        .with_gate(Gate::redis(REDIS).await.unwrap());
    let user = scope();
    let elsewhere = toy.engine(lease, DAY);
    let Ok(_) = Paused::start(&elsewhere, &user, &key("a"), &hash("{}"))
        .await
        .map(Paused::crash)
    else {
        panic!("a new key is claimed");
    };
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    // The row's lease is over, but another request holds the lock (it is
    // about to take the key over): the waiter is turned away after every wake.
    let _: () = redis::cmd("SET")
        .arg(format!("idem:{user}:a"))
        .arg("another")
        .arg("EX")
        .arg(30)
        .query_async(&mut redis().await)
        .await
        .unwrap();
    let before = toy.gets.load(Ordering::Relaxed);
    let ran = engine
        .run(
            &user,
            &key("a"),
            &hash("{}"),
            None,
            Duration::from_secs(2),
            |claim| async move { toy.answer(&claim).await },
        )
        .await
        .unwrap();
    assert!(
        matches!(ran.reply, Reply::InProgress { .. }),
        "{:?}",
        ran.reply
    );
    let gets = toy.gets.load(Ordering::Relaxed) - before;
    // A poll every 10 ms for 2 s would be 200 reads and as many asks; with
    // the delay doubling up to 200 ms, it is a few dozen at most.
    assert!(gets <= 40, "{gets} connections taken in one 2-second wait");
}

#[tokio::test]
async fn a_key_whose_effect_is_settling_outlives_its_ttl_until_it_settles() {
    let toy = &toy().await;
    let (lease, ttl) = (Duration::from_secs(1), Duration::from_secs(2));
    let engine = toy.engine(lease, ttl);
    let cleanup = Cleanup::new(toy.pool.clone(), ttl);
    let (settling, answered) = (key("settling"), key("answered"));
    // One click links an effect that stays pending (its request died);
    // another is answered.
    let Ok(claim) = Paused::start(&engine, "alice", &settling, &hash("{}"))
        .await
        .map(Paused::crash)
    else {
        panic!("a new key is claimed");
    };
    let effect = toy.link_pending(&claim).await;
    let first = engine
        .run(
            "alice",
            &answered,
            &hash("{}"),
            None,
            Duration::ZERO,
            |claim| async move { toy.answer(&claim).await },
        )
        .await
        .map(|ran| ran.reply)
        .unwrap();
    assert!(matches!(first, Reply::First(_)));
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;

    assert_eq!(cleanup.run().await.unwrap(), Swept::Deleted(1));
    assert_eq!(
        toy.count("SELECT count(*) FROM idempotency_keys WHERE key = 'settling'")
            .await,
        1,
        "the settling key stays"
    );
    // Its retry after the TTL finishes the old intent: it resumes the
    // linked effect, never starts afresh without it.
    let resumed = engine
        .run(
            "alice",
            &settling,
            &hash("{}"),
            None,
            Duration::ZERO,
            |claim| async move {
                assert_eq!(claim.kind, ClaimKind::Abandoned);
                assert_eq!(claim.effect, Some(effect.to_string()));
                toy.answer(&claim).await
            },
        )
        .await
        .map(|ran| ran.reply)
        .unwrap();
    assert!(matches!(resumed, Reply::First(_)), "{resumed:?}");

    // Answered, it goes with the next cleanup.
    assert_eq!(cleanup.run().await.unwrap(), Swept::Deleted(1));
    assert_eq!(toy.count("SELECT count(*) FROM idempotency_keys").await, 0);
}
