//! How a `Problem` is sent: the response with its headers
//! (`WWW-Authenticate`, `Retry-After`, `Location`), the engine's refusals
//! (409, 422, 429) as problems, and what a keyed request's stored answer
//! says, for the request's log. Unexpected errors log their whole chain and
//! answer an opaque 500.

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use idempotency::actix::{Answered, Refusal, Unanswered};
use uuid::Uuid;

use crate::problem::{told, Carries, Problem, CONTENT_TYPE};
use crate::telemetry::{self, ProblemSlug};

impl From<Unanswered<Problem>> for Problem {
    fn from(unanswered: Unanswered<Problem>) -> Self {
        match unanswered {
            Unanswered::Refused(refusal) => refusal.into(),
            Unanswered::Failed(error) => error.into(),
        }
    }
}

impl From<Refusal> for Problem {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            // Every effect this service links to a key is an order's id.
            Refusal::InProgress { effect } => Problem::RequestInProgress {
                order_id: effect.and_then(|effect| Uuid::parse_str(&effect).ok()),
            },
            Refusal::KeyReused => Problem::KeyReused,
            Refusal::Limited(retry_after) => Problem::RateLimited { retry_after },
        }
    }
}

impl ResponseError for Problem {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        if self.status_code().is_server_error() {
            tracing::error!(error = ?anyhow_chain(self), "request failed");
        }
        let response = self.to_response();
        let mut builder = HttpResponse::build(self.status_code());
        builder.insert_header((header::CONTENT_TYPE, CONTENT_TYPE));
        match self.kind().entry().carries {
            Carries::Challenge => {
                builder.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            Carries::RetryAfter => {
                // Whole seconds, rounded up: `Retry-After: 0` would invite a storm.
                let after = self.retry_after();
                let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
                builder.insert_header((header::RETRY_AFTER, HeaderValue::from(secs.max(1))));
            }
            Carries::Order | Carries::Nothing => {}
        }
        if let Problem::RequestInProgress {
            order_id: Some(order_id),
        } = self
        {
            builder.insert_header((header::LOCATION, format!("/orders/{order_id}")));
        }
        let mut answer = builder.body(response.body);
        answer
            .extensions_mut()
            .insert(ProblemSlug(self.kind().entry().slug));
        answer
    }
}

/// The response of a keyed request, marked with what its stored answer
/// says when it is a problem (its slug and the order it names, for the
/// request's log): a replay says what the first answer said.
pub fn answered(req: &HttpRequest, answered: Answered) -> HttpResponse {
    let Answered {
        mut response,
        answer,
    } = answered;
    if let Some(told) = told(&answer) {
        // A stored problem is no `Problem` here: what it is comes from its body.
        response.extensions_mut().insert(ProblemSlug(told.slug));
        if let Some(order_id) = told.order_id {
            telemetry::note_order(req, order_id);
        }
    }
    response
}

/// The error and its sources, outermost first, for the log.
fn anyhow_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut chain = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        chain.push_str(": ");
        chain.push_str(&cause.to_string());
        source = cause.source();
    }
    chain
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn an_answer_carries_what_the_catalogue_says() {
        let order_id = Uuid::nil();
        let retry_after = Duration::from_millis(1500);
        let problems = [
            Problem::Unauthorized("no token"),
            Problem::NotFound("nothing here"),
            Problem::RequestInProgress { order_id: None },
            Problem::RequestInProgress {
                order_id: Some(order_id),
            },
            Problem::RateLimited { retry_after },
            Problem::HoldUnavailable,
            Problem::PaymentDeclined {
                order_id,
                decline_code: None,
            },
            Problem::PaymentFailed { order_id },
            Problem::PaymentUnavailable { retry_after },
            Problem::NotReady,
            Problem::KeysUnavailable,
            Problem::Internal(anyhow::anyhow!("a bug")),
        ];
        for problem in problems {
            let carries = problem.kind().entry().carries;
            let response = problem.error_response();
            let headers = response.headers();
            let body: serde_json::Value =
                serde_json::from_slice(&problem.to_response().body).unwrap();
            let said = (
                headers.contains_key(header::WWW_AUTHENTICATE),
                headers.contains_key(header::RETRY_AFTER),
                body.get("order_id").is_some(),
            );
            let catalogued = (
                carries == Carries::Challenge,
                carries == Carries::RetryAfter,
                carries == Carries::Order,
            );
            assert_eq!(said, catalogued, "{problem:?}");
        }
    }
}
