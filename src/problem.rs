//! The service's problems: every failure is a `Problem`, each variant
//! documented with the status and slug it answers, and its answer's bytes
//! are RFC 9457 Problem Details made here and nowhere else: what the HTTP
//! layer sends (`http::problem`), and what a keyed request stores as its
//! answer (a refusal; a declined order's 402). Which error is which
//! problem is said here, for the database's, the engine's, Payrail's and
//! the tokens' errors, and beside `checkout::CheckoutError` for the
//! domain's. It knows no actix.
//!
//! The catalogue (`Kind::entry`) says what each problem type is: its status,
//! slug and title, what its answer carries, and what the OpenAPI document
//! says of it. Beside it, `answers` lists the types each operation may
//! answer: the document's error responses are made from that list, so a
//! handler does not repeat them.

use std::time::Duration;

use serde::Serialize;
use uuid::Uuid;

use idempotency::{Done, KeyError, RunError, StoredResponse};

use crate::auth::TokenError;
use crate::db::DbError;
use crate::payrail::PaymentError;

pub const CONTENT_TYPE: &str = "application/problem+json";
const TYPE_BASE: &str = "https://stagedoor.example/problems/";

#[derive(Debug, thiserror::Error)]
pub enum Problem {
    /// 401 `unauthorized`, with `WWW-Authenticate: Bearer`.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// 404 `not-found`.
    #[error("{0}")]
    NotFound(&'static str),
    /// 405 `method-not-allowed`.
    #[error("this method is not allowed on this path")]
    MethodNotAllowed,
    /// 400 `idempotency-key-missing`: rejected before the key is touched.
    #[error("this request needs an Idempotency-Key header, made once per click")]
    KeyMissing,
    /// 400 `idempotency-key-invalid`: rejected before the key is touched.
    #[error("{0}")]
    KeyInvalid(#[from] KeyError),
    /// 400 `invalid-request`: not JSON, or not the right shape.
    #[error("{0}")]
    InvalidRequest(String),
    /// 413 `payload-too-large`.
    #[error("the body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// 408 `request-timeout`: the body did not arrive in time; nothing was
    /// claimed or written.
    #[error("the request's body did not arrive within {} s", .0.as_secs())]
    RequestTimeout(Duration),
    /// 422 `idempotency-key-reused`: the key was first sent with another request.
    #[error("this Idempotency-Key was already used for a different request")]
    KeyReused,
    /// 409 `request-in-progress`, with `Retry-After: 1`, and `Location:
    /// /orders/{order_id}` when the click's order exists already (waiting
    /// for its payment).
    #[error("a request with this Idempotency-Key is still in progress; retry shortly")]
    RequestInProgress { order_id: Option<Uuid> },
    /// 429 `rate-limited`, with `Retry-After`: a new intent past the buyer's
    /// limit; nothing was written.
    #[error("too many new requests from this buyer; retry after the time Retry-After says")]
    RateLimited { retry_after: Duration },
    /// 409 `seat-unavailable`.
    #[error("this seat is held by someone else or already sold")]
    SeatUnavailable,
    /// 409 `hold-limit-reached`: the buyer holds `holds.max_per_buyer` seats
    /// of the event already; nothing was written.
    #[error("you already hold as many seats of this event as one buyer may")]
    HoldLimitReached,
    /// 409 `hold-unavailable`.
    #[error("a hold is unknown, not yours, expired or already in another order")]
    HoldUnavailable,
    /// 422 `invalid-order`.
    #[error("{0}")]
    InvalidOrder(&'static str),
    /// 402 `payment-declined`; the holds stay the buyer's until they expire.
    #[error("the payment was declined; your holds are kept until they expire")]
    PaymentDeclined {
        order_id: Uuid,
        /// Payrail's `decline_code`, bounded to the codes the service
        /// knows (`other` for the rest); `None` when it was not heard.
        decline_code: Option<&'static str>,
    },
    /// 402 `payment-failed`: Payrail never decided the charge, so it was
    /// canceled there; the holds are given back.
    #[error("the payment could not be completed and was canceled; nothing was charged")]
    PaymentFailed { order_id: Uuid },
    /// 400 `webhook-signature-invalid`: an event whose `Payrail-Signature`
    /// is missing, wrong or too old; nothing was written.
    #[error("{0}")]
    WebhookSignatureInvalid(#[from] crate::payrail::SignatureError),
    /// 504 `payment-timeout`: never stored; the intent is settled later.
    #[error("the payment provider did not answer in time; retry with the same Idempotency-Key")]
    PaymentTimeout,
    /// 503 `payment-unavailable`, with `Retry-After`: never stored.
    #[error("the payment provider is unavailable; retry with the same Idempotency-Key")]
    PaymentUnavailable { retry_after: Duration },
    /// 503 `service-unavailable`, with `Retry-After: 1`: the database is out of reach.
    #[error("the service is temporarily unavailable")]
    ServiceUnavailable(#[source] DbError),
    /// 503 `service-unavailable`, with `Retry-After: 1`: `/readyz`'s shared
    /// database check, at most a second old, found no database.
    #[error("the database did not answer the readiness check")]
    NotReady,
    /// 503 `service-unavailable`, with `Retry-After`: the identity provider's
    /// keys were never fetched, so no provider token can be checked yet.
    #[error("the identity provider's signing keys are not available yet; retry shortly")]
    KeysUnavailable,
    /// 500 `internal`.
    #[error("an unexpected error occurred")]
    Internal(#[source] anyhow::Error),
}

/// An RFC 9457 Problem Details body (`application/problem+json`).
#[derive(Serialize, utoipa::ToSchema)]
pub struct ProblemDetails {
    /// `https://stagedoor.example/problems/<slug>`.
    #[serde(rename = "type")]
    #[schema(
        format = "uri",
        example = "https://stagedoor.example/problems/hold-unavailable"
    )]
    kind: String,
    /// A short summary of the problem type.
    #[schema(example = "Hold unavailable")]
    title: &'static str,
    /// The HTTP status code, repeated.
    #[schema(example = 409)]
    status: u16,
    /// What went wrong with this request.
    detail: String,
    /// The declined or failed order (`payment-declined`, `payment-failed` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    order_id: Option<Uuid>,
    /// Why Payrail declined the card (`payment-declined` only, when Payrail
    /// said why): `card_declined`, `insufficient_funds`, `expired_card`,
    /// `incorrect_cvc`, `lost_card`, `stolen_card`, or `other`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "insufficient_funds")]
    decline_code: Option<&'static str>,
}

/// A problem type: what a client tells apart by `type`. Several `Problem`s
/// may be one type (the database's 503 and the identity provider's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Unauthorized,
    NotFound,
    MethodNotAllowed,
    KeyMissing,
    KeyInvalid,
    InvalidRequest,
    PayloadTooLarge,
    RequestTimeout,
    KeyReused,
    RequestInProgress,
    RateLimited,
    SeatUnavailable,
    HoldLimitReached,
    HoldUnavailable,
    InvalidOrder,
    PaymentDeclined,
    PaymentFailed,
    WebhookSignatureInvalid,
    PaymentTimeout,
    PaymentUnavailable,
    ServiceUnavailable,
    Internal,
}

/// What the catalogue says of a problem type: what is sent, and the
/// words the OpenAPI document gives it.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub status: u16,
    pub slug: &'static str,
    pub title: &'static str,
    /// When it is answered.
    pub about: &'static str,
    pub carries: Carries,
    /// When it may carry a `Location`, what that names.
    pub location: Option<&'static str>,
    /// Answered by the work of a keyed request, it is the intent's answer:
    /// stored under the key and replayed.
    pub stored: bool,
}

/// What an answer carries besides the problem's members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carries {
    Nothing,
    /// `WWW-Authenticate: Bearer`.
    Challenge,
    /// `Retry-After`, in whole seconds.
    RetryAfter,
    /// The order it is about, as `order_id` in the body.
    Order,
}

impl Entry {
    const fn new(
        status: u16,
        slug: &'static str,
        title: &'static str,
        about: &'static str,
    ) -> Self {
        Self {
            status,
            slug,
            title,
            about,
            carries: Carries::Nothing,
            location: None,
            stored: false,
        }
    }

