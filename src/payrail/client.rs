//! The Payrail client. Every attempt of one charge, every retry and every
//! restart sends the same `Idempotency-Key: order-{order_id}` and the same
//! body bytes, so Payrail charges at most once however often it is asked.
//! Callers must not hold a database connection across `charge`.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::Breaker;
use crate::config::PayrailSettings;
use crate::observe::{labels, Counter, Histogram};
use crate::telemetry;

/// What Payrail is asked to charge. Serialized once per charge.
#[derive(Debug, Clone, Serialize)]
pub struct Charge {
    pub amount_cents: i64,
    pub currency: String,
    pub payment_method: String,
    pub reference: Uuid,
}

/// Payrail's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeOutcome {
    Succeeded {
        charge_id: String,
    },
    /// `code`: Payrail's `decline_code` (`card_declined`, `insufficient_funds`,
    /// ...), when it says one.
    Declined {
        charge_id: Option<String>,
        code: Option<String>,
    },
}

/// The `Idempotency-Key` of every charge attempt of an order and of its
/// cancel: the same on every retry, restart and instance, so that Payrail
/// charges an order at most once. Support asks Payrail by it.
pub fn charge_key(order_id: Uuid) -> String {
    format!("order-{order_id}")
}

/// No decision could be had. The charge may or may not have been made: only
/// asking again with the same key can tell.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PaymentError {
    #[error("payrail did not answer in time")]
    Timeout,
    #[error("payrail is unavailable")]
    Unavailable { retry_after: Duration },
}

pub struct Client {
    http: reqwest::Client,
    charges_url: String,
    cancel_url: String,
    api_key: SecretString,
    timeout: Duration,
    max_attempts: u32,
    breaker: Breaker,
}

enum Attempt {
    Decided(ChargeOutcome),
    /// Worth another attempt: a timeout, a dropped connection, a 5xx.
    Failed {
        timed_out: bool,
    },
    /// Payrail refused the request itself (auth, a body that differs from the
    /// first attempt's): retrying cannot help.
    Refused(reqwest::StatusCode),
}

labels! {
    /// How one attempt ended.
    #[label = "outcome"]
    pub(super) enum AttemptOutcome {
        Succeeded = "succeeded",
        Declined = "declined",
        Timeout = "timeout",
        Error = "error",
        Refused = "refused",
    }
}

pub(super) const ATTEMPTS: Counter<AttemptOutcome> = Counter::new(
    "payrail_attempts_total",
    "Payrail charge attempts by outcome",
);
pub(super) const ATTEMPT_DURATION: Histogram = Histogram::new(
    "payrail_attempt_duration_seconds",
    "Payrail charge attempt latency",
);
pub(super) const BREAKER_REJECTIONS: Counter = Counter::new(
    "payrail_breaker_rejections_total",
    "Charges refused by the open breaker",
);

impl Attempt {
    fn outcome(&self) -> AttemptOutcome {
        match self {
            Attempt::Decided(ChargeOutcome::Succeeded { .. }) => AttemptOutcome::Succeeded,
            Attempt::Decided(ChargeOutcome::Declined { .. }) => AttemptOutcome::Declined,
            Attempt::Failed { timed_out: true } => AttemptOutcome::Timeout,
            Attempt::Failed { timed_out: false } => AttemptOutcome::Error,
            Attempt::Refused(_) => AttemptOutcome::Refused,
        }
    }
}

#[derive(Deserialize)]
struct ChargeBody {
    id: Option<String>,
    decline_code: Option<String>,
}

#[derive(Deserialize)]
struct CancelBody {
    status: String,
    id: Option<String>,
}

/// Payrail's confirmation of a cancel: the key is void either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Canceled {
    /// Nothing was charged under the key.
    Nothing,
    /// A charge was made, and is refunded.
    Refunded { charge_id: String },
}

