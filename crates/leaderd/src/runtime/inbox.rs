//! A queue of requests to one election loop (a release, the app's health,
//! a yield): rare and few, so a `Vec` behind a lock, a few dozen bytes per
//! election where a bounded channel's first block cost about 800 (one
//! daemon with thousands of elections keeps one each; a `VecDeque` is 8
//! bytes more, and taking the oldest shifts only the few behind it). The sender wakes
//! the loop (see `Shared::control`): the loop waits on one wake-up for all
//! it reacts to.

use std::sync::Mutex;

#[derive(Debug)]
pub struct Inbox<T> {
    /// The requests, and whether the receiving loop has stopped.
    queue: Mutex<(Vec<T>, bool)>,
}

impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Self {
            queue: Mutex::new((Vec::new(), false)),
        }
    }
}

impl<T> Inbox<T> {
    fn queue(&self) -> std::sync::MutexGuard<'_, (Vec<T>, bool)> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `item`; `false` (and `item` dropped) once the receiver has
    /// closed.
    pub fn send(&self, item: T) -> bool {
        let mut queue = self.queue();
        if queue.1 {
            return false;
        }
        queue.0.push(item);
        true
    }

    /// The oldest request, if any.
    pub fn try_recv(&self) -> Option<T> {
        let mut queue = self.queue();
        (!queue.0.is_empty()).then(|| queue.0.remove(0))
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

    #[tokio::test]
    async fn requests_arrive_in_order_and_none_after_close() {
        let inbox = Inbox::default();
        assert!(inbox.send(1) && inbox.send(2));
        assert_eq!(inbox.try_recv(), Some(1));
        assert_eq!(inbox.try_recv(), Some(2));
        assert_eq!(inbox.try_recv(), None);
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
