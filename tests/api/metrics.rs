use crate::helpers::{new_key, spawn_app};

#[tokio::test]
async fn metrics_show_requests_idempotency_payrail_and_the_pool() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();
    for _ in 0..2 {
        app.post_order("alice", &key, &[hold], "pm_card_visa").await;
    }
    let response = app.http.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = response.text().await.unwrap();
    for expected in [
        r#"http_requests_total{method="POST",route="/orders",status="201"}"#,
        r#"http_request_duration_seconds_bucket{method="POST",route="/orders",le="#,
        r#"idempotency_outcomes_total{outcome="first"}"#,
        r#"idempotency_outcomes_total{outcome="replay"}"#,
        r#"payrail_attempts_total{outcome="succeeded"}"#,
        "payrail_attempt_duration_seconds_bucket",
        r#"db_pool_connections{state="max"}"#,
    ] {
        assert!(text.contains(expected), "{expected} missing from:\n{text}");
    }
}
