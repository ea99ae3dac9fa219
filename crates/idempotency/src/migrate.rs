//! The key table's own migrations, kept in a history table of their own
//! (`idempotency_schema_history`) so that they run beside the migrations of
//! whichever service uses the engine, in any order relative to them.

refinery::embed_migrations!("migrations");

/// The history table of the engine's migrations.
pub const HISTORY_TABLE: &str = "idempotency_schema_history";

/// Applies the engine's pending migrations on this connection; returns how
/// many ran. Several instances starting at once should hold one advisory
/// lock around this, as around their own migrations.
pub async fn migrate(client: &mut tokio_postgres::Client) -> Result<usize, crate::Error> {
    let report = migrations::runner()
        .set_migration_table_name(HISTORY_TABLE)
        .run_async(client)
        .await?;
    Ok(report.applied_migrations().len())
}
