//! `stagedoor-checkout orders show|list`, run as the real binary on the
//! test app's database: "was I charged?" answered from an order id alone,
//! for a paid, a declined and a still settling order; a buyer's orders,
//! newest first and theirs alone.

use serde_json::Value;

use super::run;
use crate::helpers::{new_key, spawn_app_with, Seen, TestApp};

/// What an `orders` command printed, and its exit status.
struct Printed {
    status: i32,
    json: Value,
    stderr: String,
}

async fn orders(app: &TestApp, args: &[&str]) -> Printed {
    let mut all = vec!["orders"];
    all.extend_from_slice(args);
    let output = run(app, &all, &[]).await;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    Printed {
        status: output.status.code().expect("an exit status"),
        json: serde_json::from_slice(&output.stdout).unwrap_or(Value::Null),
        stderr,
    }
}

/// A click of `buyer` on `seat` with `card`: its key and what it answered.
async fn click(app: &TestApp, buyer: &str, seat: i64, card: &str) -> (String, Seen) {
    let hold = app.hold(buyer, seat).await;
    let key = new_key();
    let seen = Seen::of(app.post_order(buyer, &key, &[hold], card).await).await;
    (key, seen)
}

#[tokio::test]
async fn show_answers_was_i_charged_from_an_order_id_alone() {
    // Payrail answers `pm_card_slow` after 10 s; this instance waits 300 ms.
    let app = spawn_app_with(|settings| {
        settings.payrail.timeout_ms = 300;
        settings.payrail.max_attempts = 1;
    })
    .await;
    let seats = app.seed("support", 3, 4_500).await;

    let (paid_key, paid) = click(&app, "alice", seats[0], "pm_card_visa").await;
    assert_eq!(paid.status, 201);
    let order = paid.json();
    let order_id = order["order_id"].as_str().unwrap();
    let shown = orders(&app, &["show", "--order", order_id]).await;
    assert_eq!(shown.status, 0, "{}", shown.stderr);
    let doc = &shown.json;
    assert_eq!(doc["user_id"], "alice");
    assert_eq!(doc["order"], order, "the order as its buyer sees it");
    let charge = app
        .charges()
        .await
        .into_iter()
        .find(|charge| charge["reference"] == order["order_id"])
        .expect("Payrail's charge of the order");
    assert_eq!(doc["payment"]["charged"], "yes");
    assert_eq!(doc["payment"]["charge_id"], charge["id"]);
    assert_eq!(doc["payment"]["payrail_key"], charge["idempotency_key"]);
    assert_eq!(doc["payment"]["payrail_key"], format!("order-{order_id}"));
    assert_eq!(doc["key"]["key"], paid_key.as_str());
    assert_eq!(doc["key"]["state"], "answered");
    assert_eq!(doc["key"]["response"]["status"], 201);
    assert_eq!(doc["key"]["effect"]["order"]["order_id"], order["order_id"]);
    assert_eq!(doc["event"]["type"], "order.paid");
    assert_eq!(
        doc["event"]["state"], "pending",
        "written with the settlement, though no URL is set"
    );

    let (_, declined) = click(&app, "alice", seats[1], "pm_card_declined").await;
    assert_eq!(declined.status, 402);
    let declined_id = declined.json()["order_id"].as_str().unwrap().to_owned();
    let shown = orders(&app, &["show", "--order", &declined_id]).await;
    assert_eq!(shown.status, 0, "{}", shown.stderr);
    assert_eq!(shown.json["order"]["status"], "declined");
    assert_eq!(shown.json["payment"]["charged"], "no");
    assert_eq!(shown.json["key"]["response"]["status"], 402);
    assert_eq!(shown.json["event"]["type"], "order.declined");

    let (slow_key, slow) = click(&app, "bob", seats[2], "pm_card_slow").await;
    assert_eq!(slow.status, 504);
    let client = app.db.client().await;
    let slow_id: String = client
        .query_one(
            "SELECT order_id::text FROM orders WHERE user_id = 'bob'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let shown = orders(&app, &["show", "--order", &slow_id]).await;
    assert_eq!(shown.status, 0, "{}", shown.stderr);
    let doc = &shown.json;
    assert_eq!(doc["user_id"], "bob");
    assert_eq!(doc["order"]["status"], "payment_pending");
    assert_eq!(doc["payment"]["charged"], "not_known_yet");
    assert_eq!(doc["payment"]["charge_id"], Value::Null);
    assert_eq!(doc["key"]["key"], slow_key.as_str());
    assert_eq!(doc["key"]["state"], "in_progress");
    assert_eq!(
        doc["event"],
        Value::Null,
        "no event before the order settles"
    );

    let unknown = uuid::Uuid::new_v4().to_string();
    let absent = orders(&app, &["show", "--order", &unknown]).await;
    assert_eq!(absent.status, 1, "{}", absent.stderr);
    assert_eq!(
        absent.json,
        serde_json::json!({"order_id": unknown, "order": null})
    );

    for bad in [&["show"][..], &["show", "--order", "not-a-uuid"]] {
        let refused = orders(&app, bad).await;
        assert_eq!(refused.status, 2, "{bad:?}");
        assert_eq!(refused.json, Value::Null, "{bad:?}: nothing on stdout");
    }
}

#[tokio::test]
async fn list_gives_a_buyers_orders_newest_first_and_theirs_alone() {
    let app = crate::helpers::spawn_app().await;
    let seats = app.seed("mine", 4, 4_500).await;
    let mut made = Vec::new();
    for seat in &seats[..3] {
        let (_, seen) = click(&app, "alice", *seat, "pm_card_visa").await;
        made.push(seen.json()["order_id"].clone());
    }
    click(&app, "bob", seats[3], "pm_card_visa").await;
    made.reverse();

    let listed = orders(&app, &["list", "--user", "alice"]).await;
    assert_eq!(listed.status, 0, "{}", listed.stderr);
    assert_eq!(listed.json["user_id"], "alice");
    let ids: Vec<Value> = listed.json["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|order| order["order_id"].clone())
        .collect();
    assert_eq!(ids, made, "newest first, bob's left out");
    assert_eq!(listed.json["more"], false);

    let two = orders(&app, &["list", "--user", "alice", "--limit", "2"]).await;
    assert_eq!(two.json["orders"].as_array().unwrap().len(), 2);
    assert_eq!(two.json["more"], true);

    let nobody = orders(&app, &["list", "--user", "carol"]).await;
    assert_eq!(nobody.status, 0);
    assert_eq!(nobody.json["orders"], serde_json::json!([]));

    for bad in [
        &["list"][..],
        &["list", "--user", "alice", "--limit", "0"],
        &["list", "--user", "alice", "--limit", "101"],
    ] {
        let refused = orders(&app, bad).await;
        assert_eq!(refused.status, 2, "{bad:?}");
    }
}
