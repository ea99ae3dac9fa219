//! Each request's log line names its buyer (`user_id`, when the token was
//! good), the order it made or read (`order_id`), and the problem type of a
//! problem answer (`problem`), a replay's too: read from the log of a real
//! process.

use reqwest::Method;
use serde_json::json;

use crate::helpers::{new_key, order_body, spawn_app};

#[tokio::test]
async fn a_request_line_names_its_buyer_its_order_and_its_problem() {
    let app = spawn_app().await;
    let seats = app.seed("logged", 2, 4_500).await;
    let process = app.spawn_process_logging(&app.settings, "info").await;
    let send = |method: Method, path: &str, request_id: &str, buyer: Option<&str>| {
        let mut request = app
            .http
            .request(method, format!("{}{path}", process.url()))
            .header("X-Request-Id", request_id);
        if let Some(buyer) = buyer {
            request = request.bearer_auth(app.token(buyer));
        }
        request
    };

    let hold: serde_json::Value = send(Method::POST, "/holds", "log-hold", Some("alice"))
        .json(&json!({ "seat_id": seats[0] }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let hold_id = hold["hold_id"].as_i64().unwrap();
    let paid = send(Method::POST, "/orders", "log-paid", Some("alice"))
        .header("Idempotency-Key", new_key())
        .header("Content-Type", "application/json")
        .body(order_body(&[hold_id], "pm_card_visa"))
        .send()
        .await
        .unwrap();
    assert_eq!(paid.status(), 201);
    let paid: serde_json::Value = paid.json().await.unwrap();
    let paid_id = paid["order_id"].as_str().unwrap().to_owned();

    let hold = app.hold("bob", seats[1]).await;
    let declined_key = new_key();
    let mut declined_id = String::new();
    for request_id in ["log-declined", "log-declined-again"] {
        let declined = send(Method::POST, "/orders", request_id, Some("bob"))
            .header("Idempotency-Key", &declined_key)
            .header("Content-Type", "application/json")
            .body(order_body(&[hold], "pm_card_declined"))
            .send()
            .await
            .unwrap();
        assert_eq!(declined.status(), 402);
        let problem: serde_json::Value = declined.json().await.unwrap();
        declined_id = problem["order_id"].as_str().unwrap().to_owned();
    }

    let read = send(
        Method::GET,
        &format!("/orders/{paid_id}"),
        "log-read",
        Some("alice"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(read.status(), 200);
    let not_hers = send(
        Method::GET,
        &format!("/orders/{declined_id}"),
        "log-not-hers",
        Some("alice"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(not_hers.status(), 404);
    let anonymous = send(Method::GET, "/orders", "log-anonymous", None)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    let listed = send(Method::GET, "/orders", "log-list", Some("alice"))
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);

    let log = process.log();
    let line_of = |request_id: &str| {
        let tag = format!("request_id={request_id}");
        log.lines()
            .find(|line| line.contains("request finished") && line.contains(&tag))
            .unwrap_or_else(|| panic!("no line for {request_id}:\n{log}"))
            .to_owned()
    };
    let expect = |request_id: &str, present: &[String], absent: &[&str]| {
        let line = line_of(request_id);
        for field in present {
            assert!(
                line.contains(field.as_str()),
                "{request_id}: {field} in {line}"
            );
        }
        for field in absent {
            assert!(!line.contains(field), "{request_id}: no {field} in {line}");
        }
    };
    let alice = r#"user_id="alice""#.to_owned();
    let bob = r#"user_id="bob""#.to_owned();
    expect(
        "log-paid",
        &[alice.clone(), format!("order_id={paid_id}")],
        &["problem="],
    );
    for request_id in ["log-declined", "log-declined-again"] {
        expect(
            request_id,
            &[
                bob.clone(),
                format!("order_id={declined_id}"),
                r#"problem="payment-declined""#.to_owned(),
            ],
            &[],
        );
    }
    expect(
        "log-read",
        &[alice.clone(), format!("order_id={paid_id}")],
        &["problem="],
    );
    expect(
        "log-not-hers",
        &[alice.clone(), r#"problem="not-found""#.to_owned()],
        &["order_id="],
    );
    expect(
        "log-anonymous",
        &[r#"problem="unauthorized""#.to_owned()],
        &["user_id=", "order_id="],
    );
    expect("log-list", &[alice], &["order_id=", "problem="]);
    expect("log-hold", &[], &["order_id=", "problem="]);
}