impl Client {
    pub fn new(settings: &PayrailSettings, base_url: &str) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            // A charge re-sent to wherever a 3xx points would carry the API
            // key and the buyer's charge there; a 3xx is Payrail refusing
            // the request, never a decision.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(settings.timeout())
            .pool_max_idle_per_host(256)
            .build()?;
        Ok(Self {
            http,
            charges_url: format!("{}/v1/charges", base_url.trim_end_matches('/')),
            cancel_url: format!("{}/v1/charges/cancel", base_url.trim_end_matches('/')),
            api_key: settings.api_key.clone(),
            timeout: settings.timeout(),
            max_attempts: settings.max_attempts.max(1),
            breaker: Breaker::new(settings.breaker_failures, settings.breaker_open()),
        })
    }

    /// Refuses at once while the breaker is open, so that a checkout can
    /// fail before it writes anything.
    pub fn ready(&self) -> Result<(), PaymentError> {
        match self.breaker.open() {
            Some(retry_after) => Err(PaymentError::Unavailable { retry_after }),
            None => Ok(()),
        }
    }

    /// A buyer's click: its attempts feed the breaker, as `buyer`'s (a
    /// buyer counts once there, however often they fail), and are refused
    /// by it.
    #[tracing::instrument(name = "payrail charge", skip_all, fields(%order_id))]
    pub async fn charge(
        &self,
        buyer: &str,
        order_id: Uuid,
        charge: &Charge,
    ) -> Result<ChargeOutcome, PaymentError> {
        self.charge_with(order_id, charge, Some((&self.breaker, buyer)))
            .await
    }

    /// Reconciliation asking again about one order. Neither refused by the
    /// breaker nor feeding it: an order Payrail keeps failing (one card
    /// answering 500) is retried on its own doubling delay, and must not be
    /// what keeps the breaker open for every other buyer.
    #[tracing::instrument(name = "payrail charge", skip_all, fields(%order_id))]
    pub async fn charge_again(
        &self,
        order_id: Uuid,
        charge: &Charge,
    ) -> Result<ChargeOutcome, PaymentError> {
        self.charge_with(order_id, charge, None).await
    }

    // No span of its own: the caller's is the parent Payrail sees in
    // `traceparent`.
    async fn charge_with(
        &self,
        order_id: Uuid,
        charge: &Charge,
        breaker: Option<(&Breaker, &str)>,
    ) -> Result<ChargeOutcome, PaymentError> {
        let key = charge_key(order_id);
        let body = serde_json::to_vec(charge).map_err(|_| PaymentError::Unavailable {
            retry_after: Duration::from_secs(1),
        })?;
        let mut timed_out = false;
        for attempt in 1..=self.max_attempts {
            if let Some(retry_after) = breaker.and_then(|(b, _)| b.open()) {
                BREAKER_REJECTIONS.get().increment(1);
                return Err(PaymentError::Unavailable { retry_after });
            }
            match self.attempt(&key, &body).await {
                Attempt::Decided(outcome) => {
                    breaker.inspect(|(b, buyer)| b.record_success(buyer));
                    return Ok(outcome);
                }
                Attempt::Failed { timed_out: t } => {
                    breaker.inspect(|(b, buyer)| b.record_failure(buyer));
                    timed_out = t;
                    tracing::warn!(attempt, timed_out, "payrail attempt failed");
                }
                Attempt::Refused(status) => {
                    tracing::error!(%status, "payrail refused the charge request");
                    return Err(PaymentError::Unavailable {
                        retry_after: Duration::from_secs(1),
                    });
                }
            }
            if attempt < self.max_attempts {
                tokio::time::sleep(backoff(attempt)).await;
            }
        }
        Err(if timed_out {
            PaymentError::Timeout
        } else {
            PaymentError::Unavailable {
                retry_after: Duration::from_secs(1),
            }
        })
    }

    /// Voids the order's key at Payrail (`POST /v1/charges/cancel`): nothing
    /// is charged under it afterwards, and a charge already made is
    /// refunded. One attempt; the caller retries until Payrail confirms.
    #[tracing::instrument(skip_all, fields(%order_id))]
    pub async fn cancel(&self, order_id: Uuid) -> Result<Canceled, PaymentError> {
        let sent = self
            .http
            .post(&self.cancel_url)
            .timeout(self.timeout)
            .bearer_auth(self.api_key.expose_secret())
            .header("Idempotency-Key", charge_key(order_id))
            .send()
            .await;
        let unconfirmed = |why: &dyn std::fmt::Display| {
            tracing::warn!(%why, "payrail did not confirm a cancel");
            PaymentError::Unavailable {
                retry_after: Duration::from_secs(1),
            }
        };
        let response = sent.map_err(|e| unconfirmed(&e))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| unconfirmed(&e))?;
        if status != reqwest::StatusCode::OK {
            return Err(unconfirmed(&status));
        }
        match serde_json::from_slice::<CancelBody>(&bytes) {
            Ok(CancelBody { status, .. }) if status == "canceled" => Ok(Canceled::Nothing),
            Ok(CancelBody {
                status,
                id: Some(id),
            }) if status == "refunded" => Ok(Canceled::Refunded { charge_id: id }),
            _ => Err(unconfirmed(
                &"an answer that is neither canceled nor refunded",
            )),
        }
    }

    async fn attempt(&self, key: &str, body: &[u8]) -> Attempt {
        let started = std::time::Instant::now();
        let attempt = self.send(key, body).await;
        ATTEMPTS.of(attempt.outcome()).increment(1);
        ATTEMPT_DURATION
            .get()
            .record(started.elapsed().as_secs_f64());
        attempt
    }

    async fn send(&self, key: &str, body: &[u8]) -> Attempt {
        let sent = self
            .http
            .post(&self.charges_url)
            .timeout(self.timeout)
            .bearer_auth(self.api_key.expose_secret())
            .header("Idempotency-Key", key)
            .headers(telemetry::trace_headers())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_vec())
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(e) => return failed(&e),
        };
        let status = response.status();
        // Read the whole answer before believing it: a connection dropped
        // mid-body is no answer at all.
        let bytes = match response.bytes().await {
            Ok(bytes) => bytes,
            Err(e) => return failed(&e),
        };
        let body = serde_json::from_slice::<ChargeBody>(&bytes).ok();
        let (charge_id, code) = body.map_or((None, None), |b| (b.id, b.decline_code));
        match status.as_u16() {
            201 => match charge_id {
                Some(charge_id) => Attempt::Decided(ChargeOutcome::Succeeded { charge_id }),
                None => Attempt::Failed { timed_out: false },
            },
            402 => Attempt::Decided(ChargeOutcome::Declined { charge_id, code }),
            s if s >= 500 || s == 429 => Attempt::Failed { timed_out: false },
            _ => Attempt::Refused(status),
        }
    }
}

