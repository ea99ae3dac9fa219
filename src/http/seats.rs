//! The seat map, the on-sale's most polled read: an `ETag` of its bytes, so
//! that a poll that changed nothing is a `304` of a few bytes, and gzip when
//! the caller accepts it (a 2,000-seat map is 175 KB of JSON, 12 KB
//! gzipped).

use std::io::Write;

use actix_web::http::header::{self, AcceptEncoding, Encoding, EntityTag, Header};
use actix_web::{get, web, HttpRequest, HttpResponse};
use flate2::write::GzEncoder;
use flate2::Compression;
use sha2::{Digest, Sha256};

use super::problem::Problem;
use super::{AppState, Buyer};
use crate::checkout::seats::{self, SeatMap};

/// Each buyer's map is their own (`your_hold`), and it changes with every
/// hold: no shared cache may keep it, and a browser asks again each time,
/// with its `ETag`.
const CACHE_CONTROL: &str = "private, no-cache";

#[utoipa::path(
    operation_id = "seat_map",
    tag = "seats",
    summary = "The seat map of an event",
    description = "Every seat of the event, in seat order, with its label, price and status: \
        `available`, `held` (a live hold has it, or an order waiting for its payment) or `sold` \
        (a paid order has it). A seat the caller holds (live, not yet in an order) carries \
        `your_hold`, the hold's id and expiry; every other seat has `null` there. An event \
        that does not exist is 404.\n\n\
        The map is read from the database on every request, so it is never stale: the \
        caller's own holds and everyone else's are as of the request. It carries a weak \
        `ETag` of its bytes (the same for its gzip and identity forms); a request whose \
        `If-None-Match` names it is `304` with no body, and the tag changes whenever any \
        seat's status or the caller's own holds change. The body is gzipped when \
        `Accept-Encoding` prefers `gzip` to `identity`. `Cache-Control: private, no-cache`: \
        a browser keeps the map and revalidates it on every poll.",
    params(
        ("event_id" = String, Path, description = "The event's id", example = "demo"),
        ("If-None-Match" = Option<String>, Header,
            description = "The `ETag` of a map the caller has: `304` if it is still the map"),
        ("Accept-Encoding" = Option<String>, Header, example = "gzip",
            description = "`gzip` for a gzipped body"),
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Every seat of the event and its status", body = SeatMap,
            headers(
                ("ETag" = String, description = "A weak tag of the map's bytes"),
                ("Cache-Control" = String, description = "`private, no-cache`"),
                ("Vary" = String, description = "`Accept-Encoding`"),
                ("Content-Encoding" = Option<String>,
                    description = "`gzip` when the caller accepts it"),
            )),
        (status = 304, description = "The map is still the one `If-None-Match` names: no body",
            headers(
                ("ETag" = String, description = "The same tag"),
                ("Cache-Control" = String, description = "`private, no-cache`"),
                ("Vary" = String, description = "`Accept-Encoding`"),
            )),
    )
)]
#[get("/events/{event_id}/seats")]
pub async fn seat_map(
    req: HttpRequest,
    state: web::Data<AppState>,
    buyer: Buyer,
    event_id: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    let client = state.pool.get().await?;
    let map = seats::seat_map(&client, &event_id, &buyer.0)
        .await?
        .ok_or(Problem::NotFound("there is no event with this id"))?;
    drop(client);
    Ok(respond(&req, &map))
}

/// 200 with the map (gzipped if the caller prefers it), or 304 when the
/// caller's `If-None-Match` names its tag. Both carry the validator and the
/// caching headers, so a browser can refresh what it keeps.
fn respond(req: &HttpRequest, map: &SeatMap) -> HttpResponse {
    // Strings and numbers: serializing cannot fail.
    let body = serde_json::to_vec(map).unwrap_or_default();
    let digest = Sha256::digest(&body);
    let tag = EntityTag::new_weak(hex(&digest[..16]));
    let cached = super::conditional::has(req, &tag);
    let mut response = if cached {
        HttpResponse::NotModified()
    } else {
        HttpResponse::Ok()
    };
    response
        .insert_header(header::ETag(tag))
        .insert_header((header::CACHE_CONTROL, CACHE_CONTROL))
        .insert_header((header::VARY, "Accept-Encoding"));
    if cached {
        return response.finish();
    }
    response.content_type("application/json");
    match gzip_if_preferred(req, &body) {
        Some(gzipped) => response
            .insert_header((header::CONTENT_ENCODING, "gzip"))
            .body(gzipped),
        None => response.body(body),
    }
}

/// The body gzipped, when the caller's `Accept-Encoding` prefers `gzip` to
/// `identity` (no header, `*` alone, or a failure to compress: `None`, the
/// body goes as it is).
fn gzip_if_preferred(req: &HttpRequest, body: &[u8]) -> Option<Vec<u8>> {
    let accepted = AcceptEncoding::parse(req).ok()?;
    let chosen = accepted.negotiate([Encoding::gzip(), Encoding::identity()].iter())?;
    if chosen != Encoding::gzip() {
        return None;
    }
    // The fast level: most of the size goes at a fraction of the default's
    // time, and the map is built for every poll.
    let mut encoder = GzEncoder::new(Vec::with_capacity(body.len() / 8), Compression::fast());
    encoder.write_all(body).ok()?;
    encoder.finish().ok()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
