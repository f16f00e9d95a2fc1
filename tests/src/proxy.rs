//! A small TCP fault proxy to put between a daemon and its database.
//!
//! It forwards bytes both ways and can, at any moment: cut every connection
//! (and refuse new ones), blackhole (accept and hold bytes, deliver nothing),
//! add latency both ways, delay replies only (the statement commits, the
//! daemon hears it late), or forward the next request and cut before its
//! reply. `heal` returns to plain forwarding.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

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

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut fault: watch::Receiver<Fault>,
    epoch: Arc<Mutex<u64>>,
    born: u64,
    dir: Direction,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            // Wake on fault changes too, to notice a cut while idle.
            _ = fault.changed() => {
                if *epoch.lock().expect("epoch") != born {
                    return;
                }
                continue;
            }
        };
        loop {
            if *epoch.lock().expect("epoch") != born {
                return;
            }
            let current = *fault.borrow();
            match current {
                Fault::None => break,
                Fault::Cut => return,
                Fault::Blackhole => {
                    // Hold the bytes until the fault changes.
                    if fault.changed().await.is_err() {
                        return;
                    }
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
                        return;
                    }
                    break;
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