fn failed(error: &reqwest::Error) -> Attempt {
    Attempt::Failed {
        timed_out: error.is_timeout(),
    }
}

/// 100 ms, 200 ms, 400 ms … capped at 2 s, with up to 50 % jitter so that
/// retries from many requests do not arrive together.
fn backoff(attempt: u32) -> Duration {
    use std::hash::{BuildHasher, RandomState};
    let base = 100u64
        .saturating_mul(1 << attempt.saturating_sub(1).min(5))
        .min(2000);
    let jitter = RandomState::new().hash_one(attempt) % (base / 2 + 1);
    Duration::from_millis(base + jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Payrail is reached over HTTPS outside the sandbox: an `https://` base
    /// URL must get a TLS handshake, not a refusal from the client itself.
    #[tokio::test]
    async fn an_https_payrail_is_spoken_to_in_tls() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("https://{}", listener.local_addr().unwrap());
        let first_byte = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut first = [0u8; 1];
            socket.peek(&mut first).await.unwrap();
            first[0]
        });
        let settings = PayrailSettings {
            base_url: base_url.clone(),
            sandbox: false,
            api_key: SecretString::from("sk_test".to_owned()),
            timeout_ms: 2_000,
            max_attempts: 1,
            breaker_failures: 5,
            breaker_open_secs: 30,
            webhook_secret: SecretString::from(String::new()),
            webhook_tolerance_secs: 300,
        };
        let client = Client::new(&settings, &base_url).unwrap();
        let charge = Charge {
            amount_cents: 100,
            currency: "EUR".to_owned(),
            payment_method: "pm_card_ok".to_owned(),
            reference: Uuid::new_v4(),
        };
        let sent =
            tokio::spawn(async move { client.charge("alice", charge.reference, &charge).await });
        // 0x16 opens a TLS handshake record: the ClientHello.
        assert_eq!(first_byte.await.unwrap(), 0x16);
        assert!(sent.await.unwrap().is_err());
    }
}
