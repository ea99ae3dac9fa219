//! `serve` raises its soft limit on open files to the hard one, and logs
//! both, so that a crowd's connections are not refused at a limit the
//! operator never chose.

use std::time::Duration;

use test_support::process::{free_port, Service};

use crate::helpers::spawn_app;

/// The soft and hard "Max open files" of a running process.
fn open_files_of(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .unwrap();
    let mut values = line["Max open files".len()..].split_whitespace();
    (
        values.next().unwrap().to_owned(),
        values.next().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn serve_raises_its_soft_open_files_limit_to_the_hard_one() {
    let app = spawn_app().await;
    let port = free_port();
    // `prlimit` runs the service in its own place with the soft limit
    // lowered, the hard one as it is.
    let process = Service::new("prlimit", format!("http://127.0.0.1:{port}"))
        .args([
            "--nofile=256:",
            env!("CARGO_BIN_EXE_stagedoor-checkout"),
            "serve",
        ])
        .envs(app.process_env(&app.settings, port))
        .env("RUST_LOG", "info")
        .spawn_or_panic(Duration::from_secs(10))
        .await;
    let (soft, hard) = open_files_of(process.pid().unwrap());
    assert_ne!(
        hard, "256",
        "the hard limit leaves room to raise the soft one"
    );
    assert_eq!(soft, hard);

    let log = process.log();
    let line = log
        .lines()
        .find(|line| line.contains("open files: the soft limit is the hard limit"))
        .unwrap_or_else(|| panic!("no line on the limits in:\n{log}"));
    assert!(line.contains("soft_before=256"), "{line}");
    assert!(line.contains(&format!("hard={hard}")), "{line}");
}
