//! SQL metacharacters in every field: path ids, the idempotency key, the
//! JSON body.

use reqwest::Response;

use super::{alice_with_a_hold, rows, Rows};
use crate::helpers::{new_key, spawn_app, Seen, TestApp};
use crate::invariants::assert_invariants;

const SQLISH: [&str; 8] = [
    "'; DROP TABLE orders;--",
    "' OR '1'='1",
    "%",
    "_",
    "\\",
    "sh_w",
    "sho%",
    "\u{1F3AD} \u{0161}ow \u{202E}",
];

/// Percent-encodes every byte of a path segment, so that the server gets
/// exactly this text (and `%` and `_` are data, not syntax).
fn segment(text: &str) -> String {
    text.bytes().map(|b| format!("%{b:02X}")).collect()
}

async fn assert_tables_intact(app: &TestApp, expected: Rows) {
    for table in ["events", "seats", "holds", "orders", "idempotency_keys"] {
        assert_eq!(
            app.count(&format!(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename = '{table}'"
            ))
            .await,
            1,
            "table {table}"
        );
    }
    assert_eq!(rows(app).await, expected);
    assert_eq!(app.count("SELECT count(*) FROM events").await, 1);
    assert_eq!(app.count("SELECT count(*) FROM seats").await, 3);
}

#[tokio::test]
async fn sql_metacharacters_in_path_ids_are_404_and_change_nothing() {
    let (app, hold) = alice_with_a_hold().await;
    let order = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_visa")
            .await,
    )
    .await;
    let order_id = order.json()["order_id"].as_str().unwrap().to_owned();
    let seats = app.seed("show", 3, 2500).await; // already there: the same ids
    let spare = app.hold("alice", seats[1]).await;
    let before = rows(&app).await;

    let long = "x".repeat(3_000);
    let mut texts: Vec<String> = SQLISH.iter().map(|s| (*s).to_owned()).collect();
    texts.extend([
        format!("{spare} OR 1=1"),
        format!("{spare};DELETE FROM holds"),
        format!("{order_id}' OR '1'='1"),
        format!("{order_id}%"),
        "-1".to_owned(),
        "99999999999999999999".to_owned(),
        long,
    ]);
    for text in &texts {
        let encoded = segment(text);
        let answers = [
            ("GET seats", app.get_seats("alice", &encoded).await),
            ("GET order", app.get_order("alice", &encoded).await),
            ("DELETE hold", delete_hold_at(&app, &encoded).await),
        ];
        for (what, response) in answers {
            let seen = Seen::of(response).await;
            assert_eq!(seen.status, 404, "{what} {text:?}");
            assert_eq!(seen.problem(), "not-found", "{what} {text:?}");
        }
    }
    // Bytes that are not UTF-8 once decoded are not an id either.
    for raw in ["%FF", "%C0%27", "%00"] {
        for path in [
            format!("/events/{raw}/seats"),
            format!("/orders/{raw}"),
            format!("/holds/{raw}"),
        ] {
            let method = if path.starts_with("/holds") {
                reqwest::Method::DELETE
            } else {
                reqwest::Method::GET
            };
            let response = app
                .as_buyer(app.http.request(method, app.url(&path)), "alice")
                .send()
                .await
                .unwrap();
            let seen = Seen::of(response).await;
            assert_eq!(seen.status, 404, "{path}");
            assert_eq!(seen.problem(), "not-found", "{path}");
        }
    }
    assert_tables_intact(&app, before).await;
    // Everything still answers for the real ids.
    assert_eq!(
        Seen::of(app.get_seats("alice", "show").await).await.status,
        200
    );
    assert_eq!(
        Seen::of(app.get_order("alice", &order_id).await)
            .await
            .status,
        200
    );
    assert_eq!(app.delete_hold("alice", spare).await.status(), 204);
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

/// `DELETE /holds/{segment}` with an already-encoded segment.
async fn delete_hold_at(app: &TestApp, segment: &str) -> Response {
    app.as_buyer(
        app.http.delete(app.url(&format!("/holds/{segment}"))),
        "alice",
    )
    .send()
    .await
    .expect("DELETE hold")
}

