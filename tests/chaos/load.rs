//! The buyers: each holds seats, then clicks "pay" (a new Idempotency-Key per
//! click) and retries that click with the same key, on any instance, until it
//! has an answer, as a careful browser would. Every answer of every key is
//! recorded, so that the end can check what the buyer saw against the
//! database and Payrail's ledger.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::StreamExt;
use serde_json::{json, Value};
use test_support::{Rng, Seen};
use uuid::Uuid;

/// The PRNG streams of the load, of the run's seed (`Rng::stream`): each
/// buyer's, and the end's, per click. The monkey's are below these.
const BUYER_STREAMS: u64 = 1_000;
const FINISH_STREAMS: u64 = 1_000_000;
const REPLAY_STREAMS: u64 = 2_000_000;

/// Counters for the final table.
#[derive(Default)]
pub struct Stats {
    pub requests: AtomicU64,
    pub order_posts: AtomicU64,
    pub hold_posts: AtomicU64,
    pub reads: AtomicU64,
    pub created: AtomicU64,
    pub declined: AtomicU64,
    pub replays: AtomicU64,
    pub in_progress: AtomicU64,
    pub conflicts_other: AtomicU64,
    pub key_reused: AtomicU64,
    pub unprocessable_other: AtomicU64,
    pub internal_500: AtomicU64,
    pub unavailable_503: AtomicU64,
    pub timeout_504: AtomicU64,
    pub other_5xx: AtomicU64,
    pub client_timeouts: AtomicU64,
    pub connection_errors: AtomicU64,
    pub holds: AtomicU64,
    pub seat_unavailable: AtomicU64,
    pub clicks: AtomicU64,
    pub duplicate_bursts: AtomicU64,
    pub reuse_probes: AtomicU64,
    pub late_replays: AtomicU64,
    pub swept: AtomicU64,
    pub borrowed_keys: AtomicU64,
    pub declined_first: AtomicU64,
    pub cross_reads: AtomicU64,
    pub hot_seat_races: AtomicU64,
    /// When a buyer first found every seat handed out (ms since its start).
    pub sold_out_at_ms: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// One answer as a client sees it, and which instance gave it.
#[derive(Debug, Clone)]
pub struct Answer {
    pub seen: Seen,
    pub instance: usize,
}

impl std::ops::Deref for Answer {
    type Target = Seen;

    fn deref(&self) -> &Seen {
        &self.seen
    }
}

impl Answer {
    /// An answer to the intent (a 2xx or 4xx outcome): stored and replayed.
    pub fn is_final(&self) -> bool {
        matches!(
            (self.status, self.slug.as_deref()),
            (201 | 402, _) | (409, Some("hold-unavailable")) | (422, Some("invalid-order"))
        )
    }

    fn text(&self) -> String {
        format!("instance {}: {}", self.instance, self.seen.text())
    }
}

/// What one send produced.
pub enum Sent {
    Answer(Answer),
    Timeout,
    Connection,
}

/// One click: its key, its exact body bytes, and everything its sends got.
#[derive(Debug)]
pub struct Click {
    pub buyer: usize,
    pub key: String,
    pub body: String,
    pub method: &'static str,
    pub hold_ids: Vec<i64>,
    /// Answers to the click's own body.
    pub answers: Vec<Answer>,
    /// Answers to the same key sent with another body (expected: 422).
    pub probes: Vec<Answer>,
    pub borrowed: bool,
}

impl Click {
    pub fn final_answer(&self) -> Option<&Answer> {
        self.answers.iter().find(|a| a.is_final())
    }
}

/// Seats handed out to buyers: mostly fresh ones, sometimes one that was
/// handed out already (sold or held: a 409 to handle).
pub struct Seats {
    ids: Vec<i64>,
    next: AtomicUsize,
}

impl Seats {
    pub fn new(ids: Vec<i64>) -> Self {
        Self {
            ids,
            next: AtomicUsize::new(0),
        }
    }

