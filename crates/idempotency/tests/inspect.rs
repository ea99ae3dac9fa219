//! The key tooling (`idempotency::inspect`) against a real PostgreSQL (a
//! database per test): what a key shows in each state, which purges are
//! refused and why, that a purged key is a new intent, and the stats.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use deadpool_postgres::Pool;
use idempotency::cleanup::{Cleanup, Swept};
use idempotency::inspect::{self, KeyState, Purge, PurgeRefusal};
use idempotency::{
    Claim, ClaimKind, Done, Engine, Fence, IdempotencyKey, Policy, Reply, RequestHash,
    StoredResponse, Unit,
};
use test_support::db::TestDatabase;
use test_support::paused::Paused;

const DAY: Duration = Duration::from_secs(86_400);
const LEASE: Duration = Duration::from_secs(30);

struct Toy {
    _db: Arc<TestDatabase>,
    pool: Pool,
}

async fn toy() -> Toy {
    let db = TestDatabase::create().await;
    let mut client = db.client().await;
    idempotency::migrate(&mut client).await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE effects (id text PRIMARY KEY, settled boolean NOT NULL DEFAULT false)",
        )
        .await
        .unwrap();
    let pool = db.pool(8);
    Toy { _db: db, pool }
}

fn policy(ttl: Duration) -> Policy {
    Policy { ttl, lease: LEASE }
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::parse(text.as_bytes()).unwrap()
}

fn hash() -> RequestHash {
    RequestHash::of("POST", "/effects", b"{}")
}

impl Toy {
    fn engine(&self, ttl: Duration) -> Engine {
        Engine::new(self.pool.clone(), policy(ttl))
    }

    /// A click that got its answer: `body` stored with status 201.
    async fn answered(&self, ttl: Duration, user: &str, k: &str, body: &[u8]) -> StoredResponse {
        let answer = StoredResponse::new(201, "application/json", body.to_vec());
        let stored = answer.clone();
        let reply = self
            .engine(ttl)
            .run(
                user,
                &key(k),
                &hash(),
                None,
                Duration::ZERO,
                |_| async move { Ok::<_, idempotency::Error>(Done::Answer(stored)) },
            )
            .await
            .map(|ran| ran.reply)
            .unwrap();
        assert!(matches!(reply, Reply::First(_)), "{reply:?}");
        answer
    }

    /// A click whose request holds its key right now.
    async fn claimed(&self, ttl: Duration, user: &str, k: &str) -> Claim {
        match Paused::start(&self.engine(ttl), user, &key(k), &hash())
            .await
            .map(Paused::crash)
        {
            Ok(claim) => claim,
            other => panic!("a new key is claimed: {other:?}"),
        }
    }

    /// A claimed click that made an effect still settling (a payment that
    /// has no answer yet), and whose request then died.
    async fn settling(&self, ttl: Duration, user: &str, k: &str, effect: &str) {
        let claim = self.claimed(ttl, user, k).await;
        let mut client = self.pool.get().await.unwrap();
        let unit = Unit::begin(&claim, &mut client).await.unwrap();
        unit.tx()
            .execute("INSERT INTO effects (id) VALUES ($1)", &[&effect])
            .await
            .unwrap();
        let fence = unit.link(effect).await.unwrap();
        assert_eq!(fence, Fence::Held);
        unit.finish(fence).await.unwrap();
    }

