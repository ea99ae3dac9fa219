use std::time::Duration;

use actix_web::http::header;
use actix_web::{get, post, web, HttpRequest, HttpResponse};
use idempotency::actix;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::problem::answered;
use super::{body, cursor, seats, AppState, Buyer};
use crate::checkout::orders::click::{self, Click};
use crate::checkout::orders::{NewOrder, Order};
use crate::problem::{answer_or_fail, Problem};
use crate::telemetry;

/// `GET /orders` without `limit`.
const PAGE: u8 = 20;
/// The largest `limit`.
const MAX_PAGE: u8 = 100;

/// The body of `POST /orders`, as parsed before the key is touched; what it
/// asks for is checked once the key is claimed (an `invalid-order` answer is
/// stored like any other).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderRequest {
    /// The buyer's live holds to pay for, each once.
    #[schema(min_items = 1, max_items = 50)]
    pub hold_ids: Vec<i64>,
    /// `pm_card_visa`, `pm_card_declined`, … (letters, digits, `_`).
    #[schema(
        pattern = "^pm_[A-Za-z0-9_]+$",
        max_length = 64,
        example = "pm_card_visa"
    )]
    pub payment_method: String,
}

/// The Idempotency-Key is required.
#[utoipa::path(
    operation_id = "place_order",
    tag = "orders",
    summary = "Pay for holds: one click, one order, at most one charge",
    description = "Every 2xx and 4xx answer of the intent (201, 402, 409 `hold-unavailable`, \
        422 `invalid-order`) is stored under the key and replayed, byte for byte, to a retry with \
        the same key and body. 5xx answers are never stored: retry with the same key.",
    params(
        ("Idempotency-Key" = String, Header, min_length = 1, max_length = 255,
            pattern = "^[!#-~]{1,255}$",
            description = "Required. 1-255 visible ASCII characters, made once per click and \
                reused for every retry of it; the structured-field form `\"...\"` means the \
                text inside the quotes"),
        ("Prefer" = Option<String>, Header, example = "wait=5",
            description = "RFC 7240. `wait=N`: if the key's first request is still in \
                progress, wait up to N seconds (at most `idempotency.max_wait_secs`) for its \
                answer and get it as a replay, instead of an immediate 409"),
    ),
    request_body = OrderRequest,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Charged: the order", body = Order,
            headers(("Location" = String, description = "`/orders/{order_id}`")),
            links(("ShowOrder" = (operation_id = "show_order",
                parameters(("order_id" = "$response.body#/order_id")))))),
    )
)]
#[post("/orders")]
pub async fn create(
    state: web::Data<AppState>,
    buyer: Buyer,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    let key = actix::key(&req)?.ok_or(Problem::KeyMissing)?;
    let bytes = body::read(&req, payload, &state).await?;
    let OrderRequest {
        hold_ids,
        payment_method,
    } = body::json(&bytes)?;
    let orders = &state.orders;
    // An order that cannot be made is still the click's answer, stored on
    // its key: refused in the work, after the claim.
    let click =
        NewOrder::parse(hold_ids, &payment_method).map(|request| Click::new(orders, request));
    let click = click.as_ref().map_err(|refusal| *refusal);
    let opening = click.ok().and_then(Click::opening);
    let answered = actix::run(
        &state.engine,
        buyer.0.as_str(),
        &key,
        (&req, &bytes),
        opening,
        Duration::from_secs(state.max_wait_secs),
        |claim| async move {
            answer_or_fail(match click {
                Ok(click) => click::place(orders, &claim, click).await,
                Err(refusal) => Err(refusal.into()),
            })
        },
    )
    .await
    .map(|done| answered(&req, done))
    .map_err(Problem::from);
    seats::holds_may_have_changed(&state, &buyer.0, &answered).await;
    // The click's order, for the request's log line: the 201's `Location`,
    // or a 409's while it waits for Payrail (a 402 names it in its body,
    // which `answered` reads).
    let made = match &answered {
        Ok(response) => response
            .headers()
            .get(header::LOCATION)
            .and_then(|location| location.to_str().ok())
            .and_then(|location| location.strip_prefix("/orders/"))
            .and_then(|order_id| Uuid::parse_str(order_id).ok()),
        Err(Problem::RequestInProgress { order_id }) => *order_id,
        Err(_) => None,
    };
    if let Some(order_id) = made {
        telemetry::note_order(&req, order_id);
    }
    answered
}

