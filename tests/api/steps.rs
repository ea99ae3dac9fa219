//! Each writing step's SQL, called as the service calls it, against the
//! rows it must leave: the functions of migrations/functions/checkout.sql and the
//! engine's key writes in them. On one PostgreSQL and, in the Citus
//! profile, on the cluster.

use tokio_postgres::Client;
use uuid::Uuid;

use crate::helpers::{spawn_app, TestApp};

const HASH: &[u8] = b"request-hash";
const LEASE: f64 = 30.0;
const TTL: f64 = 86_400.0;

/// `checkout_place_order` for `user`'s click `key` with claim `token`.
async fn place(
    client: &Client,
    (user, key, token): (&str, &str, i64),
    order_id: Uuid,
    holds: &[i64],
) -> tokio_postgres::Row {
    client
        .query_one(
            "SELECT (step.claim).*, step.*
             FROM checkout_place_order($1, $2, $3, $4, $5, $6, $7, $8, 'USD', 'pm_card_visa') AS step",
            &[&user, &key, &HASH, &token, &LEASE, &TTL, &order_id, &holds],
        )
        .await
        .expect("checkout_place_order")
}

/// `checkout_settle_claimed` for `user`'s click `key` with claim `token`:
/// the answer (status, content type, location, body), then the order's
/// outcome (status, charge, decline code).
async fn settle_claimed(
    client: &Client,
    (user, key, token): (&str, &str, i64),
    (status, content_type, location, body): (i16, &str, Option<String>, &[u8]),
    order_id: Uuid,
    (order_status, charge_id, decline_code): (&str, Option<&str>, Option<&str>),
) -> tokio_postgres::Row {
    client
        .query_one(
            "SELECT * FROM checkout_settle_claimed($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            &[
                &user,
                &key,
                &token,
                &status,
                &content_type,
                &location,
                &body,
                &order_id,
                &order_status,
                &charge_id,
                &decline_code,
            ],
        )
        .await
        .expect("checkout_settle_claimed")
}

/// A paid click's answer for [`settle_claimed`]: 201 with the order's
/// `Location` and `body`.
fn created(order_id: Uuid, body: &[u8]) -> (i16, &'static str, Option<String>, &[u8]) {
    (
        201,
        "application/json",
        Some(format!("/orders/{order_id}")),
        body,
    )
}

/// The key row: (claim token, effect, response status).
async fn key_row(
    client: &Client,
    user: &str,
    key: &str,
) -> Option<(Option<i64>, Option<String>, Option<i16>)> {
    client
        .query_opt(
            "SELECT claim_token, effect, response_status FROM idempotency_keys
             WHERE user_id = $1 AND key = $2",
            &[&user, &key],
        )
        .await
        .expect("the key row")
        .map(|row| (row.get(0), row.get(1), row.get(2)))
}

/// What the settlement said on the key row: (effect settled, keep answer).
async fn settled_marks(client: &Client, user: &str, key: &str) -> (bool, bool) {
    let row = client
        .query_one(
            "SELECT effect_settled, keep_answer FROM idempotency_keys
             WHERE user_id = $1 AND key = $2",
            &[&user, &key],
        )
        .await
        .expect("the key row");
    (row.get(0), row.get(1))
}

