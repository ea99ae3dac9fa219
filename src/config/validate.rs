//! What makes a loaded configuration unusable, each refusal naming its key:
//! production's stricter rules (a real secret, no sandbox, an audience for a
//! provider's tokens) and values no service could run with.

use secrecy::ExposeSecret;

use super::{public_secrets, ConfigError, Settings};
use crate::pgurl::{PgUrl, SslMode};

const MAX_REQUEST_TIMEOUT_SECS: u64 = 300;
/// The breaker remembers twice this many buyers and scans them on each
/// Payrail answer: beyond it the memory, not the rule, is what bounds it.
const MAX_BREAKER_FAILURES: u32 = 10_000;
/// What an HS256 secret must hold in production: a buyer's own token is
/// enough to try secrets offline, as fast as HMACs can be computed.
const MIN_PRODUCTION_JWT_SECRET: usize = 32;

impl Settings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                reason: reason.to_owned(),
            })
        };
        // First: whatever else is missing, a production that would fake its
        // charges must be told so.
        if self.is_production() && self.payrail.sandbox {
            return invalid(
                "payrail.sandbox",
                "is true in production: the sandbox never moves money, so every order would \
                 be \"paid\" without a charge; set payrail.base_url and payrail.sandbox = false",
            );
        }
        self.validate_auth()?;
        self.validate_production_secrets()?;
        self.validate_transport()?;
        self.validate_database()?;
        self.validate_outcomes()?;
        self.validate_server()?;
        let webhook_secret = self.payrail.webhook_secret.expose_secret();
        if self.is_production() && !webhook_secret.is_empty() && webhook_secret.len() < 32 {
            return invalid(
                "payrail.webhook_secret",
                "must be at least 32 bytes in production (anyone who guesses it can settle orders)",
            );
        }
        if self.payrail.base_url.is_empty() && !self.payrail.sandbox {
            return invalid(
                "payrail.base_url",
                "is empty and payrail.sandbox is false: there is no Payrail to call",
            );
        }
        if !self.payrail.base_url.is_empty()
            && !self.payrail.base_url.starts_with("http://")
            && !self.payrail.base_url.starts_with("https://")
        {
            return invalid("payrail.base_url", "must start with http:// or https://");
        }
        for (at, origin) in self.http.cors_origins.iter().enumerate() {
            let host = origin
                .strip_prefix("https://")
                .or_else(|| origin.strip_prefix("http://"));
            if !host.is_some_and(|h| !h.is_empty() && !h.contains(['/', '*', ' '])) {
                return invalid(
                    "http.cors_origins",
                    &format!("entry {at} is not an origin like https://shop.example[:port]"),
                );
            }
            // A page served over http:// can be rewritten on the path, and
            // would then act with the buyer's token.
            if self.is_production() && !origin.starts_with("https://") {
                return invalid(
                    "http.cors_origins",
                    &format!("entry {at} is not https:// in production"),
                );
            }
        }
        // Past these a retention keeps the tables growing for as long as
        // it is set to, and a due time before the epoch is no time at all.
        if !(60..=31_536_000).contains(&self.holds.retention_secs) {
            return invalid(
                "holds.retention_secs",
                "must be from 60 to 31536000 (a year)",
            );
        }
        if !(1..=3_650).contains(&self.outcomes.keep_days) {
            return invalid("outcomes.keep_days", "must be from 1 to 3650");
        }
        if !(1..=MAX_BREAKER_FAILURES).contains(&self.payrail.breaker_failures) {
            return invalid(
                "payrail.breaker_failures",
                &format!("must be from 1 to {MAX_BREAKER_FAILURES}"),
            );
        }
        // A stalled client keeps a socket and a buffer this long: beyond a
        // few minutes the bound no longer protects anyone.
        if self.http.request_timeout_secs > MAX_REQUEST_TIMEOUT_SECS {
            return invalid(
                "http.request_timeout_secs",
                &format!("must be at most {MAX_REQUEST_TIMEOUT_SECS}"),
            );
        }
        let at_least_one: [(&'static str, u64); 13] = [
            (
                "limits.new_keys_per_sec",
                self.limits.new_keys_per_sec.into(),
            ),
            ("limits.burst", self.limits.burst.into()),
            ("database.pool_size", self.database.pool_size as u64),
            ("payrail.timeout_ms", self.payrail.timeout_ms),
            ("payrail.max_attempts", self.payrail.max_attempts.into()),
            ("idempotency.ttl_secs", self.idempotency.ttl_secs),
            (
                "idempotency.cleanup_interval_secs",
                self.idempotency.cleanup_interval_secs,
            ),
            ("idempotency.lease_secs", self.idempotency.lease_secs),
            ("reconcile.interval_secs", self.reconcile.interval_secs),
            ("holds.ttl_secs", self.holds.ttl_secs),
            ("holds.max_per_buyer", self.holds.max_per_buyer.into()),
            ("http.max_body_bytes", self.http.max_body_bytes as u64),
            ("http.request_timeout_secs", self.http.request_timeout_secs),
        ];
        for (key, value) in at_least_one {
            if value == 0 {
                return invalid(key, "must be at least 1");
            }
        }
        // Leeway is for clocks that disagree by seconds; beyond five minutes
        // it is a longer token lifetime than the provider issued, and an
        // expired (say, leaked and revoked by expiry) token keeps working.
        if self.auth.leeway_secs > 300 {
            return invalid("auth.leeway_secs", "must be at most 300");
        }
        // Whoever captures a signed event can replay it for this long; 0
        // would refuse every event whose clock is a second off. Fifteen
        // minutes covers any clock that is still set, no more.
        if !(1..=900).contains(&self.payrail.webhook_tolerance_secs) {
            return invalid("payrail.webhook_tolerance_secs", "must be from 1 to 900");
        }
        Ok(())
    }

    fn validate_auth(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                reason: reason.to_owned(),
            })
        };
        let auth = &self.auth;
        if !auth.jwt_secret_is_set() && !auth.has_provider() {
            return invalid(
                "auth.jwt_secret",
                "is empty and no identity provider is set: set STAGEDOOR__AUTH__JWT_SECRET, \
                 or STAGEDOOR__AUTH__JWKS_URL / STAGEDOOR__AUTH__OIDC_ISSUER \
                 (STAGEDOOR_ENV=local has a dev secret)",
            );
        }
        if auth.jwt_secret_is_set() && auth.jwt_secret.expose_secret().len() < 16 {
            return invalid("auth.jwt_secret", "must be at least 16 bytes");
        }
        if !auth.jwks_url.is_empty() && !auth.oidc_issuer.is_empty() {
            return invalid(
                "auth.oidc_issuer",
                "is set together with auth.jwks_url: set one of the two",
            );
        }
        for (key, url) in [
            ("auth.jwks_url", &auth.jwks_url),
            ("auth.oidc_issuer", &auth.oidc_issuer),
            ("telemetry.otlp_endpoint", &self.telemetry.otlp_endpoint),
        ] {
            if !url.is_empty() && !url.starts_with("http://") && !url.starts_with("https://") {
                return invalid(key, "must start with http:// or https://");
            }
        }
        if self.is_production() && auth.has_provider() && auth.audience.is_empty() {
            return invalid(
                "auth.audience",
                "is empty in production: without it, a token the identity provider issued \
                 for any other application would be accepted; set STAGEDOOR__AUTH__AUDIENCE",
            );
        }
        // Discovery checks the issuer itself; a JWKS document says nothing
        // of who may sign with its keys (a provider serving several tenants).
        if self.is_production() && !auth.jwks_url.is_empty() && auth.issuer.is_empty() {
            return invalid(
                "auth.issuer",
                "is empty beside auth.jwks_url in production: a token of any issuer that \
                 shares the key set would be accepted; set STAGEDOOR__AUTH__ISSUER",
            );
        }
        Ok(())
    }

    /// Production's credentials: none that anyone else has, none that would
    /// let a token around the identity provider's checks, and Payrail's key.
    fn validate_production_secrets(&self) -> Result<(), ConfigError> {
        if !self.is_production() {
            return Ok(());
        }
        let invalid = |key, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                reason: reason.to_owned(),
            })
        };
        // An HS256 token is checked against the secret alone: no `iss`, no
        // `aud`, any subject (the provider's `auth0|victim` too), and it
        // keeps working while the provider's keys cannot be fetched.
        if self.auth.jwt_secret_is_set() && self.auth.has_provider() {
            return invalid(
                "auth.jwt_secret",
                "is set beside an identity provider in production: tokens signed with it \
                 would skip the provider's issuer and audience checks and could name any of \
                 its buyers; leave it empty and let the provider sign every token",
            );
        }
        if self.auth.jwt_secret_is_set()
            && self.auth.jwt_secret.expose_secret().len() < MIN_PRODUCTION_JWT_SECRET
        {
            return invalid(
                "auth.jwt_secret",
                "must be at least 32 bytes in production: any buyer's own token lets a shorter \
                 one be guessed offline; generate one, e.g. `openssl rand -hex 32`",
            );
        }
        let payrail_secret = self.payrail.webhook_secret.expose_secret();
        if !payrail_secret.is_empty()
            && payrail_secret == self.outcomes.webhook_secret.expose_secret()
        {
            return invalid(
                "outcomes.webhook_secret",
                "is payrail.webhook_secret in production: one scheme signs both, so whoever \
                 receives the shop's events (the shop) could sign Payrail's and settle orders; \
                 generate another",
            );
        }
        if self.payrail.api_key.expose_secret().is_empty() {
            return invalid(
                "payrail.api_key",
                "is empty in production: Payrail would refuse every charge; set \
                 STAGEDOOR__PAYRAIL__API_KEY (or STAGEDOOR__PAYRAIL__API_KEY_FILE)",
            );
        }
        let credentials = [
            ("auth.jwt_secret", &self.auth.jwt_secret),
            ("payrail.api_key", &self.payrail.api_key),
            ("payrail.webhook_secret", &self.payrail.webhook_secret),
            ("outcomes.webhook_secret", &self.outcomes.webhook_secret),
            ("database.url", &self.database.url),
            ("redis.url", &self.redis.url),
        ];
        for (key, value) in credentials {
            if public_secrets::holds(value.expose_secret()) {
                return invalid(
                    key,
                    "holds a secret that this repository publishes (a development or \
                     example value): anyone who has read it has it too; generate one, e.g. \
                     `openssl rand -hex 32`",
                );
            }
        }
        Ok(())
    }

    /// The order events: a URL needs a secret the shop can check them with,
    /// and every bound of a delivery is one a shop's endpoint can meet.
    fn validate_outcomes(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: String| Err(ConfigError::Invalid { key, reason });
        let outcomes = &self.outcomes;
        let url = &outcomes.webhook_url;
        if !url.is_empty() && !url.starts_with("http://") && !url.starts_with("https://") {
            return invalid(
                "outcomes.webhook_url",
                "must start with http:// or https://".into(),
            );
        }
        let secret = outcomes.webhook_secret.expose_secret();
        if outcomes.enabled() && secret.len() < 32 {
            return invalid(
                "outcomes.webhook_secret",
                "must be at least 32 bytes when outcomes.webhook_url is set (the shop \
                 believes what it signs); generate one, e.g. `openssl rand -hex 32`"
                    .into(),
            );
        }
        let bounded: [(&'static str, u64, std::ops::RangeInclusive<u64>); 3] = [
            ("outcomes.timeout_ms", outcomes.timeout_ms, 100..=60_000),
            ("outcomes.poll_ms", outcomes.poll_ms, 100..=60_000),
            (
                "outcomes.max_backoff_secs",
                outcomes.max_backoff_secs,
                1..=3_600,
            ),
        ];
        for (key, value, range) in bounded {
            if !range.contains(&value) {
                return invalid(
                    key,
                    format!("must be from {} to {}", range.start(), range.end()),
                );
            }
        }
        if outcomes.retry_for_secs == 0 {
            return invalid("outcomes.retry_for_secs", "must be at least 1".into());
        }
        Ok(())
    }

    /// Production reaches Payrail and the identity provider over HTTPS only.
    /// Over `http://`, anyone on the path reads the Payrail API key, can
    /// answer a charge as "succeeded" without moving money, or serve a key
    /// set of their own and sign a token for any buyer.
    fn validate_transport(&self) -> Result<(), ConfigError> {
        if !self.is_production() {
            return Ok(());
        }
        for (key, url) in [
            ("payrail.base_url", &self.payrail.base_url),
            ("auth.jwks_url", &self.auth.jwks_url),
            ("auth.oidc_issuer", &self.auth.oidc_issuer),
            // The events carry the buyer's id and orders: not for the path to read.
            ("outcomes.webhook_url", &self.outcomes.webhook_url),
            // The spans carry buyers' ids and their keys.
            ("telemetry.otlp_endpoint", &self.telemetry.otlp_endpoint),
        ] {
            // Never the URL itself in the message: it may carry a token.
            if !url.is_empty() && !url.starts_with("https://") {
                return Err(ConfigError::Invalid {
                    key,
                    reason: "is not https:// in production".into(),
                });
            }
        }
        Ok(())
    }

    /// `database.url` parses, and `sslmode` means what it says: `verify-ca`
    /// names the CA it trusts, and production's connection cannot be
    /// turned into plain text by a machine in the path.
    fn validate_database(&self) -> Result<(), ConfigError> {
        let invalid = |reason: String| {
            Err(ConfigError::Invalid {
                key: "database.url",
                reason,
            })
        };
        let url = match PgUrl::parse(self.database.url.expose_secret()) {
            Ok(url) => url,
            Err(error) => return invalid(error.to_string()),
        };
        if self.is_production() && url.mode.can_be_plaintext() && !url.is_local() {
            return invalid(format!(
                "sslmode={} in production, to a host that is not this machine: a machine in \
                 the path can refuse TLS and read the connection, password exchange and \
                 buyers' data included; use sslmode=verify-full (or verify-ca with \
                 sslrootcert)",
                url.mode.as_str()
            ));
        }
        Ok(())
    }

    /// The metrics listener is an address.
    fn validate_server(&self) -> Result<(), ConfigError> {
        let address = &self.server.metrics_addr;
        if !address.is_empty() && address.parse::<std::net::SocketAddr>().is_err() {
            return Err(ConfigError::Invalid {
                key: "server.metrics_addr",
                reason: "is not an address like 0.0.0.0:9090 (an IP address and a port)".into(),
            });
        }
        Ok(())
    }

    /// What a start may go on with, but an operator must hear of: logged
    /// once the logs are set up.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if !self.is_production() {
            return warnings;
        }
        let mode = PgUrl::parse(self.database.url.expose_secret()).map(|url| url.mode);
        if let Ok(SslMode::Require) = mode {
            warnings.push(
                "database.url: sslmode=require encrypts the connection but does not check who \
                 answers it; use sslmode=verify-full (or verify-ca with sslrootcert)"
                    .to_owned(),
            );
        }
        if self.server.metrics_addr.is_empty() {
            warnings.push(
                "server.metrics_addr is empty in production: /metrics is not served (never on \
                 the API's listener there); set it to the address a scraper reaches"
                    .to_owned(),
            );
        }
        warnings
    }
}
