//! Retention: holds that expired `holds.retention_secs` ago and that no
//! order took, and order events delivered `outcomes.keep_days` ago, are
//! deleted in batches, one instance at a time, each counted in /metrics;
//! everything else stays, and orders always.

use stagedoor_checkout::jobs::retention::{Retention, Swept, BATCH, RETENTION_LOCK};
use tokio_util::sync::CancellationToken;

use crate::helpers::{new_key, spawn_app, Seen, TestApp};
use crate::invariants::assert_invariants;

/// More than two batches of unordered holds of one seat, one after the
/// other, the last expired two days ago.
const EXPIRED_LONG_AGO: i64 = 2 * BATCH + 345;

async fn execute(app: &TestApp, sql: &str) {
    app.db.client().await.execute(sql, &[]).await.unwrap();
}

/// The value of a counter without labels on the instance's /metrics.
async fn counter(app: &TestApp, name: &str) -> u64 {
    let text = app.metrics().await;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
}

fn retention_of(app: &TestApp) -> Retention {
    let pool = stagedoor_checkout::db::pool(&app.settings.database).unwrap();
    Retention::new(pool, &app.settings.holds, &app.settings.outcomes)
}

/// `n` order events of made-up orders of `buyer` (the table has no key to
/// `orders`), made 60 days ago, delivered and given up as long ago as said.
async fn insert_events(
    app: &TestApp,
    buyer: &str,
    delivered: Option<&str>,
    given_up: Option<&str>,
    n: i64,
) {
    let age = |column: Option<&str>| {
        column.map_or("NULL".to_owned(), |a| format!("now() - interval '{a}'"))
    };
    execute(
        app,
        &format!(
            "INSERT INTO order_events (user_id, order_id, event_id, type, created_at,
                                       delivered_at, given_up_at)
             SELECT '{buyer}', gen_random_uuid(), 'evt_' || md5(random()::text), 'order.paid',
                    now() - interval '60 days', {}, {}
             FROM generate_series(1, {n})",
            age(delivered),
            age(given_up)
        ),
    )
    .await;
}

