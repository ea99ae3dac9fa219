//! The identity provider's signing keys: its JWKS document (`auth.jwks_url`,
//! or the `jwks_uri` its discovery document names, `auth.oidc_issuer`),
//! held in memory so that a request never waits on the network.
//!
//! The set is fetched at start and refreshed in the background as its
//! `Cache-Control: max-age` allows, bounded to [10 s, 5 min]; a token naming
//! a `kid` the set lacks triggers a refresh (single-flight, at most one a
//! second, and none for a `kid` a fetch of the last 10 s already lacked), so
//! forged `kid`s cost at most a fetch a second and never keep a rotated key
//! from being fetched. When
//! the provider cannot be reached, the last good set keeps working and a
//! metric and a log line say it is stale; only a service that never got a
//! set refuses tokens (503, not 401).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Header, Validation};
use reqwest::header::CACHE_CONTROL;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{Claims, TokenError};
use crate::config::AuthSettings;
use crate::observe::{labels, Counter, Gauge, Metric};

/// The bounds of the background refresh; also how long a `kid` the set
/// lacked is not worth another fetch.
const MIN_REFRESH: Duration = Duration::from_secs(10);
/// The least time between two fetches asked for by unknown `kid`s: a new
/// key waits at most this long, a flood of made-up ones costs a fetch per.
const ON_DEMAND_GAP: Duration = Duration::from_secs(1);
/// How many `kid`s found missing are remembered; when full, those older
/// than [`MIN_REFRESH`] make room, and one that finds none is not remembered
/// (it costs at most a fetch per [`ON_DEMAND_GAP`]).
const MAX_MISSING: usize = 1_024;
const MAX_REFRESH: Duration = Duration::from_secs(300);
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

labels! {
    /// How a fetch of the key set ended.
    #[label = "result"]
    enum FetchResult {
        Ok = "ok",
        Failed = "failed",
    }
}

const FETCHES: Counter<FetchResult> = Counter::new(
    "auth_key_fetches_total",
    "Fetches of the identity provider's key set, by result",
);
const KEYS_STALE: Gauge = Gauge::new(
    "auth_keys_stale",
    "1 while the last fetch of the identity provider's keys failed",
);
/// What the key fetches report, for the recorder (`observe::install`).
pub const METRICS: &[&dyn Metric] = &[&FETCHES, &KEYS_STALE];

/// A fetch of the key set ended; a failed one makes the keys in use stale
/// until the next good one.
fn fetched(result: FetchResult) {
    FETCHES.of(result).increment(1);
    let stale = match result {
        FetchResult::Ok => 0.0,
        FetchResult::Failed => 1.0,
    };
    KEYS_STALE.get().set(stale);
}

/// Where the key set is published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The JWKS document itself.
    Jwks(String),
    /// An OpenID issuer: its `/.well-known/openid-configuration` names the
    /// JWKS (`jwks_uri`) and the issuer its tokens carry.
    Discovery(String),
}

impl KeySource {
    /// The source `auth.jwks_url` / `auth.oidc_issuer` name, if any.
    pub fn from_settings(settings: &AuthSettings) -> Option<Self> {
        if !settings.jwks_url.is_empty() {
            Some(Self::Jwks(settings.jwks_url.clone()))
        } else if !settings.oidc_issuer.is_empty() {
            Some(Self::Discovery(settings.oidc_issuer.clone()))
        } else {
            None
        }
    }
}

/// Why a fetch of the key set failed (logged; the last good set stays).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("fetching {url}: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{0} holds no signing key this service can use (RS256, PS256, ES256, EdDSA)")]
    NoUsableKey(String),
    #[error(
        "the discovery document names the issuer {discovered:?}, not auth.oidc_issuer {configured:?}"
    )]
    IssuerMismatch {
        configured: String,
        discovered: String,
    },
    #[error("the discovery document's jwks_uri {0:?} is not https:// as auth.oidc_issuer is")]
    PlainJwksUri(String),
    #[error("{url} answered {status}: redirects are not followed")]
    Redirect {
        url: String,
        status: reqwest::StatusCode,
    },
}

/// The provider's keys; cheap to clone, shared by every worker.
#[derive(Clone)]
pub struct Provider {
    inner: Arc<Inner>,
}

