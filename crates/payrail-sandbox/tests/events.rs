//! The sandbox's events and cancels, black-box: a real sandbox on port 0
//! sending to a real receiver on port 0 that records what it gets.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use payrail_sandbox::{sign, Sandbox, Webhook, SIGNATURE_HEADER};
use reqwest::StatusCode;
use serde_json::{json, Value};

const API_KEY: &str = "sk_test_sandbox";
const SECRET: &str = "whsec_test_0123456789abcdef0123456789";

/// What the receiver got, and how many of the first deliveries it refuses.
#[derive(Default)]
struct Received {
    events: Vec<(String, Vec<u8>, Instant)>,
    refuse_first: usize,
}

struct Setup {
    sandbox: Sandbox,
    received: Arc<Mutex<Received>>,
    http: reqwest::Client,
}

async fn receive(
    received: web::Data<Mutex<Received>>,
    req: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    let signature = req
        .headers()
        .get(SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut received = received.lock().unwrap();
    received
        .events
        .push((signature, body.to_vec(), Instant::now()));
    if received.events.len() <= received.refuse_first {
        HttpResponse::InternalServerError().finish()
    } else {
        HttpResponse::Ok().finish()
    }
}

async fn setup(refuse_first: usize) -> Setup {
    let received = web::Data::new(Mutex::new(Received {
        refuse_first,
        ..Received::default()
    }));
    let shared = received.clone().into_inner();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(received.clone())
            .route("/events", web::post().to(receive))
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .unwrap()
    .run();
    tokio::spawn(server);
    let webhook = Webhook {
        url: format!("http://127.0.0.1:{port}/events"),
        secret: SECRET.to_owned(),
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    Setup {
        sandbox: Sandbox::start_with(listener, API_KEY.to_owned(), Some(webhook)).unwrap(),
        received: shared,
        http: reqwest::Client::new(),
    }
}

impl Setup {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.sandbox.base_url())
    }

    async fn charge(&self, key: &str, payment_method: &str) -> reqwest::Response {
        self.http
            .post(self.url("/v1/charges"))
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", key)
            .json(&json!({
                "amount_cents": 4200,
                "currency": "EUR",
                "payment_method": payment_method,
                "reference": format!("ref-{key}"),
            }))
            .send()
            .await
            .unwrap()
    }

    async fn cancel(&self, key: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .post(self.url("/v1/charges/cancel"))
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", key)
            .send()
            .await
            .unwrap();
        (response.status(), response.json().await.unwrap())
    }

    async fn get(&self, path: &str) -> Vec<Value> {
        self.http
            .get(self.url(path))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The sandbox's event list once `settled` holds for it: the sandbox
    /// counts a delivery after the receiver's 2xx has reached it, a moment
    /// after the receiver saw the event.
    async fn events_when(&self, settled: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let listed = self.get("/v1/sandbox/events").await;
            if settled(&listed) {
                return listed;
            }
            assert!(Instant::now() < deadline, "{listed:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn set_faults(&self, faults: Value) {
        let response = self
            .http
            .post(self.url("/v1/sandbox/faults"))
            .json(&faults)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{faults}");
    }

    /// Waits until the receiver has got `n` deliveries; returns them.
    async fn received(&self, n: usize) -> Vec<(String, Vec<u8>, Instant)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = self.received.lock().unwrap().events.clone();
            if got.len() >= n {
                return got;
            }
            assert!(Instant::now() < deadline, "only {} deliveries", got.len());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The `t` of a `Payrail-Signature`, after checking that its `v1` is the
/// HMAC of `"<t>.<body>"` under the secret.
fn check_signature(header: &str, body: &[u8]) -> u64 {
    let t: u64 = header
        .strip_prefix("t=")
        .and_then(|rest| rest.split(',').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no timestamp in {header:?}"));
    assert_eq!(header, sign(SECRET.as_bytes(), t, body));
    assert_ne!(header, sign(b"another secret", t, body));
    t
}

#[tokio::test]
async fn every_decided_charge_is_sent_as_a_signed_event() {
    let app = setup(0).await;
    let paid = app.charge("k-paid", "pm_card_visa").await;
    assert_eq!(paid.status(), StatusCode::CREATED);
    let charge: Value = paid.json().await.unwrap();
    assert_eq!(
        app.charge("k-declined", "pm_card_declined").await.status(),
        StatusCode::PAYMENT_REQUIRED
    );
    assert_eq!(
        app.charge("k-error", "pm_card_error").await.status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );

    let received = app.received(2).await;
    let mut types = Vec::new();
    for (signature, body, _) in &received {
        let t = check_signature(signature, body);
        let event: Value = serde_json::from_slice(body).unwrap();
        assert!(event["id"].as_str().unwrap().starts_with("evt_"), "{event}");
        assert!(
            event["created"].as_u64().unwrap().abs_diff(t) <= 5,
            "{event}"
        );
        let data = &event["data"]["charge"];
        let key = data["idempotency_key"].as_str().unwrap();
        assert_eq!(data["reference"], format!("ref-{key}"));
        assert_eq!(data["amount_cents"], 4200);
        assert_eq!(data["currency"], "EUR");
        if key == "k-paid" {
            assert_eq!(data["id"], charge["id"]);
        }
        types.push((
            key.to_owned(),
            event["type"].as_str().unwrap().to_owned(),
            data["status"].as_str().unwrap().to_owned(),
        ));
    }
    types.sort();
    assert_eq!(
        types,
        [
            (
                "k-declined".into(),
                "charge.declined".into(),
                "declined".into()
            ),
            (
                "k-paid".into(),
                "charge.succeeded".into(),
                "succeeded".into()
            ),
        ]
    );
    // A replay decides nothing new: no second event.
    app.charge("k-paid", "pm_card_visa").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        app.received.lock().unwrap().events.len(),
        2,
        "nothing for the error, nothing for the replay"
    );
    app.events_when(|listed| {
        listed.len() == 2
            && listed
                .iter()
                .all(|e| e["attempts"] == 1 && e["delivered"] == 1)
    })
    .await;
}

#[tokio::test]
async fn a_refused_delivery_is_retried_with_the_same_bytes_until_a_2xx() {
    let app = setup(2).await;
    app.charge("k1", "pm_card_visa").await;
    let received = app.received(3).await;
    assert!(received.iter().all(|(_, body, _)| *body == received[0].1));
    // Backoff: each retry later than the one before.
    let gaps: Vec<Duration> = received.windows(2).map(|w| w[1].2 - w[0].2).collect();
    assert!(
        gaps[0] >= Duration::from_millis(100) && gaps[1] > gaps[0],
        "{gaps:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        app.received.lock().unwrap().events.len(),
        3,
        "no retry after a 2xx"
    );
    app.events_when(|listed| listed[0]["attempts"] == 3 && listed[0]["delivered"] == 1)
        .await;
}

#[tokio::test]
async fn webhook_faults_delay_double_and_lose_deliveries() {
    let app = setup(0).await;
    app.set_faults(json!({"webhook_delay_ms": 400, "webhook_duplicate_rate": 1.0}))
        .await;
    let charged = Instant::now();
    app.charge("k-doubled", "pm_card_visa").await;
    let received = app.received(2).await;
    assert!(
        received[0].2 - charged >= Duration::from_millis(400),
        "delayed"
    );
    assert_eq!(received[0].1, received[1].1, "the same event twice");
    app.events_when(|listed| listed[0]["copies"] == 2 && listed[0]["delivered"] == 2)
        .await;

    // Every attempt counted as lost: delivered again and again, until the
    // fault is lifted.
    app.set_faults(json!({"webhook_fail_rate": 1.0})).await;
    app.charge("k-lost", "pm_card_visa").await;
    let received = app.received(5).await;
    app.set_faults(json!({})).await;
    assert!(received.len() >= 5);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listed = app.get("/v1/sandbox/events").await;
        let lost = listed
            .iter()
            .find(|e| e["idempotency_key"] == "k-lost")
            .unwrap();
        if lost["delivered"] == 1 {
            assert!(lost["attempts"].as_u64().unwrap() >= 3, "{lost}");
            break;
        }
        assert!(Instant::now() < deadline, "never delivered: {lost}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_slow_card_sends_its_event_while_its_answer_is_held_back() {
    let app = setup(0).await;
    app.set_faults(json!({"slow_ms": 2000})).await;
    let started = Instant::now();
    let answer = tokio::spawn({
        let (http, url) = (app.http.clone(), app.url("/v1/charges"));
        async move {
            http.post(url)
                .bearer_auth(API_KEY)
                .header("Idempotency-Key", "k-slow")
                .json(&json!({"amount_cents": 100, "currency": "EUR",
                    "payment_method": "pm_card_slow", "reference": "r"}))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    let received = app.received(1).await;
    assert!(
        received[0].2 - started < Duration::from_millis(1500),
        "the event comes first"
    );
    assert!(!answer.is_finished(), "the answer is still held back");
    assert_eq!(answer.await.unwrap(), StatusCode::CREATED);
}

#[tokio::test]
async fn a_late_card_sends_its_event_with_its_answer_and_answers_a_repeat_at_once() {
    let app = setup(0).await;
    app.set_faults(json!({"slow_ms": 1500})).await;
    let started = Instant::now();
    let charge = |http: reqwest::Client, url: String| async move {
        http.post(url)
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", "k-late")
            .json(&json!({"amount_cents": 100, "currency": "EUR",
                "payment_method": "pm_card_late", "reference": "r"}))
            .send()
            .await
            .unwrap()
            .status()
    };
    let answer = tokio::spawn(charge(app.http.clone(), app.url("/v1/charges")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The charge is made: a repeat of its key gets it at once.
    let repeat = charge(app.http.clone(), app.url("/v1/charges")).await;
    assert_eq!(repeat, StatusCode::CREATED);
    assert!(
        started.elapsed() < Duration::from_millis(1_200),
        "the repeat waits for nothing"
    );
    let received = app.received(1).await;
    assert!(
        received[0].2 - started >= Duration::from_millis(1_500),
        "the event waits with the answer"
    );
    assert_eq!(answer.await.unwrap(), StatusCode::CREATED);
    assert_eq!(app.get("/v1/sandbox/charges").await.len(), 1, "one charge");
}

#[tokio::test]
async fn a_cancel_before_any_charge_voids_the_key() {
    let app = setup(0).await;
    assert_eq!(
        app.cancel("k1").await,
        (StatusCode::OK, json!({"status": "canceled"}))
    );
    let later = app.charge("k1", "pm_card_visa").await;
    assert_eq!(later.status(), StatusCode::CONFLICT);
    assert!(
        app.get("/v1/sandbox/charges").await.is_empty(),
        "nothing charged"
    );
    assert_eq!(
        app.cancel("k1").await,
        (StatusCode::OK, json!({"status": "canceled"}))
    );
}

#[tokio::test]
async fn a_cancel_after_a_charge_refunds_it() {
    let app = setup(0).await;
    let charged: Value = app.charge("k1", "pm_card_visa").await.json().await.unwrap();
    let refunded = json!({"status": "refunded", "id": charged["id"]});
    assert_eq!(app.cancel("k1").await, (StatusCode::OK, refunded.clone()));
    assert_eq!(
        app.cancel("k1").await,
        (StatusCode::OK, refunded),
        "a repeat answers the same"
    );
    let ledger = app.get("/v1/sandbox/charges").await;
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["status"], "refunded");
    assert_eq!(
        app.charge("k1", "pm_card_visa").await.status(),
        StatusCode::CONFLICT
    );
    assert_eq!(
        app.get("/v1/sandbox/charges").await.len(),
        1,
        "nothing more charged"
    );
}

#[tokio::test]
async fn a_cancel_needs_the_api_key_and_a_key() {
    let app = setup(0).await;
    let no_auth = app
        .http
        .post(app.url("/v1/charges/cancel"))
        .header("Idempotency-Key", "k1")
        .send()
        .await
        .unwrap();
    assert_eq!(no_auth.status(), StatusCode::UNAUTHORIZED);
    let no_key = app
        .http
        .post(app.url("/v1/charges/cancel"))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), StatusCode::BAD_REQUEST);
    // Neither voided anything.
    assert_eq!(
        app.charge("k1", "pm_card_visa").await.status(),
        StatusCode::CREATED
    );
}
