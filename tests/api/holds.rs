use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;

use crate::helpers::{new_key, spawn_app, spawn_app_with, Seen, TestApp};
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

/// `holds.max_per_buyer` for the tests below that do not race.
const LIMIT: u32 = 3;

async fn limited_app(max_per_buyer: u32) -> TestApp {
    spawn_app_with(|s| s.holds.max_per_buyer = max_per_buyer).await
}

async fn holds_of(app: &TestApp, buyer: &str) -> i64 {
    let client = app.db.client().await;
    client
        .query_one("SELECT count(*) FROM holds WHERE user_id = $1", &[&buyer])
        .await
        .unwrap()
        .get(0)
}

fn assert_hold_limit_reached(seen: &Seen, why: &str) {
    assert_eq!(seen.status, 409, "{why}");
    assert_eq!(seen.problem(), "hold-limit-reached", "{why}");
    let body = seen.json();
    assert_eq!(body["status"], 409, "{why}");
    assert!(body["detail"].is_string(), "{why}");
}

/// One buyer could hold every seat of an event, re-holding each as it
/// expired: past `holds.max_per_buyer` live holds on one event the next is
/// refused, writes nothing, and other buyers and events are untouched.
#[tokio::test]
async fn a_hold_past_the_buyers_limit_on_an_event_is_409_and_writes_nothing() {
    let app = limited_app(LIMIT).await;
    let seats = app.seed("show", 5, 1000).await;
    for &seat in &seats[..3] {
        app.hold("mallory", seat).await;
    }
    let refused = Seen::of(app.post_hold("mallory", seats[3], None).await).await;
    assert_hold_limit_reached(&refused, "unkeyed");
    assert_eq!(holds_of(&app, "mallory").await, 3);

    // A keyed hold stores the refusal like any 4xx: its retry replays it.
    let key = new_key();
    let first = Seen::of(app.post_hold("mallory", seats[3], Some(&key)).await).await;
    assert_hold_limit_reached(&first, "keyed");
    assert!(!first.replayed);
    let retry = Seen::of(app.post_hold("mallory", seats[3], Some(&key)).await).await;
    assert_hold_limit_reached(&retry, "the keyed retry");
    assert!(retry.replayed && retry.body == first.body);
    assert_eq!(holds_of(&app, "mallory").await, 3);
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE response_status = 409")
            .await,
        1
    );

    // The seat is still free for anyone else; another event is not limited.
    app.hold("alice", seats[3]).await;
    let other = app.seed("matinee", 1, 1000).await;
    app.hold("mallory", other[0]).await;
    assert_invariants(&app).await;
}

