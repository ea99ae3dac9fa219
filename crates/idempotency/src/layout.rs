//! Where the key table's rows live, read from the database: it decides the
//! form of a statement, never what it does.
//!
//! On one PostgreSQL a step is cheapest as one statement (the claim's
//! insert CTE, an effect's CTEs around the key's): one executor run. On a
//! table Citus distributes by the scope, such a statement is planned as
//! subplans joined on the coordinator, while a PL/pgSQL function's
//! statements each go whole to the node of their rows (the claim's
//! function is delegated to the buyer's worker). Each form is measured on
//! both layouts in docs/PERFORMANCE.md ("The order and its settlement on
//! the coordinator and the buyer's worker").

use deadpool_postgres::GenericClient;

/// How `idempotency_keys` is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// One table on one server: each step one statement.
    #[default]
    Single,
    /// Split by the scope over the nodes of a Citus cluster: each step that
    /// writes the key is a function call.
    Distributed,
}

impl Layout {
    /// Reads the layout of the key table `client` sees. An instance reads
    /// it once, when it starts: a table distributed later is still used in
    /// its one-statement form, correctly and at the cluster's higher cost,
    /// until the instance restarts.
    pub async fn of(client: &impl GenericClient) -> Result<Self, tokio_postgres::Error> {
        // Citus's catalog exists only where the extension is installed.
        let citus: bool = client
            .query_one(
                "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL",
                &[],
            )
            .await?
            .get(0);
        if !citus {
            return Ok(Self::Single);
        }
        let distributed: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_dist_partition
                                WHERE logicalrelid = 'idempotency_keys'::regclass
                                  AND partmethod = 'h')",
                &[],
            )
            .await?
            .get(0);
        Ok(if distributed {
            Self::Distributed
        } else {
            Self::Single
        })
    }
}
