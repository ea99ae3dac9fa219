//! The Payrail sandbox's control endpoints, over HTTP (the embedded one and
//! the `payrail-sandbox` process answer the same): its faults, and its
//! ledger, the truth about what was charged. `sandbox` is its base URL
//! (`http://127.0.0.1:PORT`). Each panics if the sandbox does not answer
//! 2xx: that is the harness's failure, not the service's.

use serde_json::Value;

/// `GET /v1/sandbox/charges`: every charge, as the sandbox's JSON.
pub async fn ledger(http: &reqwest::Client, sandbox: &str) -> Vec<Value> {
    http.get(format!("{sandbox}/v1/sandbox/charges"))
        .send()
        .await
        .expect("GET /v1/sandbox/charges")
        .json()
        .await
        .expect("the ledger's JSON")
}

/// `DELETE /v1/sandbox/charges`: an empty ledger.
pub async fn clear_ledger(http: &reqwest::Client, sandbox: &str) {
    let sent = http.delete(format!("{sandbox}/v1/sandbox/charges")).send();
    succeeded(sent.await, "clearing the ledger");
}

/// `POST /v1/sandbox/faults`: `{}` for none, or any of `latency_ms`,
/// `error_rate`, `drop_after_charge_rate`.
pub async fn set_faults(http: &reqwest::Client, sandbox: &str, faults: &Value) {
    let sent = http
        .post(format!("{sandbox}/v1/sandbox/faults"))
        .json(faults);
    succeeded(sent.send().await, &format!("setting faults {faults}"));
}

fn succeeded(sent: reqwest::Result<reqwest::Response>, what: &str) {
    let response = sent.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        response.status().is_success(),
        "{what}: {}",
        response.status()
    );
}
