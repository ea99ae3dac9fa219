//! Where a buyer's statements go, and a seat's. The service's route
//! (`database.route_to_workers`) sends a buyer's to the worker of the
//! buyer's shard, found by PostgreSQL's `hashtext`, and a seat's or a
//! hold's to the worker of its slot's shard, found by `hashint4`: both
//! checked against the server's hash on both profiles and against Citus's
//! placements on the cluster.
//!
//! On the Citus profile (`STAGEDOOR_TEST_CITUS=1`): which nodes a click's
//! statements reach, read from what the node they are sent to sends on
//! (`citus.log_remote_commands`, one notice per command, naming the node).
//! Through the coordinator (the route's home, and every statement with
//! `route_to_workers = false`): the claim (the engine's
//! `idempotency_claim`), the key's read without a claim, the answer stored
//! for a settled order (an event's or reconciliation's) and `GET
//! /orders/{id}`'s load must each be one command, on the worker that holds
//! the buyer's shard, with no transaction around it (no `BEGIN`, no
//! `PREPARE TRANSACTION`), and so must a seat map's read, on the event's
//! worker. The steps that write both the event's seat side and the
//! buyer's rows (the keyed hold, the order, its settlement) commit in two
//! phases on those two workers alone, with no intermediate result; an
//! order event's lease (with its order's read) and its delivery's mark
//! reach the buyer's worker alone. As the service sends them, from the
//! buyer's worker or the event's, a click reaches the other one of the two
//! alone, and never the coordinator. On one PostgreSQL there is no other
//! node to reach: each test says so and checks nothing, but for the layout
//! the service reads (`idempotency::Layout`), which must be `Single` there
//! and `Distributed` on the cluster: it picks the statements checked here.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Connect, Manager, ManagerConfig, Pool};
use futures_util::future::BoxFuture;
use idempotency::{
    Engine, Gate, IdempotencyKey, Layout, Policy, Reply, RequestHash, StoredResponse,
};
use secrecy::ExposeSecret;
use stagedoor_checkout::checkout::holds::{self, Hold, HoldPolicy};
use stagedoor_checkout::checkout::orders::click::{self, Click};
use stagedoor_checkout::checkout::orders::{self, outbox, settle, NewOrder, Orders, Settlement};
use stagedoor_checkout::checkout::seats;
use stagedoor_checkout::db;
use stagedoor_checkout::payrail::{self, ChargeOutcome};
use test_support::db::TestDatabase;
use test_support::paused::Paused;
use test_support::rng::Rng;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, NoTls};
use uuid::Uuid;

use crate::helpers::{new_key, spawn_app, TestApp};

/// The worker ("host:port") that holds the shard of the keys of a buyer
/// (`$1`), as Citus placed it.
const PLACEMENT: &str = "SELECT nodename || ':' || nodeport FROM citus_shards
    WHERE table_name = 'idempotency_keys'::regclass
      AND shardid = get_shard_id_for_distribution_column('idempotency_keys', $1::text)";

/// The worker ("host:port") that holds the shard of the holds of a slot
/// (`$1`), as Citus placed it.
const SLOT_PLACEMENT: &str = "SELECT nodename || ':' || nodeport FROM citus_shards
    WHERE table_name = 'holds'::regclass
      AND shardid = get_shard_id_for_distribution_column('holds', $1::int)";

