//! The thin actix layer: extract, call the domain, map the answer. Handlers
//! hold no business rules and no SQL.

mod auth;
mod body;
mod client;
mod conditional;
pub mod cors;
mod cursor;
mod demo;
mod health;
mod holds;
pub mod metrics;
mod openapi;
mod orders;
pub mod payrail_events;
pub mod problem;
mod seats;
pub mod watch;

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{AppService, HttpServiceFactory, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::{ErrorHandlerResponse, ErrorHandlers};
use actix_web::{web, FromRequest, Handler, HttpResponse, Responder, ResponseError};
use deadpool_postgres::Pool;
use idempotency::Engine;
use utoipa::openapi::path::{Operation, PathItem, Paths};
use utoipa::openapi::{RefOr, Schema};
use utoipa_actix_web::service_config::ServiceConfig;
use utoipa_actix_web::OpenApiFactory;

use crate::auth::Verifier;
use crate::checkout::orders::Orders;
use crate::problem::{answers, Kind, Problem};
use crate::readiness::Readiness;

pub use auth::Buyer;

/// What every handler may use; built once per instance.
pub struct AppState {
    /// The server of `database.url`: the seat side's statements, a keyed
    /// hold's unit among them.
    pub pool: Pool,
    /// Each buyer's statements: on a cluster, to the buyer's worker.
    pub route: idempotency::Route,
    /// `/readyz`'s database check, shared by concurrent callers.
    pub readiness: Readiness,
    pub engine: Engine,
    /// The per-buyer limit on new intents, shared with the engine (which
    /// applies it to keyed requests); unkeyed `POST /holds` asks it directly.
    pub limit: idempotency::Limit,
    pub orders: Orders,
    /// The events' seat maps, kept in memory for a bounded time.
    pub seat_maps: crate::checkout::seat_maps::SeatMaps,
    /// Checks bearer tokens (the HS256 secret and/or the identity provider).
    pub verifier: Verifier,
    /// The longest a `Prefer: wait` request waits (`idempotency.max_wait_secs`).
    pub max_wait_secs: u64,
    pub holds: crate::checkout::holds::HoldPolicy,
    pub max_body_bytes: usize,
    /// How long a body may take to arrive (`http.request_timeout_secs`).
    pub request_timeout: Duration,
    /// Payrail's events; `None` (404) without `payrail.webhook_secret`.
    pub events: Option<payrail_events::PayrailEvents>,
}

/// Every route: the API's operations, then the browser files. Each path
/// answers its own methods, and 405 `method-not-allowed` with `Allow` for
/// the others (actix alone would answer 404). `key_life` is
/// `idempotency.ttl_secs`, which `/openapi.json` publishes; `/metrics` is
/// among them only `with_metrics` (not when it has a listener of its own).
pub fn routes(key_life: Duration, with_metrics: bool) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg| {
        let api = move |cfg: &mut ServiceConfig| api(cfg, with_metrics);
        cfg.app_data(web::Data::new(openapi::Document::of(api, key_life)));
        api(&mut ServiceConfig::new(cfg));
        cfg.service(file("/demo/", demo::page))
            .service(file("/demo", demo::redirect))
            .service(file("/client/checkout.js", client::module))
            .service(file("/client/checkout.d.ts", client::types));
    }
}

/// The API: each operation registered once, with the problems it answers
/// (`crate::problem::answers`). Registering it is also what collects
/// `/openapi.json` (`openapi::Document`).
fn api(cfg: &mut ServiceConfig, with_metrics: bool) {
    if with_metrics {
        cfg.service(Endpoint(metrics::metrics, answers::NONE));
    }
    cfg.service(Endpoint(health::healthz, answers::NONE))
        .service(Endpoint(health::readyz, answers::READINESS))
        .service(Endpoint(openapi::openapi_json, answers::NONE))
        .service(Endpoint(seats::seat_map, answers::BUYERS_OWN))
        .service(Endpoint(holds::create, answers::HOLD_SEAT))
        .service(Endpoint(holds::release, answers::BUYERS_OWN))
        .service(OnePath(
            Endpoint(orders::list, answers::LIST_ORDERS),
            Endpoint(orders::create, answers::PLACE_ORDER),
        ))
        .service(Endpoint(orders::show, answers::BUYERS_OWN))
        .service(Endpoint(payrail_events::receive, answers::PAYRAIL_EVENT));
}