    /// Settles a toy effect and tells its key, in one transaction, as a
    /// caller's settlement does: `undone` when it left nothing behind (a
    /// declined payment), so that the key's answer must be kept.
    async fn settle(&self, effect: &str, undone: bool) {
        let mut client = self.pool.get().await.unwrap();
        let tx = client.transaction().await.unwrap();
        tx.execute(
            "UPDATE effects SET settled = true WHERE id = $1",
            &[&effect],
        )
        .await
        .unwrap();
        tx.execute(
            "SELECT idempotency_settled(user_id, key, effect, $2)
             FROM idempotency_keys WHERE effect = $1",
            &[&effect, &undone],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }

    async fn show(&self, ttl: Duration, user: &str, k: &str) -> Option<inspect::KeyReport> {
        let client = self.pool.get().await.unwrap();
        inspect::inspect(&client, policy(ttl), user, &key(k))
            .await
            .unwrap()
    }

    async fn purge(&self, ttl: Duration, user: &str, k: &str) -> Purge {
        let mut client = self.pool.get().await.unwrap();
        inspect::purge(&mut client, policy(ttl), user, &key(k))
            .await
            .unwrap()
    }
}

#[tokio::test]
async fn a_key_shows_its_state_its_times_its_effect_and_its_answer() {
    let toy = toy().await;
    assert_eq!(toy.show(DAY, "alice", "never-sent").await, None);

    let before = SystemTime::now() - Duration::from_secs(5);
    toy.claimed(DAY, "alice", "holding").await;
    let holding = toy.show(DAY, "alice", "holding").await.unwrap();
    assert_eq!(holding.state, KeyState::InProgress);
    assert!(holding.created_at > before);
    assert_eq!(
        holding
            .expires_at
            .duration_since(holding.created_at)
            .unwrap(),
        DAY
    );
    assert!(holding
        .lease_expires_at
        .is_some_and(|lease| lease > holding.created_at));
    assert!(!holding.lease_expired);
    assert_eq!((holding.effect, holding.response), (None, None));
    assert_eq!(
        toy.show(DAY, "bob", "holding").await,
        None,
        "another user's key is not bob's"
    );

    let answer = toy.answered(DAY, "alice", "done", b"\xff not UTF-8").await;
    let done = toy.show(DAY, "alice", "done").await.unwrap();
    assert_eq!(done.state, KeyState::Answered);
    assert_eq!(done.response, Some(answer), "the stored bytes, as stored");

    toy.settling(DAY, "alice", "paying", "effect-1").await;
    let paying = toy.show(DAY, "alice", "paying").await.unwrap();
    assert_eq!(paying.state, KeyState::InProgress);
    assert_eq!(paying.effect.as_deref(), Some("effect-1"));

    // Its answer, stored by whoever settled the effect, takes the lease
    // and the link with it; the token stays, to say whose claim it
    // answered (`idempotency_answered_while_held`).
    toy.settle("effect-1", false).await;
    let paid = StoredResponse::new(201, "application/json", b"{\"paid\":true}".to_vec());
    let client = toy.pool.get().await.unwrap();
    assert!(
        idempotency::store_for_effect(&client, "alice", "paying", "effect-1", &paid)
            .await
            .unwrap()
    );
    let claim: (bool, Option<SystemTime>, Option<String>) = client
        .query_one(
            "SELECT claim_token IS NOT NULL, lease_expires_at, effect FROM idempotency_keys
             WHERE user_id = 'alice' AND key = 'paying'",
            &[],
        )
        .await
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .unwrap();
    assert_eq!(claim, (true, None, None), "an answered key keeps no lease");
    let paid_key = toy.show(DAY, "alice", "paying").await.unwrap();
    assert_eq!(paid_key.state, KeyState::Answered);
    assert_eq!(
        (
            paid_key.lease_expires_at,
            paid_key.lease_expired,
            paid_key.effect
        ),
        (None, false, None)
    );
    assert_eq!(paid_key.response, Some(paid));

    // Under a TTL of a second, a second later, every one of them is expired.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for k in ["holding", "done", "paying"] {
        let old = toy.show(Duration::from_secs(1), "alice", k).await.unwrap();
        assert_eq!(old.state, KeyState::Expired, "{k}");
    }
}

#[tokio::test]
async fn a_purged_answer_is_gone_and_the_next_request_with_its_key_is_a_new_intent() {
    let toy = toy().await;
    assert_eq!(toy.purge(DAY, "alice", "never-sent").await, Purge::Absent);

    let answer = toy.answered(DAY, "alice", "k-1", b"{\"n\":1}").await;
    let Purge::Purged(report) = toy.purge(DAY, "alice", "k-1").await else {
        panic!("an answered key is purged");
    };
    assert_eq!(report.state, KeyState::Answered);
    assert_eq!(report.response, Some(answer), "what was deleted");
    assert_eq!(toy.show(DAY, "alice", "k-1").await, None);
    assert_eq!(toy.purge(DAY, "alice", "k-1").await, Purge::Absent);

    let again = toy.claimed(DAY, "alice", "k-1").await;
    assert_eq!(again.kind, ClaimKind::First, "a new intent, not a replay");
}

#[tokio::test]
async fn an_answer_that_rearms_its_click_once_forgotten_stays_until_it_expires() {
    let toy = toy().await;
    toy.settling(DAY, "alice", "declined-1", "effect-d").await;
    toy.settle("effect-d", true).await;
    let declined = StoredResponse::new(402, "application/problem+json", b"{}".to_vec());
    let client = toy.pool.get().await.unwrap();
    assert!(
        idempotency::store_for_effect(&client, "alice", "declined-1", "effect-d", &declined)
            .await
            .unwrap()
    );
    let refused = toy.purge(DAY, "alice", "declined-1").await;
    assert!(
        matches!(refused, Purge::Refused(PurgeRefusal::Rearms, ref report)
            if report.state == KeyState::Answered),
        "{refused:?}"
    );
    assert!(toy.show(DAY, "alice", "declined-1").await.is_some());

    // Past its TTL a retry with it is a new intent anyway: purged.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let ttl = Duration::from_secs(1);
    assert!(matches!(
        toy.purge(ttl, "alice", "declined-1").await,
        Purge::Purged(ref report) if report.state == KeyState::Expired
    ));
}

