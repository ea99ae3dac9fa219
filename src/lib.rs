//! Stagedoor checkout: seat holds, orders and the Payrail charge behind them,
//! guarded by idempotency keys (the `idempotency` engine crate) so that one
//! click is one order and at most one charge.

pub mod auth; // buyers and their bearer tokens
pub mod checkout; // the domain: events, seats, holds, orders (SQL, Payrail, no actix)
pub mod cli; // the admin commands besides `serve`
pub mod config; // typed, layered settings
pub mod db; // pool, create-if-missing, embedded migrations
pub mod descriptors; // the open-files limit, raised at start
pub mod http; // the thin actix layer: auth, errors mapped to problems and sent, handlers
pub mod jobs; // background tasks: key cleanup, order reconciliation
pub mod observe; // metric names and the /metrics renderer
pub mod payrail; // the Payrail client and its circuit breaker
pub mod pgurl; // database.url as libpq reads it: sslmode, sslrootcert, hosts
pub mod problem; // the problems answered, their catalogue and RFC 9457 bodies (no actix)
pub mod readiness; // /readyz's database check, one at a time
pub mod signature; // the t.body HMAC of webhook events, checked (Payrail's) and made (ours)
pub mod startup; // Application::build / run_until_stopped
pub mod telemetry; // tracing subscriber
