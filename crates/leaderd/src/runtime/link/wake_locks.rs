//! MySQL's wake-up locks on the link's connection: a batch's frees, then
//! its takes, one statement each.

use leaderd_store::WakeLock;

use super::{Job, Task, WakeLockReply, RELEASE_CAP};

impl Task {
    /// The batch's wake-up locks: the frees in one statement, then the
    /// takes in another (a batch holds at most one of each per election:
    /// its presence task waits for each answer). Any failure, even one the
    /// server answered, drops the connection and the locks with it: a lock
    /// left held by a replica that no longer leads would keep the next
    /// leader from taking it, and its releases would wake nobody.
    pub(super) async fn wake_locks(&mut self, jobs: Vec<(String, Option<u64>, WakeLockReply)>) {
        let generation = self.state.borrow().generation;
        let mut frees = Vec::new();
        let mut takes = Vec::new();
        for (election, free, reply) in jobs {
            match free {
                // Gone with the connection it was taken on.
                Some(taken_on) if taken_on != generation => {
                    let _ = reply.send(Ok((WakeLock::Busy(None), generation)));
                }
                Some(_) => frees.push((election, reply)),
                None => takes.push((election, reply)),
            }
        }
        if !frees.is_empty() {
            let names: Vec<&str> = frees.iter().map(|(e, _)| e.as_str()).collect();
            let answer = match self.conn.as_mut() {
                Some(conn) => tokio::time::timeout(RELEASE_CAP, conn.free_wake_locks(&names)).await,
                None => Ok(Ok(())),
            };
            let answer = self.settle_wake_locks(answer, "freeing wake-up locks");
            for (_, reply) in frees {
                let _ = reply.send(answer.clone().map(|()| (WakeLock::Busy(None), generation)));
            }
        }
        if takes.is_empty() {
            return;
        }
        let Some(conn) = self.conn.as_mut() else {
            // The frees cost the connection: the takes wait for the next.
            for (election, reply) in takes {
                let job = Job::WakeLock {
                    election,
                    free: None,
                    reply,
                };
                self.pending.push_back(job);
            }
            return;
        };
        let names: Vec<&str> = takes.iter().map(|(e, _)| e.as_str()).collect();
        let answer = tokio::time::timeout(RELEASE_CAP, conn.hold_wake_locks(&names)).await;
        match self.settle_wake_locks(answer, "taking wake-up locks") {
            Ok(held) => {
                for ((_, reply), held) in takes.into_iter().zip(held) {
                    let _ = reply.send(Ok((held, generation)));
                }
            }
            Err(e) => {
                for (_, reply) in takes {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}
