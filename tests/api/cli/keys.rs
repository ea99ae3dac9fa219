//! `stagedoor-checkout keys show|purge|stats`, run as the real binary on the
//! test app's database: what a support session sees of a paid click, of one
//! whose payment is still settling, and of a key that is not there; which
//! purges are refused because the click would charge again.

use std::time::Duration;

use idempotency::{Engine, IdempotencyKey, Policy, RequestHash};
use serde_json::Value;
use test_support::paused::Paused;

use super::run;
use crate::helpers::{new_key, order_body, pool, spawn_app, spawn_app_with, Seen, TestApp};
use crate::invariants::assert_invariants;

/// What a `keys` command printed, and its exit status.
struct Keys {
    status: i32,
    json: Value,
    stderr: String,
}

async fn keys(app: &TestApp, args: &[&str], env: &[(&str, &str)]) -> Keys {
    let mut all = vec!["keys"];
    all.extend_from_slice(args);
    let output = run(app, &all, env).await;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let json = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: one JSON document ({e}); stderr: {stderr}"));
    Keys {
        status: output.status.code().expect("an exit status"),
        json,
        stderr,
    }
}

async fn key_rows(app: &TestApp, key: &str) -> i64 {
    let client = app.db.client().await;
    client
        .query_one(
            "SELECT count(*) FROM idempotency_keys WHERE key = $1",
            &[&key],
        )
        .await
        .unwrap()
        .get(0)
}

/// Payrail answers `pm_card_slow` after 10 s; the service gives up after
/// 300 ms and one attempt, so that click's order stays `payment_pending`.
async fn impatient_app() -> TestApp {
    spawn_app_with(|settings| {
        settings.payrail.timeout_ms = 300;
        settings.payrail.max_attempts = 1;
    })
    .await
}

/// A click whose payment timed out: its key and its order, still settling.
async fn timed_out_click(app: &TestApp, seat: i64) -> String {
    let hold = app.hold("alice", seat).await;
    let key = new_key();
    let timed_out = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_slow").await).await;
    assert_eq!(timed_out.status, 504, "{:?}", timed_out.slug);
    key
}

