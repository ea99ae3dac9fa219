//! The crate's pieces against the real thing: the machine's PostgreSQL
//! (`DATABASE_URL`), a throwaway server, real processes, real HTTP.

use std::time::Duration;

use test_support::db::{self, TestDatabase};
use test_support::postgres::Postgres;
use test_support::process::{free_port, Service, SpawnError};
use test_support::Seen;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers every connection with `response` (a whole HTTP/1.1 response);
/// returns its base URL.
async fn serve(response: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    url
}

const HEALTHY: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";

#[tokio::test]
async fn a_test_database_is_its_own_and_goes_with_its_last_holder() {
    let db = TestDatabase::create().await;
    let name: String = db
        .client()
        .await
        .query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(name, db.name);
    let pool = db.pool(2);
    let one: i32 = pool
        .get()
        .await
        .unwrap()
        .query_one("SELECT 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(one, 1);
    drop(pool);

    let second = db.clone();
    let name = db.name.clone();
    drop(db);
    let maintenance = db::connect(&db::maintenance_url()).await;
    let exists = "SELECT count(*) FROM pg_database WHERE datname = $1";
    let row = maintenance.query_one(exists, &[&name]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 1, "a holder is left");
    drop(second);
    let row = maintenance.query_one(exists, &[&name]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 0, "dropped with the last holder");
}

async fn max_connections(client: &tokio_postgres::Client) -> String {
    let row = client.query_one("SHOW max_connections", &[]).await.unwrap();
    row.get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throwaway_server_starts_restarts_and_is_gone_on_drop() {
    let server = tokio::task::spawn_blocking(|| Postgres::start(&["max_connections=20"]))
        .await
        .unwrap()
        .expect("a throwaway PostgreSQL (initdb must be installed)");
    let url = server.url("postgres");
    let client = db::connect(&url).await;
    assert_eq!(max_connections(&client).await, "20");
    let log = server.log_path();
    let server = tokio::task::spawn_blocking(move || {
        server.restart().expect("restart");
        server
    })
    .await
    .unwrap();
    assert!(client.query_one("SELECT 1", &[]).await.is_err(), "cut off");
    let again = db::connect(&url).await;
    assert_eq!(
        max_connections(&again).await,
        "20",
        "kept across the restart"
    );
    drop(again);
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .unwrap();
    assert!(!log.exists(), "its directory is removed");
    assert!(tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throwaway_server_takes_the_port_it_is_given_and_no_other() {
    let port = free_port();
    let server = tokio::task::spawn_blocking(move || Postgres::start_on(port, &[]))
        .await
        .unwrap()
        .expect("a throwaway PostgreSQL (initdb must be installed)");
    assert_eq!(server.port(), port);
    assert!(server.url("postgres").contains(&format!(":{port}/")));
    let client = db::connect(&server.url("postgres")).await;
    client.query_one("SELECT 1", &[]).await.unwrap();
    // A second one cannot have it, and says which port it wanted.
    let taken = tokio::task::spawn_blocking(move || Postgres::start_on(port, &[]))
        .await
        .unwrap()
        .expect_err("the port is taken");
    assert!(taken.contains(&format!("port {port}")), "{taken}");
    drop(client);
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_process_that_exits_at_start_says_so_with_its_log() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let error = Service::new("sh", url)
        .args(["-c", "echo starting up; echo no database >&2; exit 3"])
        .spawn(Duration::from_secs(10))
        .await
        .expect_err("it exits");
    let SpawnError::Exited { status, log } = &error else {
        panic!("{error}");
    };
    assert_eq!(status.code(), Some(3));
    assert!(
        log.contains("starting up") && log.contains("no database"),
        "{log}"
    );
}

#[tokio::test]
async fn a_process_that_never_answers_is_reported_and_killed() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let error = Service::new("sleep", url)
        .arg("30")
        .spawn(Duration::from_millis(300))
        .await
        .expect_err("nothing answers");
    assert!(matches!(error, SpawnError::Unhealthy { .. }), "{error}");
}

#[tokio::test]
async fn a_healthy_process_is_stopped_with_sigterm_or_killed() {
    let url = serve(HEALTHY).await;
    let service = Service::new("sleep", url.clone()).arg("30");
    let process = service.spawn(Duration::from_secs(10)).await.unwrap();
    assert_eq!(process.url(), url);
    let status = process.stop(Duration::from_secs(5)).await.expect("exits");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(15), "{status}");

    let mut process = service.spawn(Duration::from_secs(10)).await.unwrap();
    assert!(process.try_exit_status().is_none());
    let status = process.kill().await.expect("gone");
    assert_eq!(status.signal(), Some(9), "{status}");
}

#[tokio::test]
async fn seen_reads_status_headers_body_and_the_problem_slug() {
    let url = serve(
        "HTTP/1.1 409 Conflict\r\ncontent-type: application/problem+json\r\n\
         retry-after: 1\r\nidempotent-replayed: true\r\nconnection: close\r\n\
         content-length: 103\r\n\r\n\
         {\"type\":\"https://stagedoor.example/problems/request-in-progress\",\
         \"status\":409,\"title\":\"t\",\"detail\":\"d\"}",
    )
    .await;
    let response = reqwest::get(format!("{url}/orders")).await.unwrap();
    let seen = Seen::of(response).await;
    assert_eq!(seen.status, 409);
    assert_eq!(seen.slug.as_deref(), Some("request-in-progress"));
    assert_eq!(seen.problem(), "request-in-progress");
    assert_eq!(seen.retry_after_secs(), Some(1));
    assert!(seen.replayed);
    assert_eq!(seen.location, None);
}
