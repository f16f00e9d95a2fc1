//! A wake-up for one waiting task (an election's loop), kept until that
//! task takes it: what a `Notify` with `notify_one` does for one waiter, at
//! a fraction of the size in the waiter's future. The loop waits on it in
//! every turn of its life, and its future is part of each election's task.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;

/// One waiter at a time: a second task waiting on the same signal would
/// take the first one's place and leave it unwoken.
#[derive(Debug, Default)]
pub struct Signal {
    waker: AtomicWaker,
    set: AtomicBool,
}

impl Signal {
    /// Wakes the waiter, or the next wait if none is waiting now.
    pub fn notify(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.waker.wake();
    }

    /// Ready (and the wake-up taken) once [`Signal::notify`] was called since
    /// the last one was taken.
    pub fn poll_taken(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.set.swap(false, Ordering::SeqCst) {
            return Poll::Ready(());
        }
        // Registered before the flag is read again: a `notify` in between
        // either sets the flag seen below or wakes this waker.
        self.waker.register(cx.waker());
        if self.set.swap(false, Ordering::SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Resolves once a wake-up is taken (see [`Signal::poll_taken`]).
    /// Cancel-safe: a wake-up is taken only by the poll that resolves.
    pub fn taken(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| self.poll_taken(cx))
    }

    /// Resolves `true` once a wake-up is taken, `false` once `other` ends
    /// first. The wake-up is looked at first, so it is not left behind when
    /// both are ready. `other` is pinned by the caller: this wait's own
    /// state is two pointers.
    pub fn or<'a, F: Future<Output = ()>>(
        &'a self,
        mut other: Pin<&'a mut F>,
    ) -> impl Future<Output = bool> + 'a {
        std::future::poll_fn(move |cx| {
            if self.poll_taken(cx).is_ready() {
                return Poll::Ready(true);
            }
            other.as_mut().poll(cx).map(|()| false)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_wake_up_before_the_wait_is_kept_for_it() {
        let signal = Signal::default();
        signal.notify();
        tokio::time::timeout(Duration::from_secs(2), signal.taken())
            .await
            .expect("the kept wake-up");
        // Taken: the next wait waits.
        let again = tokio::time::timeout(Duration::from_millis(20), signal.taken()).await;
        assert!(again.is_err(), "a wake-up is taken once");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_task_is_woken_from_another_thread() {
        let signal = Arc::new(Signal::default());
        for _ in 0..200 {
            let waiter = tokio::spawn({
                let signal = signal.clone();
                async move { signal.taken().await }
            });
            tokio::task::yield_now().await;
            let notifier = std::thread::spawn({
                let signal = signal.clone();
                move || signal.notify()
            });
            tokio::time::timeout(Duration::from_secs(2), waiter)
                .await
                .expect("woken")
                .expect("the waiter ran");
            notifier.join().expect("the notifier ran");
        }
    }

    #[tokio::test]
    async fn or_hears_the_wake_up_first_and_the_other_future_otherwise() {
        let signal = Signal::default();
        let mut done = std::pin::pin!(std::future::ready(()));
        assert!(!signal.or(done.as_mut()).await, "the other one ended");
        signal.notify();
        let mut never = std::pin::pin!(std::future::pending::<()>());
        assert!(signal.or(never.as_mut()).await, "woken");
        // Both ready: the wake-up is taken, not left for later.
        signal.notify();
        let mut done = std::pin::pin!(std::future::ready(()));
        assert!(signal.or(done.as_mut()).await, "woken first");
        let mut done = std::pin::pin!(std::future::ready(()));
        assert!(!signal.or(done.as_mut()).await, "no wake-up left");
    }

    #[test]
    fn smaller_than_a_notify_wait() {
        let notify = tokio::sync::Notify::new();
        let signal = Signal::default();
        assert!(std::mem::size_of_val(&signal.taken()) < std::mem::size_of_val(&notify.notified()));
    }
}
