//! One buyer against another (invariant 4): reads, replays, holds and
//! keys of another buyer.

use std::time::Duration;

use idempotency::RequestHash;
use serde_json::json;
use uuid::Uuid;

use super::{alice_with_a_hold, rows, Rows};
use crate::helpers::{new_key, order_body, spawn_app, spawn_app_with, Seen};
use crate::invariants::assert_invariants;

#[tokio::test]
async fn no_other_buyer_can_read_alices_order_however_the_id_is_spelled() {
    let (app, hold) = alice_with_a_hold().await;
    let order = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(order.status, 201);
    let order_id = order.json()["order_id"].as_str().unwrap().to_owned();
    // Buyer ids that a case-insensitive or LIKE comparison would confuse with alice.
    for buyer in [
        "bob", "ALICE", "Alice", "alic_", "_____", "alice.", "alice-",
    ] {
        let seen = Seen::of(app.get_order(buyer, &order_id).await).await;
        assert_eq!(seen.status, 404, "{buyer}");
        assert_eq!(seen.problem(), "not-found", "{buyer}");
        assert!(
            !String::from_utf8_lossy(&seen.body).contains(&order_id),
            "{buyer}"
        );
    }
    assert_eq!(
        Seen::of(app.get_order("alice", &order_id).await)
            .await
            .status,
        200
    );
    assert_invariants(&app).await;
}

