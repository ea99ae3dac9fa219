use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;

use crate::helpers::{new_key, spawn_app, spawn_app_with, Seen};
use crate::invariants::assert_invariants;

#[tokio::test]
async fn a_hold_is_201_with_its_id_seat_and_expiry() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 1000).await;
    let seen = Seen::of(app.post_hold("alice", seats[0], None).await).await;
    assert_eq!(seen.status, 201);
    assert_eq!(seen.content_type.as_deref(), Some("application/json"));
    let body = seen.json();
    assert!(body["hold_id"].as_i64().is_some());
    assert_eq!(body["seat_id"].as_i64(), Some(seats[0]));
    let expires = body["expires_at"].as_str().unwrap();
    assert!(expires.ends_with('Z') && expires.contains('T'), "{expires}");
}

#[tokio::test]
async fn a_held_seat_is_409_seat_unavailable_for_everyone_else() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 1000).await;
    app.hold("alice", seats[0]).await;
    for buyer in ["bob", "alice"] {
        let seen = Seen::of(app.post_hold(buyer, seats[0], None).await).await;
        assert_eq!(seen.status, 409, "{buyer}");
        assert_eq!(seen.problem(), "seat-unavailable");
    }
}

#[tokio::test]
async fn an_unknown_seat_is_404() {
    let app = spawn_app().await;
    let seen = Seen::of(app.post_hold("alice", 987_654, None).await).await;
    assert_eq!(seen.status, 404);
    assert_eq!(seen.problem(), "not-found");
}

#[tokio::test]
async fn many_buyers_racing_for_one_seat_get_exactly_one_hold() {
    let app = Arc::new(spawn_app().await);
    let seats = app.seed("race", 1, 1000).await;
    let racers = 24;
    let barrier = Arc::new(Barrier::new(racers));
    let mut tasks = Vec::new();
    for i in 0..racers {
        let (app, barrier, seat) = (app.clone(), barrier.clone(), seats[0]);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            Seen::of(app.post_hold(&format!("racer-{i}"), seat, None).await).await
        }));
    }
    let mut won = 0;
    for task in tasks {
        let seen = task.await.unwrap();
        match seen.status {
            201 => won += 1,
            409 => assert_eq!(seen.problem(), "seat-unavailable"),
            other => panic!(
                "unexpected {other}: {:?}",
                String::from_utf8_lossy(&seen.body)
            ),
        }
    }
    assert_eq!(won, 1);
    assert_eq!(app.count("SELECT count(*) FROM holds").await, 1);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn an_expired_hold_frees_its_seat_and_cannot_be_ordered() {
    let app = spawn_app_with(|s| s.holds.ttl_secs = 1).await;
    let seats = app.seed("brief", 1, 1000).await;
    let expired = app.hold("alice", seats[0]).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    let seen = Seen::of(
        app.post_order("alice", &new_key(), &[expired], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(seen.status, 409);
    assert_eq!(seen.problem(), "hold-unavailable");

    app.hold("bob", seats[0]).await;
    assert!(app.charges().await.is_empty());
    assert_invariants(&app).await;
}

#[tokio::test]
async fn a_buyer_can_release_only_their_own_unordered_holds() {
    let app = spawn_app().await;
    let seats = app.seed("show", 2, 1000).await;
    let mine = app.hold("alice", seats[0]).await;
    let ordered = app.hold("alice", seats[1]).await;
    assert_eq!(
        app.post_order("alice", &new_key(), &[ordered], "pm_card_visa")
            .await
            .status(),
        201
    );

    let cases = [
        ("bob", mine, 404, "another buyer's hold"),
        ("alice", ordered, 404, "a hold in a paid order"),
        ("alice", 424_242, 404, "an unknown hold"),
        ("alice", mine, 204, "my own hold"),
        ("alice", mine, 404, "a hold already released"),
    ];
    for (buyer, hold, status, why) in cases {
        let response = app.delete_hold(buyer, hold).await;
        assert_eq!(response.status(), status, "{why}");
        if status == 404 {
            assert_eq!(Seen::of(response).await.problem(), "not-found", "{why}");
        }
    }
    // The released seat can be held again.
    app.hold("bob", seats[0]).await;
    let not_a_number = app
        .as_buyer(app.http.delete(app.url("/holds/abc")), "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(not_a_number.status(), 404);
}
