//! The on-sale: a crowd of buyers polls one event's seat map every 2 s, holds
//! the best seats it sees available and pays for them, until the event is
//! sold out; then first clicks from thousands of connections at once (the
//! crowd's clicks) beside the same from 64.
//!
//! Each buyer polls `GET /events/{id}/seats` with the `ETag` of its last map
//! (`If-None-Match`, `Accept-Encoding: gzip`) from before the sale opens;
//! once it has made up its mind (a moment of its own), it picks 1–4 adjacent
//! seats it
//! saw `available`, far more often near the front (the lowest seat ids) than
//! at the back, holds them one by one, and pays for what it got with a new
//! `Idempotency-Key`, retried as web/client/checkout.js retries a click. The
//! buyers share a bounded number of connections, as 20,000 browsers share
//! the service's cores: the sale measures what the service does for the
//! crowd, at whatever rate the connections carry.
//!
//! The sale runs in a database of its own, with the sandbox's ledger cleared
//! first, so that the invariants' checker (`test_support::invariants`)
//! judges exactly the sale's orders and charges: a seat sold twice, a second
//! charge for one order or key, a paid order without its charge fail the
//! bench.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flate2::read::GzDecoder;
use hdrhistogram::Histogram;
use reqwest::header::{
    HeaderValue, ACCEPT_ENCODING, AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE, ETAG,
    IF_NONE_MATCH,
};
use reqwest::RequestBuilder;
use serde::Deserialize;
use serde_json::{json, Value};
use stagedoor_checkout::checkout::seat_maps::TRUSTED_AFTER;
use stagedoor_checkout::checkout::seats::{self, OWN_HOLDS_STATEMENT, SEAT_MAP_STATEMENT};
use stagedoor_checkout::config::LockMode;
use stagedoor_checkout::startup;
use test_support::db::TestDatabase;
use test_support::{invariants, sandbox, Rng, Seen};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::capacity::clear_ledger;
use crate::fixtures::{self, Buyers};
use crate::load::{self, Stats};
use crate::scenarios::{first_clicks, holds_for, order_rate, seen, CONCURRENCY, SEGMENT_WARMUP};
use crate::servers::{self, RunningApp};
use crate::{postgres, Bench};

const EVENT: &str = "onsale";
/// How often each buyer asks for the map: twice as often as the demo page,
/// a crowd keen on its seats.
const POLL: Duration = Duration::from_secs(2);
/// The crowd is there before the sale opens: it watches a map that does not
/// change (its polls are 304s) for this long.
const OPENING: Duration = Duration::from_secs(4);
/// Buyers make up their minds at different moments: each tries for seats
/// first at a moment drawn uniformly from this long after the sale opens,
/// then at every poll until it has paid. With ten buyers a seat, the sale
/// lasts several polls, and most of the crowd is still watching the map
/// when it sells out, as at a real on-sale.
const DECIDING: Duration = Duration::from_secs(240);
/// The connections the whole crowd shares.
const CONNECTIONS: usize = 256;
/// A run replays with the same seed: each buyer's picks are a stream of it.
const SEED: u64 = 0x5EA7_0A5A_1E00;
/// web/client/checkout.js's defaults: attempts per click, and the backoff
/// after an attempt with no answer.
const MAX_ATTEMPTS: u32 = 10;
const BACKOFF_FIRST_MS: f64 = 500.0;
const BACKOFF_MAX_MS: f64 = 8_000.0;
/// When a 409 request-in-progress or a 429 names no `Retry-After`.
const RETRY_AFTER_FALLBACK: Duration = Duration::from_secs(1);

pub async fn onsale(bench: &mut Bench) {
    sale(bench).await;
    crowd(bench).await;
}

/// What the crowd shares: the service, the connections, the maps it has
/// read, and the tallies.
struct Sale {
    http: reqwest::Client,
    connections: Semaphore,
    map_url: String,
    holds_url: String,
    orders_url: String,
    buyers: Buyers,
    seats: u64,
    /// The available seats of each map the crowd has read, by its `ETag`: a
    /// 200 with a tag already read is that same map, so the load generator
    /// decodes each map once instead of once per buyer, and its CPU stays
    /// with the service on the shared cores.
    maps: Mutex<HashMap<String, Arc<Vec<i64>>>>,
    tally: Tally,
    clicks: Mutex<Histogram<u64>>,
    start: Instant,
    sold_out_at: Mutex<Option<Instant>>,
    over: CancellationToken,
}