#[tokio::test]
async fn show_tells_a_paid_click_a_settling_one_and_an_absent_one_apart() {
    let app = impatient_app().await;
    let seats = app.seed("show", 2, 4_500).await;
    let hold = app.hold("alice", seats[0]).await;
    let paid_key = new_key();
    let paid = Seen::of(
        app.post_order("alice", &paid_key, &[hold], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(paid.status, 201);
    let order = paid.json();

    let shown = keys(&app, &["show", "--user", "alice", "--key", &paid_key], &[]).await;
    assert_eq!(shown.status, 0, "{}", shown.stderr);
    let doc = &shown.json;
    assert_eq!(doc["state"], "answered");
    assert_eq!(doc["effect"]["id"], order["order_id"]);
    assert_eq!(doc["effect"]["order"]["status"], "paid");
    assert_eq!(doc["effect"]["order"]["charge_id"], order["charge_id"]);
    assert_eq!(doc["response"]["status"], 201);
    assert_eq!(doc["response"]["content_type"], "application/json");
    assert_eq!(
        doc["response"]["location"].as_str(),
        paid.location.as_deref()
    );
    assert_eq!(doc["response"]["body_bytes"], paid.body.len());
    assert!(
        doc["response"].get("body").is_none(),
        "the body only with --body"
    );
    for time in ["created_at", "expires_at"] {
        assert!(
            doc[time].as_str().is_some_and(|t| t.ends_with('Z')),
            "{time}"
        );
    }
    assert_eq!(
        (&doc["lease_expires_at"], &doc["lease_expired"]),
        (&Value::Null, &Value::Bool(false)),
        "an answered key keeps no claim"
    );

    let with_body = keys(
        &app,
        &["show", "--user", "alice", "--key", &paid_key, "--body"],
        &[],
    )
    .await;
    let body = &with_body.json["response"]["body"];
    assert_eq!(body["encoding"], "utf-8");
    assert_eq!(body["data"].as_str().unwrap().as_bytes(), paid.body);

    // The quoted form of the header is the same key.
    let settling_key = timed_out_click(&app, seats[1]).await;
    let quoted = format!("\"{settling_key}\"");
    let settling = keys(&app, &["show", "--user", "alice", "--key", &quoted], &[]).await;
    assert_eq!(settling.status, 0, "{}", settling.stderr);
    let doc = &settling.json;
    assert_eq!(doc["key"], settling_key.as_str());
    assert_eq!(doc["state"], "in_progress");
    assert_eq!(doc["lease_expired"], false);
    assert_eq!(doc["effect"]["order"]["status"], "payment_pending");
    assert_eq!(doc["effect"]["order"]["charge_id"], Value::Null);
    assert_eq!(doc["response"], Value::Null);

    // Never sent, or another buyer's: absent, and nothing more.
    for (user, key) in [("alice", "never-sent"), ("bob", paid_key.as_str())] {
        let absent = keys(&app, &["show", "--user", user, "--key", key], &[]).await;
        assert_eq!(absent.status, 1, "{user} {key}");
        assert_eq!(
            absent.json,
            serde_json::json!({"user_id": user, "key": key, "state": "absent"})
        );
    }
}

#[tokio::test]
async fn purge_refuses_a_click_in_progress_or_settling_and_its_key_stays() {
    let app = impatient_app().await;
    let seats = app.seed("refuse", 1, 4_500).await;

    // A request holds this key right now, before it has made anything.
    let holding = new_key();
    let engine = Engine::new(
        pool(&app.db.url),
        Policy {
            ttl: Duration::from_secs(86_400),
            lease: Duration::from_secs(30),
        },
    );
    let body = order_body(&[1], "pm_card_visa");
    let claimed = Paused::start(
        &engine,
        "alice",
        &IdempotencyKey::parse(holding.as_bytes()).unwrap(),
        &RequestHash::of("POST", "/orders", body.as_bytes()),
    )
    .await
    .map(Paused::crash);
    assert!(claimed.is_ok(), "a new key is claimed");
    let refused = keys(&app, &["purge", "--user", "alice", "--key", &holding], &[]).await;
    assert_eq!(refused.status, 2);
    assert_eq!(refused.json["state"], "in_progress");
    assert!(refused.stderr.contains("in progress"), "{}", refused.stderr);
    assert_eq!(key_rows(&app, &holding).await, 1);

    // Payrail timed out: the order waits for its answer, so does the key.
    let settling = timed_out_click(&app, seats[0]).await;
    let refused = keys(&app, &["purge", "--user", "alice", "--key", &settling], &[]).await;
    assert_eq!(refused.status, 2);
    assert_eq!(refused.json["effect"]["order"]["status"], "payment_pending");
    assert!(
        refused.stderr.starts_with("refused: ") && refused.stderr.contains("payment_pending"),
        "{}",
        refused.stderr
    );
    assert_eq!(key_rows(&app, &settling).await, 1);

    // Past its TTL the key would be a new intent, but the order still waits.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let short_ttl = [("STAGEDOOR__IDEMPOTENCY__TTL_SECS", "1")];
    let refused = keys(
        &app,
        &["purge", "--user", "alice", "--key", &settling],
        &short_ttl,
    )
    .await;
    assert_eq!(refused.status, 2);
    assert_eq!(refused.json["state"], "expired");
    assert!(
        refused.stderr.contains("payment_pending"),
        "{}",
        refused.stderr
    );
    assert_eq!(key_rows(&app, &settling).await, 1);
}

/// A declined click's holds go back to the buyer, and its stored 402 is all
/// that stops a retry from ordering them again: forgotten, the retry would
/// make a second order and a second charge the buyer was told would not
/// happen. Refused while the key lives; once expired the retry is a new
/// click anyway, and the purge goes through.
#[tokio::test]
async fn purge_refuses_a_declined_click_until_its_key_expires() {
    let app = spawn_app().await;
    let seats = app.seed("declined", 1, 4_500).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();
    let declined = Seen::of(
        app.post_order("alice", &key, &[hold], "pm_card_declined")
            .await,
    )
    .await;
    assert_eq!(
        (declined.status, declined.slug.as_deref()),
        (402, Some("payment-declined"))
    );

    let refused = keys(&app, &["purge", "--user", "alice", "--key", &key], &[]).await;
    assert_eq!(refused.status, 2, "{}", refused.stderr);
    assert_eq!(refused.json["state"], "answered");
    assert_eq!(refused.json["effect"]["order"]["status"], "declined");
    assert!(
        refused.stderr.starts_with("refused: ")
            && refused.stderr.contains("declined")
            && refused.stderr.contains("charge again"),
        "{}",
        refused.stderr
    );
    assert_eq!(key_rows(&app, &key).await, 1);
    let retry = Seen::of(
        app.post_order("alice", &key, &[hold], "pm_card_declined")
            .await,
    )
    .await;
    assert_eq!((retry.status, retry.replayed), (402, true));
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE user_id = 'alice'")
            .await,
        1,
        "the retry made no second order"
    );
    assert_eq!(app.charges().await.len(), 1, "nor a second charge");

    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let short_ttl = [("STAGEDOOR__IDEMPOTENCY__TTL_SECS", "1")];
    let purged = keys(
        &app,
        &["purge", "--user", "alice", "--key", &key],
        &short_ttl,
    )
    .await;
    assert_eq!(purged.status, 0, "{}", purged.stderr);
    assert_eq!(purged.json["state"], "expired");
    assert_eq!(key_rows(&app, &key).await, 0);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn purge_of_an_answered_click_makes_its_key_a_new_intent() {
    let app = spawn_app().await;
    let seats = app.seed("again", 1, 4_500).await;
    let key = new_key();
    let first = Seen::of(app.post_hold("alice", seats[0], Some(&key)).await).await;
    assert_eq!(first.status, 201);
    let replay = Seen::of(app.post_hold("alice", seats[0], Some(&key)).await).await;
    assert!(replay.replayed && replay.body == first.body);
    let hold_id = first.json()["hold_id"].as_i64().unwrap();
    assert_eq!(app.delete_hold("alice", hold_id).await.status(), 204);

    let purged = keys(&app, &["purge", "--user", "alice", "--key", &key], &[]).await;
    assert_eq!(purged.status, 0, "{}", purged.stderr);
    assert_eq!(purged.json["state"], "answered");
    assert_eq!(purged.json["response"]["status"], 201);
    assert_eq!(purged.json["response"]["body_bytes"], first.body.len());
    assert_eq!(key_rows(&app, &key).await, 0);

    // The same request again is a new click: a fresh hold, not the old answer.
    let again = Seen::of(app.post_hold("alice", seats[0], Some(&key)).await).await;
    assert_eq!(again.status, 201);
    assert!(!again.replayed);
    assert_ne!(again.json()["hold_id"].as_i64(), Some(hold_id));

    let gone = keys(&app, &["purge", "--user", "bob", "--key", &key], &[]).await;
    assert_eq!(
        (gone.status, gone.json["state"].as_str()),
        (1, Some("absent"))
    );
    assert_invariants(&app).await;
}

#[tokio::test]
async fn stats_count_the_rows_the_table_holds() {
    let app = impatient_app().await;
    let seats = app.seed("count", 3, 4_500).await;
    for seat in &seats[..2] {
        let hold = Seen::of(app.post_hold("alice", *seat, Some(&new_key())).await).await;
        assert_eq!(hold.status, 201);
    }
    timed_out_click(&app, seats[2]).await;
    // The table then holds these three keys alone: the instance's jobs
    // stop, and the keys its sale job claimed for windows of expired holds
    // (a scope of its own) go, which would otherwise come and expire
    // while the counts below are compared.
    app.stop().await;
    app.db
        .client()
        .await
        .execute(
            "DELETE FROM idempotency_keys WHERE left(user_id, 1) = chr(1)",
            &[],
        )
        .await
        .expect("the sale job's keys deleted");

    let stats = keys(&app, &["stats"], &[]).await;
    assert_eq!(stats.status, 0, "{}", stats.stderr);
    let doc = &stats.json;
    let answered = app
        .count("SELECT count(*) FROM idempotency_keys WHERE response_status IS NOT NULL")
        .await;
    let in_progress = app
        .count("SELECT count(*) FROM idempotency_keys WHERE response_status IS NULL")
        .await;
    assert_eq!((answered, in_progress), (2, 1));
    assert_eq!(doc["rows"]["answered"], answered);
    assert_eq!(doc["rows"]["in_progress"], in_progress);
    assert_eq!(doc["rows"]["expired"], 0);
    assert_eq!(doc["rows"]["total"], 3);
    assert_eq!(doc["cleanup_would_delete"], 0);
    assert!(doc["oldest_row_age_secs"].as_f64().unwrap() > 0.0);
    assert!(doc["table_bytes"].as_u64().unwrap() > 0);
    assert!(doc["index_bytes"].as_u64().unwrap() > 0);

    // Under a TTL of a second, a second later, the cleanup would take them all.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let short_ttl = [("STAGEDOOR__IDEMPOTENCY__TTL_SECS", "1")];
    let later = keys(&app, &["stats"], &short_ttl).await;
    // The timed-out click's order still waits for its payment: its key stays.
    assert_eq!(later.json["rows"]["expired"], 3);
    assert_eq!(later.json["cleanup_would_delete"], 2);
    let cleanup = run(&app, &["cleanup"], &short_ttl).await;
    assert_eq!(String::from_utf8_lossy(&cleanup.stdout).trim(), "2");
    let after = keys(&app, &["stats"], &short_ttl).await;
    assert_eq!(after.json["rows"]["total"], 1);
    assert_eq!(after.json["cleanup_would_delete"], 0);
}

#[tokio::test]
async fn bad_arguments_exit_2_and_a_failure_3_with_nothing_on_stdout() {
    let app = spawn_app().await;
    for args in [
        &["keys", "show", "--user", "alice"][..],
        &["keys", "show", "--user", "alice", "--key", "a b"],
        &["keys", "purge", "--user", "no\u{1}one", "--key", "k"],
        &["keys", "purge", "--user", "alice", "--key", "\"unbalanced"],
    ] {
        let output = run(&app, args, &[]).await;
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
    let mut missing = app.db.url.clone();
    missing.push_str("_missing");
    let output = run(
        &app,
        &["keys", "show", "--user", "alice", "--key", "k"],
        &[("DATABASE_URL", &missing)],
    )
    .await;
    assert_eq!(output.status.code(), Some(3));
    assert!(output.stdout.is_empty());
    assert!(String::from_utf8_lossy(&output.stderr).starts_with("error: "));
}
