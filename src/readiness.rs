//! Whether this instance can serve, as `/readyz` asks it: one database check
//! at a time, its outcome shared. `/readyz` takes no token, so a check per
//! call would let anyone who reaches the port turn a flood of cheap requests
//! into the pool's connections, which the clicks need. Callers that come
//! while a check runs wait for its outcome, and an outcome answers for
//! [`FRESH`] after it: at most one pooled connection, about once a second,
//! whatever the number of callers.

use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio::sync::Mutex;

use crate::db::DbError;

/// How long an outcome answers for. A load balancer polls every few seconds
/// and acts on a few outcomes in a row; a second of staleness changes
/// nothing for it.
pub const FRESH: Duration = Duration::from_secs(1);

pub struct Readiness {
    pool: Pool,
    /// When the last check finished, and whether the database answered.
    /// Held across the check: that is what makes callers share it.
    last: Mutex<Option<(Instant, bool)>>,
}

impl Readiness {
    pub fn new(pool: Pool) -> Self {
        Self {
            pool,
            last: Mutex::new(None),
        }
    }

    /// Whether a pooled connection answered, at most [`FRESH`] ago.
    pub async fn database_answers(&self) -> bool {
        let mut last = self.last.lock().await;
        if let Some((at, answered)) = *last {
            if at.elapsed() < FRESH {
                return answered;
            }
        }
        let answered = match self.check().await {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(?error, "the readiness check found no database");
                false
            }
        };
        *last = Some((Instant::now(), answered));
        answered
    }

    async fn check(&self) -> Result<(), DbError> {
        let client = self.pool.get().await?;
        client.simple_query("SELECT 1").await?;
        Ok(())
    }
}