#[tokio::test]
async fn rows_past_their_retention_go_and_every_other_row_stays() {
    let app = spawn_app().await;
    let seats = app.seed("past", 3, 1000).await;
    // Holds of one seat, one a minute, the last expired two days ago: past
    // the day of retention.
    execute(
        &app,
        &format!(
            "INSERT INTO holds (slot, seat_id, user_id, created_at, expires_at)
             SELECT {seat} >> 40, {seat}, 'crowd-' || g, now() - interval '2 days' - g * interval '1 minute',
                    now() - interval '2 days' - g * interval '1 minute' + interval '30 s'
             FROM generate_series(1, {EXPIRED_LONG_AGO}) g",
            seat = seats[0]
        ),
    )
    .await;
    // Expired an hour ago: inside the retention.
    execute(
        &app,
        &format!(
            "INSERT INTO holds (slot, seat_id, user_id, created_at, expires_at)
             VALUES ({seat} >> 40, {seat}, 'recent', now() - interval '2 hours', now() - interval '1 hour')",
            seat = seats[1]
        ),
    )
    .await;
    // Held in a paid order, expired (as its hold) long ago: the order keeps it.
    let ordered = app.hold("alice", seats[2]).await;
    let paid = Seen::of(
        app.post_order("alice", &new_key(), &[ordered], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(paid.status, 201);
    execute(
        &app,
        "UPDATE holds SET created_at = now() - interval '10 days',
                          expires_at = now() - interval '9 days'
         WHERE order_id IS NOT NULL",
    )
    .await;
    // Delivered 31 days ago, they go; the others stay, the paid order's
    // (not delivered: no `outcomes.webhook_url` here) among them.
    insert_events(&app, "shop-a", Some("31 days"), None, 5).await;
    insert_events(&app, "shop-b", Some("29 days"), None, 3).await;
    insert_events(&app, "shop-c", None, None, 2).await;
    insert_events(&app, "shop-d", None, Some("40 days"), 1).await;

    let (holds_before, events_before) = (
        counter(&app, "retention_holds_deleted_total").await,
        counter(&app, "retention_order_events_deleted_total").await,
    );
    let retention = retention_of(&app);
    assert_eq!(
        retention.run(&CancellationToken::new()).await.unwrap(),
        Swept::Deleted {
            holds: EXPIRED_LONG_AGO as u64,
            order_events: 5
        }
    );
    // Counted as they go (other tests may count in this process too).
    assert!(
        counter(&app, "retention_holds_deleted_total").await
            >= holds_before + EXPIRED_LONG_AGO as u64
    );
    assert!(counter(&app, "retention_order_events_deleted_total").await >= events_before + 5);

    let held = "SELECT user_id FROM holds ORDER BY user_id";
    let client = app.db.client().await;
    let left: Vec<String> = client
        .query(held, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["alice", "recent"]);
    let events = "SELECT user_id FROM order_events ORDER BY user_id";
    let left: Vec<String> = client
        .query(events, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        left,
        ["alice", "shop-b", "shop-b", "shop-b", "shop-c", "shop-c", "shop-d"]
    );
    assert_eq!(
        app.count("SELECT count(*) FROM orders").await,
        1,
        "orders stay"
    );

    // Nothing is left to delete.
    assert_eq!(
        retention.run(&CancellationToken::new()).await.unwrap(),
        Swept::Deleted {
            holds: 0,
            order_events: 0
        }
    );
    let order: serde_json::Value = app
        .get_order("alice", &app.only_order_id().await)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(order["status"], "paid");
    assert_invariants(&app).await;
}

/// A declined order gives its holds back: past their retention they go,
/// and the order still shows its seats.
#[tokio::test]
async fn a_declined_orders_holds_go_and_the_order_stays_whole() {
    let app = spawn_app().await;
    let seats = app.seed("past", 1, 1000).await;
    let hold = app.hold("alice", seats[0]).await;
    let declined = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_declined")
            .await,
    )
    .await;
    assert_eq!(declined.status, 402);
    execute(
        &app,
        "UPDATE holds SET created_at = now() - interval '3 days', expires_at = now() - interval '2 days'",
    )
    .await;
    let retention = retention_of(&app);
    assert_eq!(
        retention.run(&CancellationToken::new()).await.unwrap(),
        Swept::Deleted {
            holds: 1,
            order_events: 0
        }
    );
    let order: serde_json::Value = app
        .get_order("alice", &app.only_order_id().await)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(order["status"], "declined");
    assert_eq!(order["seats"].as_array().map(Vec::len), Some(1));
    // The seat is anyone's again.
    app.hold("bob", seats[0]).await;
    assert_invariants(&app).await;
}

/// One instance at a time: while another holds the lock a run deletes
/// nothing; a stop ends a run after the batch in progress.
#[tokio::test]
async fn one_instance_deletes_at_a_time_and_a_stop_ends_a_run_between_batches() {
    let app = spawn_app().await;
    let seats = app.seed("past", 1, 1000).await;
    execute(
        &app,
        &format!(
            "INSERT INTO holds (slot, seat_id, user_id, created_at, expires_at)
             SELECT {seat} >> 40, {seat}, 'crowd', now() - interval '2 days' - g * interval '1 minute',
                    now() - interval '2 days' - g * interval '1 minute' + interval '30 s'
             FROM generate_series(1, {EXPIRED_LONG_AGO}) g",
            seat = seats[0]
        ),
    )
    .await;
    let retention = retention_of(&app);

    let other_instance = app.db.client().await;
    other_instance
        .execute("SELECT pg_advisory_lock($1)", &[&RETENTION_LOCK])
        .await
        .unwrap();
    assert_eq!(
        retention.run(&CancellationToken::new()).await.unwrap(),
        Swept::Skipped
    );
    assert_eq!(
        app.count("SELECT count(*) FROM holds").await,
        EXPIRED_LONG_AGO
    );
    other_instance
        .execute("SELECT pg_advisory_unlock($1)", &[&RETENTION_LOCK])
        .await
        .unwrap();

    let stopped = CancellationToken::new();
    stopped.cancel();
    assert_eq!(
        retention.run(&stopped).await.unwrap(),
        Swept::Deleted {
            holds: BATCH as u64,
            order_events: 0
        }
    );
    assert_eq!(
        retention.run(&CancellationToken::new()).await.unwrap(),
        Swept::Deleted {
            holds: (EXPIRED_LONG_AGO - BATCH) as u64,
            order_events: 0
        }
    );
    assert_eq!(app.count("SELECT count(*) FROM holds").await, 0);
}
