//! The start waits for a database that is not up yet
//! (`database.connect_timeout_secs`), then gives up naming `database.url`:
//! the real binary, pointed at a port where nothing listens, and a real
//! PostgreSQL that comes up there later.

use std::time::{Duration, Instant};

use test_support::postgres::Postgres;
use test_support::process::{free_port, Service, ServiceProcess};

/// What a failed try logs (src/db.rs, `Patience::retrying`).
const RETRY_LINE: &str = "the database is not reachable yet; retrying";

/// `serve` with the local configuration (database created at start, the
/// embedded Payrail sandbox, the demo event) against `database_url`,
/// healthy once `/readyz` answers.
pub(crate) fn service(database_url: &str, connect_timeout_secs: Option<u64>) -> Service {
    let port = free_port();
    let mut service = Service::new(
        env!("CARGO_BIN_EXE_stagedoor-checkout"),
        format!("http://127.0.0.1:{port}"),
    )
    .arg("serve")
    .health_path("/readyz")
    .envs([
        ("STAGEDOOR_ENV", "local".to_owned()),
        (
            "STAGEDOOR_CONFIG_DIR",
            format!("{}/config", env!("CARGO_MANIFEST_DIR")),
        ),
        ("DATABASE_URL", database_url.to_owned()),
        ("STAGEDOOR__SERVER__PORT", port.to_string()),
        ("STAGEDOOR__SERVER__WORKERS", "1".to_owned()),
        ("STAGEDOOR__SERVER__SHUTDOWN_TIMEOUT_SECS", "1".to_owned()),
        ("RUST_LOG", "info".to_owned()),
    ]);
    if let Some(secs) = connect_timeout_secs {
        service = service.env(
            "STAGEDOOR__DATABASE__CONNECT_TIMEOUT_SECS",
            secs.to_string(),
        );
    }
    service
}

/// The WARN lines of the failed tries.
pub(crate) fn retries(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| line.contains("WARN") && line.contains(RETRY_LINE))
        .collect()
}

/// Waits (30 s at most) for the process to exit on its own.
pub(crate) async fn exit_of(process: &mut ServiceProcess) -> std::process::ExitStatus {
    match process.wait(Duration::from_secs(30)).await {
        Some(status) => status,
        None => panic!("still running after 30 s:\n{}", process.log()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_waits_for_a_database_that_comes_up_late_then_serves() {
    let pg_port = free_port();
    let url = format!("postgres://postgres@127.0.0.1:{pg_port}/stagedoor_late");
    // The default patience (60 s in config/default.toml).
    let mut process = service(&url, None).start().expect("start the service");

    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        process.try_exit_status().is_none(),
        "it waits instead of exiting:\n{}",
        process.log()
    );
    let waiting = process.log();
    assert!(
        retries(&waiting).len() >= 2,
        "a WARN line per failed try:\n{waiting}"
    );

    let server = tokio::task::spawn_blocking(move || Postgres::start_on(pg_port, &[]))
        .await
        .unwrap()
        .expect("a throwaway PostgreSQL (initdb must be installed)");
    if let Err(error) = process.wait_healthy(Duration::from_secs(60)).await {
        panic!("not ready once the database was up: {error}");
    }

    let log = process.log();
    let tries = retries(&log);
    assert!(tries.len() >= 2, "{log}");
    for line in &tries {
        // The error, and the wait before the next try.
        assert!(line.contains("error connecting to server"), "{line}");
        assert!(line.contains("retry_in_ms="), "{line}");
    }
    assert!(
        tries[0].contains("retry_in_ms=200"),
        "starts at 0.2 s: {}",
        tries[0]
    );
    assert!(
        tries[1].contains("retry_in_ms=400"),
        "then doubles: {}",
        tries[1]
    );
    assert!(log.contains("the database answers"), "{log}");

    // Created (create_if_missing), migrated and seeded on the late server.
    let client = test_support::db::connect(&server.url("stagedoor_late")).await;
    let seats: i64 = client
        .query_one("SELECT count(*) FROM seats WHERE event_id = 'demo'", &[])
        .await
        .expect("the service's tables")
        .get(0);
    assert_eq!(seats, 200);
    drop(client);

    let status = process.stop(Duration::from_secs(20)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "exit 0 on SIGTERM: {status:?}"
    );
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .unwrap();
}

#[tokio::test]
async fn serve_gives_up_after_connect_timeout_secs_naming_database_url() {
    let url = format!("postgres://postgres@127.0.0.1:{}/stagedoor", free_port());
    let started = Instant::now();
    let mut process = service(&url, Some(1)).start().expect("start the service");
    let status = exit_of(&mut process).await;
    let waited = started.elapsed();
    let log = process.log();
    assert!(!status.success(), "{status}:\n{log}");
    assert!(log.contains("database.url"), "names the key:\n{log}");
    assert!(
        log.contains("database.connect_timeout_secs"),
        "and the patience it ran out of:\n{log}"
    );
    // Tries at 0, 0.2, 0.6 and 1 s: the last one at the deadline.
    assert!(retries(&log).len() >= 2, "{log}");
    assert!(waited >= Duration::from_secs(1), "{waited:?}");
    assert!(waited < Duration::from_secs(20), "{waited:?}");
}

#[tokio::test]
async fn with_connect_timeout_0_serve_gives_up_at_the_first_refusal() {
    let url = format!("postgres://postgres@127.0.0.1:{}/stagedoor", free_port());
    let mut process = service(&url, Some(0)).start().expect("start the service");
    let status = exit_of(&mut process).await;
    let log = process.log();
    assert!(!status.success(), "{status}:\n{log}");
    assert!(log.contains("database.url"), "names the key:\n{log}");
    assert!(retries(&log).is_empty(), "no retry:\n{log}");
}