#[derive(Default)]
struct Tally {
    views_200: AtomicU64,
    views_304: AtomicU64,
    holds: AtomicU64,
    seat_unavailable: AtomicU64,
    orders: AtomicU64,
    seats_sold: AtomicU64,
    /// Attempts of a click after its first.
    retries: AtomicU64,
    /// Answers the sale does not expect, by request, status and slug.
    unexpected: Mutex<BTreeMap<String, u64>>,
}

#[derive(Deserialize)]
struct Map<'a> {
    #[serde(borrow)]
    seats: Vec<MapSeat<'a>>,
}

#[derive(Deserialize)]
struct MapSeat<'a> {
    seat_id: i64,
    status: &'a str,
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sale {
    /// Counts an answer the sale does not expect: `what` was asked, and
    /// this status (and problem), or no answer.
    fn unexpected(&self, what: &str, status: Option<(u16, Option<&str>)>) {
        let name = match status {
            Some((status, Some(slug))) => format!("{what} {status} {slug}"),
            Some((status, None)) => format!("{what} {status}"),
            None => format!("{what}: no answer"),
        };
        *locked(&self.tally.unexpected).entry(name).or_default() += 1;
    }

    /// One request on one of the shared connections, and how long its
    /// answer took once a connection was free.
    async fn answer(&self, request: RequestBuilder) -> (Option<Seen>, Duration) {
        let _connection = self.connections.acquire().await.expect("never closed");
        let sent = Instant::now();
        let seen = seen(request.send().await).await;
        (seen, sent.elapsed())
    }

    /// Polls the map with the tag of the last one; on a new map, its tag and
    /// its available seats replace the buyer's.
    async fn view(&self, buyer: usize, tag: &mut Option<HeaderValue>, seats: &mut Arc<Vec<i64>>) {
        let mut request = self
            .http
            .get(&self.map_url)
            .header(AUTHORIZATION, self.buyers.auth[buyer].clone())
            .header(ACCEPT_ENCODING, "gzip");
        if let Some(tag) = tag.as_ref() {
            request = request.header(IF_NONE_MATCH, tag.clone());
        }
        let read = {
            let _connection = self.connections.acquire().await.expect("never closed");
            async {
                let response = request.send().await?;
                let headers = response.headers();
                let status = response.status().as_u16();
                let etag = headers.get(ETAG).cloned();
                let gzipped = headers.get(CONTENT_ENCODING).is_some_and(|e| e == "gzip");
                Ok::<_, reqwest::Error>((status, etag, gzipped, response.bytes().await?))
            }
            .await
        };
        match read {
            Ok((304, ..)) => {
                self.tally.views_304.fetch_add(1, Ordering::Relaxed);
            }
            Ok((200, Some(etag), gzipped, body)) => {
                self.tally.views_200.fetch_add(1, Ordering::Relaxed);
                *seats = self.available(&etag, gzipped, &body);
                *tag = Some(etag);
            }
            Ok((status, ..)) => self.unexpected("view", Some((status, None))),
            Err(_) => self.unexpected("view", None),
        }
    }

    fn available(&self, tag: &HeaderValue, gzipped: bool, body: &[u8]) -> Arc<Vec<i64>> {
        let tag = String::from_utf8_lossy(tag.as_bytes()).into_owned();
        if let Some(known) = locked(&self.maps).get(&tag) {
            return known.clone();
        }
        let json = if gzipped {
            let mut json = Vec::with_capacity(body.len() * 16);
            GzDecoder::new(body)
                .read_to_end(&mut json)
                .expect("a gzipped seat map");
            Cow::Owned(json)
        } else {
            Cow::Borrowed(body)
        };
        let map: Map = serde_json::from_slice(&json).expect("a seat map");
        let available: Arc<Vec<i64>> = Arc::new(
            map.seats
                .into_iter()
                .filter(|s| s.status == "available")
                .map(|s| s.seat_id)
                .collect(),
        );
        locked(&self.maps).insert(tag, available.clone());
        available
    }

    /// A hold of `seat`, or `None` when another buyer was first.
    async fn hold(&self, buyer: usize, seat: i64) -> Option<i64> {
        let request = self
            .http
            .post(&self.holds_url)
            .header(AUTHORIZATION, self.buyers.auth[buyer].clone())
            .header(CONTENT_TYPE, "application/json")
            .body(json!({ "seat_id": seat }).to_string());
        let (seen, _) = self.answer(request).await;
        self.tally.holds.fetch_add(1, Ordering::Relaxed);
        match seen {
            Some(seen) if seen.status == 201 => serde_json::from_slice::<Value>(&seen.body)
                .ok()
                .and_then(|hold| hold["hold_id"].as_i64()),
            Some(seen) if seen.slug.as_deref() == Some("seat-unavailable") => {
                self.tally.seat_unavailable.fetch_add(1, Ordering::Relaxed);
                None
            }
            other => {
                self.unexpected("hold", other.as_ref().map(answered));
                None
            }
        }
    }

    /// The click that pays for `holds`: one key, retried as the browser
    /// client retries it. Whether it was paid.
    async fn pay(&self, buyer: usize, holds: &[i64], rng: &mut Rng) -> bool {
        let key = Uuid::new_v4().to_string();
        let body = json!({ "hold_ids": holds, "payment_method": "pm_card_visa" }).to_string();
        let (mut took, mut failures) = (Duration::ZERO, 0);
        for _ in 0..MAX_ATTEMPTS {
            let request = self
                .http
                .post(&self.orders_url)
                .header(AUTHORIZATION, self.buyers.auth[buyer].clone())
                .header("Idempotency-Key", &key)
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone());
            let (seen, elapsed) = self.answer(request).await;
            took += elapsed;
            let retry_after = seen
                .as_ref()
                .and_then(|s| s.retry_after.as_deref())
                .and_then(|s| s.trim().parse().ok())
                .map(Duration::from_secs);
            let wait = match &seen {
                Some(seen) if seen.status == 201 => {
                    self.paid(holds.len() as u64, took);
                    return true;
                }
                Some(seen) if seen.status < 500 && seen.status != 408 => {
                    let not_yet =
                        seen.status == 429 || seen.slug.as_deref() == Some("request-in-progress");
                    if !not_yet {
                        self.unexpected("order", Some(answered(seen)));
                        return false;
                    }
                    retry_after.unwrap_or(RETRY_AFTER_FALLBACK)
                }
                // No answer, a 5xx or a 408: capped exponential backoff
                // with full jitter, a 503's Retry-After as its floor.
                _ => {
                    failures += 1;
                    let ceiling = (BACKOFF_FIRST_MS * 2f64.powi(failures - 1)).min(BACKOFF_MAX_MS);
                    Duration::from_secs_f64(rng.unit() * ceiling / 1000.0)
                        .max(retry_after.unwrap_or_default())
                }
            };
            self.tally.retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(wait).await;
            took += wait;
        }
        self.unexpected(&format!("order after {MAX_ATTEMPTS} attempts"), None);
        false
    }

    fn paid(&self, seats: u64, took: Duration) {
        locked(&self.clicks).saturating_record(took.as_micros().max(1) as u64);
        self.tally.orders.fetch_add(1, Ordering::Relaxed);
        let sold = self.tally.seats_sold.fetch_add(seats, Ordering::Relaxed) + seats;
        if sold >= self.seats {
            locked(&self.sold_out_at).get_or_insert_with(Instant::now);
            self.over.cancel();
        }
    }

    /// One buyer: polls until the sale is over, and tries for seats after
    /// each poll that shows some, until it has paid for some.
    async fn buyer(self: Arc<Self>, buyer: usize) {
        let mut rng = Rng::stream(SEED, buyer as u64);
        // The crowd arrives over one polling period, not in one instant.
        let mut due = self.start + POLL.mul_f64(rng.unit());
        let decided = self.start + OPENING + DECIDING.mul_f64(rng.unit());
        let (mut tag, mut available) = (None, Arc::new(Vec::new()));
        loop {
            tokio::select! {
                () = self.over.cancelled() => return,
                () = tokio::time::sleep_until(due) => {}
            }
            // A buyer who fell behind polls again at once, never in bursts.
            due = (due + POLL).max(Instant::now());
            self.view(buyer, &mut tag, &mut available).await;
            if Instant::now() < decided {
                continue;
            }
            let mut holds = Vec::new();
            for seat in pick(&available, &mut rng) {
                if self.over.is_cancelled() {
                    return;
                }
                holds.extend(self.hold(buyer, seat).await);
            }
            if !holds.is_empty() {
                self.pay(buyer, &holds, &mut rng).await;
                return;
            }
        }
    }
}

