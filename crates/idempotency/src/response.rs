//! What is stored for an intent: its first answer, replayed byte for byte.

use tokio_postgres::Row;

use crate::error::Error;

/// An answer as it was first given: the status, the headers a client acts on
/// (`Content-Type`, `Location`) and the body bytes. The engine never looks
/// inside; a replay gives back exactly these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub content_type: String,
    pub location: Option<String>,
    pub body: Vec<u8>,
}

impl StoredResponse {
    /// An answer with a body of this media type and no `Location`.
    pub fn new(status: u16, content_type: impl Into<String>, body: Vec<u8>) -> Self {
        Self {
            status,
            content_type: content_type.into(),
            location: None,
            body,
        }
    }

    /// The same answer, naming the resource it made.
    pub fn with_location(mut self, location: impl Into<String>) -> Self {
        self.location = Some(location.into());
        self
    }

    /// The stored answer of a selected key row (its `response_*` columns),
    /// or `None` while the key is in progress.
    pub(crate) fn of_row(row: &Row) -> Result<Option<Self>, Error> {
        let Some(status) = row.try_get::<_, Option<i16>>("response_status")? else {
            return Ok(None);
        };
        Ok(Some(StoredResponse {
            status: u16::try_from(status).unwrap_or(500),
            content_type: row
                .try_get::<_, Option<String>>("response_content_type")?
                .unwrap_or_default(),
            location: row.try_get("response_location")?,
            body: row
                .try_get::<_, Option<Vec<u8>>>("response_body")?
                .unwrap_or_default(),
        }))
    }
}
