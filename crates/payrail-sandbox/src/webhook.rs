//! Events: for every charge it decides, the sandbox `POST`s a signed event
//! to the webhook URL, at least once, as Payrail does. A delivery counts
//! only when the receiver answers 2xx; until then it is retried with a
//! doubling delay, for up to an hour. The faults make events late
//! (`webhook_delay_ms`), doubled (`webhook_duplicate_rate`: a second,
//! independent delivery) and lost on the way back (`webhook_fail_rate`: an
//! attempt counted as failed whatever the receiver answered, so retried),
//! which together also reorder them.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::web::{self, Bytes};
use hmac::{Hmac, KeyInit, Mac};
use serde::Serialize;
use serde_json::json;
use sha2::Sha256;
use uuid::Uuid;

use crate::book::State;
use crate::request::ChargeRequest;

/// The header that carries `t=<unix seconds>,v1=<hex HMAC-SHA256>`.
pub const SIGNATURE_HEADER: &str = "Payrail-Signature";
/// The first retry comes this soon; each next one twice as late, up to the cap.
const FIRST_RETRY: Duration = Duration::from_millis(100);
const RETRY_CAP: Duration = Duration::from_secs(300);
/// After this long without a 2xx, an event is given up.
const GIVE_UP: Duration = Duration::from_secs(3600);
/// One attempt waits this long for the receiver's answer.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where events go and the secret they are signed with.
#[derive(Debug, Clone)]
pub struct Webhook {
    pub url: String,
    pub secret: String,
}

/// The `Payrail-Signature` value for `body` sent at `timestamp`: the hex
/// HMAC-SHA256, under `secret`, of `"<timestamp>.<body>"`.
pub fn sign(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    // HMAC takes a key of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("t={timestamp},v1={hex}")
}

/// Sends the events of one sandbox.
pub(crate) struct Sender {
    url: String,
    secret: Vec<u8>,
    http: reqwest::Client,
}

impl Sender {
    pub(crate) fn new(webhook: Webhook) -> std::io::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(ATTEMPT_TIMEOUT)
            .build()
            .map_err(std::io::Error::other)?;
        Ok(Sender {
            url: webhook.url,
            secret: webhook.secret.into_bytes(),
            http,
        })
    }

    /// One attempt, signed at the time it is sent: whether it got a 2xx.
    async fn post(&self, event: &Event) -> bool {
        let signature = sign(&self.secret, unix_now(), &event.body);
        let sent = self
            .http
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature)
            .body(event.body.clone())
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => true,
            Ok(response) => {
                tracing::warn!(event_id = %event.id, status = %response.status(), "payrail sandbox event refused");
                false
            }
            Err(error) => {
                tracing::warn!(event_id = %event.id, %error, "payrail sandbox event not delivered");
                false
            }
        }
    }
}

/// One event about a decided charge, serialized once: every delivery and
/// every retry sends the same bytes.
pub(crate) struct Event {
    pub(crate) id: String,
    kind: &'static str,
    reference: String,
    idempotency_key: String,
    created: u64,
    body: Bytes,
}

impl Event {
    pub(crate) fn new(
        charge_id: &str,
        outcome: &'static str,
        key: &str,
        request: &ChargeRequest,
    ) -> Self {
        let id = format!("evt_{}", Uuid::new_v4().simple());
        let kind = if outcome == "declined" {
            "charge.declined"
        } else {
            "charge.succeeded"
        };
        let created = unix_now();
        let body = json!({
            "id": id,
            "type": kind,
            "created": created,
            "data": {"charge": {
                "id": charge_id,
                "status": outcome,
                "amount_cents": request.amount_cents,
                "currency": request.currency,
                "reference": request.reference,
                "idempotency_key": key,
            }},
        });
        Event {
            id,
            kind,
            reference: request.reference.clone(),
            idempotency_key: key.to_owned(),
            created,
            body: Bytes::from(body.to_string()),
        }
    }
}

/// One event as `GET /v1/sandbox/events` lists it: what was sent, how many
/// attempts were made and how many of them counted as delivered.
#[derive(Clone, Serialize)]
pub(crate) struct Delivery {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    reference: String,
    idempotency_key: String,
    created: u64,
    /// Deliveries started: 2 for an event the duplicate fault doubled.
    copies: u32,
    attempts: u64,
    delivered: u64,
    #[serde(skip)]
    pub(crate) seq: usize,
}

/// Starts the deliveries of `event`, when the sandbox has a webhook.
pub(crate) fn deliver(state: &web::Data<State>, event: Event) {
    if state.webhook.is_none() {
        return;
    }
    let copies = {
        let mut book = state.book();
        let rate = book.faults.webhook_duplicate_rate;
        let copies = 1 + u32::from(book.rng.chance(rate));
        let seq = book.events.len();
        let delivery = Delivery {
            id: event.id.clone(),
            kind: event.kind,
            reference: event.reference.clone(),
            idempotency_key: event.idempotency_key.clone(),
            created: event.created,
            copies,
            attempts: 0,
            delivered: 0,
            seq,
        };
        book.events.insert(event.id.clone(), delivery);
        copies
    };
    let event = Arc::new(event);
    for _ in 0..copies {
        tokio::spawn(send_until_delivered(state.clone(), event.clone()));
    }
}

/// Retries one delivery until it counts, or for up to an hour.
async fn send_until_delivered(state: web::Data<State>, event: Arc<Event>) {
    let Some(sender) = &state.webhook else {
        return;
    };
    let delay = state.book().faults.webhook_delay_ms;
    tokio::time::sleep(Duration::from_millis(delay)).await;
    let first = Instant::now();
    let mut wait = FIRST_RETRY;
    loop {
        let answered = sender.post(&event).await;
        let (delivered, jitter) = {
            let mut book = state.book();
            let rate = book.faults.webhook_fail_rate;
            let lost = book.rng.chance(rate);
            let jitter = book.rng.next_u64() % (wait.as_millis() as u64 / 2 + 1);
            let delivered = answered && !lost;
            if let Some(record) = book.events.get_mut(&event.id) {
                record.attempts += 1;
                record.delivered += u64::from(delivered);
            }
            (delivered, jitter)
        };
        if delivered {
            return;
        }
        if first.elapsed() >= GIVE_UP {
            tracing::warn!(event_id = %event.id, "payrail sandbox gives up on an event after an hour");
            return;
        }
        tokio::time::sleep(wait + Duration::from_millis(jitter)).await;
        wait = (wait * 2).min(RETRY_CAP);
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checked against a value computed independently:
    /// `printf '1700000000.{}' | openssl dgst -sha256 -hmac key`.
    #[test]
    fn the_signature_is_the_hmac_of_timestamp_dot_body() {
        assert_eq!(
            sign(b"key", 1_700_000_000, b"{}"),
            "t=1700000000,v1=9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae"
        );
    }
}
