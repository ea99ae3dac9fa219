//! Migrations keep what is stored: key rows written under the first layout
//! of `idempotency_keys` give the same answers after every rebuild since
//! (V2, compact; V3, the engine's) and after V4 made the schema
//! distributable (which also marks sold holds), and the table the service's migrations
//! leave is exactly the one the engine makes on its own.

use std::time::Duration;

use idempotency::{Engine, IdempotencyKey, Policy, Reply, RequestHash, StoredResponse};
use test_support::paused::Paused;
use uuid::Uuid;

use crate::helpers::{self, TestDatabase};

#[tokio::test]
async fn stored_answers_survive_every_rebuild_of_the_key_table() {
    let db = TestDatabase::create().await;
    let mut client = db.client().await;
    client
        .batch_execute(include_str!("../../migrations/V1__checkout.sql"))
        .await
        .unwrap();
    let (paid, declined) = (Uuid::new_v4(), Uuid::new_v4());
    let hash = RequestHash::of("POST", "/orders", b"{}");
    client
        .execute(
            "INSERT INTO orders (order_id, user_id, status, amount_cents, currency,
                                 payment_method, hold_ids, seats, idempotency_key)
             VALUES ($1, 'alice', 'paid', 4500, 'USD', 'pm_card_visa', '{}', '{}', 'paid'),
                    ($2, 'alice', 'declined', 4500, 'USD', 'pm_card_declined', '{}', '{}', 'declined'),
                    (gen_random_uuid(), 'alice', 'payment_pending', 4500, 'USD', 'pm_card_slow',
                     '{}', '{}', 'settling')",
            &[&paid, &declined],
        )
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO idempotency_keys (user_id, key, request_hash, claim_token,
                 lease_expires_at, order_id, response_status, response_body,
                 response_location, response_content_type)
             VALUES ('alice', 'paid', $1, gen_random_uuid(), now(), $2::uuid, 201, 'order',
                     '/orders/' || $2::uuid::text, 'application/json'),
                    ('alice', 'declined', $1, gen_random_uuid(), now(), $3, 402, 'problem',
                     NULL, 'application/problem+json'),
                    ('alice', 'hold', $1, gen_random_uuid(), now(), NULL, 201, 'hold',
                     NULL, 'application/json'),
                    ('alice', 'busy', $1, gen_random_uuid(), now() + interval '1 hour', NULL,
                     NULL, NULL, NULL, NULL)",
            &[&hash.as_bytes(), &paid, &declined],
        )
        .await
        .unwrap();

    // Two held seats, one of them in the paid order.
    client
        .execute(
            "WITH e AS (INSERT INTO events (event_id) VALUES ('v1') RETURNING event_id),
                  s AS (INSERT INTO seats (event_id, label, price_cents)
                        SELECT event_id, label, 4500 FROM e, unnest('{A1,A2}'::text[]) AS label
                        RETURNING seat_id, label)
             INSERT INTO holds (seat_id, user_id, expires_at, order_id)
             SELECT seat_id, 'alice', now() + interval '10 minutes',
                    CASE label WHEN 'A1' THEN $1::uuid END
             FROM s",
            &[&paid],
        )
        .await
        .unwrap();

    for migration in [
        include_str!("../../migrations/V2__compact_idempotency_keys.sql"),
        include_str!("../../migrations/V3__idempotency_engine.sql"),
        include_str!("../../migrations/V4__distributable.sql"),
    ] {
        client.batch_execute(migration).await.unwrap();
    }
    // The engine's V1 finds the table V3 made; its V2 lets answered rows drop their
    // claim; its V3 makes the claim one function call; its V4 adds the key's
    // writes as functions; its V5 lets a step open the claim; its V6 makes
    // the claim's row one type; its V7 keeps a settlement's word on the key.
    assert_eq!(idempotency::migrate(&mut client).await.unwrap(), 8);

    let engine = Engine::new(
        helpers::pool(&db.url),
        Policy {
            ttl: Duration::from_secs(86_400),
            lease: Duration::from_secs(30),
        },
    );
    let begin = |key: &'static str| {
        let (engine, hash) = (&engine, &hash);
        async move {
            let key = IdempotencyKey::parse(key.as_bytes()).unwrap();
            Paused::start(engine, "alice", &key, hash)
                .await
                .map(Paused::crash)
        }
    };
    let Err(Reply::Replay(answer)) = begin("paid").await else {
        panic!("the paid order's answer is kept");
    };
    assert_eq!(
        answer,
        StoredResponse::new(201, "application/json", b"order".to_vec())
            .with_location(format!("/orders/{paid}"))
    );
    let Err(Reply::Replay(answer)) = begin("declined").await else {
        panic!("the declined order's answer is kept");
    };
    assert_eq!(
        answer,
        StoredResponse::new(402, "application/problem+json", b"problem".to_vec())
    );
    let Err(Reply::Replay(answer)) = begin("hold").await else {
        panic!("the hold's answer is kept");
    };
    assert_eq!(
        answer,
        StoredResponse::new(201, "application/json", b"hold".to_vec())
    );
    assert!(matches!(begin("busy").await, Err(Reply::InProgress { .. })));
    let links: i64 = client
        .query_one(
            "SELECT count(*) FROM idempotency_keys WHERE key = 'paid' AND effect = $1",
            &[&paid.to_string()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(links, 1, "the order a key made is still its effect");

    // V4: orders keyed by buyer first; a paid order's holds are sold.
    let key: String = client
        .query_one(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'orders_pkey'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(key, "PRIMARY KEY (user_id, order_id)");
    let sold: Vec<(String, bool)> = client
        .query(
            "SELECT s.label, h.sold FROM holds h JOIN seats s USING (seat_id) ORDER BY s.label",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(sold, [("A1".to_owned(), true), ("A2".to_owned(), false)]);
}

#[tokio::test]
async fn the_service_leaves_the_key_table_exactly_as_the_engine_makes_it() {
    let (service, engine) = (TestDatabase::create().await, TestDatabase::create().await);
    let mut settings = helpers::test_layer();
    settings.database.url = service.url.clone().into();
    stagedoor_checkout::db::migrate(&settings.database)
        .await
        .unwrap();
    idempotency::migrate(&mut engine.client().await)
        .await
        .unwrap();
    let shape = |db: std::sync::Arc<TestDatabase>| async move {
        let client = db.client().await;
        let columns: Vec<String> = client
            .query(
                "SELECT format('%s %s %s %s', ordinal_position, column_name, data_type, is_nullable)
                 FROM information_schema.columns
                 WHERE table_name = 'idempotency_keys' ORDER BY ordinal_position",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        let constraints: Vec<String> = client
            .query(
                "SELECT conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
                 WHERE conrelid = 'idempotency_keys'::regclass ORDER BY conname",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        let indexes: Vec<String> = client
            .query(
                "SELECT indexdef FROM pg_indexes WHERE tablename = 'idempotency_keys'
                 ORDER BY indexname",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        (columns, constraints, indexes)
    };
    let (ours, its) = (shape(service).await, shape(engine).await);
    assert!(!ours.0.is_empty());
    assert_eq!(ours, its);
    assert!(
        !ours.1.iter().any(|c| c.contains("FOREIGN KEY")),
        "the engine's table references nothing: {:?}",
        ours.1
    );
}
