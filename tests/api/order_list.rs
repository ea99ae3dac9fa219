//! `GET /orders`: the caller's orders, newest first, a page at a time;
//! never another buyer's; a bad `limit` or `after` is a 400 problem.

use std::collections::HashSet;

use serde_json::Value;

use crate::helpers::{new_key, Seen, TestApp};

/// `GET /orders?{query}` as `buyer`: the status and the body.
async fn list(app: &TestApp, buyer: &str, query: &str) -> (u16, Value) {
    let response = app
        .as_buyer(app.http.get(app.url(&format!("/orders?{query}"))), buyer)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Every page of `buyer`'s list, `limit` at a time: each page's order ids.
async fn pages(app: &TestApp, buyer: &str, limit: usize) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut query = format!("limit={limit}");
    loop {
        let (status, page) = list(app, buyer, &query).await;
        assert_eq!(status, 200, "{page}");
        let ids: Vec<String> = page["orders"]
            .as_array()
            .unwrap()
            .iter()
            .map(|order| order["order_id"].as_str().unwrap().to_owned())
            .collect();
        assert!(ids.len() <= limit, "{page}");
        pages.push(ids);
        match page["next"].as_str() {
            Some(next) => query = format!("limit={limit}&after={next}"),
            None => return pages,
        }
    }
}

/// One real click of `buyer` for a new seat of the event; its order.
async fn order(app: &TestApp, buyer: &str, seat: i64, card: &str) -> Value {
    let hold = app.hold(buyer, seat).await;
    let seen = Seen::of(app.post_order(buyer, &new_key(), &[hold], card).await).await;
    seen.json()
}

