//! Black-box tests of the Payrail sandbox: real HTTP against a
//! sandbox on port 0, and one run of the stand-alone binary.

use std::sync::Arc;
use std::time::{Duration, Instant};

use payrail_sandbox::Sandbox;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Barrier;

const API_KEY: &str = "sk_test_sandbox";

struct TestSandbox {
    sandbox: Sandbox,
    client: reqwest::Client,
}

async fn spawn_sandbox() -> TestSandbox {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    TestSandbox {
        sandbox: Sandbox::start(listener, API_KEY.to_owned()).unwrap(),
        client: reqwest::Client::new(),
    }
}

fn charge_body(payment_method: &str) -> Value {
    json!({
        "amount_cents": 4200,
        "currency": "EUR",
        "payment_method": payment_method,
        "reference": "order-1",
    })
}

impl TestSandbox {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.sandbox.base_url())
    }

    fn charge_request(&self, key: &str, body: &Value) -> reqwest::RequestBuilder {
        self.client
            .post(self.url("/v1/charges"))
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", key)
            .json(body)
    }

    async fn charge(&self, key: &str, body: &Value) -> reqwest::Response {
        self.charge_request(key, body).send().await.unwrap()
    }

    async fn set_faults(&self, faults: Value) -> reqwest::Response {
        self.client
            .post(self.url("/v1/sandbox/faults"))
            .json(&faults)
            .send()
            .await
            .unwrap()
    }

    async fn ledger(&self) -> Vec<Value> {
        let response = self
            .client
            .get(self.url("/v1/sandbox/charges"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.unwrap()
    }
}

#[tokio::test]
async fn a_new_charge_succeeds_with_201_and_echoes_the_request() {
    let app = spawn_sandbox().await;
    let response = app.charge("k1", &charge_body("pm_card_visa")).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(response.headers().get("Idempotent-Replayed").is_none());
    let body: Value = response.json().await.unwrap();
    assert!(body["id"].as_str().unwrap().starts_with("ch_"));
    assert_eq!(body["status"], "succeeded");
    assert_eq!(body["amount_cents"], 4200);
    assert_eq!(body["currency"], "EUR");
    assert_eq!(body["reference"], "order-1");

    let ledger = app.ledger().await;
    assert_eq!(ledger.len(), 1);
    let row = &ledger[0];
    assert_eq!(row["id"], body["id"]);
    assert_eq!(row["idempotency_key"], "k1");
    assert_eq!(row["reference"], "order-1");
    assert_eq!(row["amount_cents"], 4200);
    assert_eq!(row["status"], "succeeded");
    assert_eq!(row["requests"], 1);
}

#[tokio::test]
async fn a_declined_card_answers_402_with_a_decline_code() {
    let app = spawn_sandbox().await;
    let response = app.charge("k1", &charge_body("pm_card_declined")).await;
    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    let body: Value = response.json().await.unwrap();
    assert!(body["id"].as_str().unwrap().starts_with("ch_"));
    assert_eq!(body["status"], "declined");
    assert_eq!(body["decline_code"], "card_declined");
    assert_eq!(app.ledger().await[0]["status"], "declined");
}

#[tokio::test]
async fn a_repeat_of_the_key_replays_the_first_answer_byte_for_byte() {
    let app = spawn_sandbox().await;
    let first = app.charge("k1", &charge_body("pm_card_visa")).await;
    let first_status = first.status();
    let first_bytes = first.bytes().await.unwrap();

    // Same fields, another order and spacing: still the same request.
    let reordered = r#"{ "reference": "order-1", "payment_method": "pm_card_visa",
        "currency": "EUR", "amount_cents": 4200 }"#;
    let repeat = app
        .client
        .post(app.url("/v1/charges"))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", "k1")
        .header("Content-Type", "application/json")
        .body(reordered)
        .send()
        .await
        .unwrap();
    assert_eq!(repeat.status(), first_status);
    assert_eq!(repeat.headers()["Idempotent-Replayed"], "true");
    assert_eq!(repeat.bytes().await.unwrap(), first_bytes);

    let ledger = app.ledger().await;
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["requests"], 2);
}