    fn pick(&self, rng: &mut Rng) -> Option<i64> {
        let handed = self.next.load(Ordering::Relaxed).min(self.ids.len());
        if handed > 0 && (rng.chance(0.1) || handed == self.ids.len()) {
            return Some(self.ids[rng.pick(handed)]);
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.ids.get(i).copied()
    }

    pub fn handed_out(&self) -> usize {
        self.next.load(Ordering::Relaxed).min(self.ids.len())
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }
}

/// What every buyer shares: the instances, the tokens, the counters, and a
/// few recent keys and orders of others (to check that they are not ours).
pub struct Shop {
    pub urls: Vec<String>,
    pub http: reqwest::Client,
    pub tokens: Vec<String>,
    pub stats: Stats,
    pub seats: Seats,
    recent_keys: Mutex<VecDeque<(usize, String)>>,
    recent_orders: Mutex<VecDeque<(usize, String)>>,
    /// What buyers saw that breaks a rule right away (found during the run).
    pub seen_violations: Mutex<Vec<String>>,
    /// Which requests ran into the client's timeout, and when.
    pub timed_out: Mutex<Vec<String>>,
    started: Instant,
    /// The run's seed: every PRNG of the load is a stream of it.
    seed: u64,
}

pub fn buyer_name(i: usize) -> String {
    format!("chaos-buyer-{i}")
}

pub fn order_body(hold_ids: &[i64], method: &str) -> String {
    json!({ "hold_ids": hold_ids, "payment_method": method }).to_string()
}

/// Same holds, another card: the same key with this body must be refused.
fn probe_body(hold_ids: &[i64]) -> String {
    order_body(hold_ids, "pm_card_reused_key")
}

/// How often each kind of click happens.
const DECLINED_FIRST: f64 = 0.15;
const DUPLICATES: f64 = 0.2;
const REUSE_PROBE: f64 = 0.1;
const LATE_REPLAY: f64 = 0.1;
const BORROWED_KEY: f64 = 0.03;
const READ_BACK: f64 = 0.1;
const CROSS_READ: f64 = 0.05;
const TWO_SEATS: f64 = 0.2;
const HOT_SEAT: f64 = 0.03;
/// Sends of one click while the chaos lasts (the end retries the rest).
const MAX_SENDS: usize = 40;

impl Shop {
    pub fn new(urls: Vec<String>, tokens: Vec<String>, seats: Seats, seed: u64) -> Self {
        Self {
            urls,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .pool_max_idle_per_host(64)
                .build()
                .expect("http client"),
            tokens,
            stats: Stats::default(),
            seats,
            recent_keys: Mutex::new(VecDeque::new()),
            recent_orders: Mutex::new(VecDeque::new()),
            seen_violations: Mutex::new(Vec::new()),
            timed_out: Mutex::new(Vec::new()),
            started: Instant::now(),
            seed,
        }
    }

    fn timeout(&self, path: &str, instance: usize) -> Sent {
        bump(&self.stats.client_timeouts);
        self.timed_out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!(
                "{path} on instance {instance}, sent before {:.1} s",
                self.started.elapsed().as_secs_f64()
            ));
        Sent::Timeout
    }

    fn violation(&self, what: String) {
        self.seen_violations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(what);
    }

    /// Reads, classifies and counts one response.
    async fn read(&self, response: reqwest::Response, instance: usize) -> Sent {
        let path = response.url().path().to_owned();
        let seen = match Seen::read(response).await {
            Ok(seen) => seen,
            Err(e) if e.is_timeout() => return self.timeout(&path, instance),
            Err(_) => {
                bump(&self.stats.connection_errors);
                return Sent::Connection;
            }
        };
        let s = &self.stats;
        if seen.replayed {
            bump(&s.replays);
        }
        match (seen.status, seen.slug.as_deref()) {
            (201, _) => {}
            (402, _) => bump(&s.declined),
            (409, Some("request-in-progress")) => bump(&s.in_progress),
            (409, _) => bump(&s.conflicts_other),
            (422, Some("idempotency-key-reused")) => bump(&s.key_reused),
            (422, _) => bump(&s.unprocessable_other),
            (500, _) => {
                // Every failure the chaos causes has its documented answer
                // (503, 504); a 500 means the service did not recognise one.
                bump(&s.internal_500);
                self.violation(format!(
                    "{path} on instance {instance} answered 500 internal (its stderr has \
                     the cause): {}",
                    String::from_utf8_lossy(&seen.body)
                ));
            }
            (503, _) => bump(&s.unavailable_503),
            (504, _) => bump(&s.timeout_504),
            (500..=599, _) => bump(&s.other_5xx),
            _ => {}
        }
        Sent::Answer(Answer { seen, instance })
    }

