//! The engine's one error type. It says whether the database was out of
//! reach (the caller may answer 503 and the client retry with the same key)
//! or something else failed (a 500); how either is shown is the caller's.

/// A failure of the key table, its migrations or the Redis gate's set-up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no database connection available")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("database error")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("applying the key table's migrations")]
    Migrate(#[from] refinery::Error),
    #[error("connecting to Redis")]
    Redis(#[from] redis::RedisError),
    #[error("opening a pool on a worker")]
    Build(#[from] deadpool_postgres::BuildError),
}

impl Error {
    /// True when the database could not be reached, as opposed to a
    /// statement that failed: the same request may succeed later.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Pool(_) => true,
            Error::Postgres(e) => is_unavailable(e),
            Error::Migrate(_) | Error::Redis(_) | Error::Build(_) => false,
        }
    }
}

/// A closed connection, no SQLSTATE at all (the server went away mid-way), or
/// one that means "try again in a moment": class 08 (connection exception),
/// 57P01-57P03 (administrator shutdown, crash, starting up), 53300 (too many
/// connections), and 40P01 and 40001 (a deadlock or serialization failure
/// that PostgreSQL resolved by aborting this statement: nothing of it was
/// made, and the same request succeeds when sent again).
///
/// On a Citus cluster, a worker that went away mid-statement or mid-commit
/// reaches the client with a code that does not say so (`XX000` mostly,
/// `58030` for a copy to a shard), so its message decides: the
/// coordinator's transaction is aborted or its outcome is with the
/// two-phase commit's recovery, so a retry with the same key finds what was
/// made, as after a connection lost on a commit here.
pub fn is_unavailable(error: &tokio_postgres::Error) -> bool {
    error.is_closed()
        || error
            .code()
            .is_none_or(|code| is_unavailable_state(code.code()))
        || error
            .as_db_error()
            .is_some_and(|e| is_lost_node(e.message()))
}

/// Citus's messages for a connection to another node that failed.
fn is_lost_node(message: &str) -> bool {
    [
        "failure on connection marked as essential",
        "could not commit transaction for shard",
        "SSL SYSCALL error",
        "server closed the connection unexpectedly",
        "connection not open",
        // An `INSERT … SELECT` whose rows go to a worker that is down.
        "failed to COPY to shard",
        // A worker's backend cut off by its postmaster's crash or shutdown,
        // relayed without its SQLSTATE.
        "terminating connection due to",
        "could not receive data from",
        "could not send data to",
        // A worker that runs a buyer's step itself, its postmaster killed
        // while the step waited on another node: the backend aborts the
        // step and exits.
        "postmaster was shut down, exiting",
    ]
    .iter()
    .any(|lost| message.contains(lost))
}

fn is_unavailable_state(code: &str) -> bool {
    code.starts_with("08")
        || matches!(
            code,
            "57P01" | "57P02" | "57P03" | "53300" | "40P01" | "40001"
        )
}

#[cfg(test)]
mod tests {
    use super::{is_lost_node, is_unavailable_state};

    #[test]
    fn a_lost_citus_node_is_unavailable_and_another_internal_error_is_not() {
        for message in [
            "failure on connection marked as essential: 127.0.0.1:9702",
            "could not commit transaction for shard 102053 on at least one active node",
            "SSL SYSCALL error: EOF detected",
            "failed to COPY to shard 0 on 127.0.0.1:9702",
            "terminating connection due to unexpected postmaster exit",
            "postmaster was shut down, exiting",
        ] {
            assert!(is_lost_node(message), "{message}");
        }
        for message in [
            "cache lookup failed for relation 1234",
            "could not create distributed plan",
        ] {
            assert!(!is_lost_node(message), "{message}");
        }
    }

    #[test]
    fn a_server_going_away_is_unavailable_and_a_bad_query_is_not() {
        for code in [
            "57P01", "57P02", "57P03", "08006", "08001", "53300", "40P01", "40001",
        ] {
            assert!(is_unavailable_state(code), "{code}");
        }
        for code in ["23505", "42P01", "23514", "22P02"] {
            assert!(!is_unavailable_state(code), "{code}");
        }
    }
}
