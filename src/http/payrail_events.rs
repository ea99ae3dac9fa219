//! `POST /payrail/events`: Payrail's signed events, with no buyer token.
//! The signature header is checked before the body is read (its bounds and
//! its timestamp), then its MAC over the raw bytes, once, before anything
//! else (nothing is written for an event that is not believed); then the event
//! is applied at most once by its id through the idempotency engine, in a
//! scope of its own, with the event's bytes as the request, so that a
//! duplicate, even a concurrent one on another instance, gets the first
//! answer and changes nothing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::{post, web, HttpRequest, HttpResponse};
use idempotency::{actix, Done, Engine, IdempotencyKey, Reply, StoredResponse};
use serde_json::json;

use super::{body, AppState};
use crate::checkout::orders::event::{self, EventResult};
use crate::observe::{Counter, Histogram, Label, Metric};
use crate::payrail::{Event, EventKind, SignatureError, Verifier};
use crate::problem::Problem;

/// The idempotency scope event ids are kept in. A scope is compared with
/// buyer ids, and a buyer id may be any printable string of up to 255
/// bytes: this one starts with U+0001, a control character no buyer id
/// (a token's `sub`, checked printable at the door) can hold, so an event
/// id can never collide with, read or block a buyer's key.
pub const EVENT_SCOPE: &str = "\u{1}payrail-events";
/// A duplicate that finds the first delivery still being applied waits this
/// long for its answer before a 409 (which Payrail retries later).
const DUPLICATE_WAIT: Duration = Duration::from_secs(5);

const EVENTS: Counter<(EventKind, EventResult)> = Counter::new(
    "payrail_events_total",
    "Payrail events received, by type and result (bad_signature: refused, nothing written)",
);
const EVENT_AGE: Histogram = Histogram::new(
    "payrail_event_age_seconds",
    "Seconds from Payrail's decision (the event's created) to the event settling its order",
);
/// What receiving events reports, for the recorder (`observe::install`).
pub const METRICS: &[&dyn Metric] = &[&EVENTS, &EVENT_AGE];

/// What receiving events needs: the signature check and an engine of its
/// own, without the per-buyer limit (every event shares one scope).
pub struct PayrailEvents {
    pub verifier: Verifier,
    pub engine: Engine,
}

/// 404 unless `payrail.webhook_secret` is set.
#[utoipa::path(
    operation_id = "receive_payrail_event",
    tag = "payrail",
    summary = "Payrail's signed charge events (for Payrail, not for buyers)",
    description = "No bearer token: the `Payrail-Signature` header (`t=<unix seconds>,v1=<hex \
        HMAC-SHA256 of \"<t>.<raw body>\">` under `payrail.webhook_secret`) is the proof. \
        `charge.succeeded` / `charge.declined` settle the order named by `reference`, once per \
        event id; an unknown, already settled or contradicting event, or one for another amount \
        or currency than its order's, is a 200 that changes nothing. 404 when \
        `payrail.webhook_secret` is not set.",
    params(("Payrail-Signature" = String, Header,
        description = "`t=<unix seconds>,v1=<hex HMAC-SHA256>`, within \
            `payrail.webhook_tolerance_secs` of now")),
    security(),
    request_body(content = String, content_type = "application/json",
        description = "The event: `{\"id\": \"evt_…\", \"type\", \"created\", \"data\": \
            {\"charge\": {\"id\", \"status\", \"amount_cents\", \"currency\", \"reference\", \
            \"idempotency_key\"}}}`"),
    responses(
        (status = 200, description = "Received: `{\"result\": \"applied\" | \"already_settled\" \
            | \"unknown\" | \"contradicting\" | \"mismatched\"}`; a repeat of the event id \
            replays its first answer with `Idempotent-Replayed: true`",
            headers(("Idempotent-Replayed" = String, description = "`true` on a repeat"))),
    )
)]
#[post("/payrail/events")]
pub async fn receive(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    let Some(events) = &state.events else {
        return Err(Problem::NotFound("there is nothing at this path"));
    };
    // The header first, the body only for a header that passed: a request
    // without a current signature costs no read and no MAC.
    let header = req.headers().get("Payrail-Signature").map(|v| v.as_bytes());
    let signature = events
        .verifier
        .check_header(header, unix_now())
        .map_err(refused)?;
    let bytes = body::read(&req, payload, &state).await?;
    events
        .verifier
        .verify(&signature, &bytes)
        .map_err(refused)?;
    let event: Event = body::json(&bytes)?;
    let key = IdempotencyKey::parse(event.id.as_bytes())
        .map_err(|e| Problem::InvalidRequest(format!("the event id is not usable: {e}")))?;
    let kind = event.kind();
    let orders = &state.orders;
    let hash = actix::fingerprint(&req, &bytes);
    let ran = events
        .engine
        .run(
            EVENT_SCOPE,
            &key,
            &hash,
            None,
            DUPLICATE_WAIT,
            |_claim| async move {
                let result = event::apply(orders, &event).await.map_err(Problem::from)?;
                EVENTS.of((kind, result)).increment(1);
                if result == EventResult::Applied {
                    // How long after Payrail decided the event took effect.
                    let age = unix_now() as f64 - event.created as f64;
                    EVENT_AGE.get().record(age.max(0.0));
                }
                Ok::<_, Problem>(Done::Answer(answer(result)))
            },
        )
        .await?;
    if let Reply::Replay(_) = ran.reply {
        EVENTS.of((kind, EventResult::Duplicate)).increment(1);
    }
    Ok(actix::respond(ran.reply)?)
}

fn refused(error: SignatureError) -> Problem {
    EVENTS
        .of((EventKind::Unverified, EventResult::BadSignature))
        .increment(1);
    tracing::warn!(%error, "a Payrail event was refused");
    error.into()
}

fn answer(result: EventResult) -> StoredResponse {
    let body = json!({ "result": result.as_str() })
        .to_string()
        .into_bytes();
    StoredResponse::new(200, "application/json", body)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}
