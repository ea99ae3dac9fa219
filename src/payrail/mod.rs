//! Payrail, the payment provider: the client the checkout calls (retries,
//! timeouts, a circuit breaker). The sandbox that plays Payrail in local
//! runs, compose and tests is a crate of its own (`payrail-sandbox`).

mod breaker;
mod client;

pub use breaker::Breaker;
pub use client::{AttemptOutcome, Charge, ChargeOutcome, Client, PaymentError};
