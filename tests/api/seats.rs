use crate::helpers::{new_key, spawn_app, Seen};

#[tokio::test]
async fn the_seat_map_shows_available_held_and_sold_seats() {
    let app = spawn_app().await;
    let seats = app.seed("gala", 3, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let sold = app.hold("bob", seats[1]).await;
    let order = app
        .post_order("bob", &new_key(), &[sold], "pm_card_visa")
        .await;
    assert_eq!(order.status(), 201);

    let seen = Seen::of(app.get_seats("carol", "gala").await).await;
    assert_eq!(seen.status, 200);
    let body = seen.json();
    assert_eq!(body["event_id"], "gala");
    let statuses: Vec<(&str, &str, i64)> = body["seats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["label"].as_str().unwrap(),
                s["status"].as_str().unwrap(),
                s["price_cents"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        statuses,
        vec![
            ("A1", "held", 2500),
            ("A2", "sold", 2500),
            ("A3", "available", 2500)
        ]
    );
    assert!(hold > 0);
}

#[tokio::test]
async fn an_unknown_event_is_404() {
    let app = spawn_app().await;
    let seen = Seen::of(app.get_seats("alice", "no-such-event").await).await;
    assert_eq!(seen.status, 404);
    assert_eq!(seen.problem(), "not-found");
}

#[tokio::test]
async fn an_event_id_no_database_can_hold_is_404_not_500() {
    // A NUL byte in the path once reached PostgreSQL, which cannot store it: a 500.
    let app = spawn_app().await;
    for event in ["%00", "demo%00", "a%00b"] {
        let seen = Seen::of(app.get_seats("alice", event).await).await;
        assert_eq!(seen.status, 404, "{event}");
        assert_eq!(seen.problem(), "not-found", "{event}");
    }
}

#[tokio::test]
async fn seeding_twice_adds_nothing() {
    let app = spawn_app().await;
    let first = app.seed("twice", 5, 1000).await;
    let second = app.seed("twice", 5, 9999).await;
    assert_eq!(first, second);
    let seen = Seen::of(app.get_seats("alice", "twice").await).await;
    assert!(seen.json()["seats"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["price_cents"] == 1000));
}