struct Inner {
    source: KeySource,
    http: reqwest::Client,
    issuer: Option<String>,
    audience: Option<String>,
    leeway_secs: u64,
    current: RwLock<Option<Arc<KeySet>>>,
    /// Held across a fetch for an unknown `kid`, so that the requests
    /// arriving meanwhile wait for it, not fetch again.
    on_demand: tokio::sync::Mutex<OnDemand>,
}

/// The fetches asked for by unknown `kid`s. Throttled per `kid`, not as a
/// whole: with one throttle for all, an attacker's made-up `kid` every few
/// seconds kept the provider's new key out for as long as they went on.
#[derive(Default)]
struct OnDemand {
    /// When the last such fetch started.
    last: Option<Instant>,
    /// The `kid`s that set lacked, and when.
    missing: HashMap<String, Instant>,
}

impl OnDemand {
    fn lately_missing(&self, kid: &str) -> bool {
        self.missing
            .get(kid)
            .is_some_and(|at| at.elapsed() < MIN_REFRESH)
    }

    fn remember_missing(&mut self, kid: &str) {
        if self.missing.len() >= MAX_MISSING {
            self.missing.retain(|_, at| at.elapsed() < MIN_REFRESH);
        }
        if self.missing.len() < MAX_MISSING {
            self.missing.insert(kid.to_owned(), Instant::now());
        }
    }
}

/// One fetched set: each usable key by `kid`, ready to verify.
struct KeySet {
    by_kid: HashMap<String, Arc<SigningKey>>,
    /// A set of one key without a `kid` serves tokens without one.
    only: Option<Arc<SigningKey>>,
    fetched: Instant,
}

struct SigningKey {
    key: DecodingKey,
    validation: Validation,
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
}

#[derive(Deserialize)]
struct RawKeySet {
    keys: Vec<serde_json::Value>,
}

impl Provider {
    pub fn new(source: KeySource, settings: &AuthSettings) -> Result<Self, reqwest::Error> {
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        Ok(Self {
            inner: Arc::new(Inner {
                source,
                // The keys come from the configured URL or not at all: a
                // redirect could hand the set to whoever controls its target.
                http: reqwest::Client::builder()
                    .timeout(FETCH_TIMEOUT)
                    .redirect(reqwest::redirect::Policy::none())
                    .build()?,
                issuer: non_empty(&settings.issuer),
                audience: non_empty(&settings.audience),
                leeway_secs: settings.leeway_secs,
                current: RwLock::new(None),
                on_demand: tokio::sync::Mutex::new(OnDemand::default()),
            }),
        })
    }

    /// Whether a key set was ever fetched (readiness).
    pub fn has_keys(&self) -> bool {
        self.current().is_some()
    }

    /// Verifies `token`, whose header is `header`, with the key its `kid`
    /// names; returns its `sub`.
    pub(super) async fn verify(&self, token: &str, header: &Header) -> Result<String, TokenError> {
        let key = match self.key(header.kid.as_deref())? {
            Some(key) => key,
            None => {
                self.refresh_for_unknown_kid(header.kid.as_deref().unwrap_or_default())
                    .await;
                self.key(header.kid.as_deref())?
                    .ok_or(TokenError::UnknownKey)?
            }
        };
        // Only the algorithms this key is for; `decode` also refuses a key
        // of another family (an HS256 header over an RSA key).
        if !key.validation.algorithms.contains(&header.alg) {
            return Err(TokenError::Algorithm(header.alg));
        }
        let data = jsonwebtoken::decode::<Claims>(token, &key.key, &key.validation)?;
        Ok(data.claims.sub)
    }