/// Another buyer's order is 404.
#[utoipa::path(
    operation_id = "show_order",
    tag = "orders",
    summary = "One of the buyer's orders",
    description = "The order as it is now: `payment_pending` until Payrail's answer is known \
        (Payrail's event or reconciliation settles an order whose answer was lost), then `paid` \
        or `declined`, or `failed` when Payrail never decided and the charge was canceled. \
        Another buyer's order is 404, as if it did not exist.",
    params(("order_id" = uuid::Uuid, Path, description = "The order's id")),
    security(("bearer" = [])),
    responses((status = 200, description = "The order", body = Order))
)]
#[get("/orders/{order_id}")]
pub async fn show(
    state: web::Data<AppState>,
    buyer: Buyer,
    req: HttpRequest,
    order_id: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    let not_found = || Problem::NotFound("there is no such order of yours");
    let order_id = Uuid::parse_str(&order_id).map_err(|_| not_found())?;
    let order = state
        .orders
        .find(buyer.0.as_str(), order_id)
        .await?
        .ok_or_else(not_found)?;
    telemetry::note_order(&req, order_id);
    Ok(HttpResponse::Ok().json(order))
}

/// The query of `GET /orders`, as sent: each value is checked here, so that
/// a bad one is a 400 that says which.
#[derive(Debug, Deserialize)]
struct ListQuery {
    limit: Option<String>,
    after: Option<String>,
}

/// A page of the buyer's orders.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OrderList {
    /// Newest first, each as `GET /orders/{order_id}` shows it.
    pub orders: Vec<Order>,
    /// The `after` of the next page; null on the last one.
    #[schema(required = true)]
    pub next: Option<String>,
}

/// The caller's orders, newest first.
#[utoipa::path(
    operation_id = "list_orders",
    tag = "orders",
    summary = "The buyer's orders, newest first",
    description = "The caller's own orders (never another buyer's), newest first, each as \
        `GET /orders/{order_id}` shows it, a page at a time: `next` is the `after` of the next \
        page, null on the last. An order made while the pages are read is on none of the pages \
        after it, and no order is on two pages. A bad `limit` or an `after` that is not a \
        `next` of the caller's is 400 `invalid-request`.",
    params(
        ("limit" = Option<u8>, Query, minimum = 1, maximum = 100, example = 20,
            description = "Orders per page, 1-100; 20 when absent"),
        ("after" = Option<String>, Query, max_length = 64,
            description = "The `next` of the page before, as it came"),
    ),
    security(("bearer" = [])),
    responses((status = 200, description = "A page of the buyer's orders", body = OrderList))
)]
#[get("/orders")]
pub async fn list(
    state: web::Data<AppState>,
    buyer: Buyer,
    req: HttpRequest,
) -> Result<HttpResponse, Problem> {
    let bad = |why: &str| Problem::InvalidRequest(why.to_owned());
    let query = web::Query::<ListQuery>::from_query(req.query_string())
        .map_err(|error| Problem::InvalidRequest(error.to_string()))?;
    let limit = match &query.limit {
        None => PAGE,
        Some(limit) => limit
            .parse::<u8>()
            .ok()
            .filter(|limit| (1..=MAX_PAGE).contains(limit))
            .ok_or_else(|| bad("`limit` must be a whole number from 1 to 100"))?,
    };
    let buyer = buyer.0.as_str();
    let after = query
        .after
        .as_deref()
        .map(|after| cursor::decode(buyer, after))
        .transpose()
        .map_err(|error| bad(&error.to_string()))?;
    let page = state.orders.list(buyer, after, limit).await?;
    Ok(HttpResponse::Ok().json(OrderList {
        orders: page.orders,
        next: page.next.map(|next| cursor::encode(buyer, next)),
    }))
}
