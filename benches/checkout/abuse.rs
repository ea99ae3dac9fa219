//! The abuse scenario: honest first clicks while an attacker does what the
//! threat model (docs/OPERATIONS.md) says it may try, segments with and
//! without the attack alternated (quiet, attack, attack, quiet, …) so that a
//! drift of the machine falls on both sides alike.
//!
//! The attacker, all at once: floods `POST /payrail/events` with a 64 KiB
//! body under a 120 KiB `Payrail-Signature` of empty `v1=` entries and a
//! current timestamp (no secret needed); keeps 500 connections stalled,
//! half in the middle of a request's head, half in the middle of an event's
//! body; clicks `pm_card_error` as five buyers at once (Payrail answers 500
//! and charges nothing: failures meant to open the circuit breaker for
//! everyone); and tries, as another buyer, to hold every seat of an event.
//! The service runs with the shipped defaults for what these attacks meet
//! (the breaker, the per-buyer limits, the request timeout).
//!
//! Judged: the honest clicks' p99 under attack against quiet, every honest
//! click answered 201, honest buyers still able to hold seats of the hoarded
//! event afterwards, and the invariants: no click charged twice, no seat in
//! two live holds or orders.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde_json::json;
use stagedoor_checkout::auth::{BuyerId, Tokens};
use stagedoor_checkout::config::{LockMode, Settings};
use test_support::invariants;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::capacity::{clear_ledger, double_charges};
use crate::load::Stats;
use crate::scenarios::{first_clicks, holds_for, order_rate, CONCURRENCY};
use crate::servers::RunningApp;
use crate::{fixtures, postgres, Bench};

/// The event the hoarder and the breaker's attacker take their seats from.
const HOARDED_EVENT: &str = "hoarded";
const HOARDED_SEATS: i64 = 5_000;
const STALLED_CONNECTIONS: usize = 500;
const SIGNATURE_FLOODERS: usize = 4;
/// The accounts whose failing clicks try to open the breaker: as many as
/// `payrail.breaker_failures`' default, the most it is made to withstand.
const BREAKER_ACCOUNTS: usize = 5;
/// Honest buyers who try to hold a seat of the hoarded event afterwards.
const HONEST_HOLDERS: usize = 20;
/// Each attacking task's pause between two requests: the attack is measured
/// by what it costs the service, not by the load generator's spinning on
/// the same two cores.
const ATTACKER_PAUSE: Duration = Duration::from_millis(5);

