//! The idempotency mechanism: a key made at the click, a fingerprint of the
//! request, and the table row that decides who does the work and holds the
//! answer. Knows SQL, not HTTP.

mod fingerprint;
mod key;
mod lock;
pub mod store;

pub use fingerprint::RequestHash;
pub use key::{IdempotencyKey, KeyError};
pub use lock::{Gate, GateError};
pub use store::{Begin, Claim, ClaimKind, Finished, Media, StoredResponse};