#[tokio::test]
async fn the_same_key_with_another_body_is_422_and_charges_nothing_more() {
    let app = spawn_sandbox().await;
    app.charge("k1", &charge_body("pm_card_visa")).await;
    let mut other = charge_body("pm_card_visa");
    other["amount_cents"] = json!(9900);
    let response = app.charge("k1", &other).await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = response.json().await.unwrap();
    assert!(body["error"].is_string());

    let ledger = app.ledger().await;
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["requests"], 2);
}

#[tokio::test]
async fn a_charge_without_an_idempotency_key_is_400() {
    let app = spawn_sandbox().await;
    let response = app
        .client
        .post(app.url("/v1/charges"))
        .bearer_auth(API_KEY)
        .json(&charge_body("pm_card_visa"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert!(body["error"].is_string());
    assert!(app.ledger().await.is_empty());
}

#[tokio::test]
async fn a_charge_without_the_right_api_key_is_401() {
    let app = spawn_sandbox().await;
    let url = app.url("/v1/charges");
    let wrong_key = app.client.post(&url).bearer_auth("sk_wrong");
    let no_key = app.client.post(&url);
    for (request, case) in [(wrong_key, "wrong key"), (no_key, "no key")] {
        let response = request
            .header("Idempotency-Key", "k1")
            .json(&charge_body("pm_card_visa"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{case}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].is_string(), "{case}");
    }
    assert!(app.ledger().await.is_empty());
}

#[tokio::test]
async fn a_malformed_charge_body_is_400_with_a_json_error() {
    let app = spawn_sandbox().await;
    let valid = charge_body("pm_card_visa");
    let with = |field: &str, value: Value| {
        let mut body = valid.clone();
        body[field] = value;
        body.to_string()
    };
    let mut without_reference = valid.clone();
    without_reference
        .as_object_mut()
        .unwrap()
        .remove("reference");
    let cases = [
        ("not json", "not json at all".to_owned()),
        ("zero amount", with("amount_cents", json!(0))),
        ("negative amount", with("amount_cents", json!(-5))),
        ("fractional amount", with("amount_cents", json!(4.5))),
        ("amount as text", with("amount_cents", json!("4200"))),
        ("missing reference", without_reference.to_string()),
        ("empty currency", with("currency", json!(""))),
        ("not a pm_ method", with("payment_method", json!("visa"))),
    ];
    for (case, body) in cases {
        let response = app
            .client
            .post(app.url("/v1/charges"))
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", case)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{case}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].is_string(), "{case}");
    }
    assert!(app.ledger().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_identical_requests_charge_once() {
    let app = Arc::new(spawn_sandbox().await);
    let barrier = Arc::new(Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let app = Arc::clone(&app);
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                let request = app.charge_request("same-click", &charge_body("pm_card_visa"));
                barrier.wait().await;
                let response = request.send().await.unwrap();
                (response.status(), response.bytes().await.unwrap())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }

    assert!(answers.iter().all(|answer| *answer == answers[0]));
    assert_eq!(answers[0].0, StatusCode::CREATED);
    let ledger = app.ledger().await;
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["requests"], 50);
}

#[tokio::test]
async fn an_erroring_card_answers_500_and_charges_nothing() {
    let app = spawn_sandbox().await;
    for _ in 0..2 {
        let response = app.charge("k1", &charge_body("pm_card_error")).await;
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].is_string());
    }
    assert!(app.ledger().await.is_empty());
}

#[tokio::test]
async fn an_error_fault_charges_nothing_and_a_later_retry_charges_once() {
    let app = spawn_sandbox().await;
    app.set_faults(json!({"error_rate": 1.0})).await;
    let response = app.charge("k1", &charge_body("pm_card_visa")).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(app.ledger().await.is_empty());

    app.set_faults(json!({"error_rate": 0.0})).await;
    let response = app.charge("k1", &charge_body("pm_card_visa")).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let ledger = app.ledger().await;
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["requests"], 2);
}

#[tokio::test]
async fn an_error_fault_never_hits_a_replay() {
    let app = spawn_sandbox().await;
    let first = app.charge("k1", &charge_body("pm_card_visa")).await;
    let first_bytes = first.bytes().await.unwrap();
    app.set_faults(json!({"error_rate": 1.0})).await;
    let replay = app.charge("k1", &charge_body("pm_card_visa")).await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.bytes().await.unwrap(), first_bytes);
}