pub async fn abuse(bench: &mut Bench) {
    println!(
        "\n== abuse: first clicks at {CONCURRENCY} concurrent, quiet against under attack \
         (signature floods, {STALLED_CONNECTIONS} stalled connections, {BREAKER_ACCOUNTS} \
         buyers opening the breaker, a buyer hoarding holds), alternated"
    );
    let settings = attacked_settings(bench);
    let tokens = Tokens::new(&settings.auth.jwt_secret).expect("auth.jwt_secret");
    let app = RunningApp::start(settings).await;
    let seats = seed_hoarded_event(bench).await;
    clear_ledger(bench).await;
    let profile = &bench.profile;
    let segment_secs = (profile.segment + profile.warmup).as_secs_f64();
    let segments = 4 * profile.pairs.max(1);
    let holds = holds_for(bench, order_rate(bench), segment_secs * segments as f64).await;
    let tally = Arc::new(Tally::default());

    let (mut quiet, mut attacked): (Option<Stats>, Option<Stats>) = (None, None);
    for pair in 0..profile.pairs.max(1) {
        let attack_first = pair % 2 == 1;
        for under_attack in [attack_first, !attack_first] {
            let attack =
                under_attack.then(|| Attack::start(&app.url, &tokens, &seats, tally.clone()));
            if attack.is_some() {
                // The stalled connections are open and the floods running.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let stats = first_clicks(
                bench,
                &app.url,
                holds.clone(),
                CONCURRENCY,
                Duration::from_millis(500),
                profile.segment,
            )
            .await;
            if let Some(attack) = attack {
                attack.stop().await;
            }
            let side = if under_attack {
                &mut attacked
            } else {
                &mut quiet
            };
            match side {
                Some(side) => side.absorb(stats),
                None => *side = Some(stats),
            }
        }
    }
    let quiet = quiet.expect("at least one quiet segment");
    let attacked = attacked.expect("at least one attacked segment");
    println!("  quiet:        {}", quiet.summary());
    println!("  under attack: {}", attacked.summary());
    let attacks = tally.snapshot();
    println!("  the attacker's answers: {attacks:?}");

    let honest_holds_refused = honest_holders(bench, &app.url, &tokens).await;
    let (charges, doubles, orphans) = double_charges(bench).await;
    let db = postgres::connect(&bench.pg.bench_url()).await;
    let seats_twice = invariants::sql::seats_held_twice(&db).await.len();
    println!(
        "  honest buyers refused a hold of the hoarded event: {honest_holds_refused} of \
         {HONEST_HOLDERS}; ledger: {charges} charges, clicks charged twice: {doubles}, charges \
         without an order: {orphans}; seats in two live holds or orders: {seats_twice}"
    );
    app.stop().await;

    let report = &mut bench.report;
    report.set("abuse_quiet_rps", quiet.rps());
    report.set("abuse_quiet_p50_ms", quiet.p50_ms());
    report.set("abuse_quiet_p99_ms", quiet.p99_ms());
    report.set("abuse_attack_rps", attacked.rps());
    report.set("abuse_attack_p50_ms", attacked.p50_ms());
    report.set("abuse_attack_p99_ms", attacked.p99_ms());
    // No click answered under attack has no p99 at all: it counts as the
    // whole window, so an outage can never read as a pass.
    let attacked_p99_ms = if attacked.ok == 0 {
        attacked.secs * 1000.0
    } else {
        attacked.p99_ms()
    };
    report.set(
        "abuse_p99_ratio",
        attacked_p99_ms / quiet.p99_ms().max(1e-9),
    );
    let honest_refused = quiet.errors() + attacked.errors() + honest_holds_refused;
    report.set("abuse_honest_refused", honest_refused as f64);
    report.set("abuse_double_charges", (doubles + orphans) as f64);
    report.set("abuse_seats_sold_twice", seats_twice as f64);
    report.detail(
        "abuse",
        json!({
            "quiet": { "unexpected": format!("{:?}", quiet.statuses), "no_answer": quiet.failed },
            "attack": { "unexpected": format!("{:?}", attacked.statuses), "no_answer": attacked.failed },
            "attacker_answers": attacks
                .iter()
                .map(|((what, status), n)| (format!("{what} {status}"), json!(n)))
                .collect::<serde_json::Map<_, _>>(),
            "honest_holds_refused": honest_holds_refused,
        }),
    );
}

/// The bench's settings, with the shipped defaults back for everything an
/// attack meets: the breaker's threshold and the per-buyer limits (the
/// bench lifts them so that its own clicks are never refused).
fn attacked_settings(bench: &Bench) -> Settings {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let shipped = Settings::load_from(&dir, "local").expect("config/local.toml");
    let mut settings = bench.settings(LockMode::Table);
    settings.payrail.breaker_failures = shipped.payrail.breaker_failures;
    settings.payrail.breaker_open_secs = shipped.payrail.breaker_open_secs;
    settings.limits = shipped.limits.clone();
    settings.holds.max_per_buyer = shipped.holds.max_per_buyer;
    settings
}

/// Seeds the hoarded event (once) and returns its seat ids.
async fn seed_hoarded_event(bench: &Bench) -> Arc<Vec<i64>> {
    let client = postgres::connect(&bench.pg.bench_url()).await;
    client
        .execute(
            "INSERT INTO events (event_id) VALUES ($1) ON CONFLICT DO NOTHING",
            &[&HOARDED_EVENT],
        )
        .await
        .expect("the hoarded event");
    client
        .execute(
            "INSERT INTO seats (event_id, label, price_cents)
             SELECT $1, 'H' || g, 4500 FROM generate_series(1, $2::bigint) g
             WHERE NOT EXISTS (SELECT 1 FROM seats WHERE event_id = $1)",
            &[&HOARDED_EVENT, &HOARDED_SEATS],
        )
        .await
        .expect("the hoarded event's seats");
    let seats = client
        .query(
            "SELECT seat_id FROM seats WHERE event_id = $1 ORDER BY seat_id",
            &[&HOARDED_EVENT],
        )
        .await
        .expect("the hoarded event's seat ids")
        .iter()
        .map(|row| row.get(0))
        .collect();
    Arc::new(seats)
}