    const fn carrying(self, carries: Carries) -> Self {
        Self { carries, ..self }
    }

    const fn locating(self, what: &'static str) -> Self {
        Self {
            location: Some(what),
            ..self
        }
    }

    const fn stored(self) -> Self {
        Self {
            stored: true,
            ..self
        }
    }
}

impl Kind {
    /// Every problem type.
    const ALL: [Kind; 22] = [
        Kind::Unauthorized,
        Kind::NotFound,
        Kind::MethodNotAllowed,
        Kind::KeyMissing,
        Kind::KeyInvalid,
        Kind::InvalidRequest,
        Kind::PayloadTooLarge,
        Kind::RequestTimeout,
        Kind::KeyReused,
        Kind::RequestInProgress,
        Kind::RateLimited,
        Kind::SeatUnavailable,
        Kind::HoldLimitReached,
        Kind::HoldUnavailable,
        Kind::InvalidOrder,
        Kind::PaymentDeclined,
        Kind::PaymentFailed,
        Kind::WebhookSignatureInvalid,
        Kind::PaymentTimeout,
        Kind::PaymentUnavailable,
        Kind::ServiceUnavailable,
        Kind::Internal,
    ];

    /// The catalogue of problem types (docs/API.md).
    pub const fn entry(self) -> Entry {
        match self {
            Kind::Unauthorized => {
                Entry::new(401, "unauthorized", "Unauthorized", "no valid bearer token")
                    .carrying(Carries::Challenge)
            }
            Kind::NotFound => Entry::new(
                404,
                "not-found",
                "Not found",
                "what the request names does not exist, or is another buyer's",
            )
            .stored(),
            Kind::MethodNotAllowed => Entry::new(
                405,
                "method-not-allowed",
                "Method not allowed",
                "the path does not take this method; `Allow` lists the ones it takes",
            ),
            Kind::KeyMissing => Entry::new(
                400,
                "idempotency-key-missing",
                "Idempotency-Key missing",
                "the request has no `Idempotency-Key`; nothing is stored",
            ),
            Kind::KeyInvalid => Entry::new(
                400,
                "idempotency-key-invalid",
                "Idempotency-Key invalid",
                "the `Idempotency-Key` is not 1-255 visible ASCII characters; nothing is stored",
            ),
            Kind::InvalidRequest => Entry::new(
                400,
                "invalid-request",
                "Invalid request",
                "the body is not JSON, or not of this operation's shape; nothing is stored",
            ),
            Kind::PayloadTooLarge => Entry::new(
                413,
                "payload-too-large",
                "Payload too large",
                "the body is larger than `http.max_body_bytes`; nothing is stored",
            ),
            Kind::RequestTimeout => Entry::new(
                408,
                "request-timeout",
                "Request timeout",
                "the body did not arrive within `http.request_timeout_secs`; nothing was \
                 claimed or written, so the same request may be sent again",
            ),
            Kind::KeyReused => Entry::new(
                422,
                "idempotency-key-reused",
                "Idempotency-Key reused",
                "the key was first sent with another request (method, path or body), whose \
                 answer this one does not get",
            ),
            Kind::RequestInProgress => Entry::new(
                409,
                "request-in-progress",
                "Request in progress",
                "the key's first request is still being answered; retry after `Retry-After` \
                 (with `Location` when the click's order exists: its payment is being confirmed)",
            )
            .carrying(Carries::RetryAfter)
            .locating(
                "`/orders/{order_id}`, when the click's order exists already (`payment_pending`: \
                 its payment is being confirmed)",
            ),
            Kind::RateLimited => Entry::new(
                429,
                "rate-limited",
                "Rate limited",
                "a new click past the buyer's limit (`limits.new_keys_per_sec`, \
                 `limits.burst`, per instance); nothing was read or stored for the key; \
                 `Retry-After` says when the click, or a retry, is taken again",
            )
            .carrying(Carries::RetryAfter),
            Kind::SeatUnavailable => Entry::new(
                409,
                "seat-unavailable",
                "Seat unavailable",
                "another live hold or an order has the seat",
            )
            .stored(),
            Kind::HoldLimitReached => Entry::new(
                409,
                "hold-limit-reached",
                "Hold limit reached",
                "the buyer has `holds.max_per_buyer` seats of the event in live holds that no \
                 order has taken and in orders waiting for their payment; nothing was written",
            )
            .stored(),
            Kind::HoldUnavailable => Entry::new(
                409,
                "hold-unavailable",
                "Hold unavailable",
                "a hold is unknown, not the buyer's, expired or in another order",
            )
            .stored(),
            Kind::InvalidOrder => Entry::new(
                422,
                "invalid-order",
                "Invalid order",
                "no holds, a hold twice, or a malformed payment method",
            )
            .stored(),
            Kind::PaymentDeclined => Entry::new(
                402,
                "payment-declined",
                "Payment declined",
                "Payrail declined the card; the holds stay the buyer's for another click \
                 with a new key",
            )
            .carrying(Carries::Order)
            .stored(),
            Kind::PaymentFailed => Entry::new(
                402,
                "payment-failed",
                "Payment failed",
                "Payrail never decided, so the charge was canceled there; the holds are the \
                 buyer's again, for another click with a new key",
            )
            .carrying(Carries::Order)
            .stored(),
            Kind::WebhookSignatureInvalid => Entry::new(
                400,
                "webhook-signature-invalid",
                "Webhook signature invalid",
                "a missing, stale or wrong signature, a header longer than 1 KiB, with more \
                 than 4 `v1` or a `v1` that is not 64 hex digits, or a tampered body; nothing \
                 is written",
            ),
            Kind::PaymentTimeout => Entry::new(
                504,
                "payment-timeout",
                "Payment timeout",
                "Payrail did not answer in time; not stored, the order is settled later",
            ),
            Kind::PaymentUnavailable => Entry::new(
                503,
                "payment-unavailable",
                "Payment unavailable",
                "Payrail is failing or its breaker is open; not stored",
            )
            .carrying(Carries::RetryAfter),
            Kind::ServiceUnavailable => Entry::new(
                503,
                "service-unavailable",
                "Service unavailable",
                "the database is out of reach, or the identity provider's keys were never \
                 fetched; not stored",
            )
            .carrying(Carries::RetryAfter),
            Kind::Internal => Entry::new(
                500,
                "internal",
                "Internal error",
                "an unexpected error, logged and not told; not stored",
            ),
        }
    }
}

/// The problems each operation of the API answers besides its success,
/// declared once: `http::routes` registers each operation with its list,
/// and the document's error responses (statuses, what each means, the
/// headers) are made from the list and the catalogue.
pub mod answers {
    use super::Kind;