#[tokio::test]
async fn bob_replaying_alices_key_and_body_gets_his_own_answer_never_hers() {
    let (app, hold) = alice_with_a_hold().await;
    let key = new_key();
    let alices = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!(alices.status, 201);

    // Bob has seen alice's key and request (a shared device, a log).
    let bobs = Seen::of(app.post_order("bob", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!((bobs.status, bobs.replayed), (409, false));
    assert_eq!(bobs.problem(), "hold-unavailable");
    assert_ne!(bobs.body, alices.body);
    assert_eq!(bobs.location, None);
    // His answer is stored under his own row and replayed to him alone.
    let again = Seen::of(app.post_order("bob", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!((again.status, again.replayed), (409, true));
    assert_eq!(again.body, bobs.body);
    let alices_again = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!((alices_again.status, alices_again.replayed), (201, true));
    assert_eq!(alices_again.body, alices.body);

    assert_eq!(
        rows(&app).await,
        Rows {
            keys: 2,
            orders: 1,
            holds: 1
        }
    );
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE user_id = 'bob'")
            .await,
        0
    );
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn bobs_request_in_progress_under_alices_key_does_not_block_alice() {
    let app = spawn_app_with(|s| s.payrail.timeout_ms = 5_000).await;
    let seats = app.seed("show", 2, 2500).await;
    let alices_hold = app.hold("alice", seats[0]).await;
    let bobs_hold = app.hold("bob", seats[1]).await;
    app.set_faults(json!({"latency_ms": 1_500})).await;
    let key = new_key();

    let bobs = {
        let request = app
            .as_buyer(app.http.post(app.url("/orders")), "bob")
            .header("Idempotency-Key", key.clone())
            .body(order_body(&[bobs_hold], "pm_card_visa"));
        tokio::spawn(async move { Seen::of(request.send().await.unwrap()).await })
    };
    let in_progress =
        "SELECT count(*) FROM idempotency_keys WHERE user_id = 'bob' AND response_status IS NULL";
    for _ in 0..100 {
        if app.count(in_progress).await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        app.count(in_progress).await,
        1,
        "bob's claim is in progress"
    );

    let alices = Seen::of(
        app.post_order("alice", &key, &[alices_hold], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!((alices.status, alices.replayed), (201, false), "not 409");
    let bobs = bobs.await.unwrap();
    assert_eq!((bobs.status, bobs.replayed), (201, false));
    assert_ne!(alices.json()["order_id"], bobs.json()["order_id"]);
    assert_eq!(
        rows(&app).await,
        Rows {
            keys: 2,
            orders: 2,
            holds: 2
        }
    );
    assert_eq!(app.charges().await.len(), 2);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn bob_can_neither_release_nor_order_alices_hold() {
    let app = spawn_app().await;
    let seats = app.seed("show", 2, 2500).await;
    let alices_hold = app.hold("alice", seats[0]).await;
    let bobs_hold = app.hold("bob", seats[1]).await;
    let before = rows(&app).await;

    let seen = Seen::of(app.delete_hold("bob", alices_hold).await).await;
    assert_eq!(seen.status, 404);
    assert_eq!(seen.problem(), "not-found");
    for holds in [vec![alices_hold], vec![bobs_hold, alices_hold]] {
        let seen = Seen::of(
            app.post_order("bob", &new_key(), &holds, "pm_card_visa")
                .await,
        )
        .await;
        assert_eq!(seen.status, 409, "{holds:?}");
        assert_eq!(seen.problem(), "hold-unavailable", "{holds:?}");
    }
    // The two 409s are stored answers (4xx are stored); nothing else changed.
    assert_eq!(
        rows(&app).await,
        Rows {
            keys: before.keys + 2,
            ..before
        }
    );
    assert_eq!(
        app.count("SELECT count(*) FROM holds WHERE order_id IS NOT NULL")
            .await,
        0
    );
    assert!(app.charges().await.is_empty());

    // Alice's hold is still hers to pay for, and bob's still his.
    for (buyer, hold) in [("alice", alices_hold), ("bob", bobs_hold)] {
        let seen = Seen::of(
            app.post_order(buyer, &new_key(), &[hold], "pm_card_visa")
                .await,
        )
        .await;
        assert_eq!(seen.status, 201, "{buyer}");
    }
    assert_eq!(app.charges().await.len(), 2);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn bob_cannot_take_over_alices_abandoned_key() {
    let app = spawn_app_with(|s| s.idempotency.lease_secs = 1).await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();
    let body = order_body(&[hold], "pm_card_visa");
    let hash = RequestHash::of("POST", "/orders", body.as_bytes());
    let (order_id, token) = (Uuid::new_v4(), 7_i64);

    // Alice's click died after it made its order and before Payrail was
    // called: a pending order linked to an in-progress key whose lease ran out.
    let db = app.db.client().await;
    db.batch_execute("BEGIN").await.unwrap();
    db.execute(
        "INSERT INTO orders (order_id, user_id, status, amount_cents, currency, payment_method,
                             hold_ids, seats, idempotency_key)
         SELECT $1, 'alice', 'payment_pending', s.price_cents, 'USD', 'pm_card_visa',
                ARRAY[h.hold_id], ARRAY[s.label], $2
         FROM holds h JOIN seats s USING (slot, seat_id) WHERE h.hold_id = $3",
        &[&order_id, &key, &hold],
    )
    .await
    .unwrap();
    db.execute(
        "UPDATE holds SET order_id = $1 WHERE hold_id = $2",
        &[&order_id, &hold],
    )
    .await
    .unwrap();
    db.execute(
        "INSERT INTO idempotency_keys (user_id, key, request_hash, claim_token, lease_expires_at,
                                       effect)
         VALUES ('alice', $1, $2, $3, now() - interval '1 minute', $4)",
        &[&key, &hash.as_bytes(), &token, &order_id.to_string()],
    )
    .await
    .unwrap();
    db.batch_execute("COMMIT").await.unwrap();
    let alices_row = "SELECT claim_token, lease_expires_at::text, effect, response_status
                      FROM idempotency_keys WHERE user_id = 'alice'";
    let snapshot = |row: tokio_postgres::Row| {
        (
            row.get::<_, i64>(0),
            row.get::<_, String>(1),
            row.get::<_, Option<String>>(2),
            row.get::<_, Option<i16>>(3),
        )
    };
    let abandoned = snapshot(db.query_one(alices_row, &[]).await.unwrap());

    // Bob sends the same key and the very same bytes: a takeover would resume
    // alice's order and charge her card. He gets his own intent instead.
    let seen = Seen::of(app.post_order_raw("bob", &key, &body).await).await;
    assert_eq!((seen.status, seen.replayed), (409, false));
    assert_eq!(seen.problem(), "hold-unavailable");
    assert_eq!(
        snapshot(db.query_one(alices_row, &[]).await.unwrap()),
        abandoned,
        "alice's row is untouched"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE status = 'payment_pending'")
            .await,
        1
    );
    assert!(app.charges().await.is_empty(), "nothing charged");

    // Alice's own retry takes her key over and finishes her order, once.
    let alices = Seen::of(app.post_order_raw("alice", &key, &body).await).await;
    assert_eq!(alices.status, 201);
    assert_eq!(alices.json()["order_id"], json!(order_id));
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}
