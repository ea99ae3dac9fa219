//! Conditional requests (RFC 9110 §13): whether the caller already has
//! what would be sent, so that the answer is a `304` without the body.

use actix_web::http::header::{EntityTag, Header, IfNoneMatch};
use actix_web::HttpRequest;

/// Whether the request's `If-None-Match` names `tag` (weak comparison,
/// §13.1.2) or is `*`. A malformed one is as good as none: the body is
/// sent.
pub fn has(req: &HttpRequest, tag: &EntityTag) -> bool {
    match IfNoneMatch::parse(req) {
        Ok(IfNoneMatch::Any) => true,
        Ok(IfNoneMatch::Items(tags)) => tags.iter().any(|t| t.weak_eq(tag)),
        Err(_) => false,
    }
}
