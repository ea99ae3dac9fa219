//! The `Buyer` extractor: a verified bearer token, or 401 before anything
//! else about the request is looked at (503 while the identity provider's
//! keys were never fetched).

use actix_web::http::header;
use actix_web::{dev::Payload, web, FromRequest, HttpMessage, HttpRequest};
use futures_util::future::LocalBoxFuture;

use super::AppState;
use crate::auth::BuyerId;
use crate::problem::Problem;
use crate::telemetry::Caller;

/// The authenticated buyer of a request.
pub struct Buyer(pub BuyerId);

impl FromRequest for Buyer {
    type Error = Problem;
    type Future = LocalBoxFuture<'static, Result<Self, Problem>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let state = req.app_data::<web::Data<AppState>>().cloned();
        let token = bearer_token(req).map(str::to_owned);
        let req = req.clone();
        Box::pin(async move {
            let state = state.ok_or_else(|| {
                Problem::Internal(anyhow::anyhow!("application state is missing"))
            })?;
            let buyer = state.verifier.verify(&token?).await?;
            // The request's log line names its buyer.
            let caller = Caller(buyer.as_str().to_owned());
            req.extensions_mut().insert(caller);
            Ok(Buyer(buyer))
        })
    }
}

fn bearer_token(req: &HttpRequest) -> Result<&str, Problem> {
    let mut values = req.headers().get_all(header::AUTHORIZATION);
    let value = values.next().ok_or(Problem::Unauthorized(
        "this endpoint needs Authorization: Bearer <token>",
    ))?;
    if values.next().is_some() {
        return Err(Problem::Unauthorized("send one Authorization header"));
    }
    value
        .to_str()
        .ok()
        // The scheme name is case-insensitive (RFC 9110 §11.1).
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token)
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(Problem::Unauthorized(
            "the Authorization header must be Bearer <token>",
        ))
}
