//! The seat map, the on-sale's most polled read, from memory
//! (`checkout::seat_maps`): an `ETag` of its bytes, so that a poll that
//! changed nothing is a `304` of a few bytes, and gzip when the caller
//! accepts it (a 2,000-seat map is 175 KB of JSON, 12 KB gzipped).

use actix_web::http::header::{self, AcceptEncoding, Encoding, EntityTag, Header};
use actix_web::{get, web, HttpRequest, HttpResponse};

use super::{AppState, Buyer};
use crate::auth::BuyerId;
use crate::checkout::seat_maps::MapBody;
use crate::checkout::seats::SeatMap;
use crate::problem::Problem;

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
        Other buyers' changes show within one second: each instance serves the map from a \
        snapshot in memory, read again when it is 0.9 s old or when a hold in it expires. The \
        caller's own live holds are exact: a hold just made is in its holder's next map (on \
        another instance once the change's notice reached it, which the instance that made it \
        waits for; at the latest within the second). It carries a weak \
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
    let map = state
        .seat_maps
        .view(&state.route, &event_id, &buyer.0)
        .await?
        .ok_or(Problem::NotFound("there is no event with this id"))?;
    Ok(respond(&req, &map))
}

/// After a request that may have changed the buyer's holds (a hold, a
/// release, an order): the seat maps of every instance learn it, unless
/// the answer shows nothing was done, a replay or a refusal (`402` aside:
/// a declined order gave its holds back).
pub(super) async fn holds_may_have_changed(
    state: &AppState,
    buyer: &BuyerId,
    answered: &Result<HttpResponse, Problem>,
) {
    let changed = match answered {
        Ok(response) => {
            !response
                .headers()
                .contains_key(idempotency::actix::REPLAYED)
                && (response.status().is_success()
                    || response.status() == actix_web::http::StatusCode::PAYMENT_REQUIRED)
        }
        // An order's charge may have failed after its holds went into it.
        Err(problem) => problem.status() >= 500,
    };
    if changed {
        state.seat_maps.changed(&state.pool, buyer).await;
    }
}

/// 200 with the map (gzipped if the caller prefers it), or 304 when the
/// caller's `If-None-Match` names its tag. Both carry the validator and the
/// caching headers, so a browser can refresh what it keeps.
fn respond(req: &HttpRequest, map: &MapBody) -> HttpResponse {
    let tag = EntityTag::new_weak(hex(&map.digest));
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
    match gzip_preferred(req).then(|| map.gzipped()).flatten() {
        Some(gzipped) => response
            .insert_header((header::CONTENT_ENCODING, "gzip"))
            .body(gzipped),
        None => response.body(map.json.clone()),
    }
}

/// Whether the caller's `Accept-Encoding` prefers `gzip` to `identity` (no
/// header, or `*` alone: no).
fn gzip_preferred(req: &HttpRequest) -> bool {
    AcceptEncoding::parse(req).ok().is_some_and(|accepted| {
        accepted.negotiate([Encoding::gzip(), Encoding::identity()].iter())
            == Some(Encoding::gzip())
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
