//! The reference checkout page at `/demo/`: one static HTML file,
//! compiled in, public. It holds no secret and reaches no data by itself; the
//! API calls it makes carry the bearer token the buyer pastes, so it needs
//! no authentication of its own. It takes no token from its address: a link
//! must not be able to sign a visitor in as someone else.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse};

const PAGE: &str = include_str!("../../web/demo/index.html");

/// The page may run its own inline script and style, import this origin's
/// client module (`/client/checkout.js`) and call this origin's API, nothing
/// else.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self' 'unsafe-inline'; \
    style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

/// `GET /demo/`: the page.
pub async fn page() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .body(PAGE)
}

/// `GET /demo`: a permanent redirect to `/demo/` (the page has one address),
/// the query string kept so that `?event=` and `?timeout=` survive.
pub async fn redirect(req: HttpRequest) -> HttpResponse {
    let location = match req.query_string() {
        "" => "/demo/".to_owned(),
        query => format!("/demo/?{query}"),
    };
    HttpResponse::PermanentRedirect()
        .insert_header((header::LOCATION, location))
        .finish()
}
