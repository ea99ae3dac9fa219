//! `GET /openapi.json`: the OpenAPI document of this API. It is what the
//! registration of the API's operations collects (utoipa-actix-web reads
//! each handler's `#[utoipa::path]` as `routes()` registers it), so a route
//! cannot be served without being documented, nor documented without being
//! served. Each operation's error responses are made here from the
//! problems it declares (`problem::answers`) and the catalogue, rather
//! than written out per handler.

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::http::header::ContentType;
use actix_web::web::{self, Bytes};
use actix_web::{get, App, HttpResponse};
use idempotency::actix::{PREFERENCE_APPLIED, REPLAYED};
use utoipa::openapi::header::Header;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{
    HttpMethod, Operation, OperationBuilder, ParameterBuilder, ParameterIn, PathItem,
};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::Required;
use utoipa::openapi::{Content, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};
use utoipa_actix_web::service_config::ServiceConfig;
use utoipa_actix_web::AppExt;

use crate::checkout::orders::outbox::{OrderEvent, SIGNATURE_HEADER};
use crate::problem::{Carries, Entry, Kind, ProblemDetails, CONTENT_TYPE};

/// The name of the bearer-token scheme the handlers' `security(...)` name.
const BEARER: &str = "bearer";

/// What the document says besides its operations.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Stagedoor checkout",
        description = "Seat holds and idempotent orders: one click is one order and at most \
            one charge. Every error is RFC 9457 Problem Details (`application/problem+json`) \
            with `type` = `https://stagedoor.example/problems/<slug>`; a wrong method on a \
            known path is 405 `method-not-allowed`, an unknown path 404 `not-found`.",
        contact(name = "Stagedoor checkout", url = "https://stagedoor.example/")
    ),
    // Relative: the API is at the root of wherever this document was fetched
    // from (a local run, a container, behind a proxy that keeps the paths).
    servers((url = "/", description = "The instance that serves this document")),
    components(schemas(ProblemDetails, OrderEvent)),
    modifiers(&BearerAuth, &OrderOutcomes),
    tags(
        (name = "seats", description = "Events and their seat maps"),
        (name = "holds", description = "A buyer's claim on a seat until it expires"),
        (name = "orders", description = "Paying for holds, guarded by an Idempotency-Key"),
        (name = "payrail", description = "Payrail's signed events; no token"),
        (name = "operations", description = "Health, readiness, metrics and this document; no token"),
    )
)]
struct ApiDoc;

/// Declares the bearer JWT that the handlers require.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .bearer_format("JWT")
            .description(Some(
                "A JWT from the configured identity provider (RS256, PS256, ES256 or EdDSA, \
                 with a key of its JWKS chosen by `kid`; `iss` and `aud` checked when \
                 configured), or HS256 with the service's own secret (local runs, tests). \
                 `exp` is required; `sub` is the buyer's id: any printable text of 1-255 \
                 bytes, such as `auth0|64f0c2...`.",
            ))
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(BEARER, SecurityScheme::Http(scheme));
    }
}

/// Declares the order events this service sends the shop (OpenAPI 3.1
/// `webhooks`): what `jobs::outcomes` `POST`s to `outcomes.webhook_url`.
struct OrderOutcomes;

impl Modify for OrderOutcomes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let signature = ParameterBuilder::new()
            .name(SIGNATURE_HEADER)
            .parameter_in(ParameterIn::Header)
            .required(Required::True)
            .schema(Some(String::schema()))
            .example(Some(serde_json::json!(
                "t=1764846000,v1=6c0f8e5b2d4a1c9e7f3b5d8a0c2e4f6a8b1d3f5e7a9c0b2d4f6e8a1c3e5f7b9d"
            )))
            .description(Some(
                "`t=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<raw body>\">` under \
                 `outcomes.webhook_secret`: check it over the bytes received, in constant time, \
                 and refuse a `t` far from now",
            ))
            .build();
        let body = RequestBodyBuilder::new()
            .required(Some(Required::True))
            .content(
                "application/json",
                Content::new(Some(Ref::from_schema_name(OrderEvent::name()))),
            )
            .build();
        let operation = OperationBuilder::new()
            .operation_id(Some("order_outcome"))
            .tag("orders")
            .summary(Some("How an order ended, sent to the shop"))
            .description(Some(
                "Sent to `outcomes.webhook_url` for every order that becomes `paid`, `declined` \
                 or `failed`, whatever settled it (the click, a takeover, Payrail's event, \
                 reconciliation, the give-up). At least once: retried until a 2xx, a second \
                 later and then doubling up to `outcomes.max_backoff_secs`, for \
                 `outcomes.retry_for_secs`; every delivery has the same `id` and body bytes, so \
                 drop an `id` already handled.",
            ))
            .parameter(signature)
            .request_body(Some(body))
            .security(SecurityRequirement::default())
            .response(
                "200",
                ResponseBuilder::new().description("Delivered (any 2xx): never sent again"),
            )
            .response(
                "default",
                ResponseBuilder::new().description(
                    "Anything else, or no answer within `outcomes.timeout_ms`: sent again later",
                ),
            )
            .build();
        openapi
            .webhooks
            .get_or_insert_with(Default::default)
            .paths
            .insert(
                "orderOutcome".to_owned(),
                PathItem::new(HttpMethod::Post, operation),
            );
    }
}

/// The document as served, made once per app.
pub struct Document(Bytes);