fn answered(seen: &Seen) -> (u16, Option<&str>) {
    (seen.status, seen.slug.as_deref())
}

/// 1–4 adjacent seats of those available, from a place near the front far
/// more often than near the back (the cube of a uniform draw), so that the
/// best seats are fought over.
fn pick(available: &[i64], rng: &mut Rng) -> Vec<i64> {
    if available.is_empty() {
        return Vec::new();
    }
    let want = 1 + rng.below(4) as usize;
    let from = (rng.unit().powi(3) * available.len() as f64) as usize;
    let from = from.min(available.len().saturating_sub(want));
    available[from..].iter().take(want).copied().collect()
}

async fn sale(bench: &mut Bench) {
    let profile = &bench.profile;
    let (seats, crowd_size) = (profile.sale_seats, profile.sale_buyers);
    println!(
        "\n== onsale: {crowd_size} buyers poll a {seats}-seat map every {} s from {} s before \
         the opening and buy 1-4 seats each over {CONNECTIONS} shared connections, until it is \
         sold out",
        POLL.as_secs(),
        OPENING.as_secs()
    );
    let database = TestDatabase::create_on(&bench.pg.url("postgres")).await;
    let settings = servers::settings(&database.url, &bench.sandbox_url, LockMode::Table);
    startup::prepare_database(&settings)
        .await
        .expect("prepare the on-sale's database");
    {
        let pool = database.pool(1);
        let client = pool.get().await.expect("a connection");
        seats::seed(&client, EVENT, seats, 4500)
            .await
            .expect("seed the on-sale's event");
    }
    let buyers = Buyers::new(&settings, crowd_size);
    clear_ledger(bench).await;
    let app = RunningApp::start(settings).await;
    // The crowd meets an instance at its steady state: one just started
    // reads each viewer's own holds on every view until it has listened
    // long enough to hear every other instance's changes.
    tokio::time::sleep(TRUSTED_AFTER).await;
    let sale = Arc::new(Sale {
        http: fixtures::client(CONNECTIONS),
        connections: Semaphore::new(CONNECTIONS),
        map_url: format!("{}/events/{EVENT}/seats", app.url),
        holds_url: format!("{}/holds", app.url),
        orders_url: format!("{}/orders", app.url),
        buyers,
        seats: u64::from(seats),
        maps: Mutex::default(),
        tally: Tally::default(),
        clicks: Mutex::new(load::histogram()),
        start: Instant::now(),
        sold_out_at: Mutex::default(),
        over: CancellationToken::new(),
    });
    let mut tasks = JoinSet::new();
    for buyer in 0..crowd_size {
        tasks.spawn(sale.clone().buyer(buyer));
    }
    // Every buyer who got seats has paid, so the last 201 ends the sale; the
    // limit ends one whose seats stay held.
    tokio::select! {
        () = sale.over.cancelled() => {}
        () = tokio::time::sleep(profile.sale_limit) => sale.over.cancel(),
    }
    let ended = *locked(&sale.sold_out_at);
    // Views over the crowd's whole visit; sales from the opening.
    let secs = ended
        .unwrap_or_else(Instant::now)
        .duration_since(sale.start)
        .as_secs_f64();
    let selling = secs - OPENING.as_secs_f64();
    while tasks.join_next().await.is_some() {}
    app.stop().await;

    let tally = &sale.tally;
    let count = |n: &AtomicU64| n.load(Ordering::Relaxed);
    let (views_200, views_304) = (count(&tally.views_200), count(&tally.views_304));
    let (holds, unavailable) = (count(&tally.holds), count(&tally.seat_unavailable));
    let sold = count(&tally.seats_sold);
    let unexpected = locked(&tally.unexpected).clone();
    let clicks = locked(&sale.clicks).clone();
    let click_ms = |q: f64| clicks.value_at_quantile(q) as f64 / 1000.0;
    let unavailable_share = unavailable as f64 / holds.max(1) as f64;
    match ended {
        Some(_) => println!(
            "  sold out {selling:.1} s after the opening: {:.0} seats/s",
            sold as f64 / selling
        ),
        None => bench.report.note(format!(
            "onsale: not sold out after {} s ({sold} of {seats} seats paid)",
            profile.sale_limit.as_secs()
        )),
    }
    println!(
        "  clicks: {} paid, p50 {:.1} ms, p99 {:.1} ms, {} retries; holds: {holds} tried, \
         {:.1} % seat-unavailable",
        count(&tally.orders),
        click_ms(0.5),
        click_ms(0.99),
        count(&tally.retries),
        unavailable_share * 100.0
    );
    println!(
        "  map views: {:.0}/s answered 200, {:.0}/s answered 304; unexpected: {unexpected:?}",
        views_200 as f64 / secs,
        views_304 as f64 / secs
    );

    let views = (views_200 + views_304).max(1) as f64;
    let map_statements = map_statements(bench, &database.name).await;
    if let Some(calls) = map_statements {
        println!(
            "  {calls} statements of the map (snapshots and the viewers' own holds): {:.3} a view",
            calls as f64 / views
        );
    }
    let ledger = sandbox::ledger(&bench.http, &bench.sandbox_url).await;
    let violations = invariants::violations(&database.client().await, &ledger).await;
    for violation in &violations {
        eprintln!("  onsale: {violation}");
    }
    println!(
        "  invariants: {} violations over {} charges",
        violations.len(),
        ledger.len()
    );

    let report = &mut bench.report;
    if ended.is_some() {
        report.set("onsale_sellout_secs", selling);
        report.set("onsale_seats_per_s", sold as f64 / selling);
    }
    report.set("onsale_click_p50_ms", click_ms(0.5));
    report.set("onsale_click_p99_ms", click_ms(0.99));
    report.set("onsale_hold_attempts", holds as f64);
    report.set("onsale_seat_unavailable_share", unavailable_share);
    report.set("onsale_views_200_per_s", views_200 as f64 / secs);
    report.set("onsale_views_304_per_s", views_304 as f64 / secs);
    if let Some(calls) = map_statements {
        report.set("onsale_statements_per_view", calls as f64 / views);
    }
    report.set("onsale_violations", violations.len() as f64);
    report.detail(
        "onsale",
        json!({
            "seats": seats, "buyers": crowd_size, "connections": CONNECTIONS,
            "poll_secs": POLL.as_secs(), "opening_secs": OPENING.as_secs(),
            "deciding_secs": DECIDING.as_secs(), "seed": SEED,
            "seats_sold": sold, "orders": count(&tally.orders),
            "retries": count(&tally.retries), "seat_unavailable": unavailable,
            "views_200": views_200, "views_304": views_304,
            "maps_decoded": locked(&sale.maps).len(),
            "unexpected": unexpected, "violations": violations,
        }),
    );
}

