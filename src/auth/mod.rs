//! Buyers and their bearer tokens. A token is either HS256, signed with
//! `auth.jwt_secret` (local runs, tests, the `token` command), or signed by
//! the shop's identity provider with a key of its published set (RS256,
//! PS256, ES256, EdDSA), the key chosen by `kid` and only for the algorithm
//! it is for. `exp` and `sub` are required, `iss` and `aud` checked when
//! configured. Verifying never touches the network: the provider's keys
//! are kept in memory ([`provider`]). Used by the HTTP extractor and the
//! `token` command.

mod provider;
mod secret;

use jsonwebtoken::{Algorithm, Validation};
use serde::{Deserialize, Serialize};

use crate::config::AuthSettings;

pub use provider::{KeySource, Provider, METRICS};
pub use secret::Tokens;

/// A buyer's id: the token's `sub` as the identity provider gives it (an
/// Auth0 `auth0|…`, a base64url string, an e-mail-like name, a UUID), 1–255
/// bytes without control characters. It scopes keys, holds and orders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuyerId(String);

#[derive(Debug, thiserror::Error)]
#[error("a buyer id is 1-255 bytes of printable text (no control characters)")]
pub struct InvalidBuyerId;

impl BuyerId {
    pub const MAX_LEN: usize = 255;

    pub fn parse(raw: &str) -> Result<Self, InvalidBuyerId> {
        let valid = (1..=Self::MAX_LEN).contains(&raw.len()) && !raw.chars().any(char::is_control);
        if valid {
            Ok(Self(raw.to_owned()))
        } else {
            Err(InvalidBuyerId)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iat: Option<u64>,
}

/// Why a token was not taken. All are 401 `unauthorized` but
/// [`TokenError::NoKeys`], which is the service's fault, not the token's.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("the bearer token is too long")]
    TooLong,
    #[error("the bearer token is invalid or expired")]
    Invalid(#[from] jsonwebtoken::errors::Error),
    #[error("the token's subject is not a valid buyer id")]
    Subject(#[from] InvalidBuyerId),
    #[error("the token secret is unusable")]
    Secret,
    #[error("tokens signed with {0:?} are not accepted here")]
    Algorithm(Algorithm),
    #[error("the token's key is not in the identity provider's key set")]
    UnknownKey,
    /// 503: the identity provider's keys were never fetched.
    #[error("the identity provider's keys are not known yet")]
    NoKeys,
}

/// Tokens larger than this are refused before any parsing.
const MAX_TOKEN_LEN: usize = 8192;

fn check_length(token: &str) -> Result<(), TokenError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::TooLong);
    }
    Ok(())
}

/// What every token must pass: these algorithms only, `exp` and `sub`
/// present, `nbf` honoured, the issuer and audience when given.
fn validation(
    algorithms: &[Algorithm],
    leeway_secs: u64,
    issuer: Option<&str>,
    audience: Option<&str>,
) -> Validation {
    let mut validation = Validation::new(algorithms[0]);
    validation.algorithms = algorithms.to_vec();
    validation.leeway = leeway_secs;
    validation.validate_nbf = true;
    let mut required = vec!["exp", "sub"];
    if let Some(issuer) = issuer {
        validation.set_issuer(&[issuer]);
        required.push("iss");
    }
    match audience {
        Some(audience) => {
            validation.set_audience(&[audience]);
            required.push("aud");
        }
        None => validation.validate_aud = false,
    }
    validation.set_required_spec_claims(&required);
    validation
}

/// Verifies a request's token with whatever is configured: the HS256
/// secret, the identity provider, or both.
#[derive(Clone)]
pub struct Verifier {
    secret: Option<Tokens>,
    provider: Option<Provider>,
}

impl Verifier {
    /// The secret's half only; the provider (which needs a runtime and a
    /// first fetch) is added by [`Verifier::with_provider`].
    pub fn new(settings: &AuthSettings) -> Result<Self, TokenError> {
        let secret = if settings.jwt_secret_is_set() {
            Some(Tokens::with_leeway(
                &settings.jwt_secret,
                settings.leeway_secs,
            )?)
        } else {
            None
        };
        Ok(Self {
            secret,
            provider: None,
        })
    }

    pub fn with_provider(mut self, provider: Provider) -> Self {
        self.provider = Some(provider);
        self
    }

    /// False while a configured identity provider's keys were never fetched.
    pub fn has_keys(&self) -> bool {
        self.provider.as_ref().is_none_or(Provider::has_keys)
    }

