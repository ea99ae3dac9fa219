//! A keyed request stopped in its work, through the engine's own flow
//! ([`Engine::run`]): it holds its claim while the test does what a
//! request elsewhere would meanwhile, then is resumed with how its work
//! ended, or is dropped, which leaves its claim as a crash would (no
//! answer, no release: the lease runs out).

use std::time::Duration;

use idempotency::{Claim, Done, Engine, IdempotencyKey, Ran, Reply, RequestHash, RunError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The work's own failure, when a test resumes it with one.
#[derive(Debug)]
pub struct Failed;

pub struct Paused {
    pub claim: Claim,
    resume: Option<oneshot::Sender<Result<Done, Failed>>>,
    task: JoinHandle<Result<Ran, RunError<Failed>>>,
}

impl Paused {
    /// Runs the request without waiting (a wait of zero) up to its work:
    /// the paused request with its claim, or, when it did not get one, what
    /// it was answered.
    pub async fn start(
        engine: &Engine,
        user_id: &str,
        key: &IdempotencyKey,
        hash: &RequestHash,
    ) -> Result<Paused, Reply> {
        let (claimed, claim) = oneshot::channel();
        let (resume, resumed) = oneshot::channel();
        let (engine, user_id, key, hash) = (engine.clone(), user_id.to_owned(), key.clone(), *hash);
        let task = tokio::spawn(async move {
            let work = |claim: Claim| async move {
                let _ = claimed.send(claim);
                resumed.await.unwrap_or(Err(Failed))
            };
            engine
                .run(&user_id, &key, &hash, None, Duration::ZERO, work)
                .await
        });
        match claim.await {
            Ok(claim) => Ok(Paused {
                claim,
                resume: Some(resume),
                task,
            }),
            // The work never ran: the request was answered without it.
            Err(_) => match task.await {
                Ok(Ok(ran)) => Err(ran.reply),
                other => panic!("a request that got no claim failed: {other:?}"),
            },
        }
    }

    /// Leaves the request as a crash would, and its claim to the test.
    pub fn crash(self) -> Claim {
        self.claim.clone()
    }

    /// Lets the work end as `ended` and returns what the request answered.
    pub async fn resume(mut self, ended: Result<Done, Failed>) -> Result<Ran, RunError<Failed>> {
        if let Some(resume) = self.resume.take() {
            let _ = resume.send(ended);
        }
        (&mut self.task).await.expect("the paused request's task")
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        // Aborted mid-work: nothing after the work runs, as in a crash.
        self.task.abort();
    }
}
