//! TLS to PostgreSQL (`sslmode` and `sslrootcert` in `database.url`): the
//! real binary against a throwaway server that rejects every connection
//! without TLS, its certificate signed by a CA made for the test.

use std::time::Duration;

use serde_json::{json, Value};
use test_support::process::ServiceProcess;
use test_support::tls::{Certificate, TlsPostgres};

use crate::cli::run_on;
use crate::helpers::{new_key, order_body, Seen};
use crate::late_database::{exit_of, retries, service};

/// What `token` signs with here, whatever the local layer holds.
const SECRET: &str = "database-tls-test-secret-0123456789abcdef";

async fn tls_server() -> TlsPostgres {
    tls_server_with(Certificate::SignedByCa).await
}

async fn tls_server_with(certificate: Certificate) -> TlsPostgres {
    tokio::task::spawn_blocking(move || TlsPostgres::start_with(certificate))
        .await
        .unwrap()
        .expect("a throwaway PostgreSQL with TLS (initdb and openssl must be installed)")
}

/// Stopping a server waits for it: not on the runtime's threads.
async fn stop(server: TlsPostgres) {
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .unwrap();
}

async fn serving(url: &str) -> ServiceProcess {
    let mut process = service(url, None)
        .env("STAGEDOOR__AUTH__JWT_SECRET", SECRET)
        .start()
        .expect("start the service");
    if let Err(error) = process.wait_healthy(Duration::from_secs(60)).await {
        panic!("not ready: {error}");
    }
    process
}

/// The start refused: the process exits on its own, at the first try (a
/// certificate does not get better by waiting), naming `database.url` and
/// `why`.
async fn refused(url: &str, why: &str) {
    let mut process = service(url, None).start().expect("start the service");
    let status = exit_of(&mut process).await;
    let log = process.log();
    assert!(!status.success(), "{url}: {status}:\n{log}");
    assert!(log.contains("database.url"), "{url}: names the key:\n{log}");
    assert!(log.contains(why), "{url}: says {why:?}:\n{log}");
    assert!(retries(&log).is_empty(), "{url}: no retry:\n{log}");
}

