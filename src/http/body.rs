//! Request bodies: read up to `http.max_body_bytes` (413 beyond) within
//! `http.request_timeout_secs` (408 beyond), keep the exact bytes for the
//! request hash, parse JSON into a typed request (400 `invalid-request` for
//! anything else).

use actix_web::http::header;
use actix_web::web::{self, Bytes, BytesMut};
use actix_web::HttpRequest;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use super::AppState;
use crate::problem::Problem;

/// The whole body, or the refusal. actix bounds only the time a head takes
/// to arrive; without this deadline a client that sends a head and then a
/// byte now and then would keep a socket and a growing buffer for as long
/// as it likes. The deadline is the request's, counted from its first byte
/// (`watch::deadline`): what the head took, the body has not. Every handler
/// reads its body before it claims a key or writes anything, so a request
/// that runs out of time has changed nothing.
pub async fn read(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<Bytes, Problem> {
    tokio::time::timeout_at(
        super::watch::deadline(req, state.request_timeout),
        collect(req, payload, state.max_body_bytes),
    )
    .await
    .map_err(|_| Problem::RequestTimeout(state.request_timeout))?
}

async fn collect(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<Bytes, Problem> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(Problem::PayloadTooLarge(limit));
    }
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk
            .map_err(|e| Problem::InvalidRequest(format!("the body could not be read: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(Problem::PayloadTooLarge(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

pub fn json<T: DeserializeOwned>(body: &[u8]) -> Result<T, Problem> {
    serde_json::from_slice(body)
        .map_err(|e| Problem::InvalidRequest(format!("the body is not the expected JSON: {e}")))
}
