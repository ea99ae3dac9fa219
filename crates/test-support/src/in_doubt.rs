//! A two-phase commit that a worker of a Citus cluster coordinates, caught
//! between its phases: another node has prepared its part, and the
//! worker's backend that coordinates the commit is stopped (SIGSTOP)
//! before it tells that node to commit it. Crashing the worker then
//! ([`Worker::crash`]) leaves the commit's outcome in doubt on the other
//! node until the cluster's recovery decides it.
//!
//! A worker coordinates a two-phase commit whenever a statement that wrote
//! rows on two nodes entered the cluster there: Citus names the prepared
//! part `citus_<group>_<pid>_<number>_<connection>`, the group and backend
//! pid of the coordinator of the commit. The part is there from its
//! `PREPARE TRANSACTION` to the coordinator's `COMMIT PREPARED`, which is
//! sent after the coordinator's own commit is flushed: that window is what
//! [`catch`] watches for, on every node at once.

use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};

use crate::citus::Worker;
use crate::process::{parent, signal_now};

/// A commit caught between its phases, its coordinating backend stopped.
pub struct InDoubt {
    /// Which of the workers given to [`catch`] coordinates it.
    pub worker: usize,
    /// The name of its prepared part.
    pub gid: String,
    /// The URL of the database that part is prepared in.
    pub participant: String,
}

/// How long a prepared part must outlive the stop of its coordinating
/// backend to be in doubt: a `COMMIT PREPARED` sent just before the stop
/// arrives within it, and the part is gone then.
const SETTLE: Duration = Duration::from_millis(50);

/// Watches the prepared transactions of the database on every node
/// (`nodes`: its URL on each) until one that a worker of `workers`
/// coordinates is caught between its phases, or until `until`. The
/// worker's coordinating backend stays stopped: crash the worker next.
pub async fn catch(
    nodes: &[String],
    workers: &[Worker],
    until: Instant,
) -> Result<Option<InDoubt>, String> {
    let mut watched = Vec::with_capacity(nodes.len());
    for url in nodes {
        let (client, connection) = tokio_postgres::connect(url, NoTls)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        tokio::spawn(connection);
        let group: i32 = client
            .query_one("SELECT groupid FROM pg_dist_local_group", &[])
            .await
            .map_err(|e| format!("{url}: its group: {e}"))?
            .get(0);
        watched.push((url, client, group));
    }
    while Instant::now() < until {
        for (url, client, own_group) in &watched {
            for gid in prepared(client, url).await? {
                let Some((group, pid)) = coordinator_of(&gid) else {
                    continue;
                };
                let Some(worker) = workers.iter().position(|w| w.group == group) else {
                    continue;
                };
                if group == *own_group || !stop(&workers[worker], pid)? {
                    continue;
                }
                tokio::time::sleep(SETTLE).await;
                if prepared(client, url).await?.contains(&gid) {
                    return Ok(Some(InDoubt {
                        worker,
                        gid,
                        participant: url.to_string(),
                    }));
                }
                signal_now(pid, libc::SIGCONT);
            }
        }
        tokio::task::yield_now().await;
    }
    Ok(None)
}

/// The names of the prepared transactions of the database `client` is on.
async fn prepared(client: &Client, url: &str) -> Result<Vec<String>, String> {
    Ok(client
        .query(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()",
            &[],
        )
        .await
        .map_err(|e| format!("{url}: pg_prepared_xacts: {e}"))?
        .iter()
        .map(|row| row.get(0))
        .collect())
}

/// The group and backend pid of the coordinator of a prepared part that
/// Citus named.
fn coordinator_of(gid: &str) -> Option<(i32, u32)> {
    let mut parts = gid.strip_prefix("citus_")?.split('_');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Stops `pid` if it is a backend of `worker`'s server (the pid of a
/// commit that just ended may be another process's by now, so it is
/// checked before and after); whether it was stopped.
fn stop(worker: &Worker, pid: u32) -> Result<bool, String> {
    let postmaster = Some(worker.postmaster()?);
    if parent(pid) != postmaster || !signal_now(pid, libc::SIGSTOP) {
        return Ok(false);
    }
    if parent(pid) == postmaster {
        return Ok(true);
    }
    signal_now(pid, libc::SIGCONT);
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_citus_name_gives_its_coordinators_group_and_pid() {
        assert_eq!(coordinator_of("citus_2_81234_17_0"), Some((2, 81234)));
        assert_eq!(coordinator_of("citus_0_5_1_3"), Some((0, 5)));
        assert_eq!(coordinator_of("my_own_gid"), None);
        assert_eq!(coordinator_of("citus_x_1_1_1"), None);
    }
}
