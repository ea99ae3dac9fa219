use crate::helpers::{spawn_app, Seen};

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
        (reqwest::Method::PUT, "/orders", "POST"),
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
