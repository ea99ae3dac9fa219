//! Idempotency keys on PostgreSQL: one intent, one execution, one stored
//! answer, across retries, instances and crashes.
//!
//! A client makes a key when its user acts and sends it with every retry of
//! that act. The first request with a key claims it (one `INSERT … ON
//! CONFLICT` decides every race, on `PRIMARY KEY (user_id, key)`), does the
//! work, and stores the answer; every later request with the same key and the
//! same request gets that answer back, byte for byte, and the work is never
//! done twice.
//!
//! # What it guarantees
//! - **One execution.** The work of an intent runs once. Its durable effect
//!   commits in the same transaction as its answer, or as a link to an effect
//!   that is still settling (a [`Unit`]), fenced by the claim's token: a
//!   crash at any point leaves either nothing (the retry starts afresh) or a
//!   committed effect that a retry resumes or replays, never re-runs.
//! - **Crash recovery.** A claim belongs to its request for the lease; after
//!   it, a retry takes the key over (one conditional update decides who) and
//!   finishes the intent, resuming the linked effect if there is one. A
//!   request that lost its claim (a long pause) writes nothing.
//! - **Replays are exact**: status, `Content-Type`, `Location`, body bytes.
//! - **No cross-talk**: a key is scoped by `user_id`; the same key with a
//!   different request (method, path, body) is refused, never answered.
//! - **Expiry**: a key older than its TTL is a new intent; [`Cleanup`]
//!   deletes expired keys in short batches, one instance at a time.
//! - **Waiting** ([`Engine::run`]'s `wait`): a request that finds its key
//!   in progress may wait for the holder's answer, on any instance, holding
//!   no connection while it waits.
//! - **A key that costs almost nothing**: the work's first step can be the
//!   claim itself ([`Opening`]), one call and one commit for the key and
//!   the effect; a lost insert touches nothing else.
//! - **A limit on new intents** ([`Limit`], optional): a token is spent only
//!   by a request about to claim a new key; past a scope's bucket a request
//!   is refused before any statement, unless memory answers it (the cache,
//!   a copy in flight), and writes nothing.
//! - **Answers from memory** ([`AnswerCache`], optional): a retry of an
//!   answered key is answered from this instance's memory, with no pooled
//!   connection; a purge reaches every instance over `LISTEN/NOTIFY`.
//!
//! # What it asks of the caller
//! - Run [`migrate`] on the database (it owns the table `idempotency_keys`).
//! - Authenticate first: `user_id` must be the caller's real identity.
//! - Read the key and the body before anything is written; reject a bad key
//!   (`KeyError`) without touching the table.
//! - Make every durable effect in a [`Unit`] of the claim and end it with
//!   [`Unit::store`] or [`Unit::link`] and [`Unit::finish`]; or in steps of
//!   one call, PL/pgSQL functions that call the engine's own for the key's
//!   writes ([`Opening`], [`Storing`]): one round trip and one commit
//!   instead of a transaction's four. Report a refusal that wrote nothing as
//!   [`Done::Answer`]; report a failure that is not an answer (a timeout, a
//!   5xx) as an error, which is never stored.
//! - Never hold a unit (a transaction) across a call to another system: link
//!   the effect, commit, call, then settle in a second unit. A settlement
//!   calls the engine's `idempotency_settled` on the key that links the
//!   effect, in its own transaction (or passes `p_keep_answer` to the
//!   `idempotency_store` that ends it): until then the key outlives its TTL.
//!
//! For support and operations, [`inspect`] shows what one key holds, purges
//! a key whose intent is over (never one in progress or whose effect is
//! still settling), and counts the table's rows.
//!
//! # A toy endpoint
//! A counter that a retried `POST /bump` must not bump twice:
//!
//! ```no_run
//! use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
//! use idempotency::actix::{self, Refusal, Unanswered};
//! use idempotency::{Done, Engine, Policy, StoredResponse, Unit};
//! use std::time::Duration;
//!
//! async fn bump(
//!     engine: web::Data<Engine>,
//!     pool: web::Data<deadpool_postgres::Pool>,
//!     req: HttpRequest,
//!     body: web::Bytes,
//! ) -> HttpResponse {
//!     let Ok(Some(key)) = actix::key(&req) else {
//!         return HttpResponse::BadRequest().body("send one valid Idempotency-Key");
//!     };
//!     let user = "alice"; // the authenticated caller
//!     let max_wait = Duration::from_secs(10); // the longest `Prefer: wait` honoured
//!     let answered = actix::run(&engine, user, &key, (&req, &body), None, max_wait, |claim| {
//!         async move {
//!             let mut client = pool.get().await.map_err(idempotency::Error::from)?;
//!             let unit = Unit::begin(&claim, &mut client).await?;
//!             let row = unit
//!                 .tx()
//!                 .query_one("UPDATE counter SET n = n + 1 RETURNING n", &[])
//!                 .await
//!                 .map_err(idempotency::Error::from)?;
//!             let n: i64 = row.get(0);
//!             let answer = StoredResponse::new(200, "text/plain", n.to_string().into_bytes());
//!             let fence = unit.store(&answer).await?;
//!             Ok::<_, idempotency::Error>(unit.finish(fence).await?.answered(answer))
//!         }
//!     })
//!     .await;
//!     match answered {
//!         Ok(answered) => answered.response,
//!         Err(Unanswered::Refused(Refusal::InProgress { .. })) => {
//!             HttpResponse::Conflict().body("retry shortly")
//!         }
//!         Err(Unanswered::Refused(Refusal::KeyReused)) => HttpResponse::UnprocessableEntity().finish(),
//!         Err(Unanswered::Refused(Refusal::Limited(_))) => HttpResponse::TooManyRequests().finish(),
//!         Err(Unanswered::Failed(_)) => HttpResponse::ServiceUnavailable().finish(),
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let url = "postgres://postgres@127.0.0.1:5432/toy";
//!     let mut client = idempotency::connect(url, tokio_postgres::NoTls).await?;
//!     idempotency::migrate(&mut client).await?;
//!     client
//!         .batch_execute(
//!             "CREATE TABLE IF NOT EXISTS counter (n bigint NOT NULL);
//!              INSERT INTO counter SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM counter)",
//!         )
//!         .await?;
//!     let config: tokio_postgres::Config = url.parse()?;
//!     let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
//!     let pool = deadpool_postgres::Pool::builder(manager).max_size(8).build()?;
//!     let policy = Policy { ttl: Duration::from_secs(86_400), lease: Duration::from_secs(30) };
//!     let engine = web::Data::new(Engine::new(pool.clone(), policy));
//!     let pool = web::Data::new(pool);
//!     HttpServer::new(move || {
//!         App::new()
//!             .app_data(engine.clone())
//!             .app_data(pool.clone())
//!             .route("/bump", web::post().to(bump))
//!     })
//!     .bind(("127.0.0.1", 8090))?
//!     .run()
//!     .await?;
//!     Ok(())
//! }
//! ```

