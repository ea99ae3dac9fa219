//! The command line, run as the real binary.

mod keys;
mod orders;

use std::process::Output;

use std::time::Duration;

use test_support::process::{free_port, Service};
use test_support::scratch::ScratchDir;

use crate::helpers::{spawn_app, Seen, TestApp};

/// The binary with `args`, on `app`'s database and configuration.
pub async fn run(app: &TestApp, args: &[&str], env: &[(&str, &str)]) -> Output {
    let plans = app.settings.database.generic_plans.to_string();
    let mut env = env.to_vec();
    env.insert(0, ("STAGEDOOR__DATABASE__GENERIC_PLANS", &plans));
    run_on(&app.db.url, args, &env).await
}

/// The binary with `args`, the local configuration, on `database_url`.
pub async fn run_on(database_url: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_stagedoor-checkout"))
        .args(args)
        .env(
            "STAGEDOOR_CONFIG_DIR",
            format!("{}/config", env!("CARGO_MANIFEST_DIR")),
        )
        .env("STAGEDOOR_ENV", "local")
        .env("DATABASE_URL", database_url)
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap()
}

#[tokio::test]
async fn token_prints_a_bearer_token_the_service_accepts() {
    let app = spawn_app().await;
    app.seed("show", 1, 1000).await;
    let output = run(
        &app,
        &["token", "--sub", "cli-buyer", "--ttl-secs", "60"],
        &[],
    )
    .await;
    assert!(output.status.success());
    let token = String::from_utf8(output.stdout).unwrap();
    let response = app
        .http
        .get(app.url("/events/show/seats"))
        .bearer_auth(token.trim())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let bad = run(&app, &["token", "--sub", &"x".repeat(256)], &[]).await;
    assert!(!bad.status.success());
}

#[tokio::test]
async fn seed_creates_an_event_idempotently_and_prints_a_summary() {
    let app = spawn_app().await;
    for created in [25, 0] {
        let output = run(
            &app,
            &[
                "seed",
                "--event",
                "cli-show",
                "--seats",
                "25",
                "--price-cents",
                "1200",
            ],
            &[],
        )
        .await;
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(summary["event_id"], "cli-show");
        assert_eq!(summary["seats"], 25);
        assert_eq!(summary["created"], created);
    }
    let seen = Seen::of(app.get_seats("alice", "cli-show").await).await;
    assert_eq!(seen.json()["seats"].as_array().unwrap().len(), 25);
}

