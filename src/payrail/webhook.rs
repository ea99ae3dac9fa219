//! Payrail's events: what a signed event says, and the check that Payrail
//! sent it. `Payrail-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
//! "<t>.<raw body>">` under the shared secret; the HMAC is computed over the
//! bytes as received (never a re-serialization), compared in constant time,
//! and a timestamp outside the tolerance is refused, so that a captured
//! event cannot be replayed later.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use uuid::Uuid;

use super::ChargeOutcome;
use crate::observe::labels;

/// Why an event is not believed. Each is answered 400
/// `webhook-signature-invalid`, and nothing is written.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SignatureError {
    #[error("the Payrail-Signature header is missing")]
    Missing,
    #[error("the Payrail-Signature header is longer than {MAX_HEADER_BYTES} bytes")]
    TooLong,
    #[error("the Payrail-Signature header has more than {MAX_SIGNATURES} v1 values")]
    TooManySignatures,
    #[error(
        "the Payrail-Signature header is not `t=<unix seconds>,v1=<64 hex digits>` \
         (one `t`, up to {MAX_SIGNATURES} `v1`)"
    )]
    Malformed,
    #[error("the event's signature timestamp is outside the accepted window")]
    Stale,
    #[error("the Payrail-Signature does not match the body")]
    Mismatch,
}

/// Longer than any header Payrail sends (a `t` and a few `v1` of 64 hex
/// digits each, about 80 bytes apiece): the header is refused before it is
/// parsed further, so that its size cannot buy an attacker work.
pub const MAX_HEADER_BYTES: usize = 1024;
/// Payrail signs with one secret, two while one is being rotated; 4 leaves
/// room and bounds the comparisons a request can ask for.
pub const MAX_SIGNATURES: usize = 4;

/// An HMAC-SHA256 as `v1` carries it.
type Tag = [u8; 32];

/// Checks events against `payrail.webhook_secret`.
pub struct Verifier {
    secret: SecretString,
    tolerance: Duration,
}

/// A `Payrail-Signature` that passed every check that does not need the
/// body: within its bounds, well formed, and current. Only such a header
/// gets the body read and a MAC computed.
#[derive(Debug)]
pub struct Signature {
    timestamp: u64,
    candidates: Vec<Tag>,
}

impl Verifier {
    pub fn new(secret: SecretString, tolerance: Duration) -> Self {
        Self { secret, tolerance }
    }

    /// The header's checks that cost nothing: present, at most
    /// [`MAX_HEADER_BYTES`], one `t`, at most [`MAX_SIGNATURES`] `v1` of
    /// exactly 64 hex digits each, and a `t` within the tolerance of `now`
    /// (unix seconds). Made before the body is read, so that a request
    /// without a current signature costs neither the body nor a MAC.
    pub fn check_header(
        &self,
        header: Option<&[u8]>,
        now: u64,
    ) -> Result<Signature, SignatureError> {
        let header = header.ok_or(SignatureError::Missing)?;
        if header.len() > MAX_HEADER_BYTES {
            return Err(SignatureError::TooLong);
        }
        let header = std::str::from_utf8(header).map_err(|_| SignatureError::Malformed)?;
        let mut timestamp = None;
        let mut candidates = Vec::new();
        for part in header.split(',') {
            match part.trim().split_once('=') {
                Some(("t", t)) => {
                    // Two `t` would leave which one was signed to the parser.
                    if timestamp.is_some() {
                        return Err(SignatureError::Malformed);
                    }
                    timestamp = Some(t.parse::<u64>().map_err(|_| SignatureError::Malformed)?);
                }
                Some(("v1", hex)) => {
                    if candidates.len() == MAX_SIGNATURES {
                        return Err(SignatureError::TooManySignatures);
                    }
                    candidates.push(decode_tag(hex).ok_or(SignatureError::Malformed)?);
                }
                // Other schemes (a future `v2`) are Payrail's to add.
                _ => {}
            }
        }
        let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
        if candidates.is_empty() {
            return Err(SignatureError::Malformed);
        }
        if now.abs_diff(timestamp) > self.tolerance.as_secs() {
            return Err(SignatureError::Stale);
        }
        Ok(Signature {
            timestamp,
            candidates,
        })
    }