/// An operation of the API: a handler with its method and path (its
/// `#[get]`, `#[post]`...) and its `#[utoipa::path]`, and the problems it
/// answers, which the document lists as its error responses.
struct Endpoint<S>(S, &'static [Kind]);

impl<S: HttpServiceFactory + OpenApiFactory> Endpoint<S> {
    /// Registers the handler alone; the methods it takes, by path.
    fn register_handler(self, config: &mut AppService) -> Vec<(String, Vec<Method>)> {
        let Endpoint(handler, _) = self;
        let paths = handler.paths();
        handler.register(config);
        paths
            .paths
            .into_iter()
            .map(|(path, mut item)| {
                let methods = operations(&mut item).map(|(method, _)| method).collect();
                (path, methods)
            })
            .collect()
    }
}

impl<S: HttpServiceFactory + OpenApiFactory> HttpServiceFactory for Endpoint<S> {
    fn register(self, config: &mut AppService) {
        let methods = self.register_handler(config);
        refuse_other_methods(config, methods);
    }
}

/// Two operations of one path (`GET` and `POST /orders`): both handlers,
/// then one 405 for the methods neither takes. Registered apart, the first
/// one's 405 would answer the second one's requests.
struct OnePath<A, B>(Endpoint<A>, Endpoint<B>);

impl<A, B> HttpServiceFactory for OnePath<A, B>
where
    A: HttpServiceFactory + OpenApiFactory,
    B: HttpServiceFactory + OpenApiFactory,
{
    fn register(self, config: &mut AppService) {
        let OnePath(first, second) = self;
        let mut methods = first.register_handler(config);
        methods.extend(second.register_handler(config));
        refuse_other_methods(config, methods);
    }
}

impl<A: OpenApiFactory, B: OpenApiFactory> OpenApiFactory for OnePath<A, B> {
    fn paths(&self) -> Paths {
        let mut paths = self.0.paths();
        paths.merge(self.1.paths());
        paths
    }

    fn schemas(&self, schemas: &mut Vec<(String, RefOr<Schema>)>) {
        self.0.schemas(schemas);
        self.1.schemas(schemas);
    }
}

/// After the handlers' own resources, so that only the methods they do not
/// take reach these: 405 with `Allow`, one resource per path.
fn refuse_other_methods(config: &mut AppService, methods: Vec<(String, Vec<Method>)>) {
    let mut by_path: BTreeMap<String, Vec<Method>> = BTreeMap::new();
    for (path, taken) in methods {
        by_path.entry(path).or_default().extend(taken);
    }
    for (path, methods) in by_path {
        allowing(web::resource(path), &methods).register(config);
    }
}

impl<S: OpenApiFactory> OpenApiFactory for Endpoint<S> {
    fn paths(&self) -> Paths {
        let Endpoint(handler, problems) = self;
        let mut paths = handler.paths();
        for item in paths.paths.values_mut() {
            for (_, operation) in operations(item) {
                openapi::document_answers(operation, problems);
            }
        }
        paths
    }

    fn schemas(&self, schemas: &mut Vec<(String, RefOr<Schema>)>) {
        self.0.schemas(schemas);
    }
}

/// The operations of a documented path, each with its method.
fn operations(item: &mut PathItem) -> impl Iterator<Item = (Method, &mut Operation)> {
    [
        (Method::GET, &mut item.get),
        (Method::PUT, &mut item.put),
        (Method::POST, &mut item.post),
        (Method::DELETE, &mut item.delete),
        (Method::OPTIONS, &mut item.options),
        (Method::HEAD, &mut item.head),
        (Method::PATCH, &mut item.patch),
        (Method::TRACE, &mut item.trace),
    ]
    .into_iter()
    .filter_map(|(method, operation)| Some((method, operation.as_mut()?)))
}

/// A file a browser or a cache may probe: `GET`, and `HEAD` with the same
/// headers and no body (actix leaves the body out of a `HEAD` answer).
fn file<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: Handler<Args>,
    Args: FromRequest + 'static,
    F::Output: Responder + 'static,
{
    let methods = [Method::GET, Method::HEAD];
    let resource = methods
        .iter()
        .fold(web::resource(path), |resource, method| {
            resource.route(web::method(method.clone()).to(handler.clone()))
        });
    allowing(resource, &methods)
}

/// `resource`, answering 405 `method-not-allowed` with `Allow: methods`
/// for any method it has no route for.
fn allowing(resource: actix_web::Resource, methods: &[Method]) -> actix_web::Resource {
    let names: Vec<&str> = methods.iter().map(Method::as_str).collect();
    let allow = HeaderValue::from_str(&names.join(", ")).unwrap_or(HeaderValue::from_static("GET"));
    resource.default_service(web::to(move || {
        let allow = allow.clone();
        async move {
            let mut response = Problem::MethodNotAllowed.error_response();
            response.headers_mut().insert(header::ALLOW, allow);
            response
        }
    }))
}

/// Refusals raised outside the handlers (a CORS preflight from an origin
/// that is not allowed) come as plain text; this turns them into problems,
/// so that every error a client sees is RFC 9457.
pub fn bare_refusals_as_problems<B: MessageBody + 'static>() -> ErrorHandlers<B> {
    ErrorHandlers::new().handler(StatusCode::BAD_REQUEST, |res: ServiceResponse<B>| {
        let is_problem = res
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes() == crate::problem::CONTENT_TYPE.as_bytes());
        if is_problem {
            return Ok(ErrorHandlerResponse::Response(res.map_into_left_body()));
        }
        let detail = res
            .response()
            .error()
            .map_or_else(|| "the request was refused".to_owned(), ToString::to_string);
        let (req, _) = res.into_parts();
        let problem = Problem::InvalidRequest(detail).error_response();
        Ok(ErrorHandlerResponse::Response(
            ServiceResponse::new(req, problem).map_into_right_body(),
        ))
    })
}

/// The answer for paths that do not exist.
pub async fn not_found() -> Result<HttpResponse, Problem> {
    Err(Problem::NotFound("there is nothing at this path"))
}