impl Document {
    /// The document of the operations `register` registers: the app it
    /// registers them on is only read for what it collected, never served.
    /// `key_life` (`idempotency.ttl_secs`) is published on every
    /// `Idempotency-Key`, as the IETF draft asks of a server.
    pub fn of(register: impl FnOnce(&mut ServiceConfig), key_life: Duration) -> Self {
        let (_, operations) = App::new()
            .into_utoipa_app()
            .configure(register)
            .split_for_parts();
        let mut document = ApiDoc::openapi();
        document.merge(operations);
        publish_key_life(&mut document, key_life);
        // Plain maps, strings and numbers: serializing them cannot fail.
        Self(document.to_json().unwrap_or_default().into())
    }
}

/// Adds the key's lifetime, and what happens after it, to the description
/// of every `Idempotency-Key` parameter.
fn publish_key_life(document: &mut utoipa::openapi::OpenApi, key_life: Duration) {
    let secs = key_life.as_secs();
    let life = format!(
        " A key lives {secs} s (`idempotency.ttl_secs`) from the first request that sent it: \
         within that time a retry gets the stored answer. After it the key is forgotten, and \
         the same key is a new request, done again; except that a key whose order is still \
         `payment_pending` is kept, answering as before, until the order settles."
    );
    let operations = document.paths.paths.values_mut().flat_map(|item| {
        [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
    });
    for operation in operations {
        for parameter in operation.parameters.iter_mut().flatten() {
            if let RefOr::T(parameter) = parameter {
                if parameter.parameter_in == ParameterIn::Header
                    && parameter.name == "Idempotency-Key"
                {
                    parameter
                        .description
                        .get_or_insert_with(String::new)
                        .push_str(&life);
                }
            }
        }
    }
}

/// `GET /openapi.json`.
#[utoipa::path(
    tag = "operations",
    summary = "This document",
    description = "The OpenAPI document of this API, generated from the handlers, so it \
        changes with the code. No token: clients and tools read it before they have one.",
    security(),
    responses((status = 200, description = "The OpenAPI document", body = Object))
)]
#[get("/openapi.json")]
pub async fn openapi_json(document: web::Data<Document>) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header(ContentType::json())
        .body(document.0.clone())
}

/// Documents what `operation` answers besides its success: a response for
/// each status of `problems`. An operation that takes an `Idempotency-Key`
/// replays its stored answers (its successes and the intent's refusals),
/// and says so in their headers.
pub fn document_answers(operation: &mut Operation, problems: &[Kind]) {
    let keyed = operation.parameters.iter().flatten().any(|parameter| {
        matches!(parameter, RefOr::T(parameter)
            if parameter.parameter_in == ParameterIn::Header && parameter.name == "Idempotency-Key")
    });
    let responses = &mut operation.responses.responses;
    if keyed {
        let successes = responses
            .iter_mut()
            .filter(|(status, _)| status.starts_with('2'));
        for (_, response) in successes {
            if let RefOr::T(response) = response {
                response.headers.extend(replay_headers());
            }
        }
    }
    let mut by_status: BTreeMap<u16, Vec<Entry>> = BTreeMap::new();
    for kind in problems {
        let entry = kind.entry();
        by_status.entry(entry.status).or_default().push(entry);
    }
    for (status, entries) in by_status {
        let response = problem_response(&entries, keyed);
        responses.insert(status.to_string(), RefOr::T(response));
    }
}

/// The response of the problem types that share a status: which they are
/// and what each means, the problem body, and what they carry.
fn problem_response(entries: &[Entry], keyed: bool) -> Response {
    let description = entries
        .iter()
        .map(|entry| format!("`{}`: {}.", entry.slug, entry.about))
        .collect::<Vec<_>>()
        .join(" ");
    let body = Content::new(Some(Ref::from_schema_name(ProblemDetails::name())));
    let mut response = ResponseBuilder::new()
        .description(description)
        .content(CONTENT_TYPE, body)
        .build();
    for entry in entries {
        match entry.carries {
            Carries::Challenge => {
                let challenge = Header::new(String::schema());
                response
                    .headers
                    .insert("WWW-Authenticate".to_owned(), challenge.into());
            }
            Carries::RetryAfter => {
                let wait = described::<u32>("Seconds to wait before trying again");
                response
                    .headers
                    .insert("Retry-After".to_owned(), wait.into());
            }
            Carries::Order => {
                let order = LinkBuilder::new()
                    .operation_id("show_order")
                    .parameter("order_id", "$response.body#/order_id")
                    .build();
                response.links.insert("ShowOrder".to_owned(), order.into());
            }
            Carries::Nothing => {}
        }
        if let Some(what) = entry.location {
            response
                .headers
                .insert("Location".to_owned(), described::<String>(what).into());
        }
    }
    if keyed && entries.iter().any(|entry| entry.stored) {
        response.headers.extend(replay_headers());
    }
    response
}

/// The headers of a keyed operation's stored answer.
fn replay_headers() -> impl Iterator<Item = (String, RefOr<Header>)> {
    [
        (REPLAYED, "`true` on a replay"),
        (
            PREFERENCE_APPLIED,
            "`wait=N` when the request waited for this answer",
        ),
    ]
    .into_iter()
    .map(|(name, description)| (name.to_owned(), described::<String>(description).into()))
}

fn described<T: PartialSchema>(description: &str) -> Header {
    let mut header = Header::new(T::schema());
    header.description = Some(description.to_owned());
    header
}