    /// `/healthz`, `/metrics`, `/openapi.json`: nothing can fail them.
    pub const NONE: &[Kind] = &[];
    /// `/readyz`.
    pub const READINESS: &[Kind] = &[Kind::ServiceUnavailable, Kind::Internal];
    /// One thing a buyer reads or deletes: the seat map, a hold, an order.
    pub const BUYERS_OWN: &[Kind] = &[
        Kind::Unauthorized,
        Kind::NotFound,
        Kind::ServiceUnavailable,
        Kind::Internal,
    ];
    /// `GET /orders`: a page of the buyer's orders.
    pub const LIST_ORDERS: &[Kind] = &[
        Kind::Unauthorized,
        Kind::InvalidRequest,
        Kind::ServiceUnavailable,
        Kind::Internal,
    ];
    /// `POST /holds`.
    pub const HOLD_SEAT: &[Kind] = &[
        // Refused before the key is touched.
        Kind::Unauthorized,
        Kind::KeyInvalid,
        Kind::InvalidRequest,
        Kind::PayloadTooLarge,
        Kind::RequestTimeout,
        // The intent's answers.
        Kind::NotFound,
        Kind::SeatUnavailable,
        Kind::HoldLimitReached,
        // The key's.
        Kind::RequestInProgress,
        Kind::KeyReused,
        Kind::RateLimited,
        // No answer yet.
        Kind::ServiceUnavailable,
        Kind::Internal,
    ];
    /// `POST /orders`.
    pub const PLACE_ORDER: &[Kind] = &[
        // Refused before the key is touched.
        Kind::Unauthorized,
        Kind::KeyMissing,
        Kind::KeyInvalid,
        Kind::InvalidRequest,
        Kind::PayloadTooLarge,
        Kind::RequestTimeout,
        // The intent's answers.
        Kind::PaymentDeclined,
        Kind::PaymentFailed,
        Kind::HoldUnavailable,
        Kind::InvalidOrder,
        // The key's.
        Kind::RequestInProgress,
        Kind::KeyReused,
        Kind::RateLimited,
        // No answer yet.
        Kind::PaymentTimeout,
        Kind::PaymentUnavailable,
        Kind::ServiceUnavailable,
        Kind::Internal,
    ];
    /// `POST /payrail/events`: no token, the signature instead; 404 while
    /// events are off.
    pub const PAYRAIL_EVENT: &[Kind] = &[
        Kind::NotFound,
        Kind::WebhookSignatureInvalid,
        Kind::InvalidRequest,
        Kind::RequestTimeout,
        Kind::PayloadTooLarge,
        Kind::RequestInProgress,
        Kind::ServiceUnavailable,
        Kind::Internal,
    ];
}

impl Problem {
    /// The problem type this is an instance of.
    pub fn kind(&self) -> Kind {
        match self {
            Problem::Unauthorized(_) => Kind::Unauthorized,
            Problem::NotFound(_) => Kind::NotFound,
            Problem::MethodNotAllowed => Kind::MethodNotAllowed,
            Problem::KeyMissing => Kind::KeyMissing,
            Problem::KeyInvalid(_) => Kind::KeyInvalid,
            Problem::InvalidRequest(_) => Kind::InvalidRequest,
            Problem::PayloadTooLarge(_) => Kind::PayloadTooLarge,
            Problem::RequestTimeout(_) => Kind::RequestTimeout,
            Problem::KeyReused => Kind::KeyReused,
            Problem::RequestInProgress { .. } => Kind::RequestInProgress,
            Problem::RateLimited { .. } => Kind::RateLimited,
            Problem::SeatUnavailable => Kind::SeatUnavailable,
            Problem::HoldLimitReached => Kind::HoldLimitReached,
            Problem::HoldUnavailable => Kind::HoldUnavailable,
            Problem::InvalidOrder(_) => Kind::InvalidOrder,
            Problem::PaymentDeclined { .. } => Kind::PaymentDeclined,
            Problem::PaymentFailed { .. } => Kind::PaymentFailed,
            Problem::WebhookSignatureInvalid(_) => Kind::WebhookSignatureInvalid,
            Problem::PaymentTimeout => Kind::PaymentTimeout,
            Problem::PaymentUnavailable { .. } => Kind::PaymentUnavailable,
            Problem::ServiceUnavailable(_) | Problem::NotReady | Problem::KeysUnavailable => {
                Kind::ServiceUnavailable
            }
            Problem::Internal(_) => Kind::Internal,
        }
    }

