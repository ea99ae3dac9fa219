//! What the service accepts from the servers it calls: Payrail and the
//! identity provider are never followed through a redirect, a discovery
//! document must name the configured issuer, and made-up `kid`s cannot keep
//! the provider's new key out. Each server here is a real one on a socket
//! of its own that counts the requests it gets.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use crate::helpers::{new_key, spawn_app_with, unix_now, Seen, TestApp};

const JWKS: &str = include_str!("../../src/auth/testdata/jwks.json");
const RSA_PRIVATE: &[u8] = include_bytes!("../../src/auth/testdata/rsa.der");
/// The `iss` of tokens where the service is not told to check it.
const ISSUER: &str = "https://login.shop.test";

type Answer = dyn Fn(&HttpRequest) -> HttpResponse + Send + Sync;

/// An HTTP server answering every request with `answer`, counting them.
struct Canned {
    url: String,
    hits: Arc<AtomicUsize>,
    handle: actix_web::dev::ServerHandle,
}

impl Canned {
    fn start(answer: impl Fn(&HttpRequest) -> HttpResponse + Send + Sync + 'static) -> Self {
        let answer: Arc<Answer> = Arc::new(answer);
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = HttpServer::new(move || {
            let (answer, counted) = (answer.clone(), counted.clone());
            App::new().default_service(web::to(move |req: HttpRequest| {
                counted.fetch_add(1, Ordering::SeqCst);
                let response = answer(&req);
                async move { response }
            }))
        })
        .workers(1)
        .listen(listener)
        .unwrap()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self { url, hits, handle }
    }