#[tokio::test]
async fn an_idempotency_key_made_of_sql_is_stored_literally_and_replays() {
    let app = spawn_app().await;
    let seats = app.seed("show", 6, 2500).await;
    // Visible ASCII, so valid keys: data, never syntax.
    let keys = [
        "'OR'1'='1'--",
        "';DROP/**/TABLE/**/idempotency_keys;--",
        "%",
        "a_c",
        "abc",
        "\\'\\\\%_*",
    ];
    let mut first_answers = Vec::new();
    for (key, seat) in keys.iter().zip(&seats) {
        // `a_c` would match `abc` under LIKE: each key here is its own intent.
        let hold = app.hold("alice", *seat).await;
        let seen = Seen::of(app.post_order("alice", key, &[hold], "pm_card_visa").await).await;
        assert_eq!((seen.status, seen.replayed), (201, false), "{key}");
        first_answers.push((key, hold, seen));
    }
    for (key, hold, first) in &first_answers {
        let again = Seen::of(app.post_order("alice", key, &[*hold], "pm_card_visa").await).await;
        assert_eq!((again.status, again.replayed), (201, true), "{key}");
        assert_eq!(again.body, first.body, "{key}");
        assert_eq!(again.location, first.location, "{key}");
        let stored = app
            .db
            .client()
            .await
            .query_one(
                "SELECT count(*) FROM idempotency_keys WHERE user_id = 'alice' AND key = $1",
                &[key],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
        assert_eq!(stored, 1, "{key} is stored as it was sent");
    }
    // The quoted form is the same key, metacharacters and all.
    let (key, hold, first) = &first_answers[0];
    let quoted = Seen::of(
        app.post_order("alice", &format!("\"{key}\""), &[*hold], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!((quoted.status, quoted.replayed), (201, true));
    assert_eq!(quoted.body, first.body);

    // With spaces it is no key at all (0x20 is not visible ASCII): refused
    // before the key is touched.
    let before = rows(&app).await;
    for key in ["' OR 1=1 --", "'; DROP TABLE idempotency_keys; --"] {
        let seen = Seen::of(app.post_order("alice", key, &[*hold], "pm_card_visa").await).await;
        assert_eq!(seen.status, 400, "{key}");
        assert_eq!(seen.problem(), "idempotency-key-invalid", "{key}");
    }
    assert_eq!(rows(&app).await, before);
    assert_eq!(app.charges().await.len(), keys.len());
    assert_invariants(&app).await;
}

#[tokio::test]
async fn sql_metacharacters_in_json_fields_are_a_4xx_and_charge_nothing() {
    let (app, hold) = alice_with_a_hold().await;
    let before = rows(&app).await;

    // A payment method of the right type but not of the pm_… form is an
    // answer to the intent (422 `invalid-order`): stored, replayed, no order.
    let methods = [
        "pm_'; --",
        "pm_card_visa' OR '1'='1",
        "pm_card_visa;DROP TABLE orders",
        "pm_card_visa\u{0}",
        "pm_%",
        "pm_\u{0161}",
    ];
    for method in methods {
        let key = new_key();
        let seen = Seen::of(app.post_order("alice", &key, &[hold], method).await).await;
        assert_eq!(seen.status, 422, "{method:?}");
        assert_eq!(seen.problem(), "invalid-order", "{method:?}");
        let again = Seen::of(app.post_order("alice", &key, &[hold], method).await).await;
        assert_eq!((again.status, again.replayed), (422, true), "{method:?}");
        assert_eq!(again.body, seen.body, "{method:?}");
    }
    assert_eq!(
        rows(&app).await,
        Rows {
            keys: before.keys + methods.len() as i64,
            ..before
        }
    );

    // Not the right shape: 400 `invalid-request` before the key is touched.
    let before = rows(&app).await;
    let bodies = [
        format!(
            r#"{{"hold_ids": ["{hold}; DROP TABLE holds"], "payment_method": "pm_card_visa"}}"#
        ),
        format!(r#"{{"hold_ids": "{hold} OR 1=1", "payment_method": "pm_card_visa"}}"#),
        format!(r#"{{"hold_ids": [{hold}], "payment_method": ["pm_card_visa", "'--"]}}"#),
        format!(
            r#"{{"hold_ids": [{hold}], "payment_method": "pm_card_visa", "'; DROP TABLE orders;--": 1}}"#
        ),
        format!(r#"{{"hold_ids": [{hold}], "payment_method\u0000": "pm_card_visa"}}"#),
    ];
    for body in &bodies {
        let seen = Seen::of(app.post_order_raw("alice", &new_key(), body).await).await;
        assert_eq!(seen.status, 400, "{body}");
        assert_eq!(seen.problem(), "invalid-request", "{body}");
    }
    for body in [
        r#"{"seat_id": "1 OR 1=1"}"#,
        r#"{"seat_id": 1, "'; DROP TABLE holds;--": 1}"#,
    ] {
        let response = app
            .as_buyer(app.http.post(app.url("/holds")), "alice")
            .header("Idempotency-Key", new_key())
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let seen = Seen::of(response).await;
        assert_eq!(seen.status, 400, "{body}");
        assert_eq!(seen.problem(), "invalid-request", "{body}");
    }
    assert_eq!(rows(&app).await, before);
    assert!(app.charges().await.is_empty());
    assert_tables_intact(&app, before).await;

    // The hold was never touched: it can still be paid for.
    let seen = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(seen.status, 201);
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}