/// Honest buyers each try to hold one free seat of the hoarded event: how
/// many were refused.
async fn honest_holders(bench: &Bench, url: &str, tokens: &Tokens) -> u64 {
    let client = postgres::connect(&bench.pg.bench_url()).await;
    let free: Vec<i64> = client
        .query(
            "SELECT s.seat_id FROM seats s WHERE s.event_id = $1 AND NOT EXISTS (
                 SELECT 1 FROM holds h WHERE h.seat_id = s.seat_id
                   AND (h.order_id IS NOT NULL OR h.expires_at > now()))
             ORDER BY s.seat_id DESC LIMIT $2",
            &[&HOARDED_EVENT, &(HONEST_HOLDERS as i64)],
        )
        .await
        .expect("free seats of the hoarded event")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let http = fixtures::client(HONEST_HOLDERS);
    let mut refused = (HONEST_HOLDERS - free.len()) as u64;
    for (i, seat) in free.iter().enumerate() {
        let buyer = format!("honest-holder-{i}");
        let sent = http
            .post(format!("{url}/holds"))
            .header(AUTHORIZATION, bearer(tokens, &buyer))
            .json(&json!({ "seat_id": seat }))
            .send()
            .await;
        if !sent.is_ok_and(|answer| answer.status().as_u16() == 201) {
            refused += 1;
        }
    }
    refused
}

fn bearer(tokens: &Tokens, buyer: &str) -> String {
    let buyer = BuyerId::parse(buyer).expect("buyer id");
    let token = tokens
        .sign(&buyer, Duration::from_secs(3600))
        .expect("sign a token");
    format!("Bearer {token}")
}

