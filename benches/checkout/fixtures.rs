//! What the load needs before it starts: buyers with signed tokens, and
//! fresh seats with a live hold each, written by SQL so that making them
//! costs the measured service nothing.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderValue;
use stagedoor_checkout::auth::{BuyerId, Tokens};
use stagedoor_checkout::config::Settings;

use crate::postgres;

/// Buyers `b0` … `b{n-1}` and their `Authorization` headers.
pub struct Buyers {
    pub auth: Vec<HeaderValue>,
}

impl Buyers {
    pub fn new(settings: &Settings, count: usize) -> Self {
        let tokens = Tokens::new(&settings.auth.jwt_secret).expect("auth.jwt_secret");
        let auth = (0..count)
            .map(|i| {
                let buyer = BuyerId::parse(&name(i)).expect("buyer id");
                let token = tokens
                    .sign(&buyer, Duration::from_secs(6 * 3600))
                    .expect("sign a token");
                HeaderValue::from_str(&format!("Bearer {token}")).expect("header value")
            })
            .collect();
        Self { auth }
    }

    pub fn len(&self) -> usize {
        self.auth.len()
    }
}

pub fn name(i: usize) -> String {
    format!("b{i}")
}

/// Live holds, each on a seat of its own, handed out once each.
pub struct Holds {
    holds: Vec<(usize, i64)>,
    next: AtomicUsize,
}

impl Holds {
    /// The next unused (buyer, hold id), or `None` when all are used.
    pub fn take(&self) -> Option<(usize, i64)> {
        self.holds
            .get(self.next.fetch_add(1, Ordering::Relaxed))
            .copied()
    }

    pub fn used(&self) -> usize {
        self.next.load(Ordering::Relaxed).min(self.holds.len())
    }
}

/// Makes seats and holds on demand; labels never repeat within the event.
pub struct Factory {
    url: String,
    buyers: usize,
    next_label: AtomicU64,
}

pub const EVENT: &str = "bench";

impl Factory {
    pub async fn new(url: String, buyers: usize) -> Self {
        let client = postgres::connect(&url).await;
        client
            .execute(
                "INSERT INTO events (event_id) VALUES ($1) ON CONFLICT DO NOTHING",
                &[&EVENT],
            )
            .await
            .expect("the bench event");
        let next: i64 = client
            .query_one("SELECT count(*) FROM seats WHERE event_id = $1", &[&EVENT])
            .await
            .expect("seat count")
            .get(0);
        Self {
            url,
            buyers,
            next_label: AtomicU64::new(next as u64),
        }
    }

    /// `count` new seats, each held by buyer `seat % buyers` for two hours.
    /// The connection is closed before this returns, so that it adds nothing
    /// to the server's counters during a run.
    pub async fn holds(&self, count: usize) -> Arc<Holds> {
        let client = postgres::connect(&self.url).await;
        let mut holds = Vec::with_capacity(count);
        let mut left = count as u64;
        while left > 0 {
            let chunk = left.min(50_000);
            left -= chunk;
            let first = self.next_label.fetch_add(chunk, Ordering::Relaxed) as i64;
            // Two statements, not one with a CTE: Citus loses the parameters
            // of a CTE it plans apart from the statement around it.
            let seats: Vec<i64> = client
                .query(
                    "INSERT INTO seats (event_id, label, price_cents)
                     SELECT $1, 'S' || g, 4500
                     FROM generate_series($2::bigint, $3::bigint) g
                     RETURNING seat_id",
                    &[&EVENT, &first, &(first + chunk as i64 - 1)],
                )
                .await
                .expect("seats")
                .iter()
                .map(|row| row.get(0))
                .collect();
            let names: Vec<String> = seats
                .iter()
                .map(|seat| name(*seat as usize % self.buyers))
                .collect();
            let rows = client
                .query(
                    "INSERT INTO holds (seat_id, user_id, expires_at)
                     SELECT seat_id, user_id, now() + interval '2 hours'
                     FROM unnest($1::bigint[], $2::text[]) AS h (seat_id, user_id)
                     RETURNING hold_id, seat_id",
                    &[&seats, &names],
                )
                .await
                .expect("holds");
            holds.extend(rows.iter().map(|row| {
                let seat: i64 = row.get(1);
                (seat as usize % self.buyers, row.get::<_, i64>(0))
            }));
        }
        drop(client);
        Arc::new(Holds {
            holds,
            next: AtomicUsize::new(0),
        })
    }
}

/// The body of a one-hold order.
pub fn order_body(hold: i64) -> String {
    format!(r#"{{"hold_ids":[{hold}],"payment_method":"pm_card_visa"}}"#)
}

/// An HTTP client for `connections` concurrent requests to one host.
pub fn client(connections: usize) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(connections.max(1))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client")
}