    pub async fn verify(&self, token: &str) -> Result<BuyerId, TokenError> {
        check_length(token)?;
        let header = jsonwebtoken::decode_header(token)?;
        match (header.alg, &self.secret, &self.provider) {
            (Algorithm::HS256, Some(secret), _) => secret.verify(token),
            (
                Algorithm::RS256 | Algorithm::PS256 | Algorithm::ES256 | Algorithm::EdDSA,
                _,
                Some(provider),
            ) => {
                let sub = provider.verify(token, &header).await?;
                Ok(BuyerId::parse(&sub)?)
            }
            (alg, _, _) => Err(TokenError::Algorithm(alg)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use jsonwebtoken::{EncodingKey, Header};
    use secrecy::SecretString;

    const SECRET: &str = "a-secret-for-unit-tests-only";
    const JWKS: &str = include_str!("testdata/jwks.json");
    const RSA_PRIVATE: &[u8] = include_bytes!("testdata/rsa.der");
    const EC_PRIVATE: &[u8] = include_bytes!("testdata/ec.der");
    const RSA_PUBLIC_PEM: &[u8] = include_bytes!("testdata/public.pem");

    fn settings(secret: &str) -> AuthSettings {
        AuthSettings {
            jwt_secret: SecretString::from(secret.to_owned()),
            jwks_url: "http://jwks.test".into(),
            oidc_issuer: String::new(),
            issuer: "https://login.test".into(),
            audience: "https://checkout.test".into(),
            leeway_secs: 0,
        }
    }

    fn verifier(secret: &str) -> Verifier {
        let settings = settings(secret);
        Verifier::new(&settings)
            .unwrap()
            .with_provider(Provider::holding(JWKS, &settings))
    }

    fn claims() -> serde_json::Value {
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600;
        serde_json::json!({
            "sub": "auth0|64f0c2", "exp": exp,
            "iss": "https://login.test", "aud": "https://checkout.test",
        })
    }

    fn token(alg: Algorithm, kid: &str, key: &EncodingKey) -> String {
        let mut header = Header::new(alg);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, &claims(), key).unwrap()
    }

    fn rsa() -> EncodingKey {
        EncodingKey::from_rsa_der(RSA_PRIVATE)
    }

    fn ec() -> EncodingKey {
        EncodingKey::from_ec_der(EC_PRIVATE)
    }

    #[tokio::test]
    async fn the_providers_keys_verify_their_own_algorithms() {
        let verifier = verifier(SECRET);
        for token in [
            token(Algorithm::RS256, "rsa-1", &rsa()),
            token(Algorithm::PS256, "rsa-1", &rsa()),
            token(Algorithm::ES256, "ec-1", &ec()),
        ] {
            let buyer = verifier.verify(&token).await.unwrap();
            assert_eq!(buyer.as_str(), "auth0|64f0c2");
        }
    }

    #[tokio::test]
    async fn no_token_gets_in_by_confusing_the_algorithm() {
        let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let public_as_secret = EncodingKey::from_secret(RSA_PUBLIC_PEM).unwrap();
        let unsigned = format!(
            "{}.{}.",
            b64(br#"{"alg":"none","kid":"rsa-1"}"#),
            b64(claims().to_string().as_bytes())
        );
        let cases = [
            (
                "HS256 over the RSA public key, with the RSA kid",
                token(Algorithm::HS256, "rsa-1", &public_as_secret),
            ),
            ("alg none", unsigned),
            (
                "RS256 naming the EC key",
                token(Algorithm::RS256, "ec-1", &rsa()),
            ),
            (
                "ES256 naming the RSA key",
                token(Algorithm::ES256, "rsa-1", &ec()),
            ),
            (
                "RS384, which no key is for",
                token(Algorithm::RS384, "rsa-1", &rsa()),
            ),
            ("an unknown kid", token(Algorithm::RS256, "rsa-2", &rsa())),
        ];
        // With the secret configured, and without it (provider only).
        for secret in [SECRET, ""] {
            let verifier = verifier(secret);
            for (why, token) in &cases {
                assert!(verifier.verify(token).await.is_err(), "{why} ({secret:?})");
            }
        }
    }

    #[tokio::test]
    async fn another_issuer_or_audience_is_refused() {
        let verifier = verifier(SECRET);
        for (claim, value) in [("iss", "https://other.test"), ("aud", "https://other.test")] {
            let mut claims = claims();
            claims[claim] = value.into();
            let mut header = Header::new(Algorithm::RS256);
            header.kid = Some("rsa-1".into());
            let token = jsonwebtoken::encode(&header, &claims, &rsa()).unwrap();
            assert!(verifier.verify(&token).await.is_err(), "{claim}");
        }
    }

    #[test]
    fn buyer_ids_are_the_providers_subjects_up_to_255_bytes() {
        for ok in [
            "a",
            "buyer-1",
            "auth0|64f0c2a1b2c3d4e5f6a7b8c9",
            "google-oauth2|109876543210987654321",
            "AAAAAAAAAAAAAAAAAAAAAIkzqFVrSaSaFHy782bbtaQ",
            "ana.lima@shop.example",
            "f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
            "Zoë Ünal",
            &"x".repeat(255),
        ] {
            assert!(BuyerId::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a\nb",
            "a\u{0}b",
            "tab\there",
            "del\u{7f}",
            &"x".repeat(256),
        ] {
            assert!(BuyerId::parse(bad).is_err(), "{bad:?}");
        }
    }
}
