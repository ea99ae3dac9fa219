//! On the Citus profile (`STAGEDOOR_TEST_CITUS=1`): which nodes a click's
//! routed statements reach, read from what the coordinator sends them
//! (`citus.log_remote_commands`, one notice per command, naming the node).
//! The claim (the engine's `idempotency_claim`), the key's read without a
//! claim, the answer stored for a settled order (an event's or
//! reconciliation's) and `GET /orders/{id}`'s load must each be one
//! command, on the worker that holds the buyer's shard, with no transaction
//! around it (no `BEGIN`, no `PREPARE TRANSACTION`) and no step joined on
//! the coordinator. On one PostgreSQL there is no other node to reach: each
//! test says so and checks nothing.

use std::time::Duration;

use deadpool_postgres::{Connect, Manager, ManagerConfig, Pool};
use futures_util::future::BoxFuture;
use idempotency::{store, IdempotencyKey, Policy, RequestHash, StoredResponse};
use stagedoor_checkout::checkout::orders;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, NoTls};
use uuid::Uuid;

use crate::helpers::{new_key, spawn_app, TestApp};

/// A connection to the app's database that records every command the
/// coordinator sends to a worker, as `(node "host:port", command)`.
struct Watched {
    client: deadpool_postgres::Object,
    commands: mpsc::UnboundedReceiver<(String, String)>,
}

/// Opens connections whose notices go to `sender` (deadpool's own connect
/// drops them).
struct Listening {
    sender: mpsc::UnboundedSender<(String, String)>,
}

impl Connect for Listening {
    fn connect(
        &self,
        config: &tokio_postgres::Config,
    ) -> BoxFuture<'_, Result<(tokio_postgres::Client, JoinHandle<()>), tokio_postgres::Error>>
    {
        let (config, sender) = (config.clone(), self.sender.clone());
        Box::pin(async move {
            let (client, mut connection) = config.connect(NoTls).await?;
            let task = tokio::spawn(async move {
                while let Some(message) =
                    std::future::poll_fn(|cx| connection.poll_message(cx)).await
                {
                    let Ok(AsyncMessage::Notice(notice)) = message else {
                        continue;
                    };
                    // "issuing <command>", detail "on server user@host:port connectionId: n"
                    let Some(command) = notice.message().strip_prefix("issuing ") else {
                        continue;
                    };
                    let node = notice
                        .detail()
                        .and_then(|d| d.split('@').nth(1))
                        .and_then(|d| d.split_whitespace().next())
                        .unwrap_or("?")
                        .to_owned();
                    let _ = sender.send((node, command.to_owned()));
                }
            });
            Ok((client, task))
        })
    }
}

impl Watched {
    async fn open(app: &TestApp) -> Self {
        let (sender, commands) = mpsc::unbounded_channel();
        let config: tokio_postgres::Config = app.db.url.parse().expect("the database URL");
        let manager = Manager::from_connect(config, Listening { sender }, ManagerConfig::default());
        let pool = Pool::builder(manager).max_size(1).build().expect("a pool");
        let client = pool.get().await.expect("connect to the coordinator");
        client
            .batch_execute("SET citus.log_remote_commands = on")
            .await
            .expect("citus.log_remote_commands");
        Self { client, commands }
    }

    /// The commands sent since the last call.
    fn sent(&mut self) -> Vec<(String, String)> {
        std::iter::from_fn(|| self.commands.try_recv().ok()).collect()
    }

    /// The worker ("host:port") that holds `user_id`'s shard of the keys.
    async fn worker_of(&mut self, user_id: &str) -> String {
        let row = self
            .client
            .query_one(
                "SELECT nodename || ':' || nodeport FROM citus_shards
                 WHERE table_name = 'idempotency_keys'::regclass
                   AND shardid = get_shard_id_for_distribution_column('idempotency_keys', $1::text)",
                &[&user_id],
            )
            .await
            .expect("the shard's placement");
        self.sent();
        row.get(0)
    }
}

/// One command, on `worker`, of no transaction: a single-task router (or
/// delegated function) execution.
fn assert_routed(what: &str, sent: &[(String, String)], worker: &str, names: &str) {
    assert_eq!(
        sent.len(),
        1,
        "{what}: one command to one worker, not {sent:#?}"
    );
    let (node, command) = &sent[0];
    assert_eq!(node, worker, "{what}: on the buyer's worker: {command}");
    assert!(command.contains(names), "{what}: {command}");
    for step in ["BEGIN", "PREPARE TRANSACTION", "read_intermediate_result"] {
        assert!(!command.contains(step), "{what}: {step} in {command}");
    }
}

/// On the cluster: an app, a watched connection to its database, and the
/// worker that holds alice's shard. On one PostgreSQL: `None`, said so.
async fn watching_alice() -> Option<(TestApp, Watched, String)> {
    if !test_support::citus::enabled() {
        eprintln!("one PostgreSQL: no worker to route to (STAGEDOOR_TEST_CITUS=1 runs this)");
        return None;
    }
    let app = spawn_app().await;
    let mut db = Watched::open(&app).await;
    let worker = db.worker_of("alice").await;
    Some((app, db, worker))
}

const POLICY: Policy = Policy {
    ttl: Duration::from_secs(86_400),
    lease: Duration::from_secs(30),
};

#[tokio::test]
async fn the_claim_and_its_replay_run_whole_on_the_buyers_worker() {
    let Some((_app, mut db, worker)) = watching_alice().await else {
        return;
    };
    let key = IdempotencyKey::parse(new_key().as_bytes()).expect("a key");
    let hash = RequestHash::of("POST", "/orders", b"{}");

    let first = store::begin(&db.client, POLICY, "alice", &key, &hash)
        .await
        .expect("claim");
    assert!(matches!(first, store::Begin::Claimed(_)));
    assert_routed("the claim", &db.sent(), &worker, "idempotency_claim(");

    // The same click again: the same call, which now reads the row it lost to.
    let again = store::begin(&db.client, POLICY, "alice", &key, &hash)
        .await
        .expect("claim again");
    assert!(matches!(again, store::Begin::InProgress));
    assert_routed("the claim again", &db.sent(), &worker, "idempotency_claim(");

    // The key's read without a claim (a request the Redis gate turned away).
    let seen = store::existing(&db.client, POLICY, "alice", &key, &hash)
        .await
        .expect("read");
    assert!(matches!(seen, Some(store::Begin::InProgress)));
    assert_routed("the key's read", &db.sent(), &worker, "idempotency_keys");
}

#[tokio::test]
async fn an_orders_load_runs_on_the_buyers_worker() {
    let Some((_app, mut db, worker)) = watching_alice().await else {
        return;
    };
    let order = orders::load(&db.client, "alice", Uuid::new_v4())
        .await
        .expect("load");
    assert!(order.is_none());
    assert_routed("GET /orders/{id}", &db.sent(), &worker, "orders");
}

#[tokio::test]
async fn the_answer_of_a_settled_order_is_stored_on_the_buyers_worker() {
    let Some((_app, mut db, worker)) = watching_alice().await else {
        return;
    };
    let answer = StoredResponse::new(201, "application/json", b"{}".to_vec());
    // The settling guard reads `orders` beside the key row: named through
    // `k.user_id`, Citus sent this statement to all 32 shards.
    let stored = idempotency::store_for_effect(
        &db.client,
        orders::SETTLING,
        "alice",
        &new_key(),
        &Uuid::new_v4().to_string(),
        &answer,
    )
    .await
    .expect("store");
    assert!(!stored, "no such key");
    assert_routed(
        "the answer of a settled order",
        &db.sent(),
        &worker,
        "idempotency_keys",
    );
}
