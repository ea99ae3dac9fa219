//! What a client sees of a response, read once: the status, the headers a
//! client of an idempotent API acts on, the body's bytes, and the problem
//! slug of an RFC 9457 body. The API tests assert on it, the chaos run
//! records and compares it, the bench counts it.

use serde_json::Value;

/// The `type` of every problem body starts with this; the rest is its slug.
pub const PROBLEM_TYPE_PREFIX: &str = "https://stagedoor.example/problems/";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub status: u16,
    pub content_type: Option<String>,
    pub location: Option<String>,
    /// `Idempotent-Replayed: true`.
    pub replayed: bool,
    pub retry_after: Option<String>,
    /// The problem slug, for an `application/problem+json` body whose
    /// `type` is one of ours.
    pub slug: Option<String>,
    pub body: Vec<u8>,
}

impl Seen {
    /// Reads the whole response; `Err` if its body does not arrive (a
    /// timeout, a cut connection).
    pub async fn read(response: reqwest::Response) -> Result<Self, reqwest::Error> {
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let status = response.status().as_u16();
        let content_type = header("content-type");
        let location = header("location");
        let replayed = header("idempotent-replayed").as_deref() == Some("true");
        let retry_after = header("retry-after");
        let body = response.bytes().await?.to_vec();
        let slug = (content_type.as_deref() == Some("application/problem+json"))
            .then(|| serde_json::from_slice::<Value>(&body).ok())
            .flatten()
            .and_then(|v| {
                v["type"]
                    .as_str()
                    .and_then(|t| t.strip_prefix(PROBLEM_TYPE_PREFIX))
                    .map(str::to_owned)
            });
        Ok(Self {
            status,
            content_type,
            location,
            replayed,
            retry_after,
            slug,
            body,
        })
    }

    /// [`Self::read`], panicking if the body does not arrive.
    pub async fn of(response: reqwest::Response) -> Self {
        Self::read(response).await.expect("body")
    }

    /// `Retry-After` in seconds, when it is a number.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after.as_deref().and_then(|v| v.parse().ok())
    }

    /// The body as JSON; panics if it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }

    /// The problem slug of an RFC 9457 body, asserting that the body is one:
    /// `application/problem+json`, its `status` the response's, a `title`
    /// and a `detail`, a `type` of ours.
    pub fn problem(&self) -> String {
        assert_eq!(
            self.content_type.as_deref(),
            Some("application/problem+json"),
            "a problem body: {}",
            String::from_utf8_lossy(&self.body)
        );
        let body = self.json();
        assert_eq!(body["status"].as_u64(), Some(u64::from(self.status)));
        assert!(body["title"].is_string() && body["detail"].is_string());
        body["type"]
            .as_str()
            .and_then(|t| t.strip_prefix(PROBLEM_TYPE_PREFIX))
            .expect("problem type")
            .to_owned()
    }

    /// `201 (replayed false) {"order_id":…` with the body cut at 300
    /// characters, for messages.
    pub fn text(&self) -> String {
        let body = String::from_utf8_lossy(&self.body);
        let body: String = body.chars().take(300).collect();
        format!("{} (replayed {}) {body}", self.status, self.replayed)
    }
}