#[tokio::test]
async fn holds_taken_by_an_order_or_expired_or_released_do_not_count() {
    let app = limited_app(LIMIT).await;
    let seats = app.seed("show", 7, 1000).await;
    let held: Vec<i64> = {
        let mut held = Vec::new();
        for &seat in &seats[..3] {
            held.push(app.hold("alice", seat).await);
        }
        held
    };
    let paid = Seen::of(
        app.post_order("alice", &new_key(), &held[..2], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(paid.status, 201);
    // Two are in an order now: two more may be held, not three.
    app.hold("alice", seats[3]).await;
    let last = app.hold("alice", seats[4]).await;
    let refused = Seen::of(app.post_hold("alice", seats[5], None).await).await;
    assert_hold_limit_reached(&refused, "three live holds again");

    assert_eq!(app.delete_hold("alice", last).await.status(), 204);
    app.hold("alice", seats[5]).await;

    // Let every unordered hold of hers run out (made in earlier
    // transactions, so `now()` is past their `created_at`; Citus refuses
    // an expression over the row's own columns here).
    let client = app.db.client().await;
    client
        .execute(
            "UPDATE holds SET expires_at = now()
             WHERE user_id = 'alice' AND order_id IS NULL",
            &[],
        )
        .await
        .unwrap();
    app.hold("alice", seats[6]).await;
    assert_invariants(&app).await;
}

/// Settles a buyer's order as Payrail's decline does, by the function
/// every path of a decline calls (the click, Payrail's event,
/// reconciliation): the order `declined`, its holds given back.
async fn decline(app: &TestApp, buyer: &str, order_id: &str) {
    let client = app.db.client().await;
    let settled = client
        .query(
            "SELECT 1 FROM checkout_settle_order($1, $2::text::uuid, 'declined', NULL)",
            &[&buyer, &order_id],
        )
        .await
        .unwrap();
    assert_eq!(settled.len(), 1, "the order was pending");
}

/// Holds `seats` for `buyer` and orders them with a card whose payment
/// fails at Payrail: the click is 503 and its order stays `payment_pending`
/// (reconciliation waits `reconcile.grace_secs`, 30 s, before it asks).
async fn order_left_pending(app: &TestApp, buyer: &str, seats: &[i64]) -> String {
    let mut held = Vec::new();
    for &seat in seats {
        held.push(app.hold(buyer, seat).await);
    }
    let seen = Seen::of(
        app.post_order(buyer, &new_key(), &held, "pm_card_error")
            .await,
    )
    .await;
    assert_eq!(seen.status, 503, "Payrail answered 500");
    app.only_order_id().await
}

/// A buyer at the limit whose order's payment never comes cannot hold the
/// limit again: the seats of a pending order count until it settles. A
/// decline gives them back as live holds, which still count; a paid order's
/// seats do not.
#[tokio::test]
async fn seats_in_an_order_waiting_for_its_payment_count_toward_the_limit() {
    let app = limited_app(LIMIT).await;
    let seats = app.seed("show", 6, 1000).await;
    let order_id = order_left_pending(&app, "mallory", &seats[..3]).await;
    for key in [None, Some(new_key())] {
        let refused = Seen::of(app.post_hold("mallory", seats[3], key.as_deref()).await).await;
        assert_hold_limit_reached(&refused, "three seats in a pending order");
    }
    assert_eq!(holds_of(&app, "mallory").await, 3);
    // Another event is not limited by this one's order; nor is anyone else.
    let other = app.seed("matinee", 1, 1000).await;
    app.hold("mallory", other[0]).await;
    app.hold("alice", seats[3]).await;

    decline(&app, "mallory", &order_id).await;
    let refused = Seen::of(app.post_hold("mallory", seats[4], None).await).await;
    assert_hold_limit_reached(&refused, "three live holds given back by the decline");

    let client = app.db.client().await;
    let given_back: Vec<i64> = client
        .query(
            "SELECT h.hold_id FROM holds h JOIN seats s USING (slot, seat_id)
             WHERE h.user_id = 'mallory' AND s.event_id = 'show' ORDER BY h.hold_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let paid = Seen::of(
        app.post_order("mallory", &new_key(), &given_back, "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(paid.status, 201);
    app.hold("mallory", seats[4]).await;
    app.hold("mallory", seats[5]).await;
    assert_invariants(&app).await;
}

/// An order keeps its seats past its holds' expiry until it settles, and
/// so they count as long.
#[tokio::test]
async fn a_pending_orders_seats_count_after_their_holds_would_have_expired() {
    let app = limited_app(LIMIT).await;
    let seats = app.seed("show", 4, 1000).await;
    let order_id = order_left_pending(&app, "mallory", &seats[..3]).await;
    let client = app.db.client().await;
    client
        .execute(
            "UPDATE holds SET expires_at = now() WHERE user_id = 'mallory'",
            &[],
        )
        .await
        .unwrap();
    let refused = Seen::of(app.post_hold("mallory", seats[3], None).await).await;
    assert_hold_limit_reached(&refused, "a pending order's expired holds");

    // Declined, its holds come back expired, and count no more.
    decline(&app, "mallory", &order_id).await;
    app.hold("mallory", seats[3]).await;
    assert_invariants(&app).await;
}

/// Concurrent holds of one buyer at the limit, on one instance or two
/// (the count is the database's): exactly `max_per_buyer` get through.
async fn race_to_the_limit(apps: &[Arc<TestApp>], max_per_buyer: u32, racers: usize) {
    let seats = apps[0].seed("rush", racers as u32, 1000).await;
    let barrier = Arc::new(Barrier::new(racers));
    let mut tasks = Vec::new();
    for (i, &seat) in seats.iter().enumerate() {
        let (app, barrier) = (apps[i % apps.len()].clone(), barrier.clone());
        // Keyed and unkeyed holds alike.
        let key = (i % 2 == 0).then(new_key);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            Seen::of(app.post_hold("mallory", seat, key.as_deref()).await).await
        }));
    }
    let mut held = 0;
    for task in tasks {
        let seen = task.await.unwrap();
        match seen.status {
            201 => held += 1,
            _ => assert_hold_limit_reached(&seen, "a racer past the limit"),
        }
    }
    assert_eq!(held, max_per_buyer);
    assert_eq!(
        holds_of(&apps[0], "mallory").await,
        i64::from(max_per_buyer)
    );
    assert_invariants(&apps[0]).await;
}

#[tokio::test]
async fn a_buyers_holds_racing_at_the_limit_end_with_exactly_the_limit() {
    // The shipped default.
    let app = Arc::new(limited_app(10).await);
    race_to_the_limit(&[app], 10, 32).await;
}

#[tokio::test]
async fn the_limit_holds_across_instances_on_one_database() {
    let first = limited_app(LIMIT).await;
    let second = first.another_instance().await;
    race_to_the_limit(&[Arc::new(first), Arc::new(second)], LIMIT, 16).await;
}