#[tokio::test]
async fn a_key_in_progress_is_refused_and_stays() {
    let toy = toy().await;
    toy.claimed(DAY, "alice", "holding").await;
    let Purge::Refused(PurgeRefusal::InProgress, report) = toy.purge(DAY, "alice", "holding").await
    else {
        panic!("a key in progress is refused");
    };
    assert_eq!(report.state, KeyState::InProgress);
    assert!(toy.show(DAY, "alice", "holding").await.is_some());

    // Past its TTL, without an effect, it is as good as absent: purged.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let ttl = Duration::from_secs(1);
    assert!(matches!(
        toy.purge(ttl, "alice", "holding").await,
        Purge::Purged(ref report) if report.state == KeyState::Expired
    ));
}

#[tokio::test]
async fn a_key_whose_effect_is_settling_is_refused_until_the_effect_settles() {
    let toy = toy().await;
    let ttl = Duration::from_secs(1);
    toy.settling(DAY, "alice", "paying", "effect-1").await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    let refused = toy.purge(ttl, "alice", "paying").await;
    assert!(
        matches!(refused, Purge::Refused(PurgeRefusal::Settling, ref report)
            if report.state == KeyState::Expired && report.effect.as_deref() == Some("effect-1")),
        "{refused:?}"
    );
    assert!(toy.show(ttl, "alice", "paying").await.is_some(), "it stays");
    toy.settle("effect-1", false).await;
    assert!(matches!(
        toy.purge(ttl, "alice", "paying").await,
        Purge::Purged(_)
    ));
}

/// A request that claimed a key links a settling effect while a purge of the
/// (expired) key is under way: the purge waits for it and then sees the
/// effect, instead of deleting the row with a view of the effects from
/// before the link committed.
#[tokio::test]
async fn a_purge_racing_a_link_sees_the_linked_effect() {
    let toy = toy().await;
    let ttl = Duration::from_secs(1);
    let claim = toy.claimed(DAY, "alice", "late").await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    let mut client = toy.pool.get().await.unwrap();
    let unit = Unit::begin(&claim, &mut client).await.unwrap();
    unit.tx()
        .execute("INSERT INTO effects (id) VALUES ('effect-late')", &[])
        .await
        .unwrap();
    let fence = unit.link("effect-late").await.unwrap();
    assert_eq!(fence, Fence::Held);
    let (purged, _) = tokio::join!(toy.purge(ttl, "alice", "late"), async {
        // The purge is blocked on the key row meanwhile.
        tokio::time::sleep(Duration::from_millis(300)).await;
        unit.finish(fence).await.unwrap()
    });
    assert!(
        matches!(purged, Purge::Refused(PurgeRefusal::Settling, _)),
        "{purged:?}"
    );
}

#[tokio::test]
async fn stats_count_the_rows_by_state_and_what_the_cleanup_would_delete() {
    let toy = toy().await;
    // Long enough that the rows made after the pause are not expired yet by
    // the time they are counted, even on a busy machine.
    let ttl = Duration::from_secs(2);
    let client = toy.pool.get().await.unwrap();
    let empty = inspect::stats(&client, policy(ttl)).await.unwrap();
    assert_eq!((empty.rows(), empty.oldest_age), (0, None));

    for n in 0..3 {
        toy.answered(DAY, "old", &format!("old-{n}"), b"{}").await;
    }
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    for n in 0..2 {
        toy.answered(DAY, "alice", &format!("done-{n}"), b"{}")
            .await;
    }
    toy.claimed(DAY, "alice", "holding").await;
    toy.settling(DAY, "bob", "paying", "effect-1").await;

    let stats = inspect::stats(&client, policy(ttl)).await.unwrap();
    assert_eq!(
        (stats.in_progress, stats.answered, stats.expired),
        (2, 2, 3)
    );
    assert_eq!(stats.rows(), 7);
    assert_eq!(stats.cleanup_due, 3);
    assert!(stats.oldest_age.unwrap() >= Duration::from_millis(2_100));
    assert!(stats.table_bytes >= 8_192, "{stats:?}");
    assert!(stats.index_bytes >= 2 * 8_192, "two indexes: {stats:?}");

    let cleanup = Cleanup::new(toy.pool.clone(), ttl);
    assert_eq!(cleanup.run().await.unwrap(), Swept::Deleted(3));
    let after = inspect::stats(&client, policy(ttl)).await.unwrap();
    assert_eq!((after.rows(), after.expired, after.cleanup_due), (4, 0, 0));
}
