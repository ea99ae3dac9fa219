//! Black-box tests of the API against a real PostgreSQL (a database per test)
//! and a real Payrail sandbox over HTTP.

mod answer_cache;
mod auth;
mod bad_input;
mod bad_night;
mod cli;
mod client;
mod cors;
mod crash;
mod database_tls;
mod expiry;
mod give_up;
mod health;
mod helpers;
mod holds;
mod idempotency;
mod invariants;
mod late_database;
mod limits;
mod metrics;
mod migrations;
mod openapi;
mod orders;
mod outbound;
mod payrail_events;
mod pool;
mod provider;
mod redis_gate;
mod routing;
mod seats;
mod security;
mod storm;
mod takeover;
mod trace;
mod waiting;
