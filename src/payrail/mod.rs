//! Payrail, the payment provider: the client the checkout calls (retries,
//! timeouts, a circuit breaker) and the sandbox that plays Payrail in local
//! runs, compose and tests.

mod breaker;
mod client;
pub mod sandbox;

pub use breaker::Breaker;
pub use client::{Charge, ChargeOutcome, Client, PaymentError};