/// What the attacker's requests were answered: (attack, status) → count;
/// status 0 is a connection the service closed (or never answered).
#[derive(Default)]
struct Tally(Mutex<BTreeMap<(&'static str, u16), u64>>);

impl Tally {
    fn count(&self, what: &'static str, status: u16) {
        *self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((what, status))
            .or_default() += 1;
    }

    fn snapshot(&self) -> BTreeMap<(&'static str, u16), u64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The attacker's tasks, running until `stop`.
struct Attack {
    stop: CancellationToken,
    tasks: JoinSet<()>,
}

impl Attack {
    fn start(url: &str, tokens: &Tokens, seats: &Arc<Vec<i64>>, tally: Arc<Tally>) -> Self {
        let stop = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let http = fixtures::client(SIGNATURE_FLOODERS + 4);
        for _ in 0..SIGNATURE_FLOODERS {
            tasks.spawn(signature_flood(
                http.clone(),
                url.to_owned(),
                tally.clone(),
                stop.clone(),
            ));
        }
        let address = url.trim_start_matches("http://").to_owned();
        for i in 0..STALLED_CONNECTIONS {
            tasks.spawn(stalled(
                address.clone(),
                i % 2 == 0,
                tally.clone(),
                stop.clone(),
            ));
        }
        for account in 0..BREAKER_ACCOUNTS {
            tasks.spawn(breaker_opener(
                http.clone(),
                url.to_owned(),
                seats.clone(),
                bearer(tokens, &format!("mallory-{account}")),
                account,
                tally.clone(),
                stop.clone(),
            ));
        }
        tasks.spawn(hoarder(
            http,
            url.to_owned(),
            seats.clone(),
            bearer(tokens, "hoarder"),
            tally,
            stop.clone(),
        ));
        Self { stop, tasks }
    }

    async fn stop(mut self) {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `POST /payrail/events` with no secret: a 64 KiB body under a 120 KiB
/// signature header of empty `v1=` entries and a current timestamp.
async fn signature_flood(
    http: reqwest::Client,
    url: String,
    tally: Arc<Tally>,
    stop: CancellationToken,
) {
    let body = format!(
        r#"{{"id":"evt_flood","pad":"{}"}}"#,
        "x".repeat(64 * 1024 - 40)
    );
    while !stop.is_cancelled() {
        let mut header = format!("t={}", unix_now());
        while header.len() < 120 * 1024 {
            header.push_str(",v1=");
        }
        let sent = http
            .post(format!("{url}/payrail/events"))
            .header("Payrail-Signature", header)
            .header(CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send();
        let status = tokio::select! {
            sent = sent => sent.map_or(0, |answer| answer.status().as_u16()),
            () = stop.cancelled() => break,
        };
        tally.count("signature flood", status);
        tokio::time::sleep(ATTACKER_PAUSE).await;
    }
}

/// A connection that sends part of a request and then nothing: the middle
/// of a head (`in_head`), or an event's whole head with a well-formed
/// signature and then the middle of its body. Opened again whenever the
/// service closes it.
async fn stalled(address: String, in_head: bool, tally: Arc<Tally>, stop: CancellationToken) {
    let what = if in_head {
        "stalled head"
    } else {
        "stalled body"
    };
    while !stop.is_cancelled() {
        let Ok(mut stream) = TcpStream::connect(&address).await else {
            tally.count(what, 0);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let partial = if in_head {
            format!("POST /orders HTTP/1.1\r\nHost: {address}\r\nContent-Type: appl")
        } else {
            format!(
                "POST /payrail/events HTTP/1.1\r\nHost: {address}\r\nContent-Type: \
                 application/json\r\nContent-Length: 65536\r\nPayrail-Signature: t={},v1={}\r\n\r\n\
                 {{\"id\":\"evt_",
                unix_now(),
                "0".repeat(64)
            )
        };
        if stream.write_all(partial.as_bytes()).await.is_err() {
            tally.count(what, 0);
            continue;
        }
        let mut answer = [0u8; 12];
        tokio::select! {
            read = stream.read(&mut answer) => {
                let status = match read {
                    Ok(n) if n >= 12 => std::str::from_utf8(&answer[9..12])
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0),
                    _ => 0,
                };
                tally.count(what, status);
            }
            () = stop.cancelled() => break,
        }
    }
}

/// One attacking account's clicks paid with `pm_card_error`: Payrail
/// answers 500 to every attempt. Each click holds a seat of the hoarded
/// event first.
async fn breaker_opener(
    http: reqwest::Client,
    url: String,
    seats: Arc<Vec<i64>>,
    auth: String,
    account: usize,
    tally: Arc<Tally>,
    stop: CancellationToken,
) {
    // Each account from its own place in the event, so that they seldom
    // want the same seat.
    let start = account * seats.len() / (2 * BREAKER_ACCOUNTS);
    for seat in seats.iter().cycle().skip(start) {
        if stop.is_cancelled() {
            break;
        }
        let Some(hold) = hold(&http, &url, &auth, *seat, "breaker's hold", &tally).await else {
            tokio::time::sleep(ATTACKER_PAUSE).await;
            continue;
        };
        let sent = http
            .post(format!("{url}/orders"))
            .header(AUTHORIZATION, &auth)
            .header("Idempotency-Key", Uuid::new_v4().to_string())
            .json(&json!({ "hold_ids": [hold], "payment_method": "pm_card_error" }))
            .send();
        let status = tokio::select! {
            sent = sent => sent.map_or(0, |answer| answer.status().as_u16()),
            () = stop.cancelled() => break,
        };
        tally.count("breaker's click", status);
        tokio::time::sleep(ATTACKER_PAUSE).await;
    }
}

/// One buyer holding seat after seat of the hoarded event.
async fn hoarder(
    http: reqwest::Client,
    url: String,
    seats: Arc<Vec<i64>>,
    auth: String,
    tally: Arc<Tally>,
    stop: CancellationToken,
) {
    // From the middle, so that the two attackers seldom want the same seat.
    let half = seats.len() / 2;
    for seat in seats[half..].iter().chain(&seats[..half]).cycle() {
        if stop.is_cancelled() {
            break;
        }
        hold(&http, &url, &auth, *seat, "hoarder's hold", &tally).await;
        tokio::time::sleep(ATTACKER_PAUSE).await;
    }
}

/// `POST /holds` of one seat; its hold id on a 201.
async fn hold(
    http: &reqwest::Client,
    url: &str,
    auth: &str,
    seat_id: i64,
    what: &'static str,
    tally: &Tally,
) -> Option<i64> {
    let answer = http
        .post(format!("{url}/holds"))
        .header(AUTHORIZATION, auth)
        .json(&json!({ "seat_id": seat_id }))
        .send()
        .await
        .ok()?;
    let status = answer.status().as_u16();
    tally.count(what, status);
    let body: serde_json::Value = answer.json().await.ok()?;
    (status == 201).then(|| body["hold_id"].as_i64()).flatten()
}
