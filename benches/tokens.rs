//! `cargo bench --bench tokens`: what checking one bearer token costs the
//! service per request, in µs, for each kind it accepts: HS256 with the
//! shared secret, RS256 and ES256 with a key of an identity provider's set
//! (fetched once from a JWKS served here, as at start). Through the same
//! `Verifier::verify` the `Buyer` extractor calls, on one thread.

use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use secrecy::SecretString;
use serde_json::json;
use stagedoor_checkout::auth::{KeySource, Provider, Verifier};
use stagedoor_checkout::config::AuthSettings;

const JWKS: &str = include_str!("../src/auth/testdata/jwks.json");
const RSA_PRIVATE: &[u8] = include_bytes!("../src/auth/testdata/rsa.der");
const EC_PRIVATE: &[u8] = include_bytes!("../src/auth/testdata/ec.der");
const SECRET: &str = "a-secret-for-the-token-bench-only";
const CHECKS: u32 = 20_000;

fn token(alg: Algorithm, kid: Option<&str>, key: &EncodingKey) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_secs()
        + 3_600;
    let claims = json!({
        "sub": "auth0|64f0c2a1b2c3d4e5f6a7b8c9", "exp": exp,
        "iss": "https://login.bench", "aud": "https://checkout.bench",
    });
    jsonwebtoken::encode(&header, &claims, key).expect("a signed token")
}

#[actix_web::main]
async fn main() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let jwks_url = format!("http://{}/jwks", listener.local_addr().expect("an address"));
    let server = HttpServer::new(|| {
        App::new().route(
            "/jwks",
            web::get().to(|| async {
                HttpResponse::Ok()
                    .content_type("application/json")
                    .body(JWKS)
            }),
        )
    })
    .workers(1)
    .listen(listener)
    .expect("listen")
    .run();
    let handle = server.handle();
    tokio::spawn(server);

    let settings = AuthSettings {
        jwt_secret: SecretString::from(SECRET.to_owned()),
        jwks_url: jwks_url.clone(),
        oidc_issuer: String::new(),
        issuer: "https://login.bench".into(),
        audience: "https://checkout.bench".into(),
        leeway_secs: 30,
    };
    let provider = Provider::new(KeySource::Jwks(jwks_url), &settings).expect("a client");
    provider.refresh().await.expect("the key set");
    let verifier = Verifier::new(&settings)
        .expect("the secret")
        .with_provider(provider);

    let secret = EncodingKey::from_secret(SECRET.as_bytes()).expect("a secret");
    let tokens = [
        ("HS256", token(Algorithm::HS256, None, &secret)),
        (
            "RS256",
            token(
                Algorithm::RS256,
                Some("rsa-1"),
                &EncodingKey::from_rsa_der(RSA_PRIVATE),
            ),
        ),
        (
            "ES256",
            token(
                Algorithm::ES256,
                Some("ec-1"),
                &EncodingKey::from_ec_der(EC_PRIVATE),
            ),
        ),
    ];
    println!("token check, per request ({CHECKS} checks each, one thread):");
    for (name, token) in &tokens {
        for _ in 0..CHECKS / 10 {
            verifier.verify(token).await.expect("a valid token");
        }
        let started = Instant::now();
        for _ in 0..CHECKS {
            verifier.verify(token).await.expect("a valid token");
        }
        let per_check = started.elapsed() / CHECKS;
        println!("  {name}: {:.1} µs", micros(per_check));
    }
    handle.stop(false).await;
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
