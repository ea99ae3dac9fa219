use std::time::Duration;

use crate::helpers::{spawn_app, spawn_app_with, Seen};

#[tokio::test]
async fn health_and_readiness_answer_without_a_token() {
    let app = spawn_app().await;
    for path in ["/healthz", "/readyz"] {
        let response = app.http.get(app.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
    }
}

#[tokio::test]
async fn an_unknown_path_is_a_404_problem() {
    let app = spawn_app().await;
    let seen = Seen::of(app.http.get(app.url("/nope")).send().await.unwrap()).await;
    assert_eq!(seen.status, 404);
    assert_eq!(seen.problem(), "not-found");
}

#[tokio::test]
async fn a_wrong_method_on_a_known_path_is_a_405_problem() {
    let app = spawn_app().await;
    for (method, path, allow) in [
        (reqwest::Method::GET, "/holds", "POST"),
        (reqwest::Method::PUT, "/orders", "GET, POST"),
        (reqwest::Method::POST, "/healthz", "GET"),
        (reqwest::Method::DELETE, "/events/demo/seats", "GET"),
        (reqwest::Method::POST, "/holds/1", "DELETE"),
    ] {
        let response = app
            .as_buyer(app.http.request(method.clone(), app.url(path)), "alice")
            .send()
            .await
            .unwrap();
        assert_eq!(response.headers()["allow"], allow, "{method} {path}");
        let seen = Seen::of(response).await;
        assert_eq!(seen.status, 405, "{method} {path}");
        assert_eq!(seen.problem(), "method-not-allowed");
    }
}

#[tokio::test]
async fn responses_carry_a_request_id() {
    let app = spawn_app().await;
    let response = app
        .http
        .get(app.url("/healthz"))
        .header("X-Request-Id", "trace-123")
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-request-id"], "trace-123");
}

#[tokio::test]
async fn a_flood_of_readiness_calls_shares_a_few_database_checks() {
    const CALLS: usize = 500;
    let app = spawn_app_with(|s| {
        s.database.pool_size = 2;
        // The answer cache's listener outlives the instance (it ends with
        // the runtime): without it, every connection ends with the instance.
        s.idempotency.answer_cache_mb = 0;
    })
    .await;
    let mut calls = Vec::new();
    for _ in 0..CALLS {
        let request = app.http.get(app.url("/readyz"));
        calls.push(tokio::spawn(async move { request.send().await }));
    }
    for call in calls {
        let response = call.await.unwrap().expect("GET /readyz");
        assert_eq!(response.status(), 200);
    }
    // Every check is a transaction of the database's. A backend reports its
    // counts when it exits: stop the instance, wait for its connections to
    // end, then read the database's total.
    let db = app.db.clone();
    drop(app);
    let client = db.client().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let others: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                   AND backend_type = 'client backend'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if others == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the instance's connections never ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let transactions: i64 = client
        .query_one(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database
             WHERE datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // Migrating, starting and stopping the instance take some tens; a check
    // per call would be CALLS more.
    assert!(
        transactions < (CALLS / 2) as i64,
        "{transactions} transactions for {CALLS} readiness calls"
    );
}