    fn failed(&self, error: &reqwest::Error, instance: usize) -> Sent {
        if error.is_timeout() {
            self.timeout(error.url().map_or("?", |url| url.path()), instance)
        } else {
            bump(&self.stats.connection_errors);
            Sent::Connection
        }
    }

    /// Sends `method path` to instance `instance` as `buyer` (`build` adds
    /// the rest), counted as a request and in `kind`, and reads the answer.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        buyer: usize,
        instance: usize,
        kind: &AtomicU64,
        build: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Sent {
        bump(&self.stats.requests);
        bump(kind);
        let request = self
            .http
            .request(method, format!("{}{path}", self.urls[instance]))
            .bearer_auth(&self.tokens[buyer]);
        match build(request).send().await {
            Ok(response) => self.read(response, instance).await,
            Err(error) => self.failed(&error, instance),
        }
    }

    /// `POST /orders` with exactly these body bytes, to instance `instance`.
    async fn post_order(&self, buyer: usize, key: &str, body: &str, instance: usize) -> Sent {
        let sent = self
            .send(
                reqwest::Method::POST,
                "/orders",
                buyer,
                instance,
                &self.stats.order_posts,
                |request| {
                    request
                        .header("Idempotency-Key", key)
                        .header("Content-Type", "application/json")
                        .body(body.to_owned())
                },
            )
            .await;
        if let Sent::Answer(answer) = &sent {
            if answer.status == 201 {
                bump(&self.stats.created);
            }
        }
        sent
    }

    async fn get(&self, buyer: usize, path: &str, instance: usize) -> Sent {
        let reads = &self.stats.reads;
        self.send(reqwest::Method::GET, path, buyer, instance, reads, |r| r)
            .await
    }

    async fn post_hold(&self, buyer: usize, seat: i64, instance: usize) -> Sent {
        let holds = &self.stats.hold_posts;
        self.send(
            reqwest::Method::POST,
            "/holds",
            buyer,
            instance,
            holds,
            |r| r.json(&json!({ "seat_id": seat })),
        )
        .await
    }

    /// A hot seat: 3-6 buyers (this one among them) ask for one fresh seat
    /// at the same instant, on random instances. At most one may get it, the
    /// others are told 409 `seat-unavailable`. Returns this buyer's hold if
    /// it won (the others' holds just keep their seat until they expire).
    async fn race(&self, buyer: usize, seat: i64, rng: &mut Rng) -> Option<i64> {
        bump(&self.stats.hot_seat_races);
        let mut racers = vec![buyer];
        let wanted = (rng.range(3, 6) as usize).min(self.tokens.len());
        while racers.len() < wanted {
            let other = rng.pick(self.tokens.len());
            if !racers.contains(&other) {
                racers.push(other);
            }
        }
        let sends = racers
            .iter()
            .map(|&racer| self.post_hold(racer, seat, rng.pick(self.urls.len())));
        let answers = join_all(sends).await;
        let mut winners = Vec::new();
        let mut mine = None;
        for (racer, sent) in racers.iter().zip(answers) {
            let Sent::Answer(answer) = sent else { continue };
            match (answer.status, answer.slug.as_deref()) {
                (201, _) => {
                    bump(&self.stats.holds);
                    winners.push(format!("buyer {racer}: {}", answer.text()));
                    let body: Value = serde_json::from_slice(&answer.body).unwrap_or_default();
                    if *racer == buyer {
                        mine = body["hold_id"].as_i64();
                    }
                }
                (409, Some("seat-unavailable")) => bump(&self.stats.seat_unavailable),
                (500..=599, _) => {}
                _ => self.violation(format!("hot seat {seat}, buyer {racer}: {}", answer.text())),
            }
        }
        if winners.len() > 1 {
            self.violation(format!(
                "hot seat {seat} was held by {} buyers at once: {winners:?}",
                winners.len()
            ));
        }
        mine
    }

