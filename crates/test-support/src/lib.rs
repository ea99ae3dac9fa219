//! What the workspace's tests and benches share, written once: the API
//! tests (`tests/api`), the chaos run (`tests/chaos/main.rs`), the bench
//! (`benches/checkout/`) and the other crates' own tests against
//! PostgreSQL.
//!
//! | module | for |
//! | --- | --- |
//! | [`postgres`] | a throwaway PostgreSQL server of the test's own (initdb, pg_ctl), stopped and removed on drop |
//! | [`scratch`] | a temp directory of the run's own, and the sweep of those a killed run left behind |
//! | [`tls`] | a throwaway PostgreSQL that takes TLS connections only, with a CA made at test time |
//! | [`db`] | a database per test on the machine's server (`DATABASE_URL`), a plain connection, a pool |
//! | [`citus`] | the Citus profile (`STAGEDOOR_TEST_CITUS=1`): every test database a database of the cluster, and the tables' layout there |
//! | [`in_doubt`] | on Citus, a two-phase commit a worker coordinates, caught between its phases for a crash |
//! | [`process`] | a real service process: spawned, waited for until its health URL answers, killed or stopped; any process by its pid: SIGKILLed, its children, whether it lives |
//! | [`rng`] | one small seeded PRNG, so that a random run can be replayed from its seed |
//! | [`seen`] | what a client sees of an HTTP response, and the problem slug of its body |
//! | [`receiver`] | a shop's webhook endpoint that records what it reads and fails, stalls, answers late or drops the connection on command |
//! | [`sandbox`] | the Payrail sandbox's control endpoints: faults and the ledger of charges |
//! | [`paused`] | a keyed request stopped in its work, through the engine's own flow, resumed or left as a crash would |
//! | [`invariants`] | the checker of docs/DESIGN.md's "What always holds" against the tables and the ledger |
//!
//! It does not depend on the `stagedoor-checkout` library: everything here
//! speaks to PostgreSQL, to processes and over HTTP, as a client would.

pub mod citus;
pub mod db;
pub mod in_doubt;
pub mod invariants;
pub mod paused;
pub mod postgres;
pub mod process;
pub mod receiver;
pub mod rng;
pub mod sandbox;
pub mod scratch;
pub mod seen;
pub mod tls;

pub use rng::Rng;
pub use seen::Seen;
