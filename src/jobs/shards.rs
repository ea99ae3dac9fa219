//! Where each buyer's statements go on a Citus cluster: the shards' places
//! read at start and again every [`EVERY`], so that a shard moved by a
//! rebalance, or a worker added, is routed to within a minute (until then
//! its statements take one more hop, through the node that got them).

use std::time::Duration;

use idempotency::Route;

/// How often the shards' places are read again.
pub const EVERY: Duration = Duration::from_secs(60);

/// Reads the shards' places; a failure keeps the routes known so far.
/// Returns how many workers the buyers' statements go to.
pub async fn refresh_logged(route: &Route) -> usize {
    match route.refresh().await {
        Ok(workers) => workers,
        Err(error) => {
            tracing::warn!(%error, "could not read the cluster's shards; routes unchanged");
            0
        }
    }
}
