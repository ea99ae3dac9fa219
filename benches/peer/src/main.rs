//! `stagedoor-peer <port> <redis url>`: `POST /holds` behind
//! actix-idempotent, answers stored in Redis sessions. A replay is the
//! session read from Redis and the cached response returned; the handler
//! runs once per session and request.

use actix_idempotent::{IdempotentFactory, IdempotentOptions};
use actix_session::config::{BrowserSession, SessionLifecycle};
use actix_session::storage::RedisSessionStore;
use actix_session::SessionMiddleware;
use actix_web::cookie::{time::Duration, Key};
use actix_web::{web, App, HttpResponse, HttpServer};

async fn hold(body: web::Bytes) -> HttpResponse {
    HttpResponse::Created()
        .content_type("application/json")
        .insert_header(("Location", "/holds/1"))
        .body(format!(
            "{{\"hold_id\":1,\"request_bytes\":{}}}",
            body.len()
        ))
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let redis = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let pool = deadpool_redis::Config::from_url(redis)
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .map_err(std::io::Error::other)?;
    let store = RedisSessionStore::new_pooled(pool)
        .await
        .map_err(std::io::Error::other)?;
    let key = Key::generate();
    HttpServer::new(move || {
        // The hash of a request must not change with wrk's headers.
        let idempotent = IdempotentFactory::new(IdempotentOptions::default().ignore_all_headers());
        App::new()
            .wrap(
                SessionMiddleware::builder(store.clone(), key.clone())
                    .cookie_name("session".into())
                    .cookie_secure(false)
                    .session_lifecycle(SessionLifecycle::BrowserSession(
                        BrowserSession::default().state_ttl(Duration::hours(1)),
                    ))
                    .build(),
            )
            .route("/holds", web::post().to(hold).wrap(idempotent))
    })
    .bind(("127.0.0.1", port))?
    .run()
    .await
}
