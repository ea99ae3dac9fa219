//! Which server a buyer's key rows are on, so that each of the buyer's
//! statements goes there first. On one PostgreSQL that is the one server.
//! On a Citus cluster it is the worker that holds the buyer's shard of
//! `idempotency_keys`, and of every table co-located with it: a statement
//! sent there runs on the shard locally, and a transaction that also
//! writes another node commits with a two-phase commit that this worker
//! coordinates (and its maintenance daemon recovers), with no planning on
//! the coordinator.
//!
//! The shard is found as Citus finds it, with no lookup per statement: the
//! hash of the buyer's id ([`hashtext`]) falls in one shard's range, read
//! with the shards' placements from the catalog ([`Route::refresh`]). A
//! route that is behind a shard's move still works, since any node runs any
//! statement: it costs one more hop until the next refresh.
//!
//! A caller whose other rows are distributed by an integer of their own (a
//! slot, co-located in one table's shards) routes those too
//! ([`Route::with_slots`]): Citus places an integer by PostgreSQL's
//! `hashint4` ([`hashint4`]).

use std::sync::{Arc, PoisonError, RwLock};

use deadpool_postgres::{BuildError, GenericClient, Pool};
use tokio_postgres::error::SqlState;
use tokio_postgres::Row;

use crate::error::Error;
use crate::hash::{hashint4, hashtext};

/// Opens a pool on a worker, given its address as the catalog names it.
pub type OpenPool = dyn Fn(&str, u16) -> Result<Pool, BuildError> + Send + Sync;

/// The pool each buyer's statements take: `home` (the server of the
/// configured URL, on a cluster its coordinator) or a worker's.
#[derive(Clone)]
pub struct Route {
    home: Pool,
    open: Option<Arc<OpenPool>>,
    /// The table distributed by slot, if the caller has one.
    slots_table: Option<&'static str>,
    shards: Arc<RwLock<Arc<Shards>>>,
}

/// The shards of the buyers' rows and of the slots' rows, with the pools
/// of the nodes that hold them; none on one PostgreSQL.
#[derive(Default)]
struct Shards {
    buyers: Ranges,
    slots: Ranges,
    /// The slots' table is hash-distributed, whether or not its
    /// statements are routed to its workers.
    spread: bool,
    /// Each worker's address (`host:port`) and pool; `None` for the home
    /// server (a shard that the coordinator itself holds).
    pools: Vec<Option<(String, Pool)>>,
}

/// One table's shards: ranges of hashes, ascending, each with the index of
/// the pool of the node that holds it. Shard `i` holds the hashes from
/// `starts[i]` to the next start.
#[derive(Default)]
struct Ranges {
    starts: Vec<i32>,
    nodes: Vec<usize>,
}

impl From<Pool> for Route {
    /// Every statement on `home`.
    fn from(home: Pool) -> Self {
        Self {
            home,
            open: None,
            slots_table: None,
            shards: Arc::default(),
        }
    }
}

impl Route {
    /// Statements on `home` until [`refresh`](Self::refresh) finds a
    /// cluster's shards there; `open` makes a pool on each worker it finds.
    pub fn to_workers(home: Pool, open: Arc<OpenPool>) -> Self {
        Self {
            open: Some(open),
            ..Self::from(home)
        }
    }

    /// Routes the rows of `table` too, distributed by an integer slot
    /// ([`slot_pool`](Self::slot_pool)), once [`refresh`](Self::refresh)
    /// finds its shards.
    pub fn with_slots(self, table: &'static str) -> Self {
        Self {
            slots_table: Some(table),
            ..self
        }
    }

    /// The server of the configured URL: what spans the buyers, and every
    /// statement when there are no workers to go to.
    pub fn home(&self) -> &Pool {
        &self.home
    }

    /// The pool for a statement on `user_id`'s rows.
    pub fn pool(&self, user_id: &str) -> Pool {
        self.pool_of(|shards| shards.buyers.node(|| hashtext(user_id)))
    }

    /// The worker `user_id`'s statements go to, as `host:port`; `None`: the
    /// home server.
    pub fn worker(&self, user_id: &str) -> Option<String> {
        self.worker_of(|shards| shards.buyers.node(|| hashtext(user_id)))
    }

