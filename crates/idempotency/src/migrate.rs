//! The key table's own migrations, kept in a history table of their own
//! (`idempotency_schema_history`) so that they run beside the migrations of
//! whichever service uses the engine, in any order relative to them; then
//! its functions, from the one file that holds each one's current body.

use sha2::{Digest, Sha256};

use crate::error::Error;

refinery::embed_migrations!("migrations");

/// The history table of the engine's migrations.
pub const HISTORY_TABLE: &str = "idempotency_schema_history";

/// The engine's functions, as they are now.
const FUNCTIONS: &str = include_str!("../migrations/functions/idempotency.sql");

/// Applies the engine's pending migrations on this connection, then its
/// functions ([`replace_functions`]); returns how many migrations ran.
/// Several instances starting at once should hold one advisory lock around
/// this, as around their own migrations.
pub async fn migrate(client: &mut tokio_postgres::Client) -> Result<usize, Error> {
    let report = migrations::runner()
        .set_migration_table_name(HISTORY_TABLE)
        .run_async(client)
        .await?;
    let applied = report.applied_migrations().len();
    replace_functions(client, "idempotency", FUNCTIONS, applied > 0).await?;
    Ok(applied)
}

/// Applies `functions`, a file of `CREATE OR REPLACE FUNCTION` statements
/// that holds the current body of each function of `owner`, after that
/// owner's versioned migrations (which keep the tables, indexes and types,
/// and drop a function whose arguments or result change), as Flyway's
/// repeatable migrations are. It runs in one transaction, and only when the
/// file differs from the one last applied for `owner` (its SHA-256 is kept
/// in `schema_functions`) or when `migrated` (the owner's versioned
/// migrations just ran, and one may have dropped a function to change its
/// form), so a start that changes nothing rewrites no catalog row and, on
/// Citus, sends the workers nothing. True when it ran.
///
/// The bodies in force are those of the instance that applied them last:
/// an older binary, started after a newer one, puts its own back. A body
/// that older instances must not restore comes with a versioned migration,
/// which an older binary refuses to start beside. Hold the caller's
/// migration lock around this too: two `CREATE OR REPLACE` of one function
/// at once fail with "tuple concurrently updated".
pub async fn replace_functions(
    client: &mut tokio_postgres::Client,
    owner: &str,
    functions: &str,
    migrated: bool,
) -> Result<bool, Error> {
    let digest = Sha256::digest(functions.as_bytes()).to_vec();
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_functions (
                 owner      text PRIMARY KEY,
                 sha256     bytea NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )",
        )
        .await?;
    let tx = client.transaction().await?;
    let applied = tx
        .query_opt(
            "SELECT sha256 FROM schema_functions WHERE owner = $1 FOR UPDATE",
            &[&owner],
        )
        .await?
        .map(|row| row.try_get::<_, Vec<u8>>(0))
        .transpose()?;
    if !migrated && applied.as_ref() == Some(&digest) {
        return Ok(false);
    }
    tx.batch_execute(functions).await?;
    tx.execute(
        "INSERT INTO schema_functions (owner, sha256) VALUES ($1, $2)
         ON CONFLICT (owner) DO UPDATE SET sha256 = EXCLUDED.sha256, applied_at = now()",
        &[&owner, &digest],
    )
    .await?;
    tx.commit().await?;
    tracing::info!(owner, "replaced functions");
    Ok(true)
}
