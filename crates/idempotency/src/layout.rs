//! Where the key table's rows live, read from the database. Every step is
//! the same function call on both layouts (Citus sends each statement of a
//! function whole to the node of its rows, and delegates the claim's to the
//! buyer's worker); the layout decides only how much the cleanup deletes
//! per statement.

use deadpool_postgres::GenericClient;

/// How `idempotency_keys` is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// One table on one server.
    #[default]
    Single,
    /// Split by the scope over the nodes of a Citus cluster.
    Distributed,
}

impl Layout {
    /// Reads the layout of the key table `client` sees.
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
