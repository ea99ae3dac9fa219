//! What a client sends the sandbox: a charge request, the test card it
//! names, and the global faults; and the randomness that picks which
//! requests a fault hits.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::MAX_DELAY_MS;

/// The body of `POST /v1/charges`. Requests with one key are compared by
/// these parsed fields, so whitespace or field order never cause a 422.
#[derive(Clone, PartialEq, Deserialize)]
pub(crate) struct ChargeRequest {
    pub(crate) amount_cents: i64,
    pub(crate) currency: String,
    pub(crate) payment_method: String,
    pub(crate) reference: String,
}

impl ChargeRequest {
    pub(crate) fn parse(body: &[u8]) -> Result<Self, String> {
        let request: ChargeRequest =
            serde_json::from_slice(body).map_err(|e| format!("invalid charge body: {e}"))?;
        if request.amount_cents <= 0 {
            return Err("amount_cents must be a positive integer".into());
        }
        if request.currency.trim().is_empty() || request.reference.trim().is_empty() {
            return Err("currency and reference must not be empty".into());
        }
        if !request.payment_method.starts_with("pm_") {
            return Err("payment_method must start with \"pm_\"".into());
        }
        Ok(request)
    }
}

/// Test cards, named by payment method like a real provider's.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Card {
    Succeeds,
    Declines,
    /// Charged at once, answered after `slow_ms`; its event leaves at once.
    Slow,
    /// Charged at once; its answer and its event both after `slow_ms`: a
    /// Payrail that is late with everything.
    Late,
    Errors,
}

impl Card {
    pub(crate) fn of(payment_method: &str) -> Card {
        match payment_method {
            "pm_card_declined" => Card::Declines,
            "pm_card_slow" => Card::Slow,
            "pm_card_late" => Card::Late,
            "pm_card_error" => Card::Errors,
            _ => Card::Succeeds,
        }
    }
}

/// Global faults; a field missing from `POST /v1/sandbox/faults` is reset.
#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct Faults {
    pub(crate) latency_ms: u64,
    pub(crate) error_rate: f64,
    pub(crate) drop_after_charge_rate: f64,
    pub(crate) slow_ms: u64,
    /// How long each event waits before its first delivery.
    pub(crate) webhook_delay_ms: u64,
    /// The share of events delivered twice, as two independent deliveries.
    pub(crate) webhook_duplicate_rate: f64,
    /// The share of delivery attempts counted as lost whatever the receiver
    /// answered (as if the network had lost the answer), so retried later.
    pub(crate) webhook_fail_rate: f64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            latency_ms: 0,
            error_rate: 0.0,
            drop_after_charge_rate: 0.0,
            slow_ms: 10_000,
            webhook_delay_ms: 0,
            webhook_duplicate_rate: 0.0,
            webhook_fail_rate: 0.0,
        }
    }
}

impl Faults {
    /// An empty body resets every fault.
    pub(crate) fn parse(body: &[u8]) -> Result<Self, String> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Faults::default());
        }
        let faults: Faults =
            serde_json::from_slice(body).map_err(|e| format!("invalid faults body: {e}"))?;
        let is_rate = |rate: f64| (0.0..=1.0).contains(&rate);
        let rates = [
            faults.error_rate,
            faults.drop_after_charge_rate,
            faults.webhook_duplicate_rate,
            faults.webhook_fail_rate,
        ];
        if !rates.into_iter().all(is_rate) {
            return Err(
                "error_rate, drop_after_charge_rate, webhook_duplicate_rate and \
                        webhook_fail_rate must be between 0 and 1"
                    .into(),
            );
        }
        let delays = [faults.latency_ms, faults.slow_ms, faults.webhook_delay_ms];
        if delays.into_iter().any(|ms| ms > MAX_DELAY_MS) {
            return Err(format!(
                "latency_ms, slow_ms and webhook_delay_ms must be at most {MAX_DELAY_MS}"
            ));
        }
        Ok(faults)
    }
}

/// splitmix64: enough randomness to pick which requests a fault hits, without
/// a crate. Seeded from uuid's random bits so runs differ.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn seeded() -> Self {
        Rng(Uuid::new_v4().as_u64_pair().0)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `rate`: never at 0, always at 1.
    pub(crate) fn chance(&mut self, rate: f64) -> bool {
        // The top 53 bits give a uniform float in [0, 1).
        rate > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < rate
    }
}
