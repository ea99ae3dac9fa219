//! HS256 tokens with one shared secret (`auth.jwt_secret`): local runs,
//! tests and the `token` command. Checked for `exp`, `nbf` and `sub` only:
//! `auth.issuer` and `auth.audience` are the identity provider's.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::{ExposeSecret, SecretString};

use super::{BuyerId, Claims, TokenError};

/// Signs and verifies bearer tokens with one HS256 secret.
#[derive(Clone)]
pub struct Tokens {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl Tokens {
    pub fn new(secret: &SecretString) -> Result<Self, TokenError> {
        Self::with_leeway(secret, 0)
    }

    /// Verifies with `leeway_secs` of clock skew allowed (`auth.leeway_secs`).
    pub fn with_leeway(secret: &SecretString, leeway_secs: u64) -> Result<Self, TokenError> {
        let secret = secret.expose_secret().as_bytes();
        Ok(Self {
            encoding: EncodingKey::from_secret(secret).map_err(|_| TokenError::Secret)?,
            decoding: DecodingKey::from_secret(secret).map_err(|_| TokenError::Secret)?,
            validation: super::validation(&[Algorithm::HS256], leeway_secs, None, None),
        })
    }

    pub fn sign(&self, buyer: &BuyerId, ttl: Duration) -> Result<String, TokenError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| TokenError::Secret)?
            .as_secs();
        let claims = Claims {
            sub: buyer.as_str().to_owned(),
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
        super::check_length(token)?;
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
    fn a_signed_token_verifies_to_its_buyer() {
        let buyer = BuyerId::parse("auth0|64f0c2").unwrap();
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
