//! What the workspace's tests and benches share, written once: the API
//! tests (`tests/api`), the chaos run (`tests/chaos.rs`), the bench
//! (`benches/checkout.rs`) and the other crates' own tests against
//! PostgreSQL.
//!
//! | module | for |
//! | --- | --- |
//! | [`rng`] | one small seeded PRNG, so that a random run can be replayed from its seed |
//! | [`seen`] | what a client sees of an HTTP response, and the problem slug of its body |
//! | [`sandbox`] | the Payrail sandbox's control endpoints: faults and the ledger of charges |
//!
//! It does not depend on the `stagedoor-checkout` library: everything here
//! speaks to PostgreSQL, to processes and over HTTP, as a client would.

pub mod rng;
pub mod sandbox;
pub mod seen;

pub use rng::Rng;
pub use seen::Seen;