/// The order ids of the database, as the list must give them: newest first.
async fn newest_first(app: &TestApp, buyer: &str) -> Vec<String> {
    let client = app.db.client().await;
    client
        .query(
            "SELECT order_id::text FROM orders WHERE user_id = $1
             ORDER BY created_at DESC, order_id DESC",
            &[&buyer],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[tokio::test]
async fn the_callers_orders_come_newest_first_each_as_get_shows_it() {
    let app = crate::helpers::spawn_app().await;
    let seats = app.seed("list", 4, 4_500).await;
    let (status, empty) = list(&app, "alice", "").await;
    assert_eq!(status, 200);
    assert_eq!(empty, serde_json::json!({"orders": [], "next": null}));

    let first = order(&app, "alice", seats[0], "pm_card_visa").await;
    let declined = order(&app, "alice", seats[1], "pm_card_declined").await;
    let last = order(&app, "alice", seats[2], "pm_card_visa").await;
    order(&app, "bob", seats[3], "pm_card_visa").await;

    let (status, page) = list(&app, "alice", "").await;
    assert_eq!(status, 200);
    assert_eq!(page["next"], Value::Null, "one page holds them all");
    let orders = page["orders"].as_array().unwrap();
    let ids: Vec<&str> = orders
        .iter()
        .map(|o| o["order_id"].as_str().unwrap())
        .collect();
    let declined_id = declined["order_id"].as_str().unwrap();
    assert_eq!(
        ids,
        [
            last["order_id"].as_str().unwrap(),
            declined_id,
            first["order_id"].as_str().unwrap()
        ]
    );
    for order in orders {
        let id = order["order_id"].as_str().unwrap();
        let shown: Value = app.get_order("alice", id).await.json().await.unwrap();
        assert_eq!(order, &shown, "as GET /orders/{id} shows it");
    }
    assert_eq!(orders[1]["status"], "declined");
    assert_eq!(orders[0], last, "as the click's 201 showed it");

    let (_, bobs) = list(&app, "bob", "").await;
    assert_eq!(bobs["orders"].as_array().unwrap().len(), 1, "{bobs}");
    assert!(!ids.contains(&bobs["orders"][0]["order_id"].as_str().unwrap()));
}

#[tokio::test]
async fn pages_give_every_order_once_whatever_the_limit() {
    let app = crate::helpers::spawn_app().await;
    let seats = app.seed("pages", 5, 4_500).await;
    for seat in &seats {
        order(&app, "alice", *seat, "pm_card_visa").await;
    }
    // Three more made in one microsecond with the newest: the id decides
    // between them, so a page may end among them.
    let client = app.db.client().await;
    client
        .execute(
            "INSERT INTO orders (order_id, user_id, status, amount_cents, currency,
                                 payment_method, hold_ids, seats, charge_id, idempotency_key,
                                 created_at)
             SELECT gen_random_uuid(), user_id, status, amount_cents, currency, payment_method,
                    hold_ids, seats, charge_id, idempotency_key || n, created_at
             FROM orders, generate_series(1, 3) AS n
             WHERE order_id = (SELECT order_id FROM orders ORDER BY created_at DESC LIMIT 1)",
            &[],
        )
        .await
        .unwrap();
    let all = newest_first(&app, "alice").await;
    assert_eq!(all.len(), 8);
    for limit in [1, 2, 3, 7, 8, 100] {
        let pages = pages(&app, "alice", limit).await;
        assert_eq!(
            pages.len(),
            all.len().div_ceil(limit).max(1),
            "limit {limit}"
        );
        let listed: Vec<String> = pages.concat();
        assert_eq!(
            listed, all,
            "limit {limit}: no gap, no repeat, newest first"
        );
    }

    // An order made between two pages shows on none after the first.
    let (_, first) = list(&app, "alice", "limit=2").await;
    let new_seat = app.seed("later", 1, 4_500).await[0];
    let newer = order(&app, "alice", new_seat, "pm_card_visa").await;
    let next = first["next"].as_str().unwrap();
    let (_, second) = list(&app, "alice", &format!("limit=6&after={next}")).await;
    let seen: HashSet<&str> = second["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["order_id"].as_str().unwrap())
        .collect();
    assert!(!seen.contains(newer["order_id"].as_str().unwrap()));
    assert_eq!(seen.len(), 6);
}

#[tokio::test]
async fn a_bad_limit_or_cursor_is_a_400_problem() {
    let app = crate::helpers::spawn_app().await;
    let seats = app.seed("bad", 2, 4_500).await;
    for seat in &seats {
        order(&app, "alice", *seat, "pm_card_visa").await;
    }
    let (_, page) = list(&app, "alice", "limit=1").await;
    let next = page["next"].as_str().unwrap().to_owned();

    let mut tampered = next.clone().into_bytes();
    tampered[5] = if tampered[5] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    for query in [
        "limit=0".to_owned(),
        "limit=101".to_owned(),
        "limit=-1".to_owned(),
        "limit=ten".to_owned(),
        "limit=".to_owned(),
        "limit=1&limit=2".to_owned(),
        format!("after={tampered}"),
        format!("after={}", &next[..next.len() - 2]),
        "after=".to_owned(),
        "after=%FF%FE".to_owned(),
    ] {
        let (status, problem) = list(&app, "alice", &query).await;
        assert_eq!(status, 400, "{query}: {problem}");
        assert_eq!(
            problem["type"], "https://stagedoor.example/problems/invalid-request",
            "{query}"
        );
    }
    // Another buyer's cursor is no cursor of theirs.
    let (status, _) = list(&app, "bob", &format!("after={next}")).await;
    assert_eq!(status, 400);

    for (query, count) in [("limit=1", 1), ("limit=100", 2), ("", 2)] {
        let (status, page) = list(&app, "alice", query).await;
        assert_eq!(status, 200, "{query}");
        assert_eq!(page["orders"].as_array().unwrap().len(), count, "{query}");
    }
    let unauthenticated = app.http.get(app.url("/orders")).send().await.unwrap();
    assert_eq!(unauthenticated.status(), 401);
    let wrong_method = app
        .as_buyer(app.http.put(app.url("/orders")), "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), 405);
    let allow = wrong_method.headers()["allow"].to_str().unwrap().to_owned();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
}