#[tokio::test]
async fn a_dropped_answer_still_charges_and_the_retry_gets_the_replay() {
    let app = spawn_sandbox().await;
    app.set_faults(json!({"drop_after_charge_rate": 1.0})).await;
    let lost = app
        .charge_request("k1", &charge_body("pm_card_visa"))
        .send()
        .await;
    assert!(lost.is_err(), "the answer leaked through: {lost:?}");

    let ledger = app.ledger().await;
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["status"], "succeeded");

    // The fault is still on, but it never applies to a replay.
    let retry = app.charge("k1", &charge_body("pm_card_visa")).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
    let body: Value = retry.json().await.unwrap();
    assert_eq!(body["id"], ledger[0]["id"]);
    assert_eq!(app.ledger().await[0]["requests"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_card_charges_at_once_and_a_repeat_answers_without_waiting() {
    let app = Arc::new(spawn_sandbox().await);
    // Wide margins: this must hold on a busy two-core machine.
    app.set_faults(json!({"slow_ms": 1000})).await;
    let started = Instant::now();
    let first = tokio::spawn({
        let app = Arc::clone(&app);
        async move {
            let response = app.charge("k1", &charge_body("pm_card_slow")).await;
            (started.elapsed(), response.bytes().await.unwrap())
        }
    });

    // The charge is in the ledger long before the first answer arrives.
    while app.ledger().await.is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let repeat_started = Instant::now();
    let repeat = app.charge("k1", &charge_body("pm_card_slow")).await;
    let repeat_took = repeat_started.elapsed();
    assert_eq!(repeat.status(), StatusCode::CREATED);
    assert_eq!(repeat.headers()["Idempotent-Replayed"], "true");
    let repeat_bytes = repeat.bytes().await.unwrap();

    let (first_took, first_bytes) = first.await.unwrap();
    assert!(first_took >= Duration::from_millis(1000), "{first_took:?}");
    assert!(repeat_took < Duration::from_millis(500), "{repeat_took:?}");
    assert_eq!(first_bytes, repeat_bytes);
    assert_eq!(app.ledger().await.len(), 1);
}

#[tokio::test]
async fn latency_delays_every_answer_including_replays() {
    let app = spawn_sandbox().await;
    app.set_faults(json!({"latency_ms": 200})).await;
    for attempt in ["first", "replay"] {
        let started = Instant::now();
        let response = app.charge("k1", &charge_body("pm_card_visa")).await;
        assert_eq!(response.status(), StatusCode::CREATED, "{attempt}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(200),
            "{attempt} took {took:?}"
        );
    }
}

#[tokio::test]
async fn faults_read_back_what_was_set_and_missing_fields_reset() {
    let app = spawn_sandbox().await;
    let get_faults = || async {
        let response = app
            .client
            .get(app.url("/v1/sandbox/faults"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.json::<Value>().await.unwrap()
    };
    let defaults = json!({
        "latency_ms": 0, "error_rate": 0.0, "drop_after_charge_rate": 0.0, "slow_ms": 10000,
        "webhook_delay_ms": 0, "webhook_duplicate_rate": 0.0, "webhook_fail_rate": 0.0
    });
    assert_eq!(get_faults().await, defaults);

    let all = json!({
        "latency_ms": 5, "error_rate": 0.25, "drop_after_charge_rate": 0.5, "slow_ms": 300,
        "webhook_delay_ms": 20, "webhook_duplicate_rate": 0.5, "webhook_fail_rate": 0.125
    });
    let response = app.set_faults(all.clone()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(get_faults().await, all);

    app.set_faults(json!({"latency_ms": 7})).await;
    let mut expected = defaults.clone();
    expected["latency_ms"] = json!(7);
    assert_eq!(get_faults().await, expected);
}

#[tokio::test]
async fn faults_out_of_range_are_rejected_with_400_and_change_nothing() {
    let app = spawn_sandbox().await;
    let cases = [
        ("error rate above 1", json!({"error_rate": 1.5})),
        (
            "negative drop rate",
            json!({"drop_after_charge_rate": -0.1}),
        ),
        ("negative latency", json!({"latency_ms": -1})),
        ("absurd slow_ms", json!({"slow_ms": 100_000_000})),
        (
            "duplicate rate above 1",
            json!({"webhook_duplicate_rate": 2.0}),
        ),
        ("negative fail rate", json!({"webhook_fail_rate": -0.5})),
        (
            "absurd webhook delay",
            json!({"webhook_delay_ms": 100_000_000}),
        ),
        ("unknown field", json!({"latncy_ms": 5})),
        ("not an object", json!([1, 2])),
    ];
    for (case, faults) in cases {
        let response = app.set_faults(faults).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{case}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].is_string(), "{case}");
    }
    let faults: Value = app
        .client
        .get(app.url("/v1/sandbox/faults"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(faults["error_rate"], 0.0);
}

#[tokio::test]
async fn deleting_charges_empties_the_ledger_and_forgets_the_keys() {
    let app = spawn_sandbox().await;
    let first: Value = app
        .charge("k1", &charge_body("pm_card_visa"))
        .await
        .json()
        .await
        .unwrap();
    let response = app
        .client
        .delete(app.url("/v1/sandbox/charges"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert!(app.ledger().await.is_empty());

    let again = app.charge("k1", &charge_body("pm_card_visa")).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert!(again.headers().get("Idempotent-Replayed").is_none());
    let again: Value = again.json().await.unwrap();
    assert_ne!(again["id"], first["id"]);
    assert_eq!(app.ledger().await[0]["requests"], 1);
}

#[tokio::test]
async fn unknown_paths_are_404_and_wrong_methods_405_with_json_errors() {
    let app = spawn_sandbox().await;
    let unknown = app.client.get(app.url("/v1/nope")).send().await.unwrap();
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    assert!(unknown.json::<Value>().await.unwrap()["error"].is_string());

    let wrong = app.client.get(app.url("/v1/charges")).send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(wrong.json::<Value>().await.unwrap()["error"].is_string());

    let health = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_stopped_sandbox_no_longer_answers() {
    let app = spawn_sandbox().await;
    let url = app.url("/healthz");
    app.sandbox.stop().await;
    assert!(reqwest::get(&url).await.is_err());
}

#[tokio::test]
async fn the_binary_prints_its_address_charges_and_exits_0_on_sigterm() {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_payrail-sandbox"))
        .args(["--port", "0"])
        .env_remove("PAYRAIL_API_KEY")
        .env_remove("PAYRAIL_SANDBOX_HOST")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let base_url = line
        .strip_prefix("payrail-sandbox listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line}"));
    assert!(base_url.starts_with("http://127.0.0.1:"), "{base_url}");

    let response = reqwest::Client::new()
        .post(format!("{base_url}/v1/charges"))
        .bearer_auth("sk_test_stagedoor") // the documented default key
        .header("Idempotency-Key", "k1")
        .json(&charge_body("pm_card_visa"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);

    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn in_production_the_binary_logs_json_lines_to_stderr() {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_payrail-sandbox"))
        .args(["--port", "0"])
        .env_remove("PAYRAIL_API_KEY")
        .env_remove("PAYRAIL_SANDBOX_HOST")
        .env("STAGEDOOR_ENV", "production")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let base_url = line
        .strip_prefix("payrail-sandbox listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .to_owned();
    let response = reqwest::Client::new()
        .post(format!("{base_url}/v1/charges"))
        .bearer_auth("sk_test_stagedoor")
        .header("Idempotency-Key", "k1")
        .json(&charge_body("pm_card_visa"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);

    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let output = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(output.status.success(), "{:?}", output.status);
    // stdout: nothing after the listening line, which was read above.
    assert!(
        output.stdout.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&output.stdout)
    );

    let stderr = String::from_utf8(output.stderr).unwrap();
    let events: Vec<Value> = stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    for event in &events {
        assert!(event["level"].is_string(), "{event}");
        assert!(event["timestamp"].is_string(), "{event}");
    }
    let charged = events
        .iter()
        .find(|e| e["message"] == "payrail sandbox charge decided")
        .unwrap_or_else(|| panic!("the charge is logged: {stderr}"));
    assert_eq!(charged["idempotency_key"], "k1");
    assert_eq!(charged["outcome"], "succeeded");
    assert!(
        events
            .iter()
            .any(|e| e["message"] == "payrail-sandbox stopping"),
        "{stderr}"
    );
}
