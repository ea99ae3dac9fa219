//! Migrations keep what is stored: key rows written under the first layout
//! of `idempotency_keys` give the same answers after the table is rebuilt.

use std::time::Duration;

use stagedoor_checkout::idempotency::store::{self, KeyPolicy};
use stagedoor_checkout::idempotency::{Begin, IdempotencyKey, Media, RequestHash, StoredResponse};
use uuid::Uuid;

use crate::helpers::{self, TestDatabase};

#[tokio::test]
async fn stored_answers_survive_the_compact_key_table() {
    let db = TestDatabase::create().await;
    let client = db.client().await;
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
                    ($2, 'alice', 'declined', 4500, 'USD', 'pm_card_declined', '{}', '{}', 'declined')",
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

    client
        .batch_execute(include_str!(
            "../../migrations/V2__compact_idempotency_keys.sql"
        ))
        .await
        .unwrap();

    let pool = helpers::pool(&db.url);
    let pooled = pool.get().await.unwrap();
    let policy = KeyPolicy {
        ttl: Duration::from_secs(86_400),
        lease: Duration::from_secs(30),
    };
    let begin = |key: &'static str| {
        let (pooled, hash) = (&pooled, &hash);
        async move {
            let key = IdempotencyKey::parse(key.as_bytes()).unwrap();
            store::begin(pooled, policy, "alice", &key, hash)
                .await
                .unwrap()
        }
    };
    let Begin::Replay(answer) = begin("paid").await else {
        panic!("the paid order's answer is kept");
    };
    assert_eq!(
        answer,
        StoredResponse {
            created_order: Some(paid),
            ..StoredResponse::json(201, b"order".to_vec())
        }
    );
    assert_eq!(answer.location(), Some(format!("/orders/{paid}")));
    let Begin::Replay(answer) = begin("declined").await else {
        panic!("the declined order's answer is kept");
    };
    assert_eq!(
        answer,
        StoredResponse {
            media: Media::Problem,
            ..StoredResponse::json(402, b"problem".to_vec())
        }
    );
    let Begin::Replay(answer) = begin("hold").await else {
        panic!("the hold's answer is kept");
    };
    assert_eq!(answer, StoredResponse::json(201, b"hold".to_vec()));
    assert!(matches!(begin("busy").await, Begin::InProgress));
}