#[tokio::test]
async fn migrate_is_idempotent() {
    let app = spawn_app().await;
    let output = run(&app, &["migrate"], &[]).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn a_bad_setting_stops_the_start_with_its_key_named() {
    let app = spawn_app().await;
    let cases = [
        (vec![("STAGEDOOR__SERVER__PORT", "eighty")], "port"),
        (vec![("STAGEDOOR__IDEMPOTENCY__LOCK", "zookeeper")], "lock"),
        (
            vec![("STAGEDOOR__PAYRAIL__TIMEOUT_MS", "0")],
            "payrail.timeout_ms",
        ),
        (vec![("STAGEDOOR_ENV", "production")], "auth.jwt_secret"),
    ];
    for (env, key) in cases {
        let output = run(&app, &["serve"], &env).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{env:?}");
        assert!(stderr.contains(key), "{env:?}: {stderr}");
    }
}

#[tokio::test]
async fn production_refuses_to_start_on_a_secret_the_repository_publishes() {
    let app = spawn_app().await;
    // What production needs, each an operator's own.
    let own = [
        ("STAGEDOOR_ENV", "production"),
        (
            "STAGEDOOR__AUTH__JWT_SECRET",
            "an-operators-own-jwt-secret-6f1c2a",
        ),
        ("STAGEDOOR__PAYRAIL__BASE_URL", "https://payrail.example"),
        (
            "STAGEDOOR__PAYRAIL__API_KEY",
            "sk_live_an_operators_own_key_93b0",
        ),
    ];
    let cases = [
        // config/local.toml's, and the compose file's fallbacks of before.
        (
            "STAGEDOOR__AUTH__JWT_SECRET",
            "dev-only-secret-change-me-dev-only-secret",
            "auth.jwt_secret",
        ),
        (
            "STAGEDOOR__AUTH__JWT_SECRET",
            "dev-only-compose-secret-change-me",
            "auth.jwt_secret",
        ),
        (
            "STAGEDOOR__PAYRAIL__API_KEY",
            "sk_test_stagedoor",
            "payrail.api_key",
        ),
        ("STAGEDOOR__PAYRAIL__API_KEY", "", "payrail.api_key"),
        (
            "STAGEDOOR__PAYRAIL__WEBHOOK_SECRET",
            "whsec-dev-only-compose-secret-change-me",
            "payrail.webhook_secret",
        ),
        (
            "DATABASE_URL",
            "postgres://stagedoor:stagedoor-dev-only-password@127.0.0.1:5432/stagedoor",
            "database.url",
        ),
        // Hole 5: HS256 beside the shop's identity provider.
        (
            "STAGEDOOR__AUTH__JWKS_URL",
            "https://login.shop.example/jwks.json",
            "auth.jwt_secret",
        ),
    ];
    for (variable, value, key) in cases {
        let mut env = own.to_vec();
        env.retain(|(name, _)| *name != variable);
        env.extend([
            (variable, value),
            ("STAGEDOOR__AUTH__AUDIENCE", "https://checkout.shop.example"),
            ("STAGEDOOR__AUTH__ISSUER", "https://login.shop.example/"),
        ]);
        let output = run(&app, &["serve"], &env).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{variable}={value} started");
        assert!(stderr.contains(key), "{variable}: {stderr}");
        if !value.is_empty() {
            assert!(
                !stderr.contains(value),
                "the refusal shows the value: {stderr}"
            );
        }
    }
}

/// A token minted by the `token` command with `env`, and what the service
/// answers it on the seat map of `event`.
async fn token_status(app: &TestApp, event: &str, env: &[(&str, &str)]) -> reqwest::StatusCode {
    let output = run(app, &["token", "--sub", "alice"], env).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let token = String::from_utf8(output.stdout).unwrap();
    app.http
        .get(app.url(&format!("/events/{event}/seats")))
        .bearer_auth(token.trim())
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn a_setting_can_be_read_from_the_file_a_variable_names() {
    let app = spawn_app().await;
    app.seed("from-file", 1, 1000).await;
    let dir = ScratchDir::new("stagedoor-secret-file-").unwrap();
    let secret = dir.path().join("jwt_secret");
    let path = secret.display().to_string();
    let from_file = [("STAGEDOOR__AUTH__JWT_SECRET_FILE", path.as_str())];

    // The service's own secret, as `echo` writes it: the final newline is no part of it.
    let own = secrecy::ExposeSecret::expose_secret(&app.settings.auth.jwt_secret).to_owned();
    std::fs::write(&secret, format!("{own}\n")).unwrap();
    assert_eq!(token_status(&app, "from-file", &from_file).await, 200);
    // The file, not the layer's secret, signed it.
    std::fs::write(&secret, "another-secret-than-the-services-0123").unwrap();
    assert_eq!(token_status(&app, "from-file", &from_file).await, 401);

    let refusals = [
        (
            vec![
                ("STAGEDOOR__AUTH__JWT_SECRET_FILE", path.as_str()),
                ("STAGEDOOR__AUTH__JWT_SECRET", own.as_str()),
            ],
            "STAGEDOOR__AUTH__JWT_SECRET_FILE",
        ),
        (
            vec![(
                "STAGEDOOR__AUTH__JWT_SECRET_FILE",
                "/nonexistent/jwt_secret",
            )],
            "/nonexistent/jwt_secret",
        ),
        (
            vec![("STAGEDOOR__AUTH__JWT_SECRT_FILE", path.as_str())],
            "STAGEDOOR__AUTH__JWT_SECRT_FILE",
        ),
    ];
    for (env, named) in refusals {
        let output = run(&app, &["token", "--sub", "alice"], &env).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{env:?}");
        assert!(stderr.contains(named), "{env:?}: {stderr}");
    }
}

#[tokio::test]
async fn a_misspelt_variable_stops_every_command_naming_the_nearest_key() {
    let app = spawn_app().await;
    let commands: [&[&str]; 6] = [
        &["serve"],
        &["migrate"],
        &["token", "--sub", "alice"],
        &["seed", "--event", "typo", "--seats", "1"],
        &["cleanup"],
        &["keys", "stats"],
    ];
    let typos = [
        ("STAGEDOOR__DATABSE__POOL_SIZE", "database.pool_size"),
        ("STAGEDOOR__IDEMPOTENCY__TTL_SECZ", "idempotency.ttl_secs"),
    ];
    for args in commands {
        for (variable, nearest) in typos {
            let output = run(&app, args, &[(variable, "3")]).await;
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success(), "{args:?} {variable}");
            assert!(stderr.contains(variable), "{args:?}: {stderr}");
            assert!(stderr.contains(nearest), "{args:?}: {stderr}");
        }
    }
    // Nothing was done: the seed command stopped before the database.
    let events = app
        .db
        .client()
        .await
        .query("SELECT 1 FROM seats WHERE event_id = 'typo'", &[])
        .await
        .unwrap();
    assert!(events.is_empty());
}

#[tokio::test]
async fn serve_and_token_run_from_a_directory_without_config() {
    let app = spawn_app().await;
    let elsewhere = ScratchDir::new("stagedoor-elsewhere-").unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_stagedoor-checkout"))
        .args(["token", "--sub", "alice"])
        .current_dir(elsewhere.path())
        .env("STAGEDOOR_CONFIG_DIR", "config")
        .env("STAGEDOOR_ENV", "local")
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let token = String::from_utf8(output.stdout).unwrap();

    // The built-in local layer: the embedded sandbox, the demo event, the dev secret.
    let port = free_port();
    let service = Service::new(
        env!("CARGO_BIN_EXE_stagedoor-checkout"),
        format!("http://127.0.0.1:{port}"),
    )
    .arg("serve")
    .current_dir(elsewhere.path())
    .env("STAGEDOOR_CONFIG_DIR", "config")
    .env("STAGEDOOR_ENV", "local")
    .env("DATABASE_URL", &app.db.url)
    .env("STAGEDOOR__SERVER__PORT", port.to_string())
    .env(
        "STAGEDOOR__DATABASE__GENERIC_PLANS",
        app.settings.database.generic_plans.to_string(),
    )
    .spawn_or_panic(Duration::from_secs(20))
    .await;
    let seats = app
        .http
        .get(format!("{}/events/demo/seats", service.url()))
        .bearer_auth(token.trim())
        .send()
        .await
        .unwrap();
    assert_eq!(seats.status(), 200);
    service.stop(Duration::from_secs(10)).await;
}