    fn current(&self) -> Option<Arc<KeySet>> {
        match self.inner.current.read() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn key(&self, kid: Option<&str>) -> Result<Option<Arc<SigningKey>>, TokenError> {
        let set = self.current().ok_or(TokenError::NoKeys)?;
        Ok(match kid {
            Some(kid) => set.by_kid.get(kid).cloned(),
            None => set.only.clone(),
        })
    }

    async fn refresh_for_unknown_kid(&self, kid: &str) {
        let arrived = Instant::now();
        let mut on_demand = self.inner.on_demand.lock().await;
        // A fetch that started after this token arrived is as new as one of
        // its own would be: the requests queued behind it share it.
        if on_demand.last.is_some_and(|at| at >= arrived) || on_demand.lately_missing(kid) {
            return;
        }
        if let Some(last) = on_demand.last {
            tokio::time::sleep_until((last + ON_DEMAND_GAP).into()).await;
        }
        on_demand.last = Some(Instant::now());
        if self.refresh().await.is_ok() && matches!(self.key(Some(kid)), Ok(None)) {
            on_demand.remember_missing(kid);
        }
    }

    /// Fetches the set once and keeps it; returns how long it may be kept.
    /// A failure leaves the last good set in place.
    pub async fn refresh(&self) -> Result<Duration, FetchError> {
        match self.fetch().await {
            Ok((set, max_age)) => {
                if let Ok(mut current) = self.inner.current.write() {
                    *current = Some(Arc::new(set));
                }
                fetched(FetchResult::Ok);
                Ok(max_age)
            }
            Err(error) => {
                fetched(FetchResult::Failed);
                match self.current() {
                    Some(set) => tracing::warn!(
                        error = %error,
                        age_secs = set.fetched.elapsed().as_secs(),
                        "identity provider keys are stale: the last good set keeps working"
                    ),
                    None => tracing::error!(
                        error = %error,
                        "identity provider keys unavailable: provider tokens get 503 until a set is fetched"
                    ),
                }
                Err(error)
            }
        }
    }

    /// Refreshes until cancelled: as the last answer's `max-age` allows,
    /// and every [`MIN_REFRESH`] while fetches fail.
    pub async fn run(self, mut next: Duration, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(next) => {
                    next = self.refresh().await.unwrap_or(MIN_REFRESH);
                }
            }
        }
    }

    async fn fetch(&self) -> Result<(KeySet, Duration), FetchError> {
        let (jwks_url, issuer) = match &self.inner.source {
            KeySource::Jwks(url) => (url.clone(), self.inner.issuer.clone()),
            KeySource::Discovery(issuer) => {
                let url = format!(
                    "{}/.well-known/openid-configuration",
                    issuer.trim_end_matches('/')
                );
                let discovery: Discovery = self
                    .get(&url)
                    .await?
                    .json()
                    .await
                    .map_err(|source| FetchError::Http { url, source })?;
                // OpenID Connect Discovery §4.3: a document for another
                // issuer (a shared host, a tenant's path) must not lend its
                // keys to this one's tokens.
                if discovery.issuer != *issuer {
                    return Err(FetchError::IssuerMismatch {
                        configured: issuer.clone(),
                        discovered: discovery.issuer,
                    });
                }
                // The keys are fetched over a channel no weaker than the
                // document that names them (production's issuer is always
                // https). Another origin is allowed: the document came from
                // the issuer itself, and large providers publish their keys
                // elsewhere (Google: accounts.google.com, keys on
                // www.googleapis.com).
                if issuer.starts_with("https://") && !discovery.jwks_uri.starts_with("https://") {
                    return Err(FetchError::PlainJwksUri(discovery.jwks_uri));
                }
                (
                    discovery.jwks_uri,
                    self.inner.issuer.clone().or(Some(discovery.issuer)),
                )
            }
        };
        let response = self.get(&jwks_url).await?;
        let max_age = max_age(response.headers().get(CACHE_CONTROL));
        let raw: RawKeySet = response.json().await.map_err(|source| FetchError::Http {
            url: jwks_url.clone(),
            source,
        })?;
        Ok((self.key_set(raw, issuer.as_deref(), &jwks_url)?, max_age))
    }

    /// The usable keys of a JWKS document.
    fn key_set(
        &self,
        raw: RawKeySet,
        issuer: Option<&str>,
        jwks_url: &str,
    ) -> Result<KeySet, FetchError> {
        let mut by_kid = HashMap::new();
        let mut without_kid = Vec::new();
        for value in raw.keys {
            let Ok(jwk) = serde_json::from_value::<Jwk>(value) else {
                continue;
            };
            let Some(key) = self.signing_key(&jwk, issuer) else {
                continue;
            };
            match jwk.common.key_id {
                Some(kid) => {
                    by_kid.insert(kid, Arc::new(key));
                }
                None => without_kid.push(Arc::new(key)),
            }
        }
        if by_kid.is_empty() && without_kid.is_empty() {
            return Err(FetchError::NoUsableKey(jwks_url.to_owned()));
        }
        let only = (by_kid.is_empty() && without_kid.len() == 1)
            .then(|| without_kid.pop())
            .flatten();
        Ok(KeySet {
            by_kid,
            only,
            fetched: Instant::now(),
        })
    }

    /// A provider holding this JWKS document already (unit tests).
    #[cfg(test)]
    pub(super) fn holding(jwks: &str, settings: &AuthSettings) -> Self {
        let provider = Self::new(KeySource::Jwks("http://jwks.test".into()), settings).unwrap();
        let raw: RawKeySet = serde_json::from_str(jwks).unwrap();
        let set = provider
            .key_set(raw, provider.inner.issuer.as_deref(), "http://jwks.test")
            .unwrap();
        *provider.inner.current.write().unwrap() = Some(Arc::new(set));
        provider
    }

    async fn get(&self, url: &str) -> Result<reqwest::Response, FetchError> {
        let http = |source| FetchError::Http {
            url: url.to_owned(),
            source,
        };
        let response = self
            .inner
            .http
            .get(url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(http)?;
        if response.status().is_redirection() {
            return Err(FetchError::Redirect {
                url: url.to_owned(),
                status: response.status(),
            });
        }
        Ok(response)
    }

    /// A key of the set as this service will use it, or nothing for a key
    /// it must not use (encryption keys, shared secrets, other curves).
    fn signing_key(&self, jwk: &Jwk, issuer: Option<&str>) -> Option<SigningKey> {
        if matches!(
            jwk.common.public_key_use,
            Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
        ) {
            return None;
        }
        let algorithms = algorithms_for(jwk)?;
        Some(SigningKey {
            key: DecodingKey::from_jwk(jwk).ok()?,
            validation: super::validation(
                &algorithms,
                self.inner.leeway_secs,
                issuer,
                self.inner.audience.as_deref(),
            ),
        })
    }
}

