//! Typed, layered settings: the defaults built into the binary
//! (`config/default.toml`, then the `config/<STAGEDOOR_ENV>.toml` of the
//! repository, `local` when unset), then the files of `STAGEDOOR_CONFIG_DIR`
//! (default `./config`) where they exist, then `STAGEDOOR__<SECTION>__<KEY>`
//! environment variables, or `STAGEDOOR__<SECTION>__<KEY>_FILE` naming a file
//! that holds the value (a mounted secret); `DATABASE_URL` wins for the
//! database. Loaded once at start and passed down, never global, so tests
//! can build the settings they need.
//!
//! Strict: a key that no field below declares, in a file or a variable, is
//! an error naming it and the nearest known key, never silently ignored.

use std::path::{Path, PathBuf};
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

mod public_secrets;
mod unknown;
mod validate;

pub use unknown::UnknownKey;

/// The layers built into the binary, so that it runs from any directory.
/// The local layer (a development secret everyone has) only beside the
/// embedded sandbox it is made for: the container's binary is built without
/// both, so `STAGEDOOR_ENV=local` there stops at start instead of serving
/// on that secret.
const DEFAULT_LAYER: &str = include_str!("../../config/default.toml");
const BUILT_IN_LAYERS: &[(&str, &str)] = &[
    #[cfg(feature = "sandbox")]
    ("local", include_str!("../../config/local.toml")),
    ("production", include_str!("../../config/production.toml")),
];
const ENV_PREFIX: &str = "STAGEDOOR";
const ENV_SEPARATOR: &str = "__";
/// `STAGEDOOR__AUTH__JWT_SECRET_FILE=/run/secrets/jwt`: the value is that
/// file's contents.
const FILE_SUFFIX: &str = "_FILE";
/// The environments without production's rules: a developer's `cargo run`,
/// the tests' instances, the compose stack.
const DEVELOPMENT_ENVIRONMENTS: &[&str] = &["local", "test", "compose"];

/// A setting that cannot be used; the message names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    #[error("configuration key `{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
    #[error("{}", unknown.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Unknown { unknown: Vec<UnknownKey> },
    #[error(
        "configuration: STAGEDOOR_ENV={environment} has no layer: none of that name is built \
         into this binary (the development layer `local` comes only with the `sandbox` \
         feature, which the container's binary lacks) and there is no file {}",
        file.display()
    )]
    NoLayer { environment: String, file: PathBuf },
    #[error("configuration variable `{variable}`: {reason}")]
    Variable { variable: String, reason: String },
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
    pub outcomes: OutcomesSettings,
    pub holds: HoldSettings,
    pub http: HttpSettings,
    pub demo: DemoSettings,
    pub telemetry: TelemetrySettings,
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
    /// `host:port` of `/metrics`' own listener; empty = the API's (never
    /// in production).
    pub metrics_addr: String,
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
    /// On a Citus coordinator, each buyer's statements go to the worker
    /// that holds the buyer's shard (`db::route`).
    pub route_to_workers: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct AuthSettings {
    /// HS256 secret; empty means not configured.
    pub jwt_secret: SecretString,
    /// The identity provider's JWKS document; empty = none.
    pub jwks_url: String,
    /// The identity provider's issuer URL, read through OpenID discovery
    /// (`jwks_uri` and `issuer`); instead of `jwks_url`.
    pub oidc_issuer: String,
    /// The `iss` provider tokens must carry; empty = not checked (with
    /// `oidc_issuer`, the discovered issuer is checked); required beside
    /// `jwks_url` in production.
    pub issuer: String,
    /// The `aud` provider tokens must carry; required in production.
    pub audience: String,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway_secs: u64,
}

impl AuthSettings {
    pub fn jwt_secret_is_set(&self) -> bool {
        !self.jwt_secret.expose_secret().is_empty()
    }

