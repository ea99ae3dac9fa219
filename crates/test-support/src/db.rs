//! A database per test on the machine's PostgreSQL, so that tests run side
//! by side without seeing each other's rows: [`TestDatabase`] makes one
//! with a unique name and drops it (`WITH (FORCE)`) when the last test
//! holding it ends. Plus the two ways to talk to any database: [`connect`]
//! (one plain connection) and [`pool`] (a small deadpool).

use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;
use uuid::Uuid;

/// The server's maintenance database, where databases are created and
/// dropped: `DATABASE_URL`, else `postgres://postgres@127.0.0.1:5432/postgres`.
pub fn maintenance_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// One connection, its driver spawned on the current runtime; panics (with
/// the URL) if the server cannot be reached.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    tokio::spawn(connection);
    client
}

/// A plain deadpool of at most `max_size` connections to `url` (fast
/// recycling, no timeouts): for code under test that takes a pool. It
/// opens nothing until asked for a connection.
pub fn pool(url: &str, max_size: usize) -> Pool {
    let config: tokio_postgres::Config = url
        .parse()
        .unwrap_or_else(|e| panic!("a PostgreSQL URL, not {url}: {e}"));
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(max_size)
        .build()
        .expect("a pool")
}

/// The TCP host and port a URL names (127.0.0.1 and 5432 when it names none).
pub(crate) fn host_and_port(config: &tokio_postgres::Config) -> (String, u16) {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    (host, config.get_ports().first().copied().unwrap_or(5432))
}

/// `maintenance`'s server, user and password, and the database `name`.
fn database_url(maintenance: &str, name: &str) -> String {
    let mut config: tokio_postgres::Config = maintenance.parse().expect("DATABASE_URL");
    config.dbname(name);
    let (host, port) = host_and_port(&config);
    let user = config.get_user().unwrap_or("postgres");
    let password = config
        .get_password()
        .map(|p| format!(":{}", String::from_utf8_lossy(p)))
        .unwrap_or_default();
    format!("postgres://{user}{password}@{host}:{port}/{name}")
}

/// A database of the test's own, `stagedoor_test_<uuid>` (on the Citus
/// profile, on every node of the cluster: [`crate::citus`]), dropped when the
/// last `Arc` of it goes (tests that share it, a second instance, hold
/// clones).
#[derive(Debug)]
pub struct TestDatabase {
    pub name: String,
    /// Its URL: the maintenance URL's server, user and password.
    pub url: String,
    maintenance: String,
    /// A database of a Citus cluster, on every node.
    cluster: bool,
}

impl TestDatabase {
    /// A new database on the server of [`maintenance_url`].
    pub async fn create() -> Arc<Self> {
        Self::create_on(&maintenance_url()).await
    }

    /// A new database on the server of `maintenance` (a URL of a database
    /// there that exists, `postgres` usually).
    pub async fn create_on(maintenance: &str) -> Arc<Self> {
        let cluster = crate::citus::enabled().then_some(crate::citus::TEMPLATE);
        Self::make(maintenance, cluster).await
    }

    /// As [`Self::create`]; on the Citus profile, with the service's tables
    /// already migrated and distributed ([`crate::citus::LAID_OUT`]).
    pub async fn create_laid_out() -> Arc<Self> {
        let cluster = crate::citus::enabled().then_some(crate::citus::LAID_OUT);
        Self::make(&maintenance_url(), cluster).await
    }

    /// A new database of the Citus cluster whose coordinator `maintenance`
    /// is on, whatever the profile.
    pub async fn create_on_cluster(maintenance: &str) -> Arc<Self> {
        Self::make(maintenance, Some(crate::citus::TEMPLATE)).await
    }

    /// On a Citus cluster, a copy of `template` on every node.
    async fn make(maintenance: &str, cluster: Option<&str>) -> Arc<Self> {
        let name = format!("stagedoor_test_{}", Uuid::new_v4().simple());
        let (client, connection) = tokio_postgres::connect(maintenance, NoTls)
            .await
            .expect("PostgreSQL must run (see README)");
        tokio::spawn(connection);
        let from = cluster.map_or_else(String::new, |template| format!(" TEMPLATE {template}"));
        client
            .batch_execute(&format!("CREATE DATABASE \"{name}\"{from}"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE{from}: {e}: {:?}", e.as_db_error()));
        if let Some(template) = cluster {
            crate::citus::join(&client, maintenance, &name, template).await;
        }
        let url = database_url(maintenance, &name);
        Arc::new(Self {
            name,
            url,
            maintenance: maintenance.to_owned(),
            cluster: cluster.is_some(),
        })
    }

    /// A new plain connection to it.
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls)
            .await
            .expect("connect to the test database");
        tokio::spawn(connection);
        client
    }

    /// A [`pool`] of at most `max_size` connections to it.
    pub fn pool(&self, max_size: usize) -> Pool {
        pool(&self.url, max_size)
    }

    /// Takes no connection any more and cuts every open one, on every node
    /// of a cluster: the database is gone for whoever uses it.
    pub async fn close(&self) {
        let close = format!(
            "ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS false;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'",
            name = self.name
        );
        let admin = connect(&self.maintenance).await;
        admin
            .batch_execute(&close)
            .await
            .unwrap_or_else(|e| panic!("closing {}: {e}", self.name));
        if self.cluster {
            crate::citus::on_every_worker(&admin, &self.maintenance, &close).await;
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let (name, cluster) = (self.name.clone(), self.cluster);
        let maintenance = self.maintenance.clone();
        // Drop runs inside the test's runtime; a thread of its own may block.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                if let Ok((client, connection)) = tokio_postgres::connect(&maintenance, NoTls).await
                {
                    tokio::spawn(connection);
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                        .await;
                    if cluster {
                        crate::citus::leave(&client, &maintenance, &name).await;
                    }
                }
            });
        })
        .join();
    }
}
