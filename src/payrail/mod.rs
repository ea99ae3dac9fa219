//! Payrail, the payment provider: the client the checkout calls (retries,
//! timeouts, a circuit breaker, cancels) and the signed events it sends
//! back (`webhook`). The sandbox that plays Payrail in local
//! runs, compose and tests is a crate of its own (`payrail-sandbox`).

mod breaker;
mod client;
mod webhook;

use crate::observe::Metric;

pub use breaker::Breaker;
pub use client::{charge_key, Canceled, Charge, ChargeOutcome, Client, PaymentError};
pub use webhook::{Event, EventKind, SignatureError, Verifier};

/// What the client and its breaker report, for the recorder (`observe::install`).
pub const METRICS: &[&dyn Metric] = &[
    &client::ATTEMPTS,
    &client::ATTEMPT_DURATION,
    &breaker::OPEN,
    &client::BREAKER_REJECTIONS,
];
