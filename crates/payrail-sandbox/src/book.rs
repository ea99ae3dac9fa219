//! The sandbox's memory behind one mutex: its faults, its own idempotency
//! table, the request counts, the ledger of every charge decided, the keys
//! voided by a cancel, and the events sent about charges.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use actix_web::http::{header, StatusCode};
use actix_web::web::Bytes;
use actix_web::HttpRequest;
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use crate::request::{Card, ChargeRequest, Faults, Rng};
use crate::webhook::{Delivery, Event, Sender};

/// Everything the workers share: the API key, where events go (if
/// anywhere) and the book behind one mutex.
pub(crate) struct State {
    pub(crate) api_key: String,
    pub(crate) webhook: Option<Sender>,
    pub(crate) book: Mutex<Book>,
}

impl State {
    pub(crate) fn new(api_key: String, webhook: Option<Sender>) -> Self {
        State {
            api_key,
            webhook,
            book: Mutex::new(Book::new()),
        }
    }

    /// The book is only ever touched synchronously (never across an await), so
    /// a panic cannot leave it half-written; a poisoned lock is still usable.
    pub(crate) fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn authorized(&self, req: &HttpRequest) -> bool {
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .is_some_and(|token| token == self.api_key)
    }
}

/// The sandbox's memory: faults, idempotency table, request counts, ledger.
pub(crate) struct Book {
    pub(crate) faults: Faults,
    pub(crate) answers: HashMap<String, Stored>,
    pub(crate) requests: HashMap<String, u64>,
    pub(crate) ledger: Vec<Charge>,
    /// Keys a cancel voided: no charge is ever made or answered under them.
    pub(crate) void: HashSet<String>,
    /// Every event sent, in the order the charges were decided.
    pub(crate) events: HashMap<String, Delivery>,
    pub(crate) rng: Rng,
}

/// A key's first request and the answer it got, replayed for every repeat,
/// and where its charge is in the ledger.
pub(crate) struct Stored {
    pub(crate) request: ChargeRequest,
    pub(crate) answer: Answer,
    pub(crate) ledger: usize,
}

/// A serialized answer, kept as bytes so that replays are byte-identical.
#[derive(Clone)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) body: Bytes,
}

/// One charge decided, succeeded or declined (or refunded since, by a
/// cancel), as listed in the ledger.
#[derive(Clone, Serialize)]
pub(crate) struct Charge {
    pub(crate) id: String,
    pub(crate) idempotency_key: String,
    pub(crate) reference: String,
    pub(crate) amount_cents: i64,
    pub(crate) status: &'static str,
}

/// What the book decided for one charge request.
pub(crate) enum Decision {
    Replay(Answer),
    Mismatch,
    /// 409 and nothing charged: a cancel voided the key.
    Void,
    /// 500 and nothing recorded: `pm_card_error` or an `error_rate` hit.
    Refuse,
    Charged {
        answer: Answer,
        event: Event,
        delay: Duration,
        /// The event waits for the answer's `delay` too.
        event_late: bool,
        drop: bool,
    },
}

/// What a cancel found under its key.
pub(crate) enum Canceled {
    /// Nothing was charged; nothing ever will be.
    Nothing,
    /// This charge was made, and is refunded now.
    Refunded { charge_id: String },
}

impl Book {
    pub(crate) fn new() -> Self {
        Book {
            faults: Faults::default(),
            answers: HashMap::new(),
            requests: HashMap::new(),
            ledger: Vec::new(),
            void: HashSet::new(),
            events: HashMap::new(),
            rng: Rng::seeded(),
        }
    }

    pub(crate) fn count_request(&mut self, key: &str) {
        *self.requests.entry(key.to_owned()).or_default() += 1;
    }

