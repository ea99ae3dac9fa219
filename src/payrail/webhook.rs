//! Payrail's events: what a signed event says, and the check that Payrail
//! sent it. `Payrail-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
//! "<t>.<raw body>">` under the shared secret; the HMAC is computed over the
//! bytes as received (never a re-serialization), compared in constant time,
//! and a timestamp outside the tolerance is refused, so that a captured
//! event cannot be replayed later.

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sha2::Sha256;
use uuid::Uuid;

use super::ChargeOutcome;

/// Why an event is not believed. Each is answered 400
/// `webhook-signature-invalid`, and nothing is written.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SignatureError {
    #[error("the Payrail-Signature header is missing")]
    Missing,
    #[error("the Payrail-Signature header is not `t=<unix seconds>,v1=<hex>`")]
    Malformed,
    #[error("the event's signature timestamp is outside the accepted window")]
    Stale,
    #[error("the Payrail-Signature does not match the body")]
    Mismatch,
}

/// Checks events against `payrail.webhook_secret`.
pub struct Verifier {
    secret: SecretString,
    tolerance: Duration,
}

impl Verifier {
    pub fn new(secret: SecretString, tolerance: Duration) -> Self {
        Self { secret, tolerance }
    }

    /// Whether `body` was signed by Payrail at a time within the tolerance
    /// of `now` (unix seconds). Any `v1` of the header may match (Payrail
    /// sends one per secret while a secret is being rotated).
    pub fn verify(
        &self,
        header: Option<&[u8]>,
        body: &[u8],
        now: u64,
    ) -> Result<(), SignatureError> {
        let header = header.ok_or(SignatureError::Missing)?;
        let header = std::str::from_utf8(header).map_err(|_| SignatureError::Malformed)?;
        let mut timestamp = None;
        let mut signatures = Vec::new();
        for part in header.split(',') {
            match part.trim().split_once('=') {
                Some(("t", t)) => timestamp = t.parse::<u64>().ok(),
                Some(("v1", hex)) => {
                    signatures.push(decode_hex(hex).ok_or(SignatureError::Malformed)?)
                }
                _ => {}
            }
        }
        let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
        if signatures.is_empty() {
            return Err(SignatureError::Malformed);
        }
        if now.abs_diff(timestamp) > self.tolerance.as_secs() {
            return Err(SignatureError::Stale);
        }
        let signed = |signature: &Vec<u8>| {
            // HMAC takes a key of any length, so this cannot fail.
            let Ok(mut mac) =
                Hmac::<Sha256>::new_from_slice(self.secret.expose_secret().as_bytes())
            else {
                return false;
            };
            mac.update(timestamp.to_string().as_bytes());
            mac.update(b".");
            mac.update(body);
            mac.verify_slice(signature).is_ok()
        };
        if signatures.iter().any(signed) {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) || !hex.is_ascii() {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect()
}

/// A verified event, as Payrail sends it.
#[derive(Debug, Clone, Deserialize)]
pub struct Event {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// Unix seconds, when Payrail decided.
    pub created: i64,
    pub data: EventData,
}

#[derive(Debug, Clone, Deserialize)]
pub struct EventData {
    pub charge: EventCharge,
}

#[derive(Debug, Clone, Deserialize)]
pub struct EventCharge {
    pub id: String,
    /// The order the charge was made for (`reference` of the charge).
    pub reference: String,
    pub idempotency_key: String,
}

/// What an event is about, as the events metric labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Succeeded,
    Declined,
    /// A type this service does not act on.
    Other,
    /// Not believed: its signature failed, so its type is unknown.
    Unverified,
}

impl EventKind {
    /// Every value, for the metric's series at zero (`observe`).
    pub const ALL: [EventKind; 4] = [
        EventKind::Succeeded,
        EventKind::Declined,
        EventKind::Other,
        EventKind::Unverified,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Succeeded => "charge.succeeded",
            EventKind::Declined => "charge.declined",
            EventKind::Other => "other",
            EventKind::Unverified => "unverified",
        }
    }
}

impl Event {
    pub fn kind(&self) -> EventKind {
        match self.kind.as_str() {
            "charge.succeeded" => EventKind::Succeeded,
            "charge.declined" => EventKind::Declined,
            _ => EventKind::Other,
        }
    }

    /// The order the event is about, when it names one of ours: its
    /// reference is an order id and its key the one that order charges with.
    pub fn order_id(&self) -> Option<Uuid> {
        let charge = &self.data.charge;
        let order_id = Uuid::parse_str(&charge.reference).ok()?;
        (charge.idempotency_key == format!("order-{order_id}")).then_some(order_id)
    }

    /// Payrail's decision, as the charge's own answer would have said it.
    pub fn outcome(&self) -> Option<ChargeOutcome> {
        let charge_id = self.data.charge.id.clone();
        match self.kind() {
            EventKind::Succeeded => Some(ChargeOutcome::Succeeded { charge_id }),
            EventKind::Declined => Some(ChargeOutcome::Declined {
                charge_id: Some(charge_id),
            }),
            EventKind::Other | EventKind::Unverified => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verifier() -> Verifier {
        Verifier::new(
            SecretString::from("key".to_owned()),
            Duration::from_secs(300),
        )
    }

    // `printf '1700000000.{}' | openssl dgst -sha256 -hmac key`
    const SIGNED: &str =
        "t=1700000000,v1=9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae";

    #[test]
    fn a_signature_over_timestamp_dot_body_within_the_window_is_believed() {
        let verify = |header: Option<&str>, body: &[u8], now| {
            verifier().verify(header.map(str::as_bytes), body, now)
        };
        assert!(verify(Some(SIGNED), b"{}", 1_700_000_100).is_ok());
        let cases: [(Option<&str>, &[u8], u64, &str); 6] = [
            (None, b"{}", 1_700_000_000, "missing"),
            (Some("v1=abcd"), b"{}", 1_700_000_000, "no timestamp"),
            (Some("t=1700000000,v1=zz"), b"{}", 1_700_000_000, "not hex"),
            (Some(SIGNED), b"{} ", 1_700_000_000, "tampered body"),
            (Some(SIGNED), b"{}", 1_700_000_301, "too old"),
            (
                Some("t=1700000001,v1=9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae"),
                b"{}",
                1_700_000_000,
                "another timestamp",
            ),
        ];
        for (header, body, now, why) in cases {
            assert!(verify(header, body, now).is_err(), "{why}");
        }
    }
}
