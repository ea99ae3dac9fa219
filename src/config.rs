//! Typed, layered settings: `config/default.toml`, then
//! `config/<STAGEDOOR_ENV>.toml` (`local` when unset), then
//! `STAGEDOOR__<SECTION>__<KEY>` environment variables; `DATABASE_URL` wins
//! for the database. Loaded once at start and passed down, never global, so
//! tests can build the settings they need.

use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

/// A setting that cannot be used; the message names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    #[error("configuration key `{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
}

#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub auth: AuthSettings,
    pub payrail: PayrailSettings,
    pub idempotency: IdempotencySettings,
    pub limits: LimitSettings,
    pub redis: RedisSettings,
    pub reconcile: ReconcileSettings,
    pub holds: HoldSettings,
    pub http: HttpSettings,
    pub demo: DemoSettings,
    /// The name of the layer that was applied (`STAGEDOOR_ENV`).
    #[serde(skip)]
    pub environment: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ServerSettings {
    pub host: String,
    /// 0 binds any free port.
    pub port: u16,
    /// HTTP worker threads; 0 = one per core.
    pub workers: usize,
    pub shutdown_timeout_secs: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct DatabaseSettings {
    pub url: SecretString,
    pub pool_size: usize,
    /// Create the database named in `url` when it is missing (local runs).
    pub create_if_missing: bool,
    pub pool_timeout_ms: u64,
    /// How long the start keeps trying a database that does not answer yet;
    /// 0 gives up at the first refusal.
    pub connect_timeout_secs: u64,
    /// Every pooled connection plans with generic plans only
    /// (`plan_cache_mode = force_generic_plan`); off for Citus (`db::pool`).
    pub generic_plans: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct AuthSettings {
    /// HS256 secret; empty means not configured.
    pub jwt_secret: SecretString,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PayrailSettings {
    /// Payrail's address; empty with `sandbox = true` means the embedded sandbox.
    pub base_url: String,
    pub sandbox: bool,
    /// Sent as `Authorization: Bearer` to Payrail.
    pub api_key: SecretString,
    pub timeout_ms: u64,
    /// Attempts per charge, all with the same key.
    pub max_attempts: u32,
    /// Consecutive failed attempts that open the circuit breaker.
    pub breaker_failures: u32,
    pub breaker_open_secs: u64,
    /// The secret Payrail signs its events with; empty = `POST
    /// /payrail/events` is 404 and reconciliation alone settles.
    pub webhook_secret: SecretString,
    /// How far an event's signature timestamp may be from now.
    pub webhook_tolerance_secs: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockMode {
    Table,
    Redis,
}

#[derive(Debug, Clone, Deserialize)]
pub struct IdempotencySettings {
    /// A key's lifetime; an older key is a new intent.
    pub ttl_secs: u64,
    pub cleanup_interval_secs: u64,
    /// How long an in-progress key belongs to the request that claimed it.
    pub lease_secs: u64,
    /// The longest a `Prefer: wait` request waits for the holder's answer.
    pub max_wait_secs: u64,
    pub lock: LockMode,
    /// The answer cache's size in MiB (0 = off): retries of answered keys
    /// are answered from memory, with no database round trip.
    pub answer_cache_mb: u64,
}

/// The per-buyer limit on new intents, per instance.
#[derive(Debug, Clone, Deserialize)]
pub struct LimitSettings {
    /// New keys a buyer may claim per second, on average.
    pub new_keys_per_sec: u32,
    /// ... and at once.
    pub burst: u32,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RedisSettings {
    pub url: SecretString,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ReconcileSettings {
    pub interval_secs: u64,
    /// How old a `payment_pending` order must be before reconciliation touches it.
    pub grace_secs: u64,
    /// How long after its first attempt an undecided order is canceled at
    /// Payrail and then `failed`.
    pub give_up_secs: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct HoldSettings {
    pub ttl_secs: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct HttpSettings {
    pub max_body_bytes: usize,
    /// Browser origins allowed by CORS.
    pub cors_origins: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct DemoSettings {
    /// Seed the event `demo` with 200 seats at start.
    pub seed: bool,
}

impl Settings {
    /// Loads the layers from `STAGEDOOR_CONFIG_DIR` (default `./config`).
    pub fn load() -> Result<Self, ConfigError> {
        let dir = std::env::var_os("STAGEDOOR_CONFIG_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("config"));
        let environment = std::env::var("STAGEDOOR_ENV").unwrap_or_else(|_| "local".into());
        Self::load_from(&dir, &environment)
    }

    pub fn load_from(dir: &Path, environment: &str) -> Result<Self, ConfigError> {
        let layered = config::Config::builder()
            .add_source(config::File::from(dir.join("default.toml")))
            .add_source(config::File::from(dir.join(format!("{environment}.toml"))))
            .add_source(
                config::Environment::with_prefix("STAGEDOOR")
                    .prefix_separator("__")
                    .separator("__")
                    .try_parsing(true)
                    .list_separator(",")
                    .with_list_parse_key("http.cors_origins"),
            )
            .set_override_option("database.url", std::env::var("DATABASE_URL").ok())?
            .build()?;
        let mut settings: Settings = layered.try_deserialize()?;
        settings.environment = environment.to_owned();
        settings.validate()?;
        Ok(settings)
    }

    pub fn is_production(&self) -> bool {
        self.environment == "production"
    }

    fn validate(&self) -> Result<(), ConfigError> {
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
        let secret = self.auth.jwt_secret.expose_secret();
        if secret.is_empty() {
            return invalid(
                "auth.jwt_secret",
                "is empty: set STAGEDOOR__AUTH__JWT_SECRET (STAGEDOOR_ENV=local has a dev one)",
            );
        }
        if secret.len() < 16 {
            return invalid("auth.jwt_secret", "must be at least 16 bytes");
        }
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
        for origin in &self.http.cors_origins {
            let host = origin
                .strip_prefix("https://")
                .or_else(|| origin.strip_prefix("http://"));
            if !host.is_some_and(|h| !h.is_empty() && !h.contains(['/', '*', ' '])) {
                return invalid(
                    "http.cors_origins",
                    &format!("`{origin}` is not an origin like https://shop.example[:port]"),
                );
            }
        }
        let at_least_one: [(&'static str, u64); 12] = [
            (
                "limits.new_keys_per_sec",
                self.limits.new_keys_per_sec.into(),
            ),
            ("limits.burst", self.limits.burst.into()),
            ("database.pool_size", self.database.pool_size as u64),
            ("payrail.timeout_ms", self.payrail.timeout_ms),
            ("payrail.max_attempts", self.payrail.max_attempts.into()),
            (
                "payrail.breaker_failures",
                self.payrail.breaker_failures.into(),
            ),
            ("idempotency.ttl_secs", self.idempotency.ttl_secs),
            (
                "idempotency.cleanup_interval_secs",
                self.idempotency.cleanup_interval_secs,
            ),
            ("idempotency.lease_secs", self.idempotency.lease_secs),
            ("reconcile.interval_secs", self.reconcile.interval_secs),
            ("holds.ttl_secs", self.holds.ttl_secs),
            ("http.max_body_bytes", self.http.max_body_bytes as u64),
        ];
        for (key, value) in at_least_one {
            if value == 0 {
                return invalid(key, "must be at least 1");
            }
        }
        Ok(())
    }
}

impl PayrailSettings {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
    pub fn breaker_open(&self) -> Duration {
        Duration::from_secs(self.breaker_open_secs)
    }
    pub fn webhook_tolerance(&self) -> Duration {
        Duration::from_secs(self.webhook_tolerance_secs)
    }
}

impl IdempotencySettings {
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_secs)
    }
    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_secs)
    }
    pub fn cleanup_interval(&self) -> Duration {
        Duration::from_secs(self.cleanup_interval_secs)
    }
}

impl LimitSettings {
    /// The limit as the engine takes it (validation keeps both above 0).
    pub fn limit(&self) -> idempotency::Limit {
        let at_least_one =
            |n: u32| std::num::NonZeroU32::new(n).unwrap_or(std::num::NonZeroU32::MIN);
        idempotency::Limit::new(
            at_least_one(self.new_keys_per_sec),
            at_least_one(self.burst),
        )
    }
}

impl ReconcileSettings {
    pub fn interval(&self) -> Duration {
        Duration::from_secs(self.interval_secs)
    }
    pub fn grace(&self) -> Duration {
        Duration::from_secs(self.grace_secs)
    }
    pub fn give_up(&self) -> Duration {
        Duration::from_secs(self.give_up_secs)
    }
}

impl DatabaseSettings {
    pub fn pool_timeout(&self) -> Duration {
        Duration::from_millis(self.pool_timeout_ms)
    }
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs(self.connect_timeout_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config")
    }

    #[test]
    fn local_layer_has_a_dev_secret_and_the_embedded_sandbox() {
        let settings = Settings::load_from(&config_dir(), "local").unwrap();
        assert!(settings.payrail.sandbox);
        assert_eq!(settings.server.port, 8080);
        assert_eq!(settings.idempotency.lock, LockMode::Table);
        assert_eq!(settings.database.connect_timeout_secs, 60);
        assert!(settings.database.generic_plans);
    }

    #[test]
    fn production_refuses_to_start_without_a_secret() {
        let err = Settings::load_from(&config_dir(), "production").unwrap_err();
        assert!(err.to_string().contains("auth.jwt_secret"), "{err}");
    }

    #[test]
    fn production_refuses_the_sandbox() {
        let mut settings = Settings::load_from(&config_dir(), "local").unwrap();
        settings.environment = "production".into();
        settings.payrail.sandbox = true;
        let err = settings.validate().unwrap_err();
        assert!(err.to_string().contains("payrail.sandbox"), "{err}");
    }

    #[test]
    fn production_refuses_a_short_webhook_secret() {
        let mut settings = Settings::load_from(&config_dir(), "local").unwrap();
        settings.environment = "production".into();
        settings.payrail.sandbox = false;
        settings.payrail.base_url = "https://payrail.example".into();
        settings.payrail.webhook_secret = SecretString::from("x".repeat(31));
        let err = settings.validate().unwrap_err();
        assert!(err.to_string().contains("payrail.webhook_secret"), "{err}");
        settings.payrail.webhook_secret = SecretString::from("x".repeat(32));
        assert!(settings.validate().is_ok());
    }

    #[test]
    fn cors_origins_must_be_exact_origins() {
        let mut settings = Settings::load_from(&config_dir(), "local").unwrap();
        for bad in ["*", "shop.example", "https://shop.example/", "https://"] {
            settings.http.cors_origins = vec![bad.to_owned()];
            let err = settings.validate().unwrap_err();
            assert!(
                err.to_string().contains("http.cors_origins"),
                "{bad}: {err}"
            );
        }
        settings.http.cors_origins = vec!["http://localhost:3000".into()];
        assert!(settings.validate().is_ok());
    }

    #[test]
    fn an_unknown_environment_names_its_missing_file() {
        let err = Settings::load_from(&config_dir(), "nosuchenv").unwrap_err();
        assert!(err.to_string().contains("nosuchenv"), "{err}");
    }
}