    /// Whether an identity provider is configured.
    pub fn has_provider(&self) -> bool {
        !self.jwks_url.is_empty() || !self.oidc_issuer.is_empty()
    }
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
    /// Failing buyers that never open the circuit breaker: more than half
    /// of the last twice this many buyers to reach Payrail must fail.
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

/// The shop's order events (`jobs::outcomes`): where they go, how they
/// are signed, and how long a delivery is tried.
#[derive(Debug, Clone, Deserialize)]
pub struct OutcomesSettings {
    /// Where each order event is `POST`ed; empty = not delivered (the
    /// events are still written, and wait).
    pub webhook_url: String,
    /// What `Stagedoor-Signature` is made with; at least 32 bytes,
    /// required with a URL.
    pub webhook_secret: SecretString,
    /// One delivery's limit, connection to answer.
    pub timeout_ms: u64,
    /// How often an instance looks for events due.
    pub poll_ms: u64,
    /// The longest wait between two attempts (the wait doubles from 1 s).
    pub max_backoff_secs: u64,
    /// How long an event is retried before it is given up.
    pub retry_for_secs: u64,
    /// Days a delivered event is kept; then `jobs::retention` deletes it.
    pub keep_days: u64,
}

impl OutcomesSettings {
    pub fn enabled(&self) -> bool {
        !self.webhook_url.is_empty()
    }
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
    pub fn poll(&self) -> Duration {
        Duration::from_millis(self.poll_ms)
    }
    pub fn max_backoff(&self) -> Duration {
        Duration::from_secs(self.max_backoff_secs)
    }
    pub fn retry_for(&self) -> Duration {
        Duration::from_secs(self.retry_for_secs)
    }
    pub fn keep(&self) -> Duration {
        Duration::from_secs(self.keep_days.saturating_mul(86_400))
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct HoldSettings {
    pub ttl_secs: u64,
    /// A buyer's seats of one event in live holds that no order has taken
    /// yet and in orders still `payment_pending`, at most, across
    /// instances; one more hold is `409 hold-limit-reached`.
    pub max_per_buyer: u32,
    /// How long after its expiry a hold that no order took is kept; then
    /// `jobs::retention` deletes it.
    pub retention_secs: u64,
}

impl HoldSettings {
    pub fn retention(&self) -> Duration {
        Duration::from_secs(self.retention_secs)
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct HttpSettings {
    pub max_body_bytes: usize,
    /// How long a request's head and body together may take to arrive,
    /// from its first byte: a slower one is answered 408 `request-timeout`
    /// (or closed).
    pub request_timeout_secs: u64,
    /// Browser origins allowed by CORS.
    pub cors_origins: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct DemoSettings {
    /// Seed the event `demo` with 200 seats at start.
    pub seed: bool,
}

/// Tracing beyond the logs.
#[derive(Debug, Clone, Deserialize)]
pub struct TelemetrySettings {
    /// An OTLP/HTTP collector (`http://collector:4318`; `/v1/traces` is
    /// added) to export spans to; empty = no export.
    pub otlp_endpoint: String,
}

impl Settings {
    /// Loads the layers over `STAGEDOOR_CONFIG_DIR` (default `./config`).
    pub fn load() -> Result<Self, ConfigError> {
        let dir = std::env::var_os("STAGEDOOR_CONFIG_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("config"));
        let environment = std::env::var("STAGEDOOR_ENV").unwrap_or_else(|_| "local".into());
        Self::load_from(&dir, &environment)
    }

    /// Loads the built-in layers, then `dir`'s files for `environment`,
    /// then the environment variables.
    pub fn load_from(dir: &Path, environment: &str) -> Result<Self, ConfigError> {
        let built_in = BUILT_IN_LAYERS
            .iter()
            .find(|(name, _)| *name == environment)
            .map(|(_, text)| *text);
        let env_file = dir.join(format!("{environment}.toml"));
        if built_in.is_none() && !env_file.is_file() {
            return Err(ConfigError::NoLayer {
                environment: environment.to_owned(),
                file: env_file,
            });
        }
        let files = [dir.join("default.toml"), env_file];
        let mut builder =
            Config::builder().add_source(File::from_str(DEFAULT_LAYER, FileFormat::Toml));
        if let Some(text) = built_in {
            builder = builder.add_source(File::from_str(text, FileFormat::Toml));
        }
        for file in &files {
            builder = builder.add_source(File::from(file.as_path()).required(false));
        }
        builder = builder.add_source(environment_variables()?);
        let from_files = file_variables()?;
        for variable in &from_files {
            builder = builder.set_override(variable.key.as_str(), variable.value.as_str())?;
        }
        let layered = builder
            .set_override_option("database.url", std::env::var("DATABASE_URL").ok())?
            .build()?;
        let mut ignored = Vec::new();
        let mut settings: Settings =
            serde_ignored::deserialize(layered.clone(), |path| ignored.push(path.to_string()))?;
        if !ignored.is_empty() {
            return Err(ConfigError::Unknown {
                unknown: unknown::keys(&layered, &ignored, &files, &from_files)?,
            });
        }
        settings.environment = environment.to_owned();
        settings.validate()?;
        Ok(settings)
    }

    /// Every environment but the three made for development and tests
    /// gets production's rules: a typo or a name of the operator's own
    /// (`prod`, `staging`) must not run on development's defaults.
    pub fn is_production(&self) -> bool {
        !DEVELOPMENT_ENVIRONMENTS.contains(&self.environment.as_str())
    }
}

/// `STAGEDOOR__<SECTION>__<KEY>`, lists split at commas; the `…_FILE`
/// ones are [`file_variables`].
fn environment_variables() -> Result<Environment, ConfigError> {
    let mut values = config::Map::new();
    for (name, value) in stagedoor_variables() {
        if plain_variable(&name).is_none() {
            let value = utf8_value(&name, value)?;
            values.insert(name, value);
        }
    }
    Ok(Environment::with_prefix(ENV_PREFIX)
        .prefix_separator(ENV_SEPARATOR)
        .separator(ENV_SEPARATOR)
        .try_parsing(true)
        .list_separator(",")
        .with_list_parse_key("http.cors_origins")
        .source(Some(values)))
}

/// A key set by `STAGEDOOR__<SECTION>__<KEY>_FILE`.
#[derive(Debug)]
struct FileVariable {
    key: String,
    variable: String,
    value: String,
}

/// Each `STAGEDOOR__<SECTION>__<KEY>_FILE=<path>`: the key's value is read
/// from the file, the way an orchestrator mounts a secret, so that it is in
/// neither the environment (which `docker inspect` and `/proc` show) nor a
/// compose file. One final line break is dropped (`echo secret > file`).
fn file_variables() -> Result<Vec<FileVariable>, ConfigError> {
    let mut variables = Vec::new();
    for (variable, path) in stagedoor_variables() {
        let Some(plain) = plain_variable(&variable) else {
            continue;
        };
        let fail = |reason: String| ConfigError::Variable {
            variable: variable.clone(),
            reason,
        };
        // Two sources for one key: neither may silently win.
        if std::env::var_os(plain).is_some() {
            return Err(fail(format!(
                "is set together with `{plain}`: set one of the two"
            )));
        }
        let path = PathBuf::from(path);
        let text = std::fs::read_to_string(&path)
            .map_err(|err| fail(format!("cannot read {}: {err}", path.display())))?;
        let value = text.strip_suffix('\n').map_or(text.as_str(), |line| {
            line.strip_suffix('\r').unwrap_or(line)
        });
        variables.push(FileVariable {
            key: plain[ENV_PREFIX.len() + ENV_SEPARATOR.len()..]
                .to_lowercase()
                .replace(ENV_SEPARATOR, "."),
            value: value.to_owned(),
            variable,
        });
    }
    Ok(variables)
}

/// The variables named `STAGEDOOR__…`, in any case as `config` reads them
/// (names that are not UTF-8 are no setting's).
fn stagedoor_variables() -> impl Iterator<Item = (String, std::ffi::OsString)> {
    let prefix = format!("{ENV_PREFIX}{ENV_SEPARATOR}");
    std::env::vars_os().filter_map(move |(name, value)| {
        let name = name.into_string().ok()?;
        name.to_uppercase()
            .starts_with(&prefix)
            .then_some((name, value))
    })
}

/// `STAGEDOOR__AUTH__JWT_SECRET` for `STAGEDOOR__AUTH__JWT_SECRET_FILE`.
fn plain_variable(variable: &str) -> Option<&str> {
    let plain = variable.len().checked_sub(FILE_SUFFIX.len())?;
    (variable.is_char_boundary(plain) && variable[plain..].eq_ignore_ascii_case(FILE_SUFFIX))
        .then(|| &variable[..plain])
}

fn utf8_value(variable: &str, value: std::ffi::OsString) -> Result<String, ConfigError> {
    value.into_string().map_err(|_| ConfigError::Variable {
        variable: variable.to_owned(),
        reason: "is not UTF-8".to_owned(),
    })
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

impl HttpSettings {
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
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

    /// Settings production accepts: the local layer with its published
    /// secrets replaced by an operator's own, a real Payrail.
    fn production() -> Settings {
        let mut settings = Settings::load_from(&config_dir(), "local").unwrap();
        settings.environment = "production".into();
        settings.payrail.sandbox = false;
        settings.payrail.base_url = "https://payrail.example".into();
        settings.auth.jwt_secret = SecretString::from("an-operators-own-jwt-secret-6f1c2a");
        settings.payrail.api_key = SecretString::from("sk_live_an_operators_own_key_93b0");
        settings.payrail.webhook_secret =
            SecretString::from("whsec_an_operators_own_secret_0d7e4c81a2");
        settings
    }

    #[test]
    fn production_refuses_a_short_webhook_secret() {
        let mut settings = production();
        settings.payrail.webhook_secret = SecretString::from("x".repeat(31));
        let err = settings.validate().unwrap_err();
        assert!(err.to_string().contains("payrail.webhook_secret"), "{err}");
        settings.payrail.webhook_secret = SecretString::from("x".repeat(32));
        assert!(settings.validate().is_ok());
    }

    #[test]
    fn production_refuses_every_secret_the_repository_publishes() {
        let local = Settings::load_from(&config_dir(), "local").unwrap();
        let published = [
            ("auth.jwt_secret", local.auth.jwt_secret.clone()),
            ("payrail.api_key", local.payrail.api_key.clone()),
            (
                "payrail.webhook_secret",
                local.payrail.webhook_secret.clone(),
            ),
            (
                "database.url",
                SecretString::from(
                    "postgres://stagedoor:stagedoor-dev-only-password@postgres:5432/stagedoor",
                ),
            ),
        ];
        for (key, value) in published {
            let mut settings = production();
            assert!(settings.validate().is_ok());
            match key {
                "auth.jwt_secret" => settings.auth.jwt_secret = value.clone(),
                "payrail.api_key" => settings.payrail.api_key = value.clone(),
                "payrail.webhook_secret" => settings.payrail.webhook_secret = value.clone(),
                _ => settings.database.url = value.clone(),
            }
            let err = settings.validate().unwrap_err().to_string();
            assert!(err.contains(key), "{key}: {err}");
            assert!(
                !err.contains(value.expose_secret()),
                "the refusal shows the secret: {err}"
            );
            // The same secret elsewhere is fine: a local run is where it belongs.
            settings.environment = "local".into();
            assert!(settings.validate().is_ok(), "{key}");
        }
    }

    #[test]
    fn order_events_need_a_secret_of_32_bytes_beside_their_url() {
        let mut settings = production();
        settings.outcomes.webhook_url = "https://shop.example/stagedoor/events".into();
        let err = settings.validate().unwrap_err();
        assert!(err.to_string().contains("outcomes.webhook_secret"), "{err}");
        settings.outcomes.webhook_secret = SecretString::from("x".repeat(31));
        assert!(settings.validate().is_err());
        // The API tests' secret: published by the repository.
        settings.outcomes.webhook_secret =
            SecretString::from("stagedoor_events_test_0123456789abcdef");
        let err = settings.validate().unwrap_err();
        assert!(err.to_string().contains("outcomes.webhook_secret"), "{err}");
        settings.outcomes.webhook_secret = SecretString::from("an operator's own 32-byte secret!");
        assert!(settings.validate().is_ok());
        settings.outcomes.webhook_url = "http://shop.example/stagedoor/events".into();
        let err = settings.validate().unwrap_err();
        assert!(err.to_string().contains("outcomes.webhook_url"), "{err}");
        settings.outcomes.webhook_url.clear();
        settings.outcomes.timeout_ms = 0;
        let err = settings.validate().unwrap_err();
        assert!(err.to_string().contains("outcomes.timeout_ms"), "{err}");
    }

    #[test]
    fn production_refuses_to_start_without_payrail_api_key() {
        let mut settings = production();
        settings.payrail.api_key = SecretString::from(String::new());
        let err = settings.validate().unwrap_err();
        assert!(err.to_string().contains("payrail.api_key"), "{err}");
    }

    #[test]
    fn production_refuses_an_hs256_secret_beside_an_identity_provider() {
        let mut settings = production();
        settings.auth.jwks_url = "https://login.shop.example/jwks.json".into();
        settings.auth.issuer = "https://login.shop.example/".into();
        settings.auth.audience = "https://checkout.shop.example".into();
        let err = settings.validate().unwrap_err();
        assert!(err.to_string().contains("auth.jwt_secret"), "{err}");
        settings.auth.jwt_secret = SecretString::from(String::new());
        assert!(settings.validate().is_ok());
        // Outside production both may be set (tests mint HS256 tokens beside a provider).
        settings.environment = "local".into();
        settings.auth.jwt_secret = SecretString::from("an-operators-own-jwt-secret-6f1c2a");
        assert!(settings.validate().is_ok());
    }

    #[test]
    fn production_with_a_provider_needs_an_audience_and_no_secret() {
        let mut settings = production();
        settings.auth.jwt_secret = SecretString::from(String::new());
        settings.auth.jwks_url = "https://login.shop.example/jwks.json".into();
        settings.auth.issuer = "https://login.shop.example/".into();
        let err = settings.validate().unwrap_err();
        assert!(err.to_string().contains("auth.audience"), "{err}");
        settings.auth.audience = "https://checkout.shop.example".into();
        assert!(settings.validate().is_ok());
        settings.auth.oidc_issuer = "https://login.shop.example".into();
        let err = settings.validate().unwrap_err();
        assert!(err.to_string().contains("auth.oidc_issuer"), "{err}");
    }

    #[test]
    fn production_refuses_plain_http_to_payrail_and_the_identity_provider() {
        let mut settings = production();
        settings.auth.jwt_secret = SecretString::from(String::new());
        settings.auth.audience = "https://checkout.shop.example".into();
        settings.auth.jwks_url = "https://login.shop.example/jwks.json".into();
        settings.auth.issuer = "https://login.shop.example/".into();
        assert!(settings.validate().is_ok());
        let plain = [
            ("payrail.base_url", "http://payrail.example"),
            ("auth.jwks_url", "http://login.shop.example/jwks.json"),
            ("auth.oidc_issuer", "http://login.shop.example"),
        ];
        for (key, url) in plain {
            let mut settings = settings.clone();
            match key {
                "payrail.base_url" => settings.payrail.base_url = url.into(),
                "auth.jwks_url" => settings.auth.jwks_url = url.into(),
                _ => {
                    settings.auth.jwks_url.clear();
                    settings.auth.oidc_issuer = url.into();
                }
            }
            let err = settings.validate().unwrap_err().to_string();
            assert!(
                err.contains(key) && err.contains("https://"),
                "{key}: {err}"
            );
            settings.environment = "local".into();
            assert!(settings.validate().is_ok(), "{key}: http is fine locally");
        }
    }

    #[test]
    fn every_environment_but_local_test_and_compose_gets_production_rules() {
        let published = SecretString::from("dev-only-secret-change-me-dev-only-secret");
        for environment in ["production", "prod", "staging", "Production", ""] {
            let mut settings = production();
            settings.environment = environment.into();
            settings.auth.jwt_secret = published.clone();
            let err = settings.validate().unwrap_err().to_string();
            assert!(err.contains("auth.jwt_secret"), "{environment:?}: {err}");
        }
        for environment in ["local", "test", "compose"] {
            let mut settings = production();
            settings.environment = environment.into();
            settings.auth.jwt_secret = published.clone();
            assert!(settings.validate().is_ok(), "{environment}");
        }
    }

    #[test]
    fn production_secrets_are_long_enough_and_each_its_own() {
        let mut settings = production();
        settings.auth.jwt_secret = SecretString::from("x".repeat(31));
        let err = settings.validate().unwrap_err().to_string();
        assert!(err.contains("auth.jwt_secret"), "{err}");
        settings.auth.jwt_secret = SecretString::from("y".repeat(32));
        assert!(settings.validate().is_ok());

        settings.outcomes.webhook_url = "https://shop.example/events".into();
        settings.outcomes.webhook_secret = settings.payrail.webhook_secret.clone();
        let err = settings.validate().unwrap_err().to_string();
        assert!(err.contains("outcomes.webhook_secret"), "{err}");
        settings.outcomes.webhook_secret = SecretString::from("an operator's other secret, 32b+");
        assert!(settings.validate().is_ok());
        settings.environment = "local".into();
        settings.auth.jwt_secret = SecretString::from("z".repeat(16));
        assert!(settings.validate().is_ok(), "16 bytes is enough locally");
    }

    #[test]
    fn production_checks_the_issuer_of_a_jwks_providers_tokens() {
        let mut settings = production();
        settings.auth.jwt_secret = SecretString::from(String::new());
        settings.auth.audience = "https://checkout.shop.example".into();
        settings.auth.jwks_url = "https://login.shop.example/jwks.json".into();
        let err = settings.validate().unwrap_err().to_string();
        assert!(err.contains("auth.issuer"), "{err}");
        settings.auth.issuer = "https://login.shop.example/".into();
        assert!(settings.validate().is_ok());
        // Discovery checks the issuer it is given.
        settings.auth.issuer.clear();
        settings.auth.jwks_url.clear();
        settings.auth.oidc_issuer = "https://login.shop.example".into();
        assert!(settings.validate().is_ok());
    }

    #[test]
    fn production_refusals_of_urls_never_print_them() {
        let token_url = "http://collector.internal:4318/?token=sekrit-token-4c1d";
        for key in ["telemetry.otlp_endpoint", "outcomes.webhook_url"] {
            let mut settings = production();
            match key {
                "telemetry.otlp_endpoint" => settings.telemetry.otlp_endpoint = token_url.into(),
                _ => {
                    settings.outcomes.webhook_url = token_url.into();
                    settings.outcomes.webhook_secret =
                        SecretString::from("an operator's other secret, 32b+");
                }
            }
            let err = settings.validate().unwrap_err().to_string();
            assert!(
                err.contains(key) && err.contains("https://"),
                "{key}: {err}"
            );
            assert!(
                !err.contains("sekrit"),
                "{key}: the refusal prints the URL: {err}"
            );
            settings.environment = "local".into();
            assert!(settings.validate().is_ok(), "{key}: http is fine locally");
        }
    }

    #[test]
    fn production_takes_https_browser_origins_only() {
        let mut settings = production();
        settings.http.cors_origins = vec!["https://shop.example".into()];
        assert!(settings.validate().is_ok());
        settings
            .http
            .cors_origins
            .push("http://shop.example".into());
        let err = settings.validate().unwrap_err().to_string();
        assert!(err.contains("http.cors_origins"), "{err}");
        settings.environment = "local".into();
        assert!(settings.validate().is_ok());
    }

    #[test]
    fn database_tls_means_what_it_says() {
        let with_url = |environment: &str, url: &str| {
            let mut settings = production();
            settings.environment = environment.into();
            settings.database.url = SecretString::from(url.to_owned());
            settings
        };
        // verify-ca without a CA of its own: refused everywhere.
        for environment in ["local", "production"] {
            let settings = with_url(
                environment,
                "postgres://app:pw@db.internal/shop?sslmode=verify-ca",
            );
            let err = settings.validate().unwrap_err().to_string();
            assert!(
                err.contains("database.url") && err.contains("sslrootcert"),
                "{environment}: {err}"
            );
            assert!(!err.contains("pw@"), "the refusal prints the URL: {err}");
        }
        // A remote host that a machine in the path could strip to plain text.
        for mode in ["disable", "allow", "prefer"] {
            let url = format!("postgres://app:pw@db.internal/shop?sslmode={mode}");
            let err = with_url("production", &url)
                .validate()
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("database.url") && err.contains(mode),
                "{mode}: {err}"
            );
            assert!(with_url("local", &url).validate().is_ok(), "{mode} locally");
            let loopback = format!("postgres://app:pw@127.0.0.1/shop?sslmode={mode}");
            assert!(
                with_url("production", &loopback).validate().is_ok(),
                "{mode}"
            );
        }
        let remote_default = with_url("production", "postgres://app:pw@db.internal/shop");
        assert!(remote_default.validate().is_err(), "prefer is the default");
        // Encrypted without checking who answers: allowed, and said.
        let require = with_url(
            "production",
            "postgres://app:pw@db.internal/shop?sslmode=require",
        );
        assert!(require.validate().is_ok());
        assert!(require
            .warnings()
            .iter()
            .any(|w| w.contains("database.url") && w.contains("sslmode=require")));
        for good in [
            "postgres://app:pw@db.internal/shop?sslmode=verify-full",
            "postgres://app:pw@db.internal/shop?sslmode=verify-ca&sslrootcert=/etc/ca.pem",
        ] {
            let settings = with_url("production", good);
            assert!(settings.validate().is_ok(), "{good}");
            assert!(
                !settings
                    .warnings()
                    .iter()
                    .any(|w| w.contains("database.url")),
                "{good}"
            );
        }
    }

    #[test]
    fn the_metrics_listener_and_the_breaker_are_checked() {
        let mut settings = production();
        assert_eq!(settings.server.metrics_addr, "", "the local layer's");
        assert!(settings
            .warnings()
            .iter()
            .any(|w| w.contains("server.metrics_addr")));
        settings.server.metrics_addr = "0.0.0.0:9090".into();
        assert!(settings.validate().is_ok());
        assert!(settings.warnings().is_empty(), "{:?}", settings.warnings());
        settings.server.metrics_addr = "metrics:9090".into();
        let err = settings.validate().unwrap_err().to_string();
        assert!(err.contains("server.metrics_addr"), "{err}");
        settings.server.metrics_addr.clear();
        for (bad_secs, bad_days) in [(59, 0), (31_536_001, 3_651)] {
            let mut settings = settings.clone();
            settings.holds.retention_secs = bad_secs;
            let err = settings.validate().unwrap_err().to_string();
            assert!(err.contains("holds.retention_secs"), "{bad_secs}: {err}");
            settings.holds.retention_secs = 86_400;
            settings.outcomes.keep_days = bad_days;
            let err = settings.validate().unwrap_err().to_string();
            assert!(err.contains("outcomes.keep_days"), "{bad_days}: {err}");
        }
        for bad in [0, 10_001] {
            settings.payrail.breaker_failures = bad;
            let err = settings.validate().unwrap_err().to_string();
            assert!(err.contains("payrail.breaker_failures"), "{bad}: {err}");
        }
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
    fn the_request_timeout_is_between_one_second_and_five_minutes() {
        let mut settings = Settings::load_from(&config_dir(), "local").unwrap();
        assert_eq!(settings.http.request_timeout_secs, 10);
        for bad in [0, 301] {
            settings.http.request_timeout_secs = bad;
            let err = settings.validate().unwrap_err();
            assert!(
                err.to_string().contains("http.request_timeout_secs"),
                "{bad}: {err}"
            );
        }
        for good in [1, 300] {
            settings.http.request_timeout_secs = good;
            assert!(settings.validate().is_ok(), "{good}");
        }
    }

    #[test]
    fn clock_tolerances_are_bounded() {
        let mut settings = Settings::load_from(&config_dir(), "local").unwrap();
        let refused = |settings: &Settings, key: &str| {
            let err = settings.validate().unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        };
        settings.auth.leeway_secs = 301;
        refused(&settings, "auth.leeway_secs");
        settings.auth.leeway_secs = 300;
        assert!(settings.validate().is_ok());
        settings.auth.leeway_secs = 0;
        assert!(settings.validate().is_ok());
        for bad in [0, 901, u64::MAX] {
            settings.payrail.webhook_tolerance_secs = bad;
            refused(&settings, "payrail.webhook_tolerance_secs");
        }
        for good in [1, 900] {
            settings.payrail.webhook_tolerance_secs = good;
            assert!(settings.validate().is_ok());
        }
    }

    /// A config dir of its own with these files (the built-in layers under them).
    fn dir_with(test: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("stagedoor-config-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn the_built_in_layers_need_no_directory() {
        let settings = Settings::load_from(Path::new("/nonexistent"), "local").unwrap();
        assert!(settings.payrail.sandbox);
        assert!(!settings.auth.jwt_secret.expose_secret().is_empty());
    }

    #[test]
    fn a_file_overrides_the_built_in_defaults() {
        let dir = dir_with("override", &[("local.toml", "[server]\nport = 9999\n")]);
        let settings = Settings::load_from(&dir, "local").unwrap();
        assert_eq!(settings.server.port, 9999);
        assert!(settings.payrail.sandbox, "the built-in local layer stays");
    }

    #[test]
    fn an_unknown_key_in_a_file_is_named_with_the_nearest_known_one() {
        let dir = dir_with(
            "unknown",
            &[(
                "default.toml",
                "[database]\npool_sise = 3\n[idempotncy]\nttl_secs = 5\n",
            )],
        );
        let err = Settings::load_from(&dir, "local").unwrap_err().to_string();
        for expected in [
            "`database.pool_sise`",
            "`database.pool_size`",
            "`idempotncy.ttl_secs`",
            "`idempotency.ttl_secs`",
            "default.toml",
        ] {
            assert!(err.contains(expected), "{expected}: {err}");
        }
    }

    #[test]
    fn every_declared_key_is_in_the_built_in_defaults() {
        // The defaults are the list of known keys the errors suggest from.
        let layered = Config::builder()
            .add_source(File::from_str(DEFAULT_LAYER, FileFormat::Toml))
            .build()
            .unwrap();
        let mut ignored = Vec::new();
        let parsed: Result<Settings, _> =
            serde_ignored::deserialize(layered, |path| ignored.push(path.to_string()));
        assert!(parsed.is_ok(), "{:?}", parsed.err());
        assert!(ignored.is_empty(), "{ignored:?}");
    }

    #[test]
    fn an_unknown_environment_names_its_missing_file() {
        let err = Settings::load_from(&config_dir(), "nosuchenv").unwrap_err();
        assert!(err.to_string().contains("nosuchenv"), "{err}");
    }
}