    /// Whether `body` is what the header signed: any `v1` may match
    /// (Payrail sends one per secret while a secret is being rotated). One
    /// MAC over the body whatever the number of `v1`, each compared with it
    /// in constant time.
    pub fn verify(&self, signature: &Signature, body: &[u8]) -> Result<(), SignatureError> {
        let expected = crate::signature::tag(
            self.secret.expose_secret().as_bytes(),
            signature.timestamp,
            body,
        );
        // Every candidate is compared, so the time taken says nothing of
        // which one matched.
        let matched = signature
            .candidates
            .iter()
            .fold(false, |matched, candidate| {
                let candidate = crate::signature::Tag::new((*candidate).into());
                (expected == candidate) | matched
            });
        if matched {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

/// Exactly 64 hex digits (an HMAC-SHA256), else `None`.
fn decode_tag(hex: &str) -> Option<Tag> {
    let hex = hex.as_bytes();
    // `from_str_radix` alone would take a sign (`+f`).
    if hex.len() != 2 * std::mem::size_of::<Tag>() || !hex.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let mut tag = Tag::default();
    for (byte, pair) in tag.iter_mut().zip(hex.chunks_exact(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(tag)
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
    pub amount_cents: i64,
    pub currency: String,
}

labels! {
    /// What an event is about, as the events metric labels it.
    #[label = "type"]
    pub enum EventKind {
        Succeeded = "charge.succeeded",
        Declined = "charge.declined",
        /// A type this service does not act on.
        Other = "other",
        /// Not believed: its signature failed, so its type is unknown.
        Unverified = "unverified",
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
        (charge.idempotency_key == super::charge_key(order_id)).then_some(order_id)
    }

    /// Whether the event's charge is for this amount in this currency.
    /// Currency codes are compared as ISO 4217 means them, in any case.
    pub fn charges(&self, amount_cents: i64, currency: &str) -> bool {
        let charge = &self.data.charge;
        charge.amount_cents == amount_cents && charge.currency.eq_ignore_ascii_case(currency)
    }

    /// Payrail's decision, as the charge's own answer would have said it.
    pub fn outcome(&self) -> Option<ChargeOutcome> {
        let charge_id = self.data.charge.id.clone();
        match self.kind() {
            EventKind::Succeeded => Some(ChargeOutcome::Succeeded { charge_id }),
            // An event says no decline code.
            EventKind::Declined => Some(ChargeOutcome::Declined {
                charge_id: Some(charge_id),
                code: None,
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
    const TAG: &str = "9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae";
    const OTHER_TAG: &str = "0000000000000000000000000000000000000000000000000000000000000000";

    fn verify(header: Option<&str>, body: &[u8], now: u64) -> Result<(), SignatureError> {
        let verifier = verifier();
        let signature = verifier.check_header(header.map(str::as_bytes), now)?;
        verifier.verify(&signature, body)
    }

    #[test]
    fn a_signature_over_timestamp_dot_body_within_the_window_is_believed() {
        let signed = format!("t=1700000000,v1={TAG}");
        assert!(verify(Some(&signed), b"{}", 1_700_000_100).is_ok());
        let another_t = format!("t=1700000001,v1={TAG}");
        let cases: [(Option<&str>, &[u8], u64, &str); 7] = [
            (None, b"{}", 1_700_000_000, "missing"),
            (Some("v1=abcd"), b"{}", 1_700_000_000, "no timestamp"),
            (Some("t=1700000000,v1=zz"), b"{}", 1_700_000_000, "not hex"),
            (Some(&signed), b"{} ", 1_700_000_000, "tampered body"),
            (Some(&signed), b"{}", 1_700_000_301, "too old"),
            (Some(&signed), b"{}", 1_699_999_699, "too far ahead"),
            (Some(&another_t), b"{}", 1_700_000_000, "another timestamp"),
        ];
        for (header, body, now, why) in cases {
            assert!(verify(header, body, now).is_err(), "{why}");
        }
    }

    #[test]
    fn the_right_tag_among_four_is_believed_wherever_it_is() {
        for at in 0..MAX_SIGNATURES {
            let tags: Vec<String> = (0..MAX_SIGNATURES)
                .map(|i| format!("v1={}", if i == at { TAG } else { OTHER_TAG }))
                .collect();
            let header = format!("t=1700000000,{}", tags.join(","));
            assert!(
                verify(Some(&header), b"{}", 1_700_000_000).is_ok(),
                "at {at}"
            );
        }
    }

    #[test]
    fn a_header_past_its_bounds_is_refused_before_the_body_is_looked_at() {
        let verifier = verifier();
        let five = format!("t=1700000000{}", format!(",v1={TAG}").repeat(5));
        let long = format!("t=1700000000,v1={TAG},x={}", "a".repeat(MAX_HEADER_BYTES));
        let cases: [(&str, &str); 8] = [
            (&five, "five v1"),
            (&long, "longer than 1 KiB"),
            ("t=1700000000,v1=", "an empty v1"),
            ("t=1700000000,v1=9d71", "a short v1"),
            (&format!("t=1700000000,v1={TAG}00"), "a long v1"),
            (&format!("t=1700000000,v1=+{}", &TAG[1..]), "a signed digit"),
            (&format!("t=1700000000,t=1700000000,v1={TAG}"), "two t"),
            (&format!("t=,v1={TAG}"), "an empty t"),
        ];
        for (header, why) in cases {
            assert!(
                verifier
                    .check_header(Some(header.as_bytes()), 1_700_000_000)
                    .is_err(),
                "{why}"
            );
        }
        let exactly = format!("t=1700000000,v1={TAG},x=");
        let exactly = format!("{exactly}{}", "a".repeat(MAX_HEADER_BYTES - exactly.len()));
        assert!(verifier
            .check_header(Some(exactly.as_bytes()), 1_700_000_000)
            .is_ok());
    }
}
