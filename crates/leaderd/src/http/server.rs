//! The HTTP server and its limits: slow or idle clients cannot exhaust the
//! daemon (in Kubernetes it listens on every address).
//!
//! - request headers must arrive within [`HEADER_TIMEOUT`] of the first byte
//!   of a request (or of the connection), else the connection is closed;
//! - a connection idle after a response closes after [`IDLE_TIMEOUT`]; a
//!   response that keeps writing (a stream) is not idle;
//! - at most [`MAX_CONNECTIONS`] are served at once; past that, up to
//!   [`PROBE_SLOTS`] more are served one request each, with a short header
//!   timeout and no stream (see [`ProbeSlot`]): whatever mix of connections
//!   holds the others (watchers, idle keep-alives, slow heads), the kubelet's
//!   probes get in, so nobody who can reach the port can fail the liveness
//!   probe and churn leadership. There are as many probe slots as served
//!   connections, so that connections which send nothing, made again as
//!   fast as they are closed, keep no probe waiting in the kernel's accept
//!   queue behind them (a probe slot is free again 250 ms after a silent
//!   connection took it). More wait in the kernel's accept queue;
//! - a connection costs no request buffer until its first byte arrives, so
//!   the silent ones hold a socket and a task, nothing more;
//! - a connection buffers at most [`MAX_BUFFER`] of request, so memory per
//!   connection is bounded; request bodies are refused (see `http`).
//!
//! hyper's own header timeout also runs while a keep-alive connection waits
//! for its next request, which would close idle connections after the header
//! timeout; so the timeouts are kept here, by watching the connection's reads
//! and writes.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::debug;

pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const MAX_CONNECTIONS: usize = 1024;
pub const MAX_BUFFER: usize = 8 * 1024;
/// Connections served past [`MAX_CONNECTIONS`], one request each.
pub const PROBE_SLOTS: usize = 1024;
/// The header timeout on a probe slot: a probe sends its request at once,
/// and a slow head must not keep a slot from the next probe for long.
pub const PROBE_HEADER_TIMEOUT: Duration = Duration::from_millis(250);

/// Marks a request that came on a probe slot: it gets its answer and the
/// connection closes; a stream (`/leader/watch`) is refused there.
#[derive(Debug, Clone, Copy)]
pub struct ProbeSlot;

/// Serves `app` on `listener` until `stop`; then closes every connection.
pub async fn serve(listener: TcpListener, app: Router, stop: CancellationToken) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let probe_slots = Arc::new(Semaphore::new(PROBE_SLOTS));
    loop {
        let (permit, probe) = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            p = permits.clone().acquire_owned() => (p.expect("the semaphore is never closed"), false),
            p = probe_slots.clone().acquire_owned() => (p.expect("the semaphore is never closed"), true),
        };
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, or a connection reset before accept:
                    // back off briefly rather than spin.
                    debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let app = app.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            connection(stream, peer, app, stop, probe).await;
            drop(permit);
        });
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    stop: CancellationToken,
    probe: bool,
) {
    let _ = stream.set_nodelay(true);
    let header_timeout = if probe {
        PROBE_HEADER_TIMEOUT
    } else {
        HEADER_TIMEOUT
    };
    let activity = Arc::new(Activity::new(header_timeout));
    let mut first = [0u8; 1];
    // Until its first byte, a connection is this small task: hyper's
    // connection (boxed below) reserves its read buffer at its first read,
    // data or not, and the future that drives it is kilobytes.
    tokio::select! {
        // `readable()` may report a fresh socket ready before any byte;
        // `peek` waits for one (0: the peer closed).
        r = stream.peek(&mut first) => if !matches!(r, Ok(n) if n > 0) { return },
        () = activity.expired() => {
            debug!(%peer, "closing a connection that sent nothing");
            return;
        }
        () = stop.cancelled() => return,
    }
    Box::pin(http(stream, peer, app, stop, probe, activity)).await;
}

/// Serves HTTP/1 on a connection that has sent its first byte.
async fn http(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    stop: CancellationToken,
    probe: bool,
    activity: Arc<Activity>,
) {
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: activity.clone(),
    });
    let busy = activity.clone();
    let service =
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            // The head is in: the header clock stops while the handler runs
            // (`/release` may take a while), until the response is written.
            busy.busy();
            req.extensions_mut().insert(ConnectInfo(peer));
            if probe {
                req.extensions_mut().insert(ProbeSlot);
            }
            app.clone().oneshot(req)
        });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .keep_alive(!probe)
        // Kept by the watchdog below, which tells idle from slow.
        .header_read_timeout(None)
        .max_buf_size(MAX_BUFFER)
        .serve_connection(io, service);
    tokio::select! {
        _ = conn => {}
        () = activity.expired() => debug!(%peer, "closing a slow or idle connection"),
        () = stop.cancelled() => {}
    }
}

/// What a connection last did, for its timeouts: when it started a request
/// (first byte read: the header timeout applies), or when its request head
/// was complete or its last response written (the idle timeout applies), in
/// ms since `start`.
#[derive(Debug)]
struct Activity {
    start: Instant,
    header_timeout: Duration,
    /// `IDLE` or `READING` in the top bit, the time below it.
    state: AtomicU64,
}

const READING: u64 = 1 << 63;

impl Activity {
    /// A new connection is waiting for its first request's headers.
    fn new(header_timeout: Duration) -> Self {
        Self {
            start: Instant::now(),
            header_timeout,
            state: AtomicU64::new(READING),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX >> 1)
    }

    fn read(&self) {
        let s = self.state.load(Ordering::Relaxed);
        if s & READING == 0 {
            self.state.store(READING | self.now_ms(), Ordering::Relaxed);
        }
    }

    /// A request is being handled: the idle limit applies until its
    /// response is written.
    fn busy(&self) {
        self.state.store(self.now_ms(), Ordering::Relaxed);
    }

    fn wrote(&self) {
        self.state.store(self.now_ms(), Ordering::Relaxed);
    }

    /// When the current state times out.
    fn deadline(&self) -> Instant {
        let s = self.state.load(Ordering::Relaxed);
        let (since, limit) = if s & READING != 0 {
            (s & !READING, self.header_timeout)
        } else {
            (s, IDLE_TIMEOUT)
        };
        self.start + Duration::from_millis(since) + limit
    }

    /// Resolves once the connection was slow (headers) or idle too long.
    async fn expired(&self) {
        loop {
            let deadline = self.deadline();
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A stream that reports its reads and writes to its [`Activity`].
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_new_connection_has_the_header_timeout_then_idle_after_a_write() {
        let a = Activity::new(HEADER_TIMEOUT);
        assert_eq!(a.deadline(), a.start + HEADER_TIMEOUT);
        tokio::time::advance(Duration::from_secs(2)).await;
        a.wrote();
        assert_eq!(
            a.deadline(),
            a.start + Duration::from_secs(2) + IDLE_TIMEOUT
        );
        tokio::time::advance(Duration::from_secs(30)).await;
        // The next request's first byte starts its header clock.
        a.read();
        assert_eq!(
            a.deadline(),
            a.start + Duration::from_secs(32) + HEADER_TIMEOUT
        );
        // More bytes of the same head do not move it.
        tokio::time::advance(Duration::from_secs(1)).await;
        a.read();
        assert_eq!(
            a.deadline(),
            a.start + Duration::from_secs(32) + HEADER_TIMEOUT
        );
    }
}
