use crate::helpers::{new_key, spawn_app, Seen};
use crate::invariants::assert_invariants;

#[tokio::test]
async fn an_order_is_charged_once_and_answered_201_with_its_location() {
    let app = spawn_app().await;
    let seats = app.seed("show", 2, 2500).await;
    let holds = [
        app.hold("alice", seats[1]).await,
        app.hold("alice", seats[0]).await,
    ];

    let seen = Seen::of(
        app.post_order("alice", &new_key(), &holds, "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(seen.status, 201);
    assert_eq!(seen.content_type.as_deref(), Some("application/json"));
    let order = seen.json();
    let order_id = order["order_id"].as_str().unwrap();
    assert_eq!(seen.location, Some(format!("/orders/{order_id}")));
    assert_eq!(order["status"], "paid");
    assert_eq!(order["amount_cents"], 5000);
    assert_eq!(order["currency"], "USD");
    assert_eq!(order["hold_ids"], serde_json::json!(holds));
    assert_eq!(order["seats"], serde_json::json!(["A2", "A1"]));
    assert!(order["charge_id"].as_str().unwrap().starts_with("ch_"));
    assert!(order["created_at"].is_string());

    let ledger = app.charges().await;
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["idempotency_key"], format!("order-{order_id}"));
    assert_eq!(ledger[0]["amount_cents"], 5000);
    assert_eq!(ledger[0]["reference"], order_id);
    assert_eq!(ledger[0]["id"], order["charge_id"]);

    let fetched = Seen::of(app.get_order("alice", order_id).await).await;
    assert_eq!(fetched.status, 200);
    assert_eq!(fetched.json(), order);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn another_buyers_order_is_404() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let order = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_visa")
            .await,
    )
    .await;
    let order_id = order.json()["order_id"].as_str().unwrap().to_owned();
    for (buyer, id) in [
        ("bob", order_id.as_str()),
        ("alice", "8a4f4a56-4b1e-4c36-9d7e-000000000000"),
        ("alice", "not-a-uuid"),
    ] {
        let seen = Seen::of(app.get_order(buyer, id).await).await;
        assert_eq!(seen.status, 404, "{buyer} {id}");
        assert_eq!(seen.problem(), "not-found");
    }
}

#[tokio::test]
async fn a_declined_card_is_402_and_gives_the_holds_back_for_another_click() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;

    let declined = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_declined")
            .await,
    )
    .await;
    assert_eq!(declined.status, 402);
    assert_eq!(declined.problem(), "payment-declined");
    // Why, as Payrail said it: what the buyer's page shows.
    assert_eq!(declined.json()["decline_code"], "card_declined");
    let declined_order = declined.json()["order_id"].as_str().unwrap().to_owned();
    let order = Seen::of(app.get_order("alice", &declined_order).await).await;
    assert_eq!(order.json()["status"], "declined");

    // The seat is still alice's, not anyone else's.
    let seen = Seen::of(app.post_hold("bob", seats[0], None).await).await;
    assert_eq!(seen.problem(), "seat-unavailable");

    let paid = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(paid.status, 201);
    let statuses: Vec<String> = app
        .charges()
        .await
        .iter()
        .map(|c| c["status"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(statuses, ["declined", "succeeded"]);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn holds_that_cannot_be_ordered_are_409_hold_unavailable() {
    let app = spawn_app().await;
    let seats = app.seed("show", 3, 2500).await;
    let mine = app.hold("alice", seats[0]).await;
    let theirs = app.hold("bob", seats[1]).await;
    let ordered = app.hold("alice", seats[2]).await;
    assert_eq!(
        app.post_order("alice", &new_key(), &[ordered], "pm_card_visa")
            .await
            .status(),
        201
    );
    let cases = [
        (vec![mine, theirs], "another buyer's hold"),
        (vec![mine, 999_999], "an unknown hold"),
        (vec![ordered], "a hold already in another order"),
        (vec![mine, ordered], "one of them already ordered"),
    ];
    for (holds, why) in cases {
        let seen = Seen::of(
            app.post_order("alice", &new_key(), &holds, "pm_card_visa")
                .await,
        )
        .await;
        assert_eq!(seen.status, 409, "{why}");
        assert_eq!(seen.problem(), "hold-unavailable", "{why}");
    }
    // Nothing was claimed by the failed attempts: mine can still be ordered.
    let seen = Seen::of(
        app.post_order("alice", &new_key(), &[mine], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(seen.status, 201);
    assert_eq!(app.charges().await.len(), 2);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn semantically_wrong_orders_are_422_invalid_order() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let cases = [
        (
            r#"{"hold_ids":[],"payment_method":"pm_card_visa"}"#.to_owned(),
            "no holds",
        ),
        (
            format!(r#"{{"hold_ids":[{hold},{hold}],"payment_method":"pm_card_visa"}}"#),
            "a duplicate",
        ),
        (
            format!(r#"{{"hold_ids":[{hold}],"payment_method":"visa"}}"#),
            "not a pm_ method",
        ),
    ];
    for (body, why) in cases {
        let seen = Seen::of(app.post_order_raw("alice", &new_key(), &body).await).await;
        assert_eq!(seen.status, 422, "{why}");
        assert_eq!(seen.problem(), "invalid-order", "{why}");
    }
    assert!(app.charges().await.is_empty());
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0);
}
