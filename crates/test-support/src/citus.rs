//! The Citus profile: with `STAGEDOOR_TEST_CITUS=1`, `DATABASE_URL` names a
//! database on the coordinator of a Citus cluster (`scripts/citus.sh` starts
//! one and prints it), and every [`TestDatabase`](crate::db::TestDatabase)
//! is a database of that cluster: made on the coordinator and on every
//! worker, with the extension, and the workers registered with the
//! coordinator. [`distribute`] then gives the service's tables the layout
//! of `scripts/citus-distribute.sql`, once they exist.

use tokio_postgres::{Client, Config, NoTls};

/// The service's tables on a cluster, as `scripts/citus.sh` lays them out.
pub const LAYOUT: &str = include_str!("../../../scripts/citus-distribute.sql");

/// Whether the tests run on a Citus cluster (`STAGEDOOR_TEST_CITUS=1`).
pub fn enabled() -> bool {
    std::env::var("STAGEDOOR_TEST_CITUS").is_ok_and(|v| v == "1")
}

/// Distributes the service's tables of `db` (after its migrations).
pub async fn distribute(db: &Client) {
    db.batch_execute(LAYOUT)
        .await
        .unwrap_or_else(|e| panic!("scripts/citus-distribute.sql: {e}"));
}

/// The workers of the cluster whose coordinator `admin` is connected to:
/// `(host, port)` of each.
pub async fn workers(admin: &Client) -> Vec<(String, u16)> {
    admin
        .query(
            "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 ORDER BY nodeport",
            &[],
        )
        .await
        .unwrap_or_else(|e| {
            panic!("STAGEDOOR_TEST_CITUS=1 but DATABASE_URL is not a Citus coordinator: {e}")
        })
        .iter()
        .map(|row| (row.get(0), row.get::<_, i32>(1) as u16))
        .collect()
}

/// `url` with another host and port (a worker's), same user and database.
fn on_node(url: &str, host: &str, port: u16) -> String {
    let config: Config = url.parse().expect("a PostgreSQL URL");
    let user = config.get_user().unwrap_or("postgres");
    let dbname = config.get_dbname().unwrap_or("postgres");
    format!("postgres://{user}@{host}:{port}/{dbname}")
}

/// Runs `sql` on the database `url` names.
async fn execute(url: &str, sql: &str) {
    crate::db::connect(url)
        .await
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{url}: {sql}: {e}: {:?}", e.as_db_error()));
}

/// Makes the new database `name` (whose URL on the coordinator is
/// `coordinator`) a database of the cluster: `CREATE DATABASE` on every
/// worker (`admin` lists them; `maintenance` is the URL it was opened
/// with), the extension on every node, and the nodes known to it.
pub(crate) async fn join(admin: &Client, maintenance: &str, name: &str, coordinator: &str) {
    // Adding nodes to two databases at once fails on the cluster-wide role
    // both copy to the workers (`tuple concurrently updated`): one join at a
    // time, across every test process (they share the maintenance database,
    // where the lock lives, until `admin` closes or unlocks it).
    const JOIN_LOCK: i64 = 0x4349_5455_535f_4a4e; // "CITUS_JN"
    admin
        .execute("SELECT pg_advisory_lock($1)", &[&JOIN_LOCK])
        .await
        .expect("the join lock");
    let workers = workers(admin).await;
    for (host, port) in &workers {
        execute(
            &on_node(maintenance, host, *port),
            &format!("CREATE DATABASE \"{name}\""),
        )
        .await;
        execute(&on_node(coordinator, host, *port), "CREATE EXTENSION citus").await;
    }
    let config: Config = coordinator.parse().expect("a PostgreSQL URL");
    let (host, port) = crate::db::host_and_port(&config);
    let mut sql =
        format!("CREATE EXTENSION citus; SELECT citus_set_coordinator_host('{host}', {port});");
    for (host, port) in &workers {
        sql.push_str(&format!("SELECT citus_add_node('{host}', {port});"));
    }
    execute(coordinator, &sql).await;
    admin
        .execute("SELECT pg_advisory_unlock($1)", &[&JOIN_LOCK])
        .await
        .expect("the join lock");
}

/// Drops `name` from every worker (the coordinator's copy is the caller's).
pub(crate) async fn leave(admin: &Client, maintenance: &str, name: &str) {
    for (host, port) in workers(admin).await {
        if let Ok((client, connection)) =
            tokio_postgres::connect(&on_node(maintenance, &host, port), NoTls).await
        {
            tokio::spawn(connection);
            let _ = client
                .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await;
        }
    }
}
