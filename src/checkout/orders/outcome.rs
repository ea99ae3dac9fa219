//! What an order's outcome is, and how it is counted: the status, charge
//! and decline reason that Payrail's decision means, whoever hears it (the
//! click, a takeover, reconciliation, Payrail's event), and the count of
//! orders settled, once each, by status and reason.

use super::{Order, OrderStatus};
use crate::checkout::holds::{self, HowEnded};
use crate::observe::{labels, Counter, Metric};
use crate::payrail::ChargeOutcome;

labels! {
    /// How an order ended.
    #[label = "status"]
    enum Settled {
        Paid = "paid",
        Declined = "declined",
        Failed = "failed",
    }
}

labels! {
    /// Why an order was declined: Payrail's `decline_code` when it is one of
    /// these, so that the series stay bounded whatever Payrail sends.
    #[label = "reason"]
    pub enum Reason {
        /// Not a decline (paid, failed).
        None = "none",
        CardDeclined = "card_declined",
        InsufficientFunds = "insufficient_funds",
        ExpiredCard = "expired_card",
        IncorrectCvc = "incorrect_cvc",
        LostCard = "lost_card",
        StolenCard = "stolen_card",
        /// A code not listed here.
        Other = "other",
        /// No code was heard: the decline came by Payrail's event, or
        /// another settlement heard it.
        Unknown = "unknown",
    }
}

impl Reason {
    /// The reason a decline code names (one of Payrail's, or one an order
    /// recorded), `Other` for a code not listed.
    pub(super) fn named(code: &str) -> Self {
        <Reason as crate::observe::Label>::ALL
            .iter()
            .copied()
            .filter(|reason| !matches!(reason, Reason::None | Reason::Other | Reason::Unknown))
            .find(|reason| crate::observe::Label::as_str(*reason) == code)
            .unwrap_or(Reason::Other)
    }

    /// The reason a settled order was counted under.
    fn recorded(order: &Order) -> Self {
        match order.status {
            OrderStatus::Declined => order.decline_code.map_or(Reason::Unknown, Reason::named),
            _ => Reason::None,
        }
    }
}

const SETTLED: Counter<(Settled, Reason)> = Counter::new(
    "orders_settled_total",
    "Orders settled, each once, by final status and decline reason",
);
/// What the settlement reports, for the recorder (`observe::install`).
pub const METRICS: &[&dyn Metric] = &[&SETTLED];

/// Counts an order that this settlement moved out of `payment_pending`:
/// once per order, whichever path settled it, since only the call whose
/// update moved it gets here. A paid order's holds end in it.
pub(super) fn counted(order: &Order) {
    let status = match order.status {
        OrderStatus::Paid => Settled::Paid,
        OrderStatus::Declined => Settled::Declined,
        OrderStatus::Failed => Settled::Failed,
        OrderStatus::PaymentPending => return,
    };
    SETTLED.of((status, Reason::recorded(order))).increment(1);
    if status == Settled::Paid {
        holds::ended(HowEnded::Ordered, order.hold_ids.len());
    }
}

/// The order status, charge id and decline code that Payrail's decision
/// means: the code bounded to the reasons the service knows (`other` for
/// the rest), none when Payrail gave none.
pub(super) fn decision(
    outcome: &ChargeOutcome,
) -> (OrderStatus, Option<&String>, Option<&'static str>) {
    match outcome {
        ChargeOutcome::Succeeded { charge_id } => (OrderStatus::Paid, Some(charge_id), None),
        ChargeOutcome::Declined { charge_id, code } => (
            OrderStatus::Declined,
            charge_id.as_ref(),
            code.as_deref()
                .map(|code| crate::observe::Label::as_str(Reason::named(code))),
        ),
    }
}