mod fingerprint; // the request hash
mod key; // the Idempotency-Key value

pub use fingerprint::RequestHash;
pub use key::{IdempotencyKey, KeyError};

/// Items of the `engine` feature: all but the key parser and the request
/// hash, which need no I/O dependency.
macro_rules! engine {
    ($($item:item)*) => { $( #[cfg(feature = "engine")] $item )* };
}

/// The key row `k` links an effect with no outcome yet (the caller's
/// settlement has not called `idempotency_settled`): it outlives its TTL,
/// neither restarted, deleted by the cleanup, nor purged. For the engine's
/// statements, with `concat!`.
#[cfg(feature = "engine")]
macro_rules! settling {
    () => {
        "(k.effect IS NOT NULL AND NOT k.effect_settled)"
    };
}

engine! {
    #[cfg(feature = "actix")]
    pub mod actix;
    mod cache; // answers in memory, invalidated over LISTEN/NOTIFY
    mod claim; // the right to do an intent's work, its steps, and how the work ends
    mod claiming; // copies of one request share the key's statement
    pub mod cleanup; // batched deletion of expired keys
    mod engine; // the engine and the flow of a keyed request
    mod error;
    mod gate; // the optional Redis gate
    pub mod inspect; // key tooling: show, purge, stats
    mod layout; // one PostgreSQL or a cluster: the cleanup's slices
    mod limit; // new intents per scope
    pub mod listen; // a connection of its own that listens on a channel
    mod migrate; // the key table's own migrations
    mod reply; // what a request is answered, and what its key decided
    mod hash; // PostgreSQL's hashes, as Citus places rows by them
    mod route; // which server a buyer's rows are on
    mod response; // what is stored and replayed
    mod statement; // the calls of a step of one call
    mod store; // the key table's claim, its reader and its takeovers
    mod unit; // the atomic step: effect and key state in one transaction
    mod wait; // the waiters of keys in progress

    pub use cache::{AnswerCache, CacheEvent, CHANNEL as ANSWER_CHANNEL};
    pub use claim::{Claim, ClaimKind, Done, Fence, Policy};
    pub use cleanup::Cleanup;
    pub use engine::Engine;
    pub use error::{is_unavailable, Error};
    pub use gate::Gate;
    pub use inspect::{KeyReport, KeyState, Purge, PurgeRefusal, Stats};
    pub use layout::Layout;
    pub use limit::Limit;
    pub use migrate::{migrate, replace_functions, HISTORY_TABLE};
    pub use reply::{Outcome, Ran, Reply, RunError};
    pub use response::StoredResponse;
    pub use hash::{hashint4, hashtext};
    pub use route::{OpenPool, Route};
    pub use statement::{Opening, Storing};
    pub use unit::{store_for_effect, Committed, Unit};
    pub use wait::WaitOutcome;

    /// Opens one connection outside any pool (migrations, tools), driven by a
    /// task of its own, secured by `tls` (`tokio_postgres::NoTls` for none).
    pub async fn connect<T>(url: &str, tls: T) -> Result<tokio_postgres::Client, Error>
    where
        T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
        T::Stream: Send + 'static,
    {
        let (client, connection) = tokio_postgres::connect(url, tls).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::warn!(%error, "database connection closed");
            }
        });
        Ok(client)
    }
}
