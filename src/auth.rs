//! Buyers and their bearer tokens: HS256 only, `exp` required, `sub` the
//! buyer's id. Used by the HTTP extractor and the `token` command.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

/// A buyer's id: 1–64 characters of `[A-Za-z0-9_.-]`. It scopes keys, holds
/// and orders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuyerId(String);

#[derive(Debug, thiserror::Error)]
#[error("a buyer id is 1-64 characters of A-Z, a-z, 0-9, '_', '.', '-'")]
pub struct InvalidBuyerId;

impl BuyerId {
    pub fn parse(raw: &str) -> Result<Self, InvalidBuyerId> {
        let valid = (1..=64).contains(&raw.len())
            && raw
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
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
}

/// Signs and verifies bearer tokens with one HS256 secret.
#[derive(Clone)]
pub struct Tokens {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl Tokens {
    /// Tokens larger than this are refused before any parsing.
    const MAX_LEN: usize = 4096;

    pub fn new(secret: &SecretString) -> Result<Self, TokenError> {
        let secret = secret.expose_secret().as_bytes();
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = 0;
        validation.validate_nbf = true;
        Ok(Self {
            encoding: EncodingKey::from_secret(secret).map_err(|_| TokenError::Secret)?,
            decoding: DecodingKey::from_secret(secret).map_err(|_| TokenError::Secret)?,
            validation,
        })
    }

    pub fn sign(&self, buyer: &BuyerId, ttl: Duration) -> Result<String, TokenError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| TokenError::Secret)?
            .as_secs();
        let claims = Claims {
            sub: buyer.0.clone(),
            iat: Some(now),
            exp: now + ttl.as_secs(),
        };
        Ok(jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &self.encoding,
        )?)
    }

    pub fn verify(&self, token: &str) -> Result<BuyerId, TokenError> {
        if token.len() > Self::MAX_LEN {
            return Err(TokenError::TooLong);
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)?;
        Ok(BuyerId::parse(&data.claims.sub)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        Tokens::new(&SecretString::from(
            "a-secret-for-unit-tests-only".to_owned(),
        ))
        .unwrap()
    }

    #[test]
    fn buyer_ids_are_1_to_64_safe_characters() {
        for ok in ["a", "buyer-1", "A.b_c-9", &"x".repeat(64)] {
            assert!(BuyerId::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a b", "é", "a/b", "a'b", &"x".repeat(65)] {
            assert!(BuyerId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_signed_token_verifies_to_its_buyer() {
        let buyer = BuyerId::parse("alice").unwrap();
        let token = tokens().sign(&buyer, Duration::from_secs(60)).unwrap();
        assert_eq!(tokens().verify(&token).unwrap(), buyer);
    }

    #[test]
    fn another_secret_is_refused() {
        let buyer = BuyerId::parse("alice").unwrap();
        let other = Tokens::new(&SecretString::from(
            "another-secret-entirely-0000".to_owned(),
        ))
        .unwrap();
        let token = other.sign(&buyer, Duration::from_secs(60)).unwrap();
        assert!(tokens().verify(&token).is_err());
    }
}
