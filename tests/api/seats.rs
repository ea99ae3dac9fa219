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

/// A page loaded after its buyer made holds still knows which seats are the
/// buyer's: the seat map names the caller's live holds, and nobody else's.
#[tokio::test]
async fn the_seat_map_names_the_callers_own_live_holds_and_no_one_elses() {
    let app = spawn_app().await;
    let seats = app.seed("gala", 3, 2500).await;
    let alices = app.hold("alice", seats[0]).await;
    let ordered = app.hold("alice", seats[1]).await;
    let order = app
        .post_order("alice", &new_key(), &[ordered], "pm_card_visa")
        .await;
    assert_eq!(order.status(), 201);

    let your_holds = |body: &serde_json::Value| -> Vec<serde_json::Value> {
        body["seats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["your_hold"].clone())
            .collect()
    };
    let alice = Seen::of(app.get_seats("alice", "gala").await).await.json();
    let mine = your_holds(&alice);
    assert_eq!(mine[0]["hold_id"], alices, "alice's live hold");
    assert!(mine[0]["expires_at"]
        .as_str()
        .is_some_and(|at| at.ends_with('Z')));
    assert_eq!(
        mine[1],
        serde_json::Value::Null,
        "a sold seat is no hold to pay"
    );
    assert_eq!(mine[2], serde_json::Value::Null);

    let bob = Seen::of(app.get_seats("bob", "gala").await).await.json();
    assert_eq!(bob["seats"][0]["status"], "held");
    assert!(
        your_holds(&bob).iter().all(serde_json::Value::is_null),
        "bob sees alice's seat held, not her hold: {bob}"
    );
}

/// The seat map reads its event's holds, not every hold ever made: with
/// the holds of past events in the table (50,000 across 10,000 seats), its
/// plan, generic as the pool's, probes each seat's holds through an index
/// on the seat, never scans the table.
#[tokio::test]
async fn the_seat_map_reads_no_other_events_holds() {
    let app = spawn_app().await;
    app.seed("show", 2_000, 1000).await;
    let past = app.seed("past", 10_000, 1000).await;
    let client = app.db.client().await;
    // Five expired holds on each seat of the past event, one after another.
    client
        .execute(
            "INSERT INTO holds (seat_id, user_id, created_at, expires_at)
             SELECT seat_id, 'crowd', now() - interval '30 days' + n * interval '10 minutes',
                    now() - interval '30 days' + n * interval '10 minutes' + interval '5 minutes'
             FROM unnest($1::bigint[]) AS seat_id, generate_series(1, 5) AS n",
            &[&past],
        )
        .await
        .unwrap();
    client
        .batch_execute(&format!(
            "ANALYZE holds, seats;
             SET plan_cache_mode = force_generic_plan;
             PREPARE seat_map (text, text) AS {}",
            stagedoor_checkout::checkout::seats::SEAT_MAP_STATEMENT
        ))
        .await
        .unwrap();
    let plan: Vec<String> = client
        .simple_query("EXPLAIN EXECUTE seat_map ('show', 'alice')")
        .await
        .unwrap()
        .into_iter()
        .filter_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .collect();
    let plan = plan.join("\n");
    assert!(!plan.contains("Seq Scan on holds"), "{plan}");
    assert!(plan.contains("Index Cond: (seat_id = s.seat_id)"), "{plan}");
}
