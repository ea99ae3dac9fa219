use crate::helpers::{new_key, spawn_app, spawn_app_with};

#[tokio::test]
async fn metrics_show_requests_idempotency_payrail_and_the_pool() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();
    for _ in 0..2 {
        app.post_order("alice", &key, &[hold], "pm_card_visa").await;
    }
    // A problem answer is counted by its type.
    assert_eq!(app.post_hold("bob", seats[0], None).await.status(), 409);
    let response = app.http.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = response.text().await.unwrap();
    for expected in [
        r#"http_requests_total{method="POST",route="/orders",status="201",problem="none"}"#,
        r#"http_requests_total{method="POST",route="/holds",status="409",problem="seat-unavailable"}"#,
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

/// A fresh process (the metrics recorder is process-wide, and other tests
/// count in this one) lists every series with known labels before any
/// traffic: at 0, except the pool's sizes, which are read at scrape time.
/// The label values are docs/OPERATIONS.md's, so that code and documentation agree.
#[tokio::test]
async fn a_fresh_instance_lists_every_known_series_at_zero() {
    let app = spawn_app().await;
    let instance = app.spawn_process().await;
    let response = app
        .http
        .get(format!("{}/metrics", instance.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    let value_of = |series: &str| {
        samples.iter().find_map(|line| {
            line.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
                .map(str::to_owned)
        })
    };

    let mut at_zero: Vec<String> = Vec::new();
    let labelled = |name: &str, label: &str, values: &[&str]| -> Vec<String> {
        values
            .iter()
            .map(|v| format!(r#"{name}{{{label}="{v}"}}"#))
            .collect()
    };
    at_zero.extend(labelled(
        "idempotency_outcomes_total",
        "outcome",
        &[
            "first",
            "replay",
            "in_progress",
            "key_reused",
            "expired_takeover",
            "lease_takeover",
        ],
    ));
    at_zero.extend(labelled(
        "idempotency_waits_total",
        "outcome",
        &["answered", "timed_out", "took_over"],
    ));
    at_zero.extend(labelled(
        "payrail_attempts_total",
        "outcome",
        &["succeeded", "declined", "timeout", "error", "refused"],
    ));
    at_zero.extend(labelled(
        "reconcile_runs_total",
        "result",
        &["done", "failed"],
    ));
    at_zero.extend(labelled(
        "reconcile_orders_total",
        "result",
        &["settled", "failed", "gave_up"],
    ));
    for kind in ["charge.succeeded", "charge.declined", "other", "unverified"] {
        for result in [
            "applied",
            "already_settled",
            "duplicate",
            "unknown",
            "contradicting",
            "mismatched",
            "bad_signature",
        ] {
            at_zero.push(format!(
                r#"payrail_events_total{{type="{kind}",result="{result}"}}"#
            ));
        }
    }
    at_zero.extend(labelled(
        "cleanup_runs_total",
        "result",
        &["done", "skipped", "failed"],
    ));
    at_zero.extend(labelled(
        "retention_runs_total",
        "result",
        &["done", "skipped", "failed"],
    ));
    at_zero.extend(labelled(
        "auth_key_fetches_total",
        "result",
        &["ok", "failed"],
    ));
    at_zero.extend(labelled(
        "holds_ended_total",
        "how",
        &["ordered", "expired", "released"],
    ));
    for status in ["paid", "declined", "failed"] {
        for reason in [
            "none",
            "card_declined",
            "insufficient_funds",
            "expired_card",
            "incorrect_cvc",
            "lost_card",
            "stolen_card",
            "other",
            "unknown",
        ] {
            at_zero.push(format!(
                r#"orders_settled_total{{status="{status}",reason="{reason}"}}"#
            ));
        }
    }
    at_zero.extend(
        [
            "order_events_pending",
            "auth_keys_stale",
            "payrail_breaker_open",
            "payrail_breaker_rejections_total",
            "orders_pending",
            "cleanup_rows_deleted_total",
            "retention_holds_deleted_total",
            "retention_order_events_deleted_total",
            r#"db_pool_connections{state="waiting"}"#,
            "idempotency_wait_duration_seconds_count",
            "payrail_attempt_duration_seconds_count",
            "payrail_event_age_seconds_count",
        ]
        .map(str::to_owned),
    );
    for series in &at_zero {
        assert_eq!(
            value_of(series).as_deref(),
            Some("0"),
            "{series} is not at 0 in:\n{text}"
        );
    }
    for state in ["max", "open", "idle"] {
        let series = format!(r#"db_pool_connections{{state="{state}"}}"#);
        assert!(
            value_of(&series).is_some(),
            "{series} missing from:\n{text}"
        );
    }
    assert_eq!(
        value_of(r#"db_pool_connections{state="max"}"#).as_deref(),
        Some("4"),
        "the pool's size (STAGEDOOR__DATABASE__POOL_SIZE of spawn_process)"
    );
    let build = format!(r#"build_info{{version="{}"}}"#, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        value_of(&build).as_deref(),
        Some("1"),
        "{build} in:\n{text}"
    );
    for series in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_threads",
        "process_start_time_seconds",
    ] {
        let value: f64 = value_of(series)
            .unwrap_or_else(|| panic!("{series} missing from:\n{text}"))
            .parse()
            .unwrap();
        assert!(
            value > 0.0 || series == "process_cpu_seconds_total",
            "{series} {value}"
        );
    }
    instance.stop(std::time::Duration::from_secs(10)).await;
}

/// SPEC §13: `server.metrics_addr` is `/metrics`' own listener, and
/// production never serves `/metrics` on the API's (it shows the breaker
/// and the pending orders, by which an attacker would time an attack).
#[tokio::test]
async fn metrics_have_a_listener_of_their_own_and_production_never_shows_them_on_the_api() {
    for environment in ["test", "production", "prod"] {
        let app = spawn_app_with(|s| {
            s.environment = environment.into();
            s.server.metrics_addr = "127.0.0.1:0".into();
        })
        .await;
        let port = app.metrics_port.expect("the metrics listener's port");
        let own = app
            .http
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
            .unwrap();
        assert_eq!(own.status(), 200, "{environment}");
        assert!(own.text().await.unwrap().contains("payrail_breaker_open"));
        let elsewhere = app
            .http
            .get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            elsewhere.status(),
            404,
            "{environment}: /metrics alone there"
        );
        let api = app.http.get(app.url("/metrics")).send().await.unwrap();
        assert_eq!(
            api.status(),
            404,
            "{environment}: not on the API's listener"
        );
        let document: serde_json::Value = app
            .http
            .get(app.url("/openapi.json"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(document["paths"]["/metrics"].is_null(), "{environment}");
    }
    let production = spawn_app_with(|s| s.environment = "production".into()).await;
    assert_eq!(production.metrics_port, None);
    let api = production.http.get(production.url("/metrics")).send().await;
    assert_eq!(api.unwrap().status(), 404, "production, no metrics_addr");
    let local = spawn_app().await;
    let api = local.http.get(local.url("/metrics")).send().await;
    assert_eq!(api.unwrap().status(), 200, "empty: the API's listener");
}