/// Each hold's order and whether it is sold, in id order.
async fn holds_of(client: &Client, holds: &[i64]) -> Vec<(Option<Uuid>, bool)> {
    client
        .query(
            "SELECT order_id, sold FROM holds WHERE hold_id = ANY ($1) ORDER BY hold_id",
            &[&holds],
        )
        .await
        .expect("the holds")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

async fn order_status(client: &Client, user: &str, order_id: Uuid) -> Option<String> {
    client
        .query_opt(
            "SELECT status FROM orders WHERE user_id = $1 AND order_id = $2",
            &[&user, &order_id],
        )
        .await
        .expect("the order")
        .map(|row| row.get(0))
}

async fn two_holds(app: &TestApp, event: &str) -> Vec<i64> {
    let seats = app.seed(event, 2, 2500).await;
    vec![
        app.hold("alice", seats[0]).await,
        app.hold("alice", seats[1]).await,
    ]
}

#[tokio::test]
async fn the_order_step_claims_the_key_takes_the_holds_and_links_the_order() {
    let app = spawn_app().await;
    let client = app.db.client().await;
    let holds = two_holds(&app, "steps").await;
    let order_id = Uuid::new_v4();

    let row = place(&client, ("alice", "click-1", 7), order_id, &holds).await;
    assert!(row.get::<_, bool>("won"));
    assert!(row.get::<_, bool>("all_held"));
    assert_eq!(row.get::<_, i64>("amount_cents"), 5000);
    assert_eq!(row.get::<_, Vec<String>>("seats").len(), 2);
    assert_eq!(
        order_status(&client, "alice", order_id).await.as_deref(),
        Some("payment_pending")
    );
    assert_eq!(
        holds_of(&client, &holds).await,
        vec![(Some(order_id), false); 2]
    );
    assert_eq!(
        key_row(&client, "alice", "click-1").await,
        Some((Some(7), Some(order_id.to_string()), None))
    );

    // A duplicate loses the insert and touches nothing: it reads the row.
    let again = place(&client, ("alice", "click-1", 8), Uuid::new_v4(), &holds).await;
    assert!(!again.get::<_, bool>("won"));
    assert_eq!(again.get::<_, Option<i64>>("claim_token"), Some(7));
    assert_eq!(again.get::<_, Option<bool>>("all_held"), None);
    // The same claim again, its order linked: no second order.
    let linked = place(&client, ("alice", "click-1", 7), Uuid::new_v4(), &holds).await;
    assert!(!linked.get::<_, bool>("won"));
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);

    // Another click on the same holds wins its key but no hold: only the
    // key is written, with nothing linked.
    let other = place(&client, ("alice", "click-2", 9), Uuid::new_v4(), &holds).await;
    assert!(other.get::<_, bool>("won"));
    assert!(!other.get::<_, bool>("all_held"));
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    assert_eq!(
        key_row(&client, "alice", "click-2").await,
        Some((Some(9), None, None))
    );
}