/// The algorithms a key is for: its `alg` when it names one, else what its
/// type and curve allow. Never HMAC: a provider's secret is not a public key.
fn algorithms_for(jwk: &Jwk) -> Option<Vec<Algorithm>> {
    let by_type = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => vec![Algorithm::RS256, Algorithm::PS256],
        AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
            vec![Algorithm::ES256]
        }
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
            vec![Algorithm::EdDSA]
        }
        _ => return None,
    };
    let named = match jwk.common.key_algorithm {
        None => return Some(by_type),
        Some(KeyAlgorithm::RS256) => Algorithm::RS256,
        Some(KeyAlgorithm::PS256) => Algorithm::PS256,
        Some(KeyAlgorithm::ES256) => Algorithm::ES256,
        Some(KeyAlgorithm::EdDSA) => Algorithm::EdDSA,
        Some(_) => return None,
    };
    by_type.contains(&named).then(|| vec![named])
}

/// How long an answer may be kept: its `max-age`, within the bounds; the
/// longest bound when it says nothing.
fn max_age(header: Option<&reqwest::header::HeaderValue>) -> Duration {
    let directive = header
        .and_then(|v| v.to_str().ok())
        .into_iter()
        .flat_map(|v| v.split(','))
        .filter_map(|d| d.trim().strip_prefix("max-age="))
        .find_map(|secs| secs.trim_matches('"').parse::<u64>().ok());
    directive.map_or(MAX_REFRESH, |secs| {
        Duration::from_secs(secs).clamp(MIN_REFRESH, MAX_REFRESH)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn the_refresh_follows_max_age_within_its_bounds() {
        let age = |v: &str| max_age(Some(&HeaderValue::from_str(v).unwrap()));
        assert_eq!(age("public, max-age=60"), Duration::from_secs(60));
        assert_eq!(age("max-age=1"), MIN_REFRESH);
        assert_eq!(age("max-age=86400, must-revalidate"), MAX_REFRESH);
        assert_eq!(age("no-cache"), MAX_REFRESH);
        assert_eq!(max_age(None), MAX_REFRESH);
    }
}