    /// Decides a charge request completely while the lock is held, so
    /// concurrent repeats see either nothing or the finished answer: no
    /// in-flight state is needed. Faults only hit requests that would charge.
    pub(crate) fn decide(&mut self, key: &str, request: &ChargeRequest) -> Decision {
        self.count_request(key);
        if self.void.contains(key) {
            return Decision::Void;
        }
        if let Some(stored) = self.answers.get(key) {
            return if stored.request == *request {
                Decision::Replay(stored.answer.clone())
            } else {
                Decision::Mismatch
            };
        }
        let card = Card::of(&request.payment_method);
        if card == Card::Errors || self.rng.chance(self.faults.error_rate) {
            return Decision::Refuse;
        }
        let drop = self.rng.chance(self.faults.drop_after_charge_rate);
        let delay = match card {
            Card::Slow | Card::Late => Duration::from_millis(self.faults.slow_ms),
            _ => Duration::ZERO,
        };
        let (answer, event) = self.charge(key, request, card);
        Decision::Charged {
            answer,
            event,
            delay,
            event_late: card == Card::Late,
            drop,
        }
    }

    /// Makes the charge: records it in the ledger and its answer under the
    /// key, and says it in an event.
    pub(crate) fn charge(
        &mut self,
        key: &str,
        request: &ChargeRequest,
        card: Card,
    ) -> (Answer, Event) {
        let id = format!("ch_{}", Uuid::new_v4().simple());
        let (status, outcome, body) = if card == Card::Declines {
            let body = json!({"id": id, "status": "declined", "decline_code": "card_declined"});
            (StatusCode::PAYMENT_REQUIRED, "declined", body)
        } else {
            let body = json!({
                "id": id,
                "status": "succeeded",
                "amount_cents": request.amount_cents,
                "currency": request.currency,
                "reference": request.reference,
            });
            (StatusCode::CREATED, "succeeded", body)
        };
        tracing::info!(
            charge_id = %id,
            idempotency_key = key,
            outcome,
            "payrail sandbox charge decided"
        );
        let answer = Answer {
            status,
            body: Bytes::from(body.to_string()),
        };
        let event = Event::new(&id, outcome, key, request);
        self.ledger.push(Charge {
            id,
            idempotency_key: key.to_owned(),
            reference: request.reference.clone(),
            amount_cents: request.amount_cents,
            status: outcome,
        });
        self.answers.insert(
            key.to_owned(),
            Stored {
                request: request.clone(),
                answer: answer.clone(),
                ledger: self.ledger.len() - 1,
            },
        );
        (answer, event)
    }

    /// Voids the key for good and refunds what was charged under it, if
    /// anything: a repeat answers the same.
    pub(crate) fn cancel(&mut self, key: &str) -> Canceled {
        self.void.insert(key.to_owned());
        let Some(stored) = self.answers.get(key) else {
            return Canceled::Nothing;
        };
        let charge = &mut self.ledger[stored.ledger];
        match charge.status {
            "declined" => Canceled::Nothing,
            _ => {
                if charge.status != "refunded" {
                    tracing::info!(charge_id = %charge.id, idempotency_key = key, "payrail sandbox charge refunded");
                }
                charge.status = "refunded";
                Canceled::Refunded {
                    charge_id: charge.id.clone(),
                }
            }
        }
    }

    pub(crate) fn ledger_rows(&self) -> Vec<serde_json::Value> {
        self.ledger
            .iter()
            .map(|charge| {
                let requests = self.requests.get(&charge.idempotency_key).copied();
                let mut row = json!(charge);
                row["requests"] = json!(requests.unwrap_or(0));
                row
            })
            .collect()
    }

    pub(crate) fn event_rows(&self) -> Vec<Delivery> {
        let mut rows: Vec<Delivery> = self.events.values().cloned().collect();
        rows.sort_by_key(|row| row.seq);
        rows
    }

    pub(crate) fn clear(&mut self) {
        self.answers.clear();
        self.requests.clear();
        self.ledger.clear();
        self.void.clear();
        self.events.clear();
    }
}
