//! A queue of requests to one election loop (a release, the app's health,
//! a yield): rare, so a `VecDeque` behind a lock and one `Notify`, a few
//! dozen bytes per election where a bounded channel's first block cost
//! about 800 (one daemon with thousands of elections keeps one each).

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::Notify;

#[derive(Debug)]
pub struct Inbox<T> {
    /// The requests, and whether the receiving loop has stopped.
    queue: Mutex<(VecDeque<T>, bool)>,
    notify: Notify,
}

impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Self {
            queue: Mutex::new((VecDeque::new(), false)),
            notify: Notify::new(),
        }
    }
}

impl<T> Inbox<T> {
    fn queue(&self) -> std::sync::MutexGuard<'_, (VecDeque<T>, bool)> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `item`; `false` (and `item` dropped) once the receiver has
    /// closed.
    pub fn send(&self, item: T) -> bool {
        let mut queue = self.queue();
        if queue.1 {
            return false;
        }
        queue.0.push_back(item);
        drop(queue);
        // A permit is kept when nobody waits: `recv` then returns at once.
        self.notify.notify_one();
        true
    }

    /// The oldest request, if any.
    pub fn try_recv(&self) -> Option<T> {
        self.queue().0.pop_front()
    }

    /// Waits for a request. Cancel-safe: a request is taken only when
    /// returned.
    pub async fn recv(&self) -> T {
        loop {
            if let Some(item) = self.try_recv() {
                return item;
            }
            self.notify.notified().await;
        }
    }

    /// No more requests are taken; the queued ones are dropped (a reply
    /// channel in one then tells its sender).
    pub fn close(&self) {
        let dropped = {
            let mut queue = self.queue();
            queue.1 = true;
            std::mem::take(&mut queue.0)
        };
        drop(dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn requests_arrive_in_order_and_none_after_close() {
        let inbox = std::sync::Arc::new(Inbox::default());
        assert!(inbox.send(1) && inbox.send(2));
        assert_eq!(inbox.recv().await, 1);
        assert_eq!(inbox.try_recv(), Some(2));
        assert_eq!(inbox.try_recv(), None);
        // A waiter is woken by a later send.
        let waiter = tokio::spawn({
            let inbox = inbox.clone();
            async move { inbox.recv().await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(inbox.send(3));
        let got = tokio::time::timeout(Duration::from_secs(2), waiter).await;
        assert_eq!(got.expect("woken").expect("no panic"), 3);
        // A cancelled wait leaves the request queued.
        assert!(inbox.send(4));
        assert_eq!(inbox.recv().await, 4);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let replies = Inbox::default();
        assert!(replies.send(tx));
        replies.close();
        assert!(
            rx.await.is_err(),
            "a queued request's reply channel is closed"
        );
        assert!(!replies.send(tokio::sync::oneshot::channel().0));
    }
}
