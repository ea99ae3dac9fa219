//! Open files: every connection the service accepts or makes is a file
//! descriptor, and a crowd at an on-sale opens thousands at once. Linux
//! starts a process at the soft `RLIMIT_NOFILE`, often 1,024, far below
//! the hard limit the operator or the container set; past it `accept`
//! fails with `Too many open files` and the buyer's connection is dropped.
//! `serve` raises the soft limit to the hard one at start, which needs no
//! privilege.

use std::io;

/// The limits on open files of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    pub soft: u64,
    pub hard: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("{call}(RLIMIT_NOFILE)")]
pub struct LimitError {
    call: &'static str,
    #[source]
    source: io::Error,
}

/// The current limits.
pub fn open_files() -> Result<OpenFiles, LimitError> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid `rlimit` for the call to write.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(LimitError {
            call: "getrlimit",
            source: io::Error::last_os_error(),
        });
    }
    Ok(OpenFiles {
        soft: limit.rlim_cur,
        hard: limit.rlim_max,
    })
}

/// Raises the soft limit to the hard one; returns the limits before and
/// after.
pub fn raise_to_hard_limit() -> Result<(OpenFiles, OpenFiles), LimitError> {
    let before = open_files()?;
    if before.soft < before.hard {
        let limit = libc::rlimit {
            rlim_cur: before.hard,
            rlim_max: before.hard,
        };
        // SAFETY: `limit` is a valid `rlimit` for the call to read.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(LimitError {
                call: "setrlimit",
                source: io::Error::last_os_error(),
            });
        }
    }
    Ok((before, open_files()?))
}

/// [`raise_to_hard_limit`], logged: the limits before and after, or why it
/// failed (the service then runs with the limit it was given).
pub fn raise_logged() {
    match raise_to_hard_limit() {
        Ok((before, after)) => tracing::info!(
            soft_before = before.soft,
            soft = after.soft,
            hard = after.hard,
            "open files: the soft limit is the hard limit"
        ),
        Err(error) => tracing::warn!(
            error = %anyhow::Error::from(error),
            "open files: the soft limit stays as it was"
        ),
    }
}