    /// The pool for a statement on the rows of `slot`.
    pub fn slot_pool(&self, slot: i32) -> Pool {
        self.pool_of(|shards| shards.slots.node(|| hashint4(slot)))
    }

    /// The worker the statements on `slot`'s rows go to, as `host:port`;
    /// `None`: the home server.
    pub fn slot_worker(&self, slot: i32) -> Option<String> {
        self.worker_of(|shards| shards.slots.node(|| hashint4(slot)))
    }

    /// Whether the slots' table is spread over shards (hash-distributed):
    /// only then does a new row of the caller's get a slot other than 0.
    /// Read from the catalog by [`refresh`](Self::refresh) even when no
    /// statement is routed (without `open`, or while a function is missing
    /// on the workers), since it says where the rows are, not where a
    /// statement goes.
    pub fn slots_spread(&self) -> bool {
        self.current().spread
    }

    fn pool_of(&self, node: impl Fn(&Shards) -> Option<usize>) -> Pool {
        self.placed(node)
            .map_or_else(|| self.home.clone(), |(_, pool)| pool)
    }

    fn worker_of(&self, node: impl Fn(&Shards) -> Option<usize>) -> Option<String> {
        self.placed(node).map(|(address, _)| address)
    }

    /// The worker (address and pool) of the shard `node` picks; `None`:
    /// the home server.
    fn placed(&self, node: impl Fn(&Shards) -> Option<usize>) -> Option<(String, Pool)> {
        let shards = self.current();
        node(&shards).and_then(|n| shards.pools[n].clone())
    }

    fn current(&self) -> Arc<Shards> {
        Arc::clone(&self.shards.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Reads the shards of `idempotency_keys` and their nodes from the home
    /// server's catalog, opening a pool on each worker not seen before (a
    /// worker's pool is kept across refreshes), and whether the slots'
    /// table is spread. No statement is routed without `open` or where the
    /// table is not distributed. Every statement goes to the home server
    /// while a function of the `public` schema is not on the workers
    /// (Citus has not been handed it): called there, it would be missing.
    /// Returns how many workers the buyers' statements now go to.
    pub async fn refresh(&self) -> Result<usize, Error> {
        let client = self.home.get().await?;
        let spread = match self.slots_table {
            Some(table) => spread(&client, table).await?,
            None => false,
        };
        let Some(open) = &self.open else {
            self.replace(Shards {
                spread,
                ..Shards::default()
            });
            return Ok(0);
        };
        let missing = client
            .query_one(
                "SELECT count(*) FROM pg_proc p
                  WHERE p.pronamespace = 'public'::regnamespace
                    AND NOT EXISTS (SELECT 1 FROM pg_depend d
                                     WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                                       AND d.deptype = 'e')
                    AND NOT EXISTS (SELECT 1 FROM pg_dist_object o
                                     WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid)",
                &[],
            )
            .await
            .map(|row| row.get::<_, i64>(0));
        let placed = match missing {
            Ok(0) => {
                async {
                    let buyers = placements(&client, "idempotency_keys").await?;
                    let slots = match self.slots_table {
                        Some(table) => placements(&client, table).await?,
                        None => Vec::new(),
                    };
                    Ok(Some((buyers, slots)))
                }
                .await
            }
            Ok(missing) => {
                tracing::warn!(
                    missing,
                    "functions are not on the workers (scripts/citus-distribute.sql hands them \
                     to Citus): every statement goes through the coordinator until they are"
                );
                Ok(None)
            }
            Err(error) => Err(error),
        };
        drop(client);
        let (buyers, slots) = match placed {
            Ok(Some(placed)) => placed,
            Ok(None) => (Vec::new(), Vec::new()),
            // No Citus catalog, or no key table yet: one server.
            Err(error) if error.code() == Some(&SqlState::UNDEFINED_TABLE) => return Ok(0),
            Err(error) => return Err(error.into()),
        };
        let known = self.current();
        let mut shards = Shards {
            spread,
            ..Shards::default()
        };
        shards.buyers = shards.ranges(buyers, &known, open.as_ref())?;
        shards.slots = shards.ranges(slots, &known, open.as_ref())?;
        let workers = shards.pools.iter().flatten().count();
        self.replace(shards);
        Ok(workers)
    }

    fn replace(&self, shards: Shards) {
        *self.shards.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(shards);
    }
}

/// Whether `table` is hash-distributed; false where there is no Citus
/// catalog.
async fn spread(client: &impl GenericClient, table: &str) -> Result<bool, Error> {
    let statement = client
        .prepare_cached(
            "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL",
        )
        .await?;
    if !client.query_one(&statement, &[]).await?.try_get::<_, bool>(0)? {
        return Ok(false);
    }
    let statement = client
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM pg_dist_partition
                             WHERE logicalrelid = to_regclass($1) AND partmethod = 'h')",
        )
        .await?;
    Ok(client.query_one(&statement, &[&table]).await?.try_get(0)?)
}