    /// Holds one seat: a fresh one each time the last is taken (409); a
    /// failed attempt may have held the seat after all, so it moves on too.
    async fn hold(&self, buyer: usize, rng: &mut Rng, until: Instant) -> Option<i64> {
        for _ in 0..50 {
            if Instant::now() >= until {
                return None;
            }
            let seat = self.seats.pick(rng)?;
            if rng.chance(HOT_SEAT) {
                match self.race(buyer, seat, rng).await {
                    Some(hold) => return Some(hold),
                    None => continue,
                }
            }
            let instance = rng.pick(self.urls.len());
            match self.post_hold(buyer, seat, instance).await {
                Sent::Answer(a) if a.status == 201 => {
                    bump(&self.stats.holds);
                    let body: Value = serde_json::from_slice(&a.body).unwrap_or_default();
                    if let Some(hold_id) = body["hold_id"].as_i64() {
                        return Some(hold_id);
                    }
                    self.violation(format!("a 201 hold without a hold_id: {}", a.text()));
                }
                Sent::Answer(a) if a.slug.as_deref() == Some("seat-unavailable") => {
                    bump(&self.stats.seat_unavailable);
                }
                Sent::Answer(a) if a.status < 500 => {
                    self.violation(format!("POST /holds of seat {seat}: {}", a.text()));
                }
                _ => tokio::time::sleep(Duration::from_millis(rng.range(100, 300))).await,
            }
        }
        None
    }

    /// A new key: a v4 UUID, or now and then another buyer's key (keys are
    /// per buyer, so it must behave as a new one).
    fn new_key(&self, buyer: usize, rng: &mut Rng) -> (String, bool) {
        let mut recent = self.recent_keys.lock().unwrap_or_else(|p| p.into_inner());
        if rng.chance(BORROWED_KEY) {
            let theirs: Vec<usize> = (0..recent.len())
                .filter(|&i| recent[i].0 != buyer)
                .collect();
            if !theirs.is_empty() {
                // Taken out, so that no buyer uses one key twice.
                let (_, key) = recent
                    .remove(theirs[rng.pick(theirs.len())])
                    .expect("an index of the queue");
                bump(&self.stats.borrowed_keys);
                return (key, true);
            }
        }
        let key = Uuid::new_v4().to_string();
        recent.push_back((buyer, key.clone()));
        if recent.len() > 256 {
            recent.pop_front();
        }
        (key, false)
    }

    fn new_click(
        &self,
        buyer: usize,
        hold_ids: &[i64],
        method: &'static str,
        rng: &mut Rng,
    ) -> Click {
        bump(&self.stats.clicks);
        let (key, borrowed) = self.new_key(buyer, rng);
        Click {
            buyer,
            key,
            body: order_body(hold_ids, method),
            method,
            hold_ids: hold_ids.to_vec(),
            answers: Vec::new(),
            probes: Vec::new(),
            borrowed,
        }
    }

    /// 2-4 copies of the click at once, to random instances.
    async fn burst(&self, click: &mut Click, rng: &mut Rng) {
        bump(&self.stats.duplicate_bursts);
        let copies = rng.range(2, 4) as usize;
        let instances: Vec<usize> = (0..copies).map(|_| rng.pick(self.urls.len())).collect();
        let sends = instances
            .iter()
            .map(|&i| self.post_order(click.buyer, &click.key, &click.body, i));
        for sent in join_all(sends).await {
            if let Sent::Answer(answer) = sent {
                click.answers.push(answer);
            }
        }
    }