/// Calls of the map's statements in the sale's database (on the bench's own
/// server, which counts them: a fresh database has no others).
async fn map_statements(bench: &mut Bench, database: &str) -> Option<i64> {
    if !bench.pg.is_throwaway() {
        bench.report.note(
            "onsale_statements_per_view not counted: no pg_stat_statements on the machine's server",
        );
        return None;
    }
    let monitor = postgres::connect(&bench.pg.url("postgres")).await;
    let rows = monitor
        .query(
            "SELECT s.query, s.calls
             FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
             WHERE d.datname = $1",
            &[&database],
        )
        .await
        .expect("pg_stat_statements");
    // pg_stat_statements keeps a statement's text with its literals made
    // parameters: the texts are compared up to the first literal.
    let map = [SEAT_MAP_STATEMENT, OWN_HOLDS_STATEMENT].map(|s| s.split('\'').next().unwrap_or(s));
    Some(
        rows.iter()
            .filter(|row| map.iter().any(|m| row.get::<_, &str>(0).starts_with(m)))
            .map(|row| row.get::<_, i64>(1))
            .sum(),
    )
}

/// First clicks (a new key, a new hold) from `profile.crowd` connections at
/// once, beside the same from 64, in alternating segments (64, crowd, crowd,
/// 64, …) so that the shared machine's drift falls on both: what the service
/// loses to a crowd's connections rather than to its clicks. Each crowd
/// segment opens its connections afresh; its first wave of clicks, which
/// queues behind all the others, is not measured. Requests with no answer at
/// all (a connection refused or reset, or no answer in 30 s), warm-up
/// included, are the connections the service failed to accept.
async fn crowd(bench: &mut Bench) {
    let crowd = bench.profile.crowd;
    let (pairs, segment) = (bench.profile.pairs.max(1), bench.profile.segment);
    println!(
        "\n== onsale, crowd: first clicks from {crowd} connections at once, beside \
         {CONCURRENCY}, alternated"
    );
    let app = RunningApp::start(bench.settings(LockMode::Table)).await;
    // Each crowd segment's warm-up takes a wave of the crowd's clicks.
    let rate = order_rate(bench);
    let per_pair = 2.0 * (SEGMENT_WARMUP + segment).as_secs_f64() + crowd as f64 / rate;
    let holds = holds_for(bench, rate, pairs as f64 * per_pair).await;
    let (mut few, mut many): (Option<Stats>, Option<Stats>) = (None, None);
    for pair in 0..pairs {
        let crowd_first = pair % 2 == 1;
        for is_crowd in [crowd_first, !crowd_first] {
            let (connections, warmup, side) = if is_crowd {
                // Its first wave queues behind all the others: as long as
                // that wave takes at the rate measured from 64.
                let rps = few.as_ref().map_or(rate, Stats::rps).max(1.0);
                let wave = Duration::from_secs_f64(crowd as f64 / rps);
                (crowd, SEGMENT_WARMUP + wave, &mut many)
            } else {
                (CONCURRENCY, SEGMENT_WARMUP, &mut few)
            };
            let stats =
                first_clicks(bench, &app.url, holds.clone(), connections, warmup, segment).await;
            match side {
                Some(side) => side.absorb(stats),
                None => *side = Some(stats),
            }
        }
    }
    app.stop().await;
    let (few, many) = (few.expect("a segment"), many.expect("a segment"));
    for (connections, stats) in [(CONCURRENCY, &few), (crowd, &many)] {
        println!("  {connections:>5} connections: {}", stats.summary());
        println!("    {}", stats.cpu_summary());
    }
    println!(
        "  {:.2} of the rate at {CONCURRENCY}; accept errors (requests with no answer: refused, \
         reset, or none in 30 s; warm-up included): {}",
        many.rps() / few.rps().max(1e-9),
        many.failed
    );
    let report = &mut bench.report;
    report.set("crowd_connections", crowd as f64);
    report.set("crowd_base_rps", few.rps());
    report.set("crowd_rps", many.rps());
    report.set("crowd_ratio", many.rps() / few.rps().max(1e-9));
    report.set("crowd_p99_ms", many.p99_ms());
    report.set("crowd_accept_errors", many.failed as f64);
    report.detail(
        "crowd",
        json!({
            "connections": crowd, "pairs": pairs, "segment_secs": segment.as_secs_f64(),
            "base": { "connections": CONCURRENCY, "p99_ms": few.p99_ms(),
                      "unexpected": format!("{:?}", few.statuses), "no_answer": few.failed },
            "crowd": { "p50_ms": many.p50_ms(), "unexpected": format!("{:?}", many.statuses) },
            "cpu": { "base": few.cpu_json(), "crowd": many.cpu_json() },
        }),
    );
}