    pub fn status(&self) -> u16 {
        self.kind().entry().status
    }

    /// The answer as bytes: what is sent, and what is stored for a replay.
    pub fn to_response(&self) -> StoredResponse {
        let Entry {
            status,
            slug,
            title,
            ..
        } = self.kind().entry();
        let body = ProblemDetails {
            kind: format!("{TYPE_BASE}{slug}"),
            title,
            status,
            detail: self.to_string(),
            order_id: match self {
                Problem::PaymentDeclined { order_id, .. } | Problem::PaymentFailed { order_id } => {
                    Some(*order_id)
                }
                _ => None,
            },
            decline_code: match self {
                Problem::PaymentDeclined { decline_code, .. } => *decline_code,
                _ => None,
            },
        };
        // Serializing plain strings and numbers cannot fail.
        StoredResponse::new(
            status,
            CONTENT_TYPE,
            serde_json::to_vec(&body).unwrap_or_default(),
        )
    }

    /// True for a refusal that answers the intent (a 4xx): stored under its
    /// key and replayed. A 5xx is not an answer and is never stored.
    pub fn is_answer(&self) -> bool {
        (400..500).contains(&self.status())
    }

    /// How long to wait, for a problem whose answer carries `Retry-After`.
    pub fn retry_after(&self) -> Duration {
        match self {
            Problem::PaymentUnavailable { retry_after } | Problem::RateLimited { retry_after } => {
                *retry_after
            }
            // The key set is fetched again every 10 s while it is missing.
            Problem::KeysUnavailable => Duration::from_secs(5),
            _ => Duration::from_secs(1),
        }
    }
}

impl From<TokenError> for Problem {
    fn from(error: TokenError) -> Self {
        match error {
            TokenError::NoKeys => Problem::KeysUnavailable,
            _ => Problem::Unauthorized("the bearer token is invalid or expired"),
        }
    }
}

impl From<DbError> for Problem {
    fn from(error: DbError) -> Self {
        if error.is_unavailable() {
            Problem::ServiceUnavailable(error)
        } else {
            Problem::Internal(error.into())
        }
    }
}

impl From<tokio_postgres::Error> for Problem {
    fn from(error: tokio_postgres::Error) -> Self {
        DbError::from(error).into()
    }
}

impl From<idempotency::Error> for Problem {
    fn from(error: idempotency::Error) -> Self {
        DbError::from(error).into()
    }
}

impl From<RunError<Problem>> for Problem {
    fn from(error: RunError<Problem>) -> Self {
        match error {
            RunError::Store(error) => error.into(),
            RunError::Work(problem) => problem,
        }
    }
}

impl From<deadpool_postgres::PoolError> for Problem {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        DbError::from(error).into()
    }
}