    /// A server that sends every request on to `target`, same path, with
    /// `307` (method and body kept: the strongest invitation to follow).
    fn redirecting_to(target: &str) -> Self {
        let target = target.to_owned();
        Self::start(move |req| {
            HttpResponse::TemporaryRedirect()
                .insert_header(("Location", format!("{target}{}", req.path())))
                .finish()
        })
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    async fn stop(self) {
        self.handle.stop(false).await;
    }
}

/// The test key set with only the keys named.
fn jwks_of(kids: &[&str]) -> String {
    let all: Value = serde_json::from_str(JWKS).unwrap();
    let keys: Vec<&Value> = all["keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|key| kids.contains(&key["kid"].as_str().unwrap()))
        .collect();
    json!({ "keys": keys }).to_string()
}

/// A buyer's RS256 token from `issuer`, signed by the test key, its header
/// naming `kid`.
fn rs256_token(kid: &str, issuer: &str) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(kid.to_owned());
    let claims = json!({ "sub": "auth0|outbound", "iss": issuer, "exp": unix_now() + 600 });
    jsonwebtoken::encode(&header, &claims, &EncodingKey::from_rsa_der(RSA_PRIVATE)).unwrap()
}

async fn seats_with(app: &TestApp, token: &str) -> Seen {
    let response = app
        .http
        .get(app.url("/events/outbound/seats"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    Seen::of(response).await
}

async fn readyz(app: &TestApp) -> u16 {
    let response = app.http.get(app.url("/readyz")).send().await.unwrap();
    response.status().as_u16()
}

#[tokio::test]
async fn a_redirect_from_payrail_is_not_followed_and_the_click_is_not_paid() {
    // Payrail's answer to a charge, should anything reach it.
    let target = Canned::start(|_| HttpResponse::Created().json(json!({ "id": "ch_elsewhere" })));
    let redirector = Canned::redirecting_to(&target.url);
    let base_url = redirector.url.clone();
    let app = spawn_app_with(|settings| settings.payrail.base_url = base_url).await;
    let seat = app.seed("outbound", 1, 2_500).await[0];
    let hold = app.hold("alice", seat).await;

    let order = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_visa")
            .await,
    )
    .await;
    assert!(redirector.hits() >= 1, "Payrail was asked");
    assert_eq!(target.hits(), 0, "nothing reached the redirect's target");
    assert_ne!(order.status, 201, "{}", order.text());
    assert_ne!(order.json()["status"], "paid", "{}", order.text());
    redirector.stop().await;
    target.stop().await;
}

#[tokio::test]
async fn a_redirect_from_the_jwks_url_is_not_followed_and_no_keys_are_taken() {
    let jwks = jwks_of(&["rsa-1", "ec-1"]);
    let target = Canned::start(move |_| HttpResponse::Ok().body(jwks.clone()));
    let redirector = Canned::redirecting_to(&target.url);
    let jwks_url = format!("{}/jwks.json", redirector.url);
    let app = spawn_app_with(|settings| settings.auth.jwks_url = jwks_url).await;
    app.seed("outbound", 1, 2_500).await;

    let seen = seats_with(&app, &rs256_token("rsa-1", ISSUER)).await;
    assert!(redirector.hits() >= 1, "the provider was asked");
    assert_eq!(target.hits(), 0, "nothing reached the redirect's target");
    assert_eq!(
        seen.status,
        503,
        "no keys, so no provider token: {}",
        seen.text()
    );
    assert_eq!(readyz(&app).await, 503);
    redirector.stop().await;
    target.stop().await;
}

#[tokio::test]
async fn a_discovery_document_for_another_issuer_lends_none_of_its_keys() {
    // The document names `issuer`; its keys are the test's.
    let provider = |issuer: Arc<Mutex<String>>| {
        let jwks = jwks_of(&["rsa-1"]);
        Canned::start(move |req| match req.path() {
            "/.well-known/openid-configuration" => {
                let issuer = issuer.lock().unwrap().clone();
                let jwks_uri = format!("{issuer}/jwks.json");
                HttpResponse::Ok().json(json!({ "issuer": issuer, "jwks_uri": jwks_uri }))
            }
            _ => HttpResponse::Ok().body(jwks.clone()),
        })
    };
    // The control: a document for the configured issuer gives its keys.
    let issuer = Arc::new(Mutex::new(String::new()));
    let honest = provider(issuer.clone());
    issuer.lock().unwrap().clone_from(&honest.url);
    let token = rs256_token("rsa-1", &honest.url);
    let oidc_issuer = honest.url.clone();
    let app = spawn_app_with(|settings| settings.auth.oidc_issuer = oidc_issuer).await;
    app.seed("outbound", 1, 2_500).await;
    let seen = seats_with(&app, &token).await;
    assert_eq!(seen.status, 200, "{}", seen.text());

    // The same document from a server that is not that issuer.
    let honest_hits = honest.hits();
    let elsewhere = provider(Arc::new(Mutex::new(honest.url.clone())));
    let oidc_issuer = elsewhere.url.clone();
    let app = spawn_app_with(|settings| settings.auth.oidc_issuer = oidc_issuer).await;
    app.seed("outbound", 1, 2_500).await;
    let seen = seats_with(&app, &token).await;
    assert_eq!(seen.status, 503, "{}", seen.text());
    assert_eq!(seen.problem(), "service-unavailable");
    assert_eq!(readyz(&app).await, 503);
    assert_eq!(
        honest.hits(),
        honest_hits,
        "the keys it names were not fetched"
    );
    honest.stop().await;
    elsewhere.stop().await;
}

#[tokio::test]
async fn made_up_kids_sent_first_do_not_keep_the_providers_new_key_out() {
    let published = Arc::new(Mutex::new(jwks_of(&["ec-1"])));
    let jwks = published.clone();
    let provider = Canned::start(move |_| HttpResponse::Ok().body(jwks.lock().unwrap().clone()));
    let jwks_url = format!("{}/jwks.json", provider.url);
    let app = spawn_app_with(|settings| settings.auth.jwks_url = jwks_url).await;
    app.seed("outbound", 1, 2_500).await;

    // The attacker's made-up kid comes first: the set is fetched again.
    let forged = rs256_token("attacker-1", ISSUER);
    assert_eq!(seats_with(&app, &forged).await.status, 401);

    // The provider rotates to its new key; a buyer's token names it.
    *published.lock().unwrap() = jwks_of(&["ec-1", "rsa-1"]);
    let seen = seats_with(&app, &rs256_token("rsa-1", ISSUER)).await;
    assert_eq!(seen.status, 200, "the new kid: {}", seen.text());

    // The same made-up kid again costs no fetch.
    let fetched = provider.hits();
    assert_eq!(seats_with(&app, &forged).await.status, 401);
    assert_eq!(provider.hits(), fetched, "no fetch for a kid known missing");
    provider.stop().await;
}
