//! Stagedoor checkout: seat holds, orders and the Payrail charge behind them,
//! guarded by idempotency keys so that one click is one order and at most one
//! charge.

pub mod auth; // buyers and their bearer tokens
pub mod checkout; // the domain: events, seats, holds, orders (knows SQL, not HTTP)
pub mod cli; // the admin commands besides `serve`
pub mod config; // typed, layered settings
pub mod db; // pool, create-if-missing, embedded migrations
pub mod http; // the thin actix layer: auth, problems, handlers
pub mod idempotency; // keys, request fingerprints, the key table
pub mod jobs; // background tasks: key cleanup, order reconciliation
pub mod observe; // metric names and the /metrics renderer
pub mod payrail; // the Payrail client, its circuit breaker, and the sandbox double
pub mod problem; // the one error policy, rendered as RFC 9457
pub mod startup; // Application::build / run_until_stopped
pub mod telemetry; // tracing subscriber