impl From<PaymentError> for Problem {
    fn from(error: PaymentError) -> Self {
        match error {
            PaymentError::Timeout => Problem::PaymentTimeout,
            PaymentError::Unavailable { retry_after } => {
                Problem::PaymentUnavailable { retry_after }
            }
        }
    }
}

/// The work of a keyed request, as the engine stores it: a refusal (a 4xx)
/// is the intent's answer, stored like any other; anything else is a
/// failure that is never stored.
pub fn answer_or_fail<E: Into<Problem>>(done: Result<Done, E>) -> Result<Done, Problem> {
    match done {
        Ok(done) => Ok(done),
        Err(error) => {
            let problem: Problem = error.into();
            if problem.is_answer() {
                Ok(Done::Answer(problem.to_response()))
            } else {
                Err(problem)
            }
        }
    }
}

/// What a stored answer says of itself when it is a problem: its type's
/// slug (one of the catalogue's) and the order it names, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Told {
    pub slug: &'static str,
    pub order_id: Option<Uuid>,
}

/// The problem a stored answer is, read back from its body: a replay says
/// what the first answer said. `None` for an answer that is no problem of
/// this service's.
pub fn told(response: &StoredResponse) -> Option<Told> {
    #[derive(serde::Deserialize)]
    struct Members {
        #[serde(rename = "type")]
        kind: String,
        order_id: Option<Uuid>,
    }
    if response.content_type != CONTENT_TYPE {
        return None;
    }
    let members: Members = serde_json::from_slice(&response.body).ok()?;
    let slug = members.kind.strip_prefix(TYPE_BASE)?;
    let kind = Kind::ALL
        .into_iter()
        .find(|kind| kind.entry().slug == slug)?;
    Some(Told {
        slug: kind.entry().slug,
        order_id: members.order_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_body_has_the_rfc_9457_members() {
        let response = Problem::HoldUnavailable.to_response();
        let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
        assert_eq!(response.status, 409);
        assert_eq!(response.content_type, "application/problem+json");
        assert_eq!(
            body["type"],
            "https://stagedoor.example/problems/hold-unavailable"
        );
        assert_eq!(body["status"], 409);
        assert!(body["title"].is_string() && body["detail"].is_string());
    }

    #[test]
    fn the_documented_problem_schema_has_the_members_that_are_sent() {
        use utoipa::openapi::{schema::Schema, RefOr};
        use utoipa::PartialSchema;
        let RefOr::T(Schema::Object(schema)) = ProblemDetails::schema() else {
            panic!("the problem schema is an object");
        };
        let mut documented: Vec<&str> = schema.properties.keys().map(String::as_str).collect();
        documented.sort_unstable();
        let declined = Problem::PaymentDeclined {
            order_id: Uuid::nil(),
            decline_code: Some("card_declined"),
        };
        let body: serde_json::Value = serde_json::from_slice(&declined.to_response().body).unwrap();
        let mut sent: Vec<&str> = body
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        sent.sort_unstable();
        assert_eq!(documented, sent);
        let required: Vec<&str> = schema.required.iter().map(String::as_str).collect();
        assert!(!required.contains(&"order_id"), "{required:?}");
        assert!(!required.contains(&"decline_code"), "{required:?}");
    }

    #[test]
    fn a_stored_problem_tells_its_slug_and_order() {
        let order_id = Uuid::new_v4();
        for problem in [
            Problem::PaymentDeclined {
                order_id,
                decline_code: Some("other"),
            },
            Problem::HoldUnavailable,
            Problem::KeyReused,
        ] {
            let told = told(&problem.to_response()).unwrap();
            assert_eq!(told.slug, problem.kind().entry().slug);
            let named = matches!(problem, Problem::PaymentDeclined { .. }).then_some(order_id);
            assert_eq!(told.order_id, named);
        }
        let order = StoredResponse::new(201, "application/json", b"{}".to_vec());
        assert_eq!(told(&order), None);
        let slugs: std::collections::HashSet<_> =
            Kind::ALL.iter().map(|kind| kind.entry().slug).collect();
        assert_eq!(slugs.len(), Kind::ALL.len(), "one slug per type");
    }

    #[test]
    fn an_internal_error_says_nothing_of_its_cause() {
        let problem = Problem::Internal(anyhow::anyhow!("relation \"orders\" does not exist"));
        let body = String::from_utf8(problem.to_response().body).unwrap();
        assert!(!body.contains("orders"), "{body}");
    }
}
