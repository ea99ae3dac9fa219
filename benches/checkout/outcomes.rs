//! What the order events cost: first clicks on an instance that delivers
//! every event to a shop's receiver on loopback, against an instance that
//! delivers none, alternated (each settlement writes its event either way:
//! the write is part of both); then how fast one instance delivers a
//! backlog of events to that receiver.

use std::time::{Duration, Instant};

use serde_json::json;
use stagedoor_checkout::config::{LockMode, Settings};
use test_support::receiver::Receiver;

use crate::scenarios::{holds_for, order_rate, orders_to, CONCURRENCY, SEGMENT_WARMUP};
use crate::servers::RunningApp;
use crate::{load, postgres, Bench};

/// Signs the bench's events (the bench's own instances, never deployed).
const EVENTS_SECRET: &str = "stagedoor-bench-events-0123456789abcdef";
/// The longest the backlog may take to go out before the figure is given up.
const BACKLOG_WITHIN: Duration = Duration::from_secs(300);

fn delivering(bench: &Bench, receiver: &Receiver) -> Settings {
    let mut settings = bench.settings(LockMode::Table);
    settings.outcomes.webhook_url = receiver.url();
    settings.outcomes.webhook_secret = EVENTS_SECRET.to_owned().into();
    settings
}

pub async fn outcomes(bench: &mut Bench) {
    println!(
        "\n== outcomes: first clicks with the order events delivered (a receiver on loopback) \
         and not, alternating; then a backlog delivered"
    );
    let receiver = Receiver::start().await;
    let on = RunningApp::start(delivering(bench, &receiver)).await;
    let off = RunningApp::start(bench.settings(LockMode::Table)).await;
    let secs = (SEGMENT_WARMUP + bench.profile.segment).as_secs_f64() * bench.profile.pairs as f64;
    let (on_holds, off_holds) = (
        holds_for(bench, order_rate(bench), secs).await,
        holds_for(bench, order_rate(bench), secs).await,
    );
    let (with, without) = load::abba(
        bench.profile.pairs,
        CONCURRENCY,
        SEGMENT_WARMUP,
        bench.profile.segment,
        orders_to(
            format!("{}/orders", on.url),
            bench.buyers.clone(),
            on_holds,
            CONCURRENCY,
        ),
        orders_to(
            format!("{}/orders", off.url),
            bench.buyers.clone(),
            off_holds,
            CONCURRENCY,
        ),
    )
    .await;
    off.stop().await;
    println!("  events delivered: {}", with.summary());
    println!("    {}", with.cpu_summary());
    println!("  events not delivered: {}", without.summary());
    println!("    {}", without.cpu_summary());
    bench.report.set("order_rps_outbox_on", with.rps());
    bench.report.set("order_rps_outbox_off", without.rps());
    bench
        .report
        .set("outbox_order_ratio", with.rps() / without.rps());

    // The backlog: every event written so far, due again at once, while
    // the delivering instance (the only one left) sends them.
    let monitor = postgres::connect(&bench.pg.bench_url()).await;
    let undelivered = "SELECT count(*) FROM order_events WHERE delivered_at IS NULL";
    let started = Instant::now();
    let events = monitor
        .execute(
            "UPDATE order_events SET delivered_at = NULL, given_up_at = NULL, attempts = 0,
                    retry_from = now(), next_attempt_at = now(), lease_token = lease_token + 1",
            &[],
        )
        .await
        .expect("the backlog");
    let mut left: i64 = events as i64;
    while left > 0 && started.elapsed() < BACKLOG_WITHIN {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = monitor
            .query_one(undelivered, &[])
            .await
            .expect(undelivered)
            .get(0);
    }
    let took = started.elapsed().as_secs_f64();
    on.stop().await;
    let delivered = events as f64 - left as f64;
    println!(
        "  backlog: {delivered} of {events} events delivered in {took:.1} s \
         ({:.0} events/s to a receiver on loopback)",
        delivered / took
    );
    bench
        .report
        .set("outbox_delivery_events_per_s", delivered / took);
    bench.report.detail(
        "outcomes",
        json!({
            "on_p99_ms": with.p99_ms(),
            "off_p99_ms": without.p99_ms(),
            "errors": [with.errors(), without.errors()],
            "cpu_per_request": { "on": with.cpu_json(), "off": without.cpu_json() },
            "backlog_events": events,
            "backlog_left": left,
            "backlog_secs": took,
            "receiver_requests": receiver.received().len(),
        }),
    );
}