fn cli_ok(output: &std::process::Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sslmode_require_a_buyer_pays_through_a_database_that_takes_only_tls() {
    let server = tls_server().await;
    let url = server.url("127.0.0.1", "stagedoor_tls", "sslmode=require");
    let process = serving(&url).await;

    let token = cli_ok(
        &run_on(
            &url,
            &["token", "--sub", "tls-buyer"],
            &[("STAGEDOOR__AUTH__JWT_SECRET", SECRET)],
        )
        .await,
        "token",
    );
    let http = reqwest::Client::new();
    let base = process.url().to_owned();
    let seats = Seen::of(
        http.get(format!("{base}/events/demo/seats"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(seats.status, 200, "{}", seats.text());
    let seat_id = seats.json()["seats"][0]["seat_id"].as_i64().unwrap();
    let hold = Seen::of(
        http.post(format!("{base}/holds"))
            .bearer_auth(&token)
            .header("Idempotency-Key", new_key())
            .json(&json!({ "seat_id": seat_id }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(hold.status, 201, "{}", hold.text());
    let hold_id = hold.json()["hold_id"].as_i64().unwrap();
    let order = Seen::of(
        http.post(format!("{base}/orders"))
            .bearer_auth(&token)
            .header("Idempotency-Key", new_key())
            .header("Content-Type", "application/json")
            .body(order_body(&[hold_id], "pm_card_visa"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(order.status, 201, "{}", order.text());
    assert_eq!(order.json()["status"], "paid");

    // The answer cache's listener is on TLS too (the server takes nothing
    // else), once it has connected.
    let pool = crate::helpers::pool(&url);
    let client = pool.get().await.unwrap();
    let listening = "SELECT count(*) FROM pg_stat_activity JOIN pg_stat_ssl USING (pid)
                     WHERE application_name = 'idempotency-listener' AND ssl";
    let mut tries = 0;
    while client
        .query_one(listening, &[])
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        tries += 1;
        assert!(
            tries < 100,
            "the listener never connected:\n{}",
            process.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(client);
    drop(pool);
    process.stop(Duration::from_secs(20)).await;
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_takes_the_servers_ca_and_refuses_another_ca_another_name_or_no_tls() {
    let server = tls_server().await;
    let ca = server.ca().display().to_string();
    let verified = |host: &str, mode: &str, root: &str| {
        server.url(
            host,
            "stagedoor_tls",
            &format!("sslmode={mode}&sslrootcert={root}"),
        )
    };

    // The CLI migrates and seeds through a verified connection, and `serve`
    // starts on one.
    let url = verified("localhost", "verify-full", &ca);
    cli_ok(&run_on(&url, &["migrate"], &[]).await, "migrate");
    let summary: Value = serde_json::from_str(&cli_ok(
        &run_on(&url, &["seed", "--event", "tls", "--seats", "3"], &[]).await,
        "seed",
    ))
    .unwrap();
    assert_eq!(summary["seats"], 3);
    serving(&verified("127.0.0.1", "verify-full", &ca))
        .await
        .stop(Duration::from_secs(20))
        .await;

    // A certificate for another name passes verify-ca (the chain only).
    let elsewhere = |mode: &str| {
        format!(
            "{}&hostaddr=127.0.0.1",
            verified("db.elsewhere.test", mode, &ca)
        )
    };
    cli_ok(
        &run_on(&elsewhere("verify-ca"), &["migrate"], &[]).await,
        "verify-ca",
    );

    let other_ca = server.other_ca().display().to_string();
    refused(
        &verified("localhost", "verify-full", &other_ca),
        "invalid peer certificate: UnknownIssuer",
    )
    .await;
    refused(&elsewhere("verify-full"), "invalid peer certificate").await;
    refused(
        &server.url("127.0.0.1", "stagedoor_tls", "sslmode=disable"),
        "no encryption",
    )
    .await;
    stop(server).await;
}

/// libpq's `prefer` and `require` take any certificate, even a bare
/// self-signed one the web PKI cannot read (Citus makes such for its
/// nodes, and turns `ssl` on), and the connection is still encrypted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_and_require_take_a_self_signed_version_1_certificate() {
    let server = tls_server_with(Certificate::SelfSignedV1).await;
    for mode in ["prefer", "require"] {
        let url = server.url("127.0.0.1", "stagedoor_tls", &format!("sslmode={mode}"));
        cli_ok(&run_on(&url, &["migrate"], &[]).await, mode);
    }
    // The default is `prefer`.
    let url = server.url("127.0.0.1", "stagedoor_tls", "");
    serving(&url).await.stop(Duration::from_secs(20)).await;
    refused(
        &server.url(
            "localhost",
            "stagedoor_tls",
            &format!("sslmode=verify-ca&sslrootcert={}", server.ca().display()),
        ),
        "invalid peer certificate",
    )
    .await;
    stop(server).await;
}

/// SPEC §13: `verify-ca` without `sslrootcert` would trust any public CA's
/// certificate for any name, so the start stops, naming `database.url`
/// (libpq refuses it too). In production, a connection that a machine in
/// the path could turn into plain text stops the start as well, and
/// `require` (encrypted, the server unauthenticated) starts with a warning.
/// No server is needed: each is refused before any connection.
#[tokio::test]
async fn sslmodes_that_would_trust_a_stranger_stop_the_start() {
    refused(
        "postgres://postgres@127.0.0.1:5432/stagedoor_tls?sslmode=verify-ca",
        "without sslrootcert",
    )
    .await;
    let production = [
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
    for mode in ["disable", "allow", "prefer"] {
        let url = format!("postgres://app:pw-9f1e@db.example.internal:5432/shop?sslmode={mode}");
        let output = run_on(&url, &["migrate"], &production).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{mode}: {stderr}");
        assert!(
            stderr.contains("database.url") && stderr.contains(&format!("sslmode={mode}")),
            "{mode}: {stderr}"
        );
        assert!(
            !stderr.contains("pw-9f1e"),
            "{mode}: the URL is printed: {stderr}"
        );
    }
    // `require` to a host that answers nothing: the start gets past the
    // configuration (its warning logged) to the connection, which fails.
    let url = "postgres://app:pw@127.0.0.2:9/shop?sslmode=require";
    let output = run_on(
        url,
        &["migrate"],
        &[
            production.as_slice(),
            &[("STAGEDOOR__DATABASE__CONNECT_TIMEOUT_SECS", "0")],
        ]
        .concat(),
    )
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "nothing answers there: {stderr}");
    assert!(
        stderr.contains("sslmode=require") && stderr.contains("WARN"),
        "the warning: {stderr}"
    );
}
