//! A small TCP fault proxy to put between a daemon and its database.
//!
//! It forwards bytes both ways and can, at any moment: cut every connection
//! (and refuse new ones), blackhole (accept and hold bytes, deliver nothing),
//! add latency both ways, delay replies only (the statement commits, the
//! daemon hears it late), forward the next request and cut before its
//! reply, or stand for a database far away (a one-way delay on every byte,
//! pipelined as on a real link, and a round trip to connect). `heal`
//! returns to plain forwarding.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// What the proxy does to traffic now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything.
    None,
    /// Close every connection and refuse new ones.
    Cut,
    /// Accept connections, deliver nothing in either direction.
    Blackhole,
    /// Delay every chunk, both ways.
    Latency(Duration),
    /// Delay only the database's replies.
    DelayReplies(Duration),
    /// Forward the next request, then cut before the reply arrives.
    CutBeforeReply,
    /// A database this far away one way: every chunk arrives this much after
    /// it was sent, chunks in flight do not wait for each other, and a new
    /// connection takes a round trip before its first byte (TCP's
    /// handshake).
    Distance(Duration),
}

/// The `host:port` a database URL (`scheme://[user[:pass]@]host:port/db`)
/// points at, for a proxy in front of it.
pub fn upstream(url: &str) -> SocketAddr {
    let rest = url.split_once("://").expect("a URL").1;
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let hostport = host.split('/').next().expect("host:port");
    hostport.parse().expect("host:port")
}

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    pub addr: SocketAddr,
    fault: watch::Sender<Fault>,
    /// Bumped on every cut, so connections opened before it close.
    epoch: Arc<Mutex<u64>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port forwarding to `upstream`.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("proxy runtime");
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("proxy bind");
        let addr = listener.local_addr().expect("proxy addr");
        let (fault, rx) = watch::channel(Fault::None);
        let epoch = Arc::new(Mutex::new(0));
        runtime.spawn(accept_loop(listener, upstream, rx, epoch.clone()));
        FaultProxy {
            addr,
            fault,
            epoch,
            runtime: Some(runtime),
        }
    }

    /// Applies `fault` from now on.
    pub fn set(&self, fault: Fault) {
        if matches!(fault, Fault::Cut) {
            *self.epoch.lock().expect("epoch") += 1;
        }
        self.fault.send_replace(fault);
    }

    /// Back to plain forwarding.
    pub fn heal(&self) {
        self.set(Fault::None);
    }

    /// A URL like `template` whose host:port is this proxy.
    pub fn url(&self, template: &str) -> String {
        let (scheme, rest) = template.split_once("://").expect("URL has a scheme");
        let (auth, after) = rest.split_once('@').map_or(("", rest), |(a, h)| (a, h));
        let path = after.find('/').map_or("", |i| &after[i..]);
        let auth = if auth.is_empty() {
            String::new()
        } else {
            format!("{auth}@")
        };
        format!("{scheme}://{auth}{}{path}", self.addr)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    fault: watch::Receiver<Fault>,
    epoch: Arc<Mutex<u64>>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let now = *fault.borrow();
        if now == Fault::Cut {
            drop(client);
            continue;
        }
        let fault = fault.clone();
        let epoch = epoch.clone();
        tokio::spawn(async move {
            let born = *epoch.lock().expect("epoch");
            if let Fault::Distance(d) = now {
                tokio::time::sleep(d * 2).await;
            }
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let up = pump(
                cr,
                sw,
                fault.clone(),
                epoch.clone(),
                born,
                Direction::Request,
            );
            let down = pump(sr, cw, fault, epoch, born, Direction::Reply);
            // When either side ends, drop both.
            tokio::select! {
                _ = up => {}
                _ = down => {}
            }
        });
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Reply,
}

/// Forwards `from` to `to` under the faults; chunks are written by a task of
/// their own at the time they are due, so that a [`Fault::Distance`] delays
/// each without holding up the next.
async fn pump(
    from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    fault: watch::Receiver<Fault>,
    epoch: Arc<Mutex<u64>>,
    born: u64,
    dir: Direction,
) {
    let (chunks, mut due) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    let reader = read_faulty(from, chunks, fault, epoch, born, dir);
    tokio::pin!(writer, reader);
    tokio::select! {
        // An end of stream: what is in flight still arrives.
        drain = &mut reader => if drain { writer.await },
        () = &mut writer => {}
    }
}

/// Reads chunks and queues each for when it is due; returns whether what
/// is queued is still to be delivered (an end of stream) or not (a cut).
async fn read_faulty(
    mut from: tokio::net::tcp::OwnedReadHalf,
    chunks: tokio::sync::mpsc::UnboundedSender<(Instant, Vec<u8>)>,
    mut fault: watch::Receiver<Fault>,
    epoch: Arc<Mutex<u64>>,
    born: u64,
    dir: Direction,
) -> bool {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return true,
                Ok(n) => n,
            },
            // Wake on fault changes too, to notice a cut while idle.
            _ = fault.changed() => {
                if *epoch.lock().expect("epoch") != born {
                    return false;
                }
                continue;
            }
        };
        let mut at = Instant::now();
        loop {
            if *epoch.lock().expect("epoch") != born {
                return false;
            }
            let current = *fault.borrow();
            match current {
                Fault::None => break,
                Fault::Cut => return false,
                Fault::Blackhole => {
                    // Hold the bytes until the fault changes.
                    if fault.changed().await.is_err() {
                        return false;
                    }
                }
                Fault::Distance(d) => {
                    at += d;
                    break;
                }
                Fault::Latency(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Fault::DelayReplies(d) => {
                    if dir == Direction::Reply {
                        tokio::time::sleep(d).await;
                    }
                    break;
                }
                Fault::CutBeforeReply => {
                    if dir == Direction::Reply {
                        *epoch.lock().expect("epoch") += 1;
                        return false;
                    }
                    break;
                }
            }
        }
        if chunks.send((at, buf[..n].to_vec())).is_err() {
            return false;
        }
    }
}
