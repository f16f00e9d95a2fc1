//! Settling: what a statement's outcome does to the connection (a failure
//! or a timeout drops it, cancelling what the server may still run), and
//! failing a job that got no answer.

use std::time::Duration;

use leaderd_store::StoreError;

use crate::clock::boot_now;

use super::{Failure, Job, Reached, Task, RELEASE_CAP};

impl Task {
    pub(super) fn settle_wake_locks<T>(
        &mut self,
        outcome: Result<Result<T, StoreError>, tokio::time::error::Elapsed>,
        what: &str,
    ) -> Result<T, String> {
        let settled = self.settle(outcome, RELEASE_CAP, what);
        if settled.is_err() {
            self.drop_connection(None);
        }
        settled
    }

    /// The outcome of one statement run under `limit`: a failure or a
    /// timeout drops the connection, cancelling what the server may still
    /// be running (not after an error it answered).
    pub(super) fn settle<T>(
        &mut self,
        outcome: Result<Result<T, StoreError>, tokio::time::error::Elapsed>,
        limit: Duration,
        what: &str,
    ) -> Result<T, String> {
        match outcome {
            Ok(Ok(value)) => {
                self.reach.answered(boot_now());
                Ok(value)
            }
            Ok(Err(e)) => {
                self.drop_connection((!e.answered()).then_some(limit));
                Err(e.to_string())
            }
            Err(_) => {
                self.drop_connection(Some(limit));
                Err(format!("{what} timed out after {limit:?}"))
            }
        }
    }
}

pub(super) fn fail(job: Job, reason: &str, reached: Reached) {
    match job {
        Job::Attempt { reply, .. } => {
            let _ = reply.send(Err(Failure {
                reason: reason.to_owned(),
                reached,
            }));
        }
        Job::Release { reply, .. } => {
            let _ = reply.send(Err(reason.to_owned()));
        }
        Job::Read { reply, .. } => {
            let _ = reply.send(Err(reason.to_owned()));
        }
        Job::Decline { reply, .. } => {
            let _ = reply.send(Err(reason.to_owned()));
        }
        Job::WakeLock { reply, .. } => {
            let _ = reply.send(Err(reason.to_owned()));
        }
    }
}