    /// Retries the click with its key until it has a final answer, honouring
    /// 409 + Retry-After, for at most `max_sends` sends or until `until`.
    pub async fn drive(&self, click: &mut Click, rng: &mut Rng, until: Instant, max_sends: usize) {
        let mut sends = 0;
        while click.final_answer().is_none() && sends < max_sends && Instant::now() < until {
            sends += 1;
            let instance = rng.pick(self.urls.len());
            let wait = match self
                .post_order(click.buyer, &click.key, &click.body, instance)
                .await
            {
                Sent::Answer(answer) => {
                    let wait = match (answer.status, answer.slug.as_deref()) {
                        (409, Some("request-in-progress")) => {
                            Duration::from_secs(answer.retry_after_secs().unwrap_or(1).min(5))
                        }
                        (503, _) => Duration::from_millis(
                            answer.retry_after_secs().unwrap_or(1).min(2) * 1000
                                + rng.range(0, 250),
                        ),
                        (500..=599, _) => Duration::from_millis(rng.range(200, 500)),
                        _ if answer.is_final() => Duration::ZERO,
                        // Anything else is a wrong answer: recorded, not retried.
                        _ => {
                            click.answers.push(answer);
                            return;
                        }
                    };
                    click.answers.push(answer);
                    wait
                }
                Sent::Timeout => Duration::ZERO,
                Sent::Connection => Duration::from_millis(rng.range(50, 250)),
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// After a final answer: now and then the same key with another body
    /// (must be 422 `idempotency-key-reused`), or the same click again (must
    /// replay the stored answer).
    async fn probe(&self, click: &mut Click, rng: &mut Rng) {
        if click.final_answer().is_none() {
            return;
        }
        if rng.chance(REUSE_PROBE) {
            bump(&self.stats.reuse_probes);
            let body = probe_body(&click.hold_ids);
            for _ in 0..5 {
                let instance = rng.pick(self.urls.len());
                match self
                    .post_order(click.buyer, &click.key, &body, instance)
                    .await
                {
                    Sent::Answer(answer) if answer.status < 500 => {
                        click.probes.push(answer);
                        break;
                    }
                    _ => tokio::time::sleep(Duration::from_millis(300)).await,
                }
            }
        }
        if rng.chance(LATE_REPLAY) {
            bump(&self.stats.late_replays);
            let instance = rng.pick(self.urls.len());
            if let Sent::Answer(answer) = self
                .post_order(click.buyer, &click.key, &click.body, instance)
                .await
            {
                click.answers.push(answer);
            }
        }
    }

    /// After a 201: now and then read the order back (it is ours and paid),
    /// or try to read another buyer's order (it must be 404).
    async fn read_back(&self, click: &Click, rng: &mut Rng) {
        let Some(answer) = click.final_answer().filter(|a| a.status == 201) else {
            return;
        };
        let order: Value = serde_json::from_slice(&answer.body).unwrap_or_default();
        let Some(order_id) = order["order_id"].as_str().map(str::to_owned) else {
            return;
        };
        if rng.chance(READ_BACK) {
            let instance = rng.pick(self.urls.len());
            if let Sent::Answer(seen) = self
                .get(click.buyer, &format!("/orders/{order_id}"), instance)
                .await
            {
                let body: Value = serde_json::from_slice(&seen.body).unwrap_or_default();
                let ok = seen.status >= 500
                    || (seen.status == 200
                        && body["order_id"] == order["order_id"]
                        && body["status"] == "paid");
                if !ok {
                    self.violation(format!(
                        "buyer {} read back its paid order {order_id}: {}",
                        click.buyer,
                        seen.text()
                    ));
                }
            }
        }
        let theirs = {
            let mut recent = self.recent_orders.lock().unwrap_or_else(|p| p.into_inner());
            recent.push_back((click.buyer, order_id));
            if recent.len() > 256 {
                recent.pop_front();
            }
            recent
                .iter()
                .find(|(owner, _)| *owner != click.buyer)
                .cloned()
        };
        if let Some((owner, other)) = theirs.filter(|_| rng.chance(CROSS_READ)) {
            bump(&self.stats.cross_reads);
            let instance = rng.pick(self.urls.len());
            if let Sent::Answer(seen) = self
                .get(click.buyer, &format!("/orders/{other}"), instance)
                .await
            {
                if seen.status < 500 && seen.status != 404 {
                    self.violation(format!(
                        "buyer {} read buyer {owner}'s order {other}: {}",
                        click.buyer,
                        seen.text()
                    ));
                }
            }
        }
    }

    /// One click from its first send to a final answer (or to `until`), then
    /// the probes.
    async fn click(&self, click: &mut Click, rng: &mut Rng, until: Instant) {
        if rng.chance(DUPLICATES) {
            self.burst(click, rng).await;
        }
        self.drive(click, rng, until, MAX_SENDS).await;
        self.probe(click, rng).await;
        self.read_back(click, rng).await;
    }

    /// A buyer: hold, click, retry, and again, until `until`.
    pub async fn buyer(self: Arc<Self>, buyer: usize, until: Instant) -> Vec<Click> {
        let started = Instant::now();
        let mut rng = Rng::stream(self.seed, BUYER_STREAMS + buyer as u64);
        let mut clicks = Vec::new();
        while Instant::now() < until {
            let seats = if rng.chance(TWO_SEATS) { 2 } else { 1 };
            let mut hold_ids = Vec::new();
            for _ in 0..seats {
                if let Some(hold) = self.hold(buyer, &mut rng, until).await {
                    hold_ids.push(hold);
                }
            }
            if hold_ids.is_empty() {
                if self.seats.handed_out() == self.seats.len() {
                    let at = started.elapsed().as_millis().max(1) as u64;
                    let _ = self.stats.sold_out_at_ms.compare_exchange(
                        0,
                        at,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    break;
                }
                continue;
            }
            let declined_first = rng.chance(DECLINED_FIRST);
            let method = if declined_first {
                bump(&self.stats.declined_first);
                "pm_card_declined"
            } else {
                "pm_card_visa"
            };
            let mut click = self.new_click(buyer, &hold_ids, method, &mut rng);
            self.click(&mut click, &mut rng, until).await;
            let declined = click.final_answer().is_some_and(|a| a.status == 402);
            clicks.push(click);
            if declined && Instant::now() < until {
                // A new click, a new key, another card, the same holds.
                let mut again = self.new_click(buyer, &hold_ids, "pm_card_visa", &mut rng);
                self.click(&mut again, &mut rng, until).await;
                clicks.push(again);
            }
            tokio::time::sleep(Duration::from_millis(rng.range(0, 30))).await;
        }
        clicks
    }

    /// Sends every answered click once more, as a late retry would: the
    /// answer must be the stored one, replayed byte for byte (checked with
    /// the others in `check_clicks`). Returns how many were replayed.
    pub async fn replay_all(&self, clicks: &mut [Click], until: Instant) -> usize {
        let replayed = AtomicUsize::new(0);
        let answered = clicks.iter_mut().filter(|c| c.final_answer().is_some());
        futures_util::stream::iter(answered.enumerate())
            .for_each_concurrent(32, |(n, click)| {
                let replayed = &replayed;
                async move {
                    let mut rng = Rng::stream(self.seed, REPLAY_STREAMS + n as u64);
                    for _ in 0..3 {
                        if Instant::now() >= until {
                            return;
                        }
                        let instance = rng.pick(self.urls.len());
                        let sent = self
                            .post_order(click.buyer, &click.key, &click.body, instance)
                            .await;
                        if let Sent::Answer(answer) = sent {
                            if answer.status < 500 {
                                click.answers.push(answer);
                                replayed.fetch_add(1, Ordering::Relaxed);
                                bump(&self.stats.swept);
                                return;
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            })
            .await;
        replayed.into_inner()
    }

    /// Retries every click without a final answer, with its own key, until
    /// each has one or `until` passes.
    pub async fn finish(&self, clicks: &mut [Click], until: Instant) {
        let unanswered = clicks.iter_mut().filter(|c| c.final_answer().is_none());
        futures_util::stream::iter(unanswered.enumerate())
            .for_each_concurrent(32, |(n, click)| async move {
                let mut rng = Rng::stream(self.seed, FINISH_STREAMS + n as u64);
                self.drive(click, &mut rng, until, usize::MAX).await;
            })
            .await;
    }
}

/// The rules of what buyers saw, checked against the database's orders (by
/// buyer and key) and Payrail's ledger:
/// - every final answer of a key is byte-identical (status, body, type,
///   location), and at most one of them is not a replay;
/// - a key's own body is never answered 422 `idempotency-key-reused`, and no
///   other unexpected answer comes back;
/// - the same key with another body is 422 `idempotency-key-reused`, never
///   the stored answer;
/// - a 201 names the key's order, paid, with the charge Payrail made; a 402
///   names the key's order, declined; a 409/422 answer made no order;
/// - the key's order (if any) is for the click's holds and card;
/// - every click ends with a final answer; every order belongs to a click.
pub fn check_clicks(
    clicks: &[Click],
    orders: &HashMap<(String, String), DbOrder>,
    ledger: &[Value],
) -> Vec<String> {
    let mut found = Vec::new();
    let charges: HashMap<&str, &Value> = ledger
        .iter()
        .filter_map(|c| Some((c["idempotency_key"].as_str()?.strip_prefix("order-")?, c)))
        .collect();
    let mut known = std::collections::HashSet::new();
    for click in clicks {
        let who = format!(
            "buyer {} key {}{}",
            click.buyer,
            click.key,
            if click.borrowed { " (borrowed)" } else { "" }
        );
        let id = (buyer_name(click.buyer), click.key.clone());
        let order = orders.get(&id);
        if !known.insert(id) {
            found.push(format!("harness error: {who} was used for two clicks"));
        }
        let finals: Vec<&Answer> = click.answers.iter().filter(|a| a.is_final()).collect();
        let Some(first) = finals.first() else {
            found.push(format!(
                "{who} never got a final answer ({} sends; last: {})",
                click.answers.len(),
                click.answers.last().map_or("none".into(), Answer::text)
            ));
            continue;
        };
        for other in &finals[1..] {
            let same = (
                other.status,
                &other.body,
                &other.content_type,
                &other.location,
            ) == (
                first.status,
                &first.body,
                &first.content_type,
                &first.location,
            );
            if !same {
                found.push(format!(
                    "{who}: replay differs from the first answer:\n    first {}\n    later {}",
                    first.text(),
                    other.text()
                ));
            }
        }
        let fresh = finals.iter().filter(|a| !a.replayed).count();
        if fresh > 1 {
            found.push(format!("{who}: {fresh} final answers were not replays"));
        }
        for answer in &click.answers {
            // These holds are live and this card is valid: 409
            // `hold-unavailable` or 422 would be wrong answers here.
            let expected = matches!(answer.status, 201 | 402 | 500..=599)
                || (answer.status, answer.slug.as_deref()) == (409, Some("request-in-progress"));
            if !expected {
                found.push(format!("{who}: unexpected answer {}", answer.text()));
            }
        }
        for probe in &click.probes {
            let refused = probe.status == 422
                && probe.slug.as_deref() == Some("idempotency-key-reused")
                && !probe.replayed
                && probe.body != first.body;
            if !refused {
                found.push(format!(
                    "{who}: the key with another body got {} (stored: {})",
                    probe.text(),
                    first.text()
                ));
            }
        }
        let body: Value = serde_json::from_slice(&first.body).unwrap_or_default();
        let named = body["order_id"].as_str();
        match (first.status, order) {
            (201 | 402, None) => found.push(format!(
                "{who}: answered {} but the key has no order",
                first.text()
            )),
            (201 | 402, Some(order)) => {
                let wanted = if first.status == 201 {
                    "paid"
                } else {
                    "declined"
                };
                if named != Some(order.order_id.as_str()) || order.status != wanted {
                    found.push(format!(
                        "{who}: answered {} but the key's order is {} ({})",
                        first.text(),
                        order.order_id,
                        order.status
                    ));
                }
                let charge = charges.get(order.order_id.as_str());
                let charge_id = charge.and_then(|c| c["id"].as_str());
                let charge_ok = if first.status == 201 {
                    body["status"] == "paid"
                        && charge.is_some_and(|c| c["status"] == "succeeded")
                        && body["charge_id"].as_str() == charge_id
                } else {
                    charge.is_some_and(|c| c["status"] == "declined")
                };
                if !charge_ok {
                    found.push(format!(
                        "{who}: answered {} but Payrail's charge for order {} is {:?}",
                        first.text(),
                        order.order_id,
                        charge
                    ));
                }
            }
            (_, Some(order)) => found.push(format!(
                "{who}: answered {} but the key made order {}",
                first.text(),
                order.order_id
            )),
            (_, None) => {}
        }
        if let Some(order) = order {
            if order.payment_method != click.method || order.hold_ids != click.hold_ids {
                found.push(format!(
                    "{who}: the key's order {} is for {:?} with {}, the click was {:?} with {}",
                    order.order_id,
                    order.hold_ids,
                    order.payment_method,
                    click.hold_ids,
                    click.method
                ));
            }
        }
    }
    for ((user, key), order) in orders {
        if !known.contains(&(user.clone(), key.clone())) {
            found.push(format!(
                "order {} of {user}/{key} belongs to no click",
                order.order_id
            ));
        }
    }
    found
}

/// An order as the checks need it.
pub struct DbOrder {
    pub order_id: String,
    pub status: String,
    pub payment_method: String,
    pub hold_ids: Vec<i64>,
}

pub async fn db_orders(db: &tokio_postgres::Client) -> HashMap<(String, String), DbOrder> {
    db.query(
        "SELECT user_id, idempotency_key, order_id::text, status, payment_method, hold_ids
         FROM orders",
        &[],
    )
    .await
    .expect("orders")
    .iter()
    .map(|row| {
        (
            (row.get(0), row.get(1)),
            DbOrder {
                order_id: row.get(2),
                status: row.get(3),
                payment_method: row.get(4),
                hold_ids: row.get(5),
            },
        )
    })
    .collect()
}