/// Connections to the app's database that record every command the
/// coordinator sends to a worker, as `(node "host:port", command)`: `client`
/// for the tests' own statements, `pool` for the checkout's code.
struct Watched {
    client: deadpool_postgres::Object,
    pool: Pool,
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
        Self::open_at(&app.db.url).await
    }

    /// Watches what the node of `url` (the app's database on it) sends.
    async fn open_at(url: &str) -> Self {
        let (sender, commands) = mpsc::unbounded_channel();
        let mut config: tokio_postgres::Config = url.parse().expect("the database URL");
        config.options("-c citus.log_remote_commands=on");
        let manager = Manager::from_connect(config, Listening { sender }, ManagerConfig::default());
        let pool = Pool::builder(manager).max_size(2).build().expect("a pool");
        let client = pool.get().await.expect("connect to the coordinator");
        Self {
            client,
            pool,
            commands,
        }
    }

    /// The commands sent since the last call.
    fn sent(&mut self) -> Vec<(String, String)> {
        std::iter::from_fn(|| self.commands.try_recv().ok()).collect()
    }

    /// Watches what the worker `node` ("host:port") sends, from the app's
    /// database there.
    async fn on(app: &TestApp, node: &str) -> Self {
        let (host, port) = node.rsplit_once(':').expect("host:port");
        let port = port.parse().expect("a port");
        Self::open_at(&test_support::citus::on_node(&app.db.url, host, port)).await
    }

    /// The worker ("host:port") that holds `user_id`'s shard of the keys.
    async fn worker_of(&mut self, user_id: &str) -> String {
        let row = self
            .client
            .query_one(PLACEMENT, &[&user_id])
            .await
            .expect("the shard's placement");
        self.sent();
        row.get(0)
    }

    /// The worker ("host:port") that holds `slot`'s shard of the holds.
    async fn worker_of_slot(&mut self, slot: i32) -> String {
        let row = self
            .client
            .query_one(SLOT_PLACEMENT, &[&slot])
            .await
            .expect("the shard's placement");
        self.sent();
        row.get(0)
    }

    /// An event of `seats` seats whose slot is on another worker than
    /// `buyers` (so that a click spans two workers): its id, its slot, its
    /// worker and its seats.
    async fn event_away_from(
        &mut self,
        app: &TestApp,
        buyers: &str,
        seats: u32,
    ) -> (String, i32, String, Vec<i64>) {
        for n in 0.. {
            let event = format!("away-{n}");
            let slot = idempotency::hashtext(&event) & 4095;
            let worker = self.worker_of_slot(slot).await;
            if worker != buyers {
                let seats = app.seed(&event, seats, 4_500).await;
                self.sent();
                return (event, slot, worker, seats);
            }
        }
        unreachable!("an event on another worker")
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

/// Every command on one of `workers`, none of them an intermediate
/// result, and `commits` two-phase commits (a `PREPARE TRANSACTION` to
/// each other node in one): a step that writes the event's seat side and
/// the buyer's rows, committed on those two nodes alone.
fn assert_on_workers(
    what: &str,
    sent: &[(String, String)],
    workers: &[&str],
    names: &[&str],
    commits: usize,
) {
    for (node, command) in sent {
        assert!(
            workers.contains(&node.as_str()),
            "{what}: only {workers:?}, not {node}: {command}"
        );
        assert!(
            !command.contains("read_intermediate_result"),
            "{what}: a subplan's result in {command}"
        );
    }
    for name in names {
        assert!(
            sent.iter().any(|(_, command)| command.contains(name)),
            "{what}: no {name} in {sent:#?}"
        );
    }
    let prepared = sent
        .iter()
        .filter(|(_, command)| command.starts_with("PREPARE TRANSACTION"))
        .count();
    assert_eq!(prepared, commits, "{what}: two-phase commits in {sent:#?}");
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

#[tokio::test]
async fn the_layout_is_read_from_the_key_table() {
    let app = spawn_app().await;
    let client = crate::helpers::pool(&app.db.url)
        .get()
        .await
        .expect("a connection");
    let expected = if test_support::citus::enabled() {
        Layout::Distributed
    } else {
        Layout::Single
    };
    assert_eq!(Layout::of(&client).await.expect("the layout"), expected);
}

/// The route finds a buyer's shard by PostgreSQL's own hash of the
/// buyer's id: the same value as the server's `hashtext`, for strings of
/// every length around lookup3's blocks of 12 bytes, in one byte and in
/// several per character. Runs on both profiles.
#[tokio::test]
async fn the_routes_hash_is_the_servers_hashtext() {
    const CHARS: [&str; 8] = ["a", "Z", "0", "-", "é", "€", "😀", "\u{1}"];
    let mut rng = Rng::from_seed(43);
    let mut texts = vec![
        String::new(),
        "alice".to_owned(),
        Uuid::new_v4().to_string(),
    ];
    for length in 1..=40 {
        for _ in 0..12 {
            let text = (0..length)
                .map(|_| CHARS[rng.pick(CHARS.len())])
                .collect::<String>();
            texts.push(text);
        }
    }
    let db = TestDatabase::create().await;
    let servers: Vec<i32> = db
        .client()
        .await
        .query(
            "SELECT hashtext(t) FROM unnest($1::text[]) WITH ORDINALITY AS u(t, n) ORDER BY n",
            &[&texts],
        )
        .await
        .expect("the server's hashes")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let ours: Vec<i32> = texts.iter().map(|t| idempotency::hashtext(t)).collect();
    for ((text, ours), server) in texts.iter().zip(&ours).zip(&servers) {
        assert_eq!(ours, server, "hashtext({text:?})");
    }
    assert_eq!(ours.len(), texts.len());
}

/// Citus places a slot (an integer) by `hashint4`: every slot an event can
/// have, and the integers' edges.
#[tokio::test]
async fn the_routes_integer_hash_is_the_servers_hashint4() {
    let values: Vec<i32> = (0..4096).chain([-1, i32::MIN, i32::MAX]).collect();
    let db = TestDatabase::create().await;
    let servers: Vec<i32> = db
        .client()
        .await
        .query(
            "SELECT hashint4(v) FROM unnest($1::int[]) WITH ORDINALITY AS u(v, n) ORDER BY n",
            &[&values],
        )
        .await
        .expect("the server's hashes")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(servers.len(), values.len());
    for (value, server) in values.iter().zip(&servers) {
        assert_eq!(idempotency::hashint4(*value), *server, "hashint4({value})");
    }
}

/// With `database.route_to_workers` (the default), each buyer's
/// statements go to the worker Citus placed the buyer's shard on, for
/// every one of 300 buyers, until a function is missing on the workers;
/// on one PostgreSQL there is no worker and every statement stays on the
/// one server.
#[tokio::test]
async fn each_buyer_is_routed_to_the_worker_of_its_shard() {
    let app = spawn_app().await;
    let pool = crate::helpers::pool(&app.db.url);
    let route = db::route(&app.settings.database, pool.clone()).expect("a route");
    let workers = route.refresh().await.expect("the shards' places");
    let client = pool.get().await.expect("a connection");
    if !test_support::citus::enabled() {
        assert_eq!(workers, 0);
        assert_eq!(route.worker("alice"), None);
        assert_eq!(route.slot_worker(7), None);
        assert!(!route.slots_spread());
        return;
    }
    let nodes: i64 = client
        .query_one("SELECT count(*) FROM pg_dist_node WHERE groupid > 0", &[])
        .await
        .expect("the workers")
        .get(0);
    assert_eq!(workers as i64, nodes, "one pool per worker");
    for n in 0..300 {
        let buyer = format!("buyer-{n}-{}", Uuid::new_v4());
        let placed: String = client
            .query_one(PLACEMENT, &[&buyer])
            .await
            .expect("the shard's placement")
            .get(0);
        assert_eq!(route.worker(&buyer), Some(placed), "{buyer}");
    }
    // Every slot an event can have goes to the worker of its holds' shard.
    assert!(route.slots_spread());
    let placed: Vec<String> = client
        .query(
            "SELECT nodename || ':' || nodeport FROM generate_series(0, 4095) AS slot,
                    LATERAL (SELECT nodename, nodeport FROM citus_shards
                              WHERE table_name = 'holds'::regclass
                                AND shardid = get_shard_id_for_distribution_column('holds', slot)) p
              ORDER BY slot",
            &[],
        )
        .await
        .expect("the slots' placements")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(placed.len(), 4096);
    for (slot, placed) in (0..).zip(placed) {
        assert_eq!(route.slot_worker(slot), Some(placed), "slot {slot}");
    }
    // A function the workers lack (made where Citus does not copy it)
    // sends every statement through the coordinator, which has it.
    client
        .batch_execute(
            "SET citus.enable_ddl_propagation = off;
             CREATE FUNCTION routing_test_here_alone() RETURNS int LANGUAGE sql AS 'SELECT 1';
             RESET citus.enable_ddl_propagation;",
        )
        .await
        .expect("a function on the coordinator alone");
    drop(client);
    assert_eq!(route.refresh().await.expect("the shards' places"), 0);
    assert_eq!(route.worker("alice"), None);
    assert_eq!(route.slot_worker(7), None);
    assert!(route.slots_spread(), "the rows are where they are");
    // Without the setting, everything goes through the coordinator.
    let mut settings = app.settings.database.clone();
    settings.route_to_workers = false;
    let home = db::route(&settings, pool).expect("a route");
    assert_eq!(home.refresh().await.expect("nothing to read"), 0);
    assert_eq!(home.worker("alice"), None);
    assert_eq!(home.slot_worker(7), None);
    assert!(home.slots_spread(), "the rows are where they are");
}

const POLICY: Policy = Policy {
    ttl: Duration::from_secs(86_400),
    lease: Duration::from_secs(30),
};

#[tokio::test]
async fn the_claim_and_its_replay_run_whole_on_the_buyers_worker() {
    let Some((app, mut db, worker)) = watching_alice().await else {
        return;
    };
    let key = IdempotencyKey::parse(new_key().as_bytes()).expect("a key");
    let hash = RequestHash::of("POST", "/orders", b"{}");

    let engine = Engine::new(db.pool.clone(), POLICY);
    let first = Paused::start(&engine, "alice", &key, &hash).await;
    assert!(first.is_ok(), "claimed");
    drop(first);
    assert_routed("the claim", &db.sent(), &worker, "idempotency_claim(");

    // The same click again: the same call, which now reads the row it lost
    // to, then, for its 409, the order the key links (none yet).
    let again = Paused::start(&engine, "alice", &key, &hash).await;
    assert!(matches!(again, Err(Reply::InProgress { effect: None })));
    let sent = db.sent();
    assert_routed("the claim again", &sent[..1], &worker, "idempotency_claim(");
    assert_routed(
        "the 409's linked effect",
        &sent[1..],
        &worker,
        "idempotency_keys",
    );

    // The key's read without a claim: a request the Redis gate turned away
    // (another request holds the key's lock).
    let redis_url = app.settings.redis.url.expose_secret();
    let gated = engine.with_gate(Gate::redis(redis_url).await.expect("the Redis gate"));
    let mut redis = redis::Client::open(redis_url)
        .expect("a Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("Redis");
    let _: () = redis::cmd("SET")
        .arg(format!("idem:alice:{}", key.as_str()))
        .arg("another")
        .arg("EX")
        .arg(30)
        .query_async(&mut redis)
        .await
        .expect("the lock");
    let seen = Paused::start(&gated, "alice", &key, &hash).await;
    assert!(matches!(seen, Err(Reply::InProgress { effect: None })));
    let sent = db.sent();
    assert_routed("the key's read", &sent[..1], &worker, "idempotency_keys");
    assert_routed(
        "the 409's linked effect",
        &sent[1..],
        &worker,
        "idempotency_keys",
    );
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
    let stored = idempotency::store_for_effect(
        &db.client,
        "alice",
        &new_key(),
        &Uuid::new_v4().to_string(),
        &answer,
    )
    .await
    .expect("store");
    assert!(!stored, "no such key");
    // The engine's write of an answer, distributed by the buyer: the whole
    // call is sent to the buyer's worker.
    assert_routed(
        "the answer of a settled order",
        &db.sent(),
        &worker,
        "idempotency_store",
    );
}

#[tokio::test]
async fn a_checkouts_writing_steps_commit_on_the_buyers_and_the_events_workers_alone() {
    let Some((app, mut db, worker)) = watching_alice().await else {
        return;
    };
    let (_, slot, event_worker, seats) = db.event_away_from(&app, &worker, 2).await;
    let both = [worker.as_str(), event_worker.as_str()];
    // A seat map's read: one command, on the event's worker.
    db.client
        .query(seats::SEAT_MAP_STATEMENT, &[&"nothing", &slot])
        .await
        .expect("a seat map");
    assert_routed("a seat map", &db.sent(), &event_worker, "seats");

    // A keyed hold: the hold on the event's worker, its answer on the key.
    let keyed = claim(&db.pool).await;
    db.sent();
    let policy = HoldPolicy::from(&app.settings.holds);
    let done = holds::place_claimed(&db.pool, &keyed, seats[0], policy, hold_answer)
        .await
        .expect("the keyed hold");
    assert!(matches!(done, idempotency::Done::Stored(_)), "{done:?}");
    assert_on_workers(
        "the keyed hold",
        &db.sent(),
        &both,
        &["idempotency_keys", "holds_"],
        2,
    );

    // The order and its settlement, with Payrail's charge between them.
    let hold_id = app.hold("alice", seats[1]).await;
    let paying = claim(&db.pool).await;
    db.sent();
    let (orders, order_id) = pay(&app, &db, &paying, hold_id).await;
    assert_on_workers(
        "the order and its settlement",
        &db.sent(),
        &both,
        &[
            "INSERT INTO public.orders_",
            "UPDATE public.orders_",
            "idempotency_keys",
            "public.holds_",
        ],
        4,
    );
    assert_eq!(app.charges().await.len(), 1);

    // Payrail's event for the same order, after the click settled it.
    let outcome = ChargeOutcome::Succeeded {
        charge_id: "ch_routed".to_owned(),
    };
    let settled = settle::unclaimed(&orders, "alice", order_id, &outcome)
        .await
        .expect("the event's settlement");
    assert!(matches!(settled, Settlement::Already(_)), "{settled:?}");
    assert_on_workers(
        "a settlement outside the claim",
        &db.sent(),
        &[&worker],
        &["UPDATE public.orders_", "idempotency_keys"],
        0,
    );

    // The order's event for the shop, written by the click's settlement:
    // its lease (with the order's read) and its mark, on the buyer's worker
    // alone, as any instance's delivery makes them.
    let due = outbox::due(&db.client, 100).await.expect("the due events");
    let due = due
        .iter()
        .find(|due| due.order_id == order_id)
        .expect("the paid order's event");
    db.sent();
    let leased = outbox::lease(&db.client, due, Duration::from_secs(30))
        .await
        .expect("the lease")
        .expect("the event is leased");
    assert_on_workers(
        "an event's lease",
        &db.sent(),
        &[&worker],
        &["UPDATE public.order_events_", "orders_"],
        0,
    );
    outbox::delivered(&db.client, &leased)
        .await
        .expect("the delivery's mark");
    assert_routed("an event's delivery", &db.sent(), &worker, "order_events");
}

fn hold_answer(hold: &Hold) -> StoredResponse {
    StoredResponse::new(
        201,
        "application/json",
        hold.hold_id.to_string().into_bytes(),
    )
}

/// A claim of a new key of alice's, by a request that then stopped.
/// As the service's route sends a click: its buyer's statements to the
/// worker of the buyer's shard, its seat's to the worker of the event's.
/// There the claim, an order's read and a seat map's send no command to
/// any other node; the keyed hold sends the buyer's worker its key's
/// statements alone, and the order and its settlement send the event's
/// worker their holds' statements alone, each step committed with one
/// two-phase commit that the worker it was sent to coordinates. None of it
/// is sent to the coordinator.
#[tokio::test]
async fn a_click_goes_between_the_buyers_and_the_events_workers_alone() {
    let Some((app, mut coordinator, worker)) = watching_alice().await else {
        return;
    };
    let (event, slot, event_worker, seats) = coordinator.event_away_from(&app, &worker, 2).await;
    let mut buyers = Watched::on(&app, &worker).await;
    let mut events = Watched::on(&app, &event_worker).await;

    events
        .client
        .query(seats::SEAT_MAP_STATEMENT, &[&event, &slot])
        .await
        .expect("a seat map");
    assert_eq!(events.sent(), [], "a seat map, on the event's worker alone");

    let keyed = claim(&buyers.pool).await;
    assert_eq!(buyers.sent(), [], "the claim, on the buyer's worker alone");
    let policy = HoldPolicy::from(&app.settings.holds);
    let done = holds::place_claimed(&events.pool, &keyed, seats[0], policy, hold_answer)
        .await
        .expect("the keyed hold");
    assert!(matches!(done, idempotency::Done::Stored(_)), "{done:?}");
    assert_on_workers(
        "the keyed hold, from the event's worker",
        &events.sent(),
        &[&worker],
        &["idempotency_keys"],
        1,
    );

    let hold_id = app.hold("alice", seats[1]).await;
    let paying = claim(&buyers.pool).await;
    buyers.sent();
    let (orders, order_id) = pay(&app, &buyers, &paying, hold_id).await;
    assert_on_workers(
        "the order and its settlement, from the buyer's worker",
        &buyers.sent(),
        &[&event_worker],
        &["public.holds_"],
        2,
    );
    assert_eq!(app.charges().await.len(), 1);

    let found = orders.find("alice", order_id).await.expect("the order");
    assert!(found.is_some(), "the order is found");
    assert_eq!(
        buyers.sent(),
        [],
        "an order's read, on the buyer's worker alone"
    );
}

/// Alice's order of `hold_id`, placed and paid with `paying` through the
/// checkout's code on `db`'s connections: those orders, and the order's id.
async fn pay(
    app: &TestApp,
    db: &Watched,
    paying: &idempotency::Claim,
    hold_id: i64,
) -> (Orders, Uuid) {
    let payrail = payrail::Client::new(&app.settings.payrail, &app.sandbox.base_url())
        .expect("a Payrail client");
    let orders = Orders::new(db.pool.clone(), Arc::new(payrail));
    let order = Click::new(
        &orders,
        NewOrder::parse(vec![hold_id], "pm_card_visa").expect("an order"),
    );
    let done = click::place(&orders, paying, &order)
        .await
        .expect("the order");
    let idempotency::Done::Stored(answer) = done else {
        panic!("a paid order is stored: {done:?}");
    };
    assert_eq!(answer.status, 201);
    let order_id = answer
        .location
        .as_deref()
        .and_then(|l| l.strip_prefix("/orders/"))
        .and_then(|id| id.parse().ok())
        .expect("the order's location");
    (orders, order_id)
}

async fn claim(pool: &Pool) -> idempotency::Claim {
    let key = IdempotencyKey::parse(new_key().as_bytes()).expect("a key");
    let hash = RequestHash::of("POST", "/x", b"{}");
    match Paused::start(&Engine::new(pool.clone(), POLICY), "alice", &key, &hash).await {
        Ok(paused) => paused.crash(),
        Err(other) => panic!("a new key is claimed, not {other:?}"),
    }
}