#[tokio::test]
async fn the_settlements_settle_the_order_sell_or_free_its_holds_and_answer_the_key() {
    let app = spawn_app().await;
    let client = app.db.client().await;

    // A claimed click's settlement: paid, its holds sold, its answer stored.
    let holds = two_holds(&app, "paid").await;
    let order_id = Uuid::new_v4();
    place(&client, ("alice", "pay", 7), order_id, &holds).await;
    let body = b"{\"status\":\"paid\"}".to_vec();
    let stale = settle_claimed(
        &client,
        ("alice", "pay", 8),
        created(order_id, &body),
        order_id,
        ("paid", Some("ch_1"), None),
    )
    .await;
    assert!(
        stale.get::<_, bool>("settled"),
        "the outcome is recorded whoever holds the key"
    );
    assert!(!stale.get::<_, bool>("held"), "but only the holder answers");
    assert_eq!(
        order_status(&client, "alice", order_id).await.as_deref(),
        Some("paid")
    );
    assert_eq!(
        holds_of(&client, &holds).await,
        vec![(Some(order_id), true); 2]
    );
    assert_eq!(
        key_row(&client, "alice", "pay").await,
        Some((Some(7), Some(order_id.to_string()), None))
    );
    assert_eq!(
        settled_marks(&client, "alice", "pay").await,
        (true, false),
        "a lost claim's settlement still tells the key that its order settled"
    );

    let holds = two_holds(&app, "paid-too").await;
    let order_id = Uuid::new_v4();
    place(&client, ("alice", "pay-too", 7), order_id, &holds).await;
    let settled = settle_claimed(
        &client,
        ("alice", "pay-too", 7),
        created(order_id, &body),
        order_id,
        ("paid", Some("ch_2"), None),
    )
    .await;
    assert!(settled.get::<_, bool>("settled"));
    assert!(settled.get::<_, bool>("held"));
    assert_eq!(
        key_row(&client, "alice", "pay-too").await,
        Some((None, None, Some(201))),
        "an answered key keeps only its answer"
    );
    assert_eq!(
        settled_marks(&client, "alice", "pay-too").await,
        (false, false),
        "paid: a purge need not keep the answer, and the key was written once"
    );

    // A claimed click declined: the answer is all that stops a retry from
    // paying again, said with the answer itself.
    let holds = two_holds(&app, "declined-click").await;
    let order_id = Uuid::new_v4();
    place(&client, ("alice", "decline-click", 7), order_id, &holds).await;
    let problem = b"{\"type\":\"payment-declined\"}".to_vec();
    let declined = settle_claimed(
        &client,
        ("alice", "decline-click", 7),
        (402, "application/problem+json", None, &problem),
        order_id,
        ("declined", None, Some("card_declined")),
    )
    .await;
    assert!(declined.get::<_, bool>("held"));
    assert_eq!(holds_of(&client, &holds).await, vec![(None, false); 2]);
    assert_eq!(
        key_row(&client, "alice", "decline-click").await,
        Some((None, None, Some(402)))
    );
    assert!(
        settled_marks(&client, "alice", "decline-click").await.1,
        "a purge keeps a declined click's answer until it expires"
    );

    // A settlement outside any claim: declined, its holds given back.
    let holds = two_holds(&app, "declined").await;
    let order_id = Uuid::new_v4();
    place(&client, ("alice", "decline", 7), order_id, &holds).await;
    let declined = client
        .query(
            "SELECT status FROM checkout_settle_order($1, $2, 'declined', 'ch_3')",
            &[&"alice", &order_id],
        )
        .await
        .expect("checkout_settle_order");
    assert_eq!(declined.len(), 1);
    assert_eq!(holds_of(&client, &holds).await, vec![(None, false); 2]);
    let twice = client
        .query(
            "SELECT status FROM checkout_settle_order($1, $2, 'paid', 'ch_3')",
            &[&"alice", &order_id],
        )
        .await
        .expect("checkout_settle_order again");
    assert!(twice.is_empty(), "a settled order is not settled again");
    assert_eq!(
        order_status(&client, "alice", order_id).await.as_deref(),
        Some("declined")
    );
}

#[tokio::test]
async fn the_key_less_order_and_the_hold_step_leave_their_rows() {
    let app = spawn_app().await;
    let client = app.db.client().await;
    let holds = two_holds(&app, "key-less").await;
    let order_id = Uuid::new_v4();
    let made = client
        .query_one(
            "SELECT * FROM checkout_make_order('alice', '', $1, $2, 'USD', 'pm_card_visa')",
            &[&order_id, &holds],
        )
        .await
        .expect("checkout_make_order");
    assert!(made.get::<_, bool>("all_held"));
    assert_eq!(
        holds_of(&client, &holds).await,
        vec![(Some(order_id), false); 2]
    );
    assert_eq!(app.buyer_keys().await, 0);

    // The hold step: a hold, then the cap.
    let seats = app.seed("capped", 3, 1000).await;
    let hold = |seat: i64| {
        let client = &client;
        async move {
            client
                .query_opt(
                    "SELECT * FROM checkout_place_hold($1, $2, 'bob', 60, 2)",
                    &[&stagedoor_checkout::checkout::slot_of(seat), &seat],
                )
                .await
                .expect("checkout_place_hold")
        }
    };
    for &seat in &seats[..2] {
        let row = hold(seat).await.expect("a hold");
        assert!(!row.get::<_, bool>("over_limit"));
        assert!(row.get::<_, Option<i64>>("new_hold_id").is_some());
    }
    let refused = hold(seats[2]).await.expect("the cap's row");
    assert!(refused.get::<_, bool>("over_limit"));
    assert_eq!(
        app.count("SELECT count(*) FROM holds WHERE user_id = 'bob'")
            .await,
        2
    );
    assert!(hold(-1).await.is_none(), "no row for no such seat");
}
