//! `GET /openapi.json`: the OpenAPI document of this API. It is what the
//! registration of the API's operations collects (utoipa-actix-web reads
//! each handler's `#[utoipa::path]` as `routes()` registers it), so a route
//! cannot be served without being documented, nor documented without being
//! served. Each operation's error responses are made here from the
//! problems it declares (`problem::answers`) and the catalogue, rather
//! than written out per handler.

use std::collections::BTreeMap;

use actix_web::http::header::ContentType;
use actix_web::web::{self, Bytes};
use actix_web::{get, App, HttpResponse};
use idempotency::actix::{PREFERENCE_APPLIED, REPLAYED};
use utoipa::openapi::header::Header;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};
use utoipa_actix_web::service_config::ServiceConfig;
use utoipa_actix_web::AppExt;

use super::problem::{Carries, Entry, Kind, ProblemDetails, CONTENT_TYPE};

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
    components(schemas(ProblemDetails)),
    modifiers(&BearerAuth),
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

/// The document as served, made once per app.
pub struct Document(Bytes);

impl Document {
    /// The document of the operations `register` registers: the app it
    /// registers them on is only read for what it collected, never served.
    pub fn of(register: impl FnOnce(&mut ServiceConfig)) -> Self {
        let (_, operations) = App::new()
            .into_utoipa_app()
            .configure(register)
            .split_for_parts();
        let mut document = ApiDoc::openapi();
        document.merge(operations);
        // Plain maps, strings and numbers: serializing them cannot fail.
        Self(document.to_json().unwrap_or_default().into())
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
        by_status
            .entry(entry.status.as_u16())
            .or_default()
            .push(entry);
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