/// The shards of `table` (hash-distributed), each with the first node
/// that holds it: the range's start, whether the node is the coordinator,
/// and its address.
async fn placements(
    client: &impl GenericClient,
    table: &str,
) -> Result<Vec<Row>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(
            "SELECT s.shardminvalue::int, p.groupid = 0, n.nodename, n.nodeport
               FROM pg_dist_shard s
               JOIN pg_dist_partition d ON d.logicalrelid = s.logicalrelid AND d.partmethod = 'h'
               JOIN pg_dist_placement p USING (shardid)
               JOIN pg_dist_node n ON n.groupid = p.groupid
              WHERE s.logicalrelid = $1::text::regclass
                AND n.noderole = 'primary' AND n.isactive
              ORDER BY 1",
        )
        .await?;
    client.query(&statement, &[&table]).await
}

impl Ranges {
    /// The index of the pool of the shard that holds `hash`; `None` for
    /// the home server.
    fn node(&self, hash: impl FnOnce() -> i32) -> Option<usize> {
        // One server: nothing to hash on every call of the click path.
        if self.starts.is_empty() {
            return None;
        }
        let hash = hash();
        let shard = self
            .starts
            .partition_point(|&start| start <= hash)
            .checked_sub(1)?;
        Some(self.nodes[shard])
    }
}

impl Shards {
    /// The ranges of the shards `placed` ([`placements`]), with a pool for
    /// each node not seen yet.
    fn ranges(&mut self, placed: Vec<Row>, known: &Shards, open: &OpenPool) -> Result<Ranges, Error> {
        let mut ranges = Ranges::default();
        for row in placed {
            let start: i32 = row.try_get(0)?;
            // A shard placed twice (a replica) goes to its first placement.
            if ranges.starts.last() == Some(&start) {
                continue;
            }
            // A port that is not one (the catalog's is an integer) leaves
            // the shard to the home server, which reaches every node.
            let worker = match (row.try_get::<_, bool>(1)?, u16::try_from(row.try_get::<_, i32>(3)?)) {
                (false, Ok(port)) => Some((row.try_get::<_, String>(2)?, port)),
                _ => None,
            };
            let node = self.node_of(worker, known, open)?;
            ranges.starts.push(start);
            ranges.nodes.push(node);
        }
        Ok(ranges)
    }

    /// The index of `worker`'s pool (`None`: the home server), added when
    /// new: the pool `known` has on its address, else one `open` makes.
    fn node_of(
        &mut self,
        worker: Option<(String, u16)>,
        known: &Shards,
        open: &OpenPool,
    ) -> Result<usize, Error> {
        let address = worker.as_ref().map(|(host, port)| format!("{host}:{port}"));
        let same = |pool: &Option<(String, Pool)>| pool.as_ref().map(|(a, _)| a) == address.as_ref();
        if let Some(index) = self.pools.iter().position(same) {
            return Ok(index);
        }
        let pool = match worker {
            Some((host, port)) => {
                let pool = match known.pools.iter().find(|p| same(p)) {
                    Some(Some((_, pool))) => pool.clone(),
                    _ => open(&host, port)?,
                };
                Some((format!("{host}:{port}"), pool))
            }
            None => None,
        };
        self.pools.push(pool);
        Ok(self.pools.len() - 1)
    }
}
