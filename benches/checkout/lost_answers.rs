//! `lost_answers`: every first Payrail answer is lost after the charge
//! (`drop_after_charge_rate = 1`, `payrail.max_attempts = 1`), so every
//! click ends in a 5xx with its order pending and charged. Measured: the
//! time from the click (the charge is made within milliseconds of it) to
//! the click's answer being stored on its key, which is when the buyer's
//! next retry gets it; once with Payrail's events on, once with
//! reconciliation alone at its defaults (`reconcile.grace_secs` 30,
//! `reconcile.interval_secs` 10). The store is watched every 20 ms.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use payrail_sandbox::{Sandbox, Webhook};
use secrecy::ExposeSecret;
use serde_json::json;
use stagedoor_checkout::config::LockMode;
use test_support::process::free_port;
use test_support::sandbox;
use uuid::Uuid;

use crate::fixtures::order_body;
use crate::load::histogram;
use crate::servers::RunningApp;
use crate::Bench;

/// How often the key rows are read for the answers that have appeared.
const WATCH_EVERY: Duration = Duration::from_millis(20);
/// Clicks are spread out, as separate buyers' would be.
const CLICK_EVERY: Duration = Duration::from_millis(100);

pub async fn lost_answers(bench: &mut Bench) {
    let clicks = if bench.profile.name == "quick" {
        10
    } else {
        50
    };
    for (name, events) in [("events", true), ("reconcile", false)] {
        let settled = measure(bench, clicks, events).await;
        let mut hist = histogram();
        for took in &settled {
            hist.record(took.as_micros().max(1) as u64)
                .expect("within the histogram's bounds");
        }
        let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "lost answers, {name}: {} of {clicks} stored; from the charge to the stored answer \
             p50 {:.0} ms, p99 {:.0} ms",
            settled.len(),
            ms(0.5),
            ms(0.99)
        );
        bench
            .report
            .set(&format!("lost_answer_p50_ms_{name}"), ms(0.5));
        bench
            .report
            .set(&format!("lost_answer_p99_ms_{name}"), ms(0.99));
        bench.report.set(
            &format!("lost_answer_unsettled_{name}"),
            (clicks - settled.len()) as f64,
        );
    }
}

/// One run on an instance and a sandbox of its own: how long each click
/// waited for its stored answer (clicks still unanswered at the deadline
/// are left out, and counted by the caller).
async fn measure(bench: &Bench, clicks: usize, events: bool) -> Vec<Duration> {
    // The service's port first: the sandbox is told where to send events.
    let port = free_port();
    let mut settings = bench.settings(LockMode::Table);
    let secret = settings.payrail.webhook_secret.expose_secret().to_owned();
    let webhook = events.then(|| Webhook {
        url: format!("http://127.0.0.1:{port}/payrail/events"),
        secret,
    });
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a sandbox");
    let api_key = settings.payrail.api_key.expose_secret().to_owned();
    let sandbox = Sandbox::start_with(listener, api_key, webhook).expect("sandbox");
    settings.payrail.base_url = sandbox.base_url();
    settings.payrail.max_attempts = 1;
    settings.server.port = port;
    settings.reconcile.interval_secs = 10;
    settings.reconcile.grace_secs = 30;
    let deadline_after =
        Duration::from_secs(settings.reconcile.grace_secs + 3 * settings.reconcile.interval_secs);
    let app = RunningApp::start(settings).await;
    let faults = json!({"drop_after_charge_rate": 1.0});
    sandbox::set_faults(&bench.http, &sandbox.base_url(), &faults).await;

    let holds = bench.factory.holds(clicks).await;
    // Clicks and the watch run side by side, so that a click's time is its
    // own and not the time the clicks after it took to be sent.
    let sent: RefCell<HashMap<String, Instant>> = RefCell::new(HashMap::new());
    let clicked_at = Cell::new(None);
    let click = async {
        while let Some((buyer, hold)) = holds.take() {
            let key = Uuid::new_v4().to_string();
            let started = Instant::now();
            let answer = bench
                .http
                .post(format!("{}/orders", app.url))
                .header("Authorization", bench.buyers.auth[buyer].clone())
                .header("Idempotency-Key", &key)
                .header("Content-Type", "application/json")
                .body(order_body(hold))
                .send()
                .await;
            let status = answer.map(|a| a.status().as_u16()).unwrap_or(0);
            assert!(status >= 500, "a lost answer is no answer: {status}");
            sent.borrow_mut().insert(key, started);
            tokio::time::sleep(CLICK_EVERY).await;
        }
        clicked_at.set(Some(Instant::now()));
    };
    let client = app.pool.get().await.expect("a connection");
    let watch = async {
        let mut settled = Vec::with_capacity(clicks);
        loop {
            if let Some(clicked_at) = clicked_at.get() {
                if sent.borrow().is_empty() || clicked_at.elapsed() >= deadline_after {
                    return settled;
                }
            }
            let keys: Vec<String> = sent.borrow().keys().cloned().collect();
            let rows = client
                .query(
                    "SELECT key FROM idempotency_keys
                     WHERE key = ANY ($1) AND response_status IS NOT NULL",
                    &[&keys],
                )
                .await
                .expect("the answered keys");
            for row in rows {
                if let Some(started) = sent.borrow_mut().remove(row.get::<_, &str>(0)) {
                    settled.push(started.elapsed());
                }
            }
            tokio::time::sleep(WATCH_EVERY).await;
        }
    };
    let ((), settled) = tokio::join!(click, watch);
    drop(client);
    app.stop().await;
    sandbox.stop().await;
    settled
}
