//! Opening a PostgreSQL connection: the URL's hosts in order (one seen not
//! answering goes last for a while), each bounded, over the URL's TLS; and
//! the handle that cancels a statement in flight.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::held_off::{self, HeldOff};
use crate::shared::error::{describe, StoreError};
use crate::shared::tls::{self, Verify};
use crate::shared::url::{DatabaseUrl, TlsMode};

/// An open tokio-postgres connection: the client, how to cancel on it, and
/// (for a [`Listener`]) the notifications it receives.
pub(super) struct Opened {
    pub(super) client: Client,
    pub(super) cancel: CancelHandle,
    /// Who held takeovers off, as the connection heard.
    pub(super) held_off: HeldOff,
    pub(super) notifications:
        Option<mpsc::UnboundedReceiver<Result<String, tokio_postgres::Error>>>,
}

/// How long one host of a list may take to connect (TCP, TLS,
/// authentication, the session check) when the URL sets no
/// `connect_timeout`: a database 150 ms away takes about a second, and two
/// hosts that never answer still leave a third its turn within the
/// connector's budget.
pub(super) const HOST_BUDGET: Duration = Duration::from_secs(4);

/// Hosts of a list seen not answering at a connect (its bound ran out, or
/// the connect was cut while on it), by host list and place, and since
/// when: tried after the others for [`STALL_MEMORY`] (see [`open`]).
pub(super) static STALLED: std::sync::Mutex<Vec<(String, usize, std::time::Instant)>> =
    std::sync::Mutex::new(Vec::new());

/// How long a host that did not answer goes to the back of its list; then
/// the list's own order again (a primary that came back is preferred again).
pub(super) const STALL_MEMORY: Duration = Duration::from_secs(60);

/// The places in `list` of hosts seen not answering lately.
pub(super) fn stalled_hosts(list: &str) -> Vec<usize> {
    let mut stalled = STALLED.lock().unwrap_or_else(|e| e.into_inner());
    stalled.retain(|(_, _, since)| since.elapsed() < STALL_MEMORY);
    stalled
        .iter()
        .filter(|(l, _, _)| l == list)
        .map(|&(_, i, _)| i)
        .collect()
}

/// Notes whether host `i` of `list` is (still) not answering.
pub(super) fn mark_stalled(list: &str, i: usize, stalled: bool) {
    let mut marks = STALLED.lock().unwrap_or_else(|e| e.into_inner());
    marks.retain(|(l, j, _)| !(l == list && *j == i));
    if stalled {
        marks.push((list.to_owned(), i, std::time::Instant::now()));
    }
}

/// Connects to the URL's hosts in order, as libpq does, except that a host
/// seen not answering in the last minute goes last: one that accepts TCP
/// and never answers would otherwise cost its bound at every connect (a
/// daemon opens three at start: the migration's, the lock table's and the
/// listener's), or the whole connect budget when its bound is longer.
/// `connect_timeout` bounds each host's whole start-up (the driver bounds
/// its TCP connect only), else [`HOST_BUDGET`] does for a list of hosts.
pub(super) async fn open(url: &DatabaseUrl, listen: bool) -> Result<Opened, StoreError> {
    let config: tokio_postgres::Config = url
        .expose()
        .parse()
        .map_err(|e: tokio_postgres::Error| StoreError::InvalidUrl(e.to_string()))?;
    let hosts = url.postgres_hosts();
    let bound = match config.get_connect_timeout() {
        Some(t) if !t.is_zero() => Some(*t),
        _ if hosts.len() > 1 => Some(HOST_BUDGET),
        _ => None,
    };
    let Some(bound) = bound else {
        return open_one(url, url.expose(), listen).await;
    };
    let list: Vec<&str> = hosts.iter().map(|(h, _)| h.as_str()).collect();
    let list = list.join(",");
    let stalled = stalled_hosts(&list);
    let (answering, late): (Vec<usize>, Vec<usize>) =
        (0..hosts.len()).partition(|i| !stalled.contains(i));
    let mut failures = Vec::new();
    for i in answering.into_iter().chain(late) {
        let (host, raw) = &hosts[i];
        // Marked first: a connect cut while on this host (by the caller's
        // budget) leaves it marked.
        mark_stalled(&list, i, true);
        match tokio::time::timeout(bound, open_one(url, raw, listen)).await {
            Ok(Ok(opened)) => {
                mark_stalled(&list, i, false);
                return Ok(opened);
            }
            Ok(Err(e)) => {
                mark_stalled(&list, i, false);
                failures.push(format!("{host}: {e}"));
            }
            Err(_) => failures.push(format!("{host}: no answer within {bound:?}")),
        }
    }
    Err(StoreError::Connect(diesel::ConnectionError::BadConnection(
        failures.join("; "),
    )))
}

/// Connects with the URL's TLS (files read now) to the host(s) of `raw`
/// (the URL, or one host of its list). The connection's messages are
/// driven by a task that ends when the client is dropped; it forwards
/// notifications only when `listen`, so that a connection that never asked
/// for any (but, behind a pooler, may be handed some) stores nothing.
pub(super) async fn open_one(
    url: &DatabaseUrl,
    raw: &str,
    listen: bool,
) -> Result<Opened, StoreError> {
    let mut config: tokio_postgres::Config = raw
        .parse()
        .map_err(|e: tokio_postgres::Error| StoreError::InvalidUrl(e.to_string()))?;
    let want = url.tls();
    let held_off = HeldOff::default();
    let (tx, rx) = if listen {
        let (tx, rx) = mpsc::unbounded_channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let failed = |e: tokio_postgres::Error| {
        StoreError::Connect(diesel::ConnectionError::BadConnection(describe(&e)))
    };
    let hosts = config.get_hosts();
    let unix_only = !hosts.is_empty()
        && hosts
            .iter()
            .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
    let tls_mode = match want.mode {
        // As libpq: no TLS over a Unix socket (the server offers none there,
        // and the channel never leaves the host), whatever `sslmode` says.
        _ if unix_only => None,
        TlsMode::Disable => None,
        TlsMode::Prefer => Some((tokio_postgres::config::SslMode::Prefer, Verify::Nothing)),
        TlsMode::Require(v) => Some((tokio_postgres::config::SslMode::Require, v)),
    };
    let (client, tls) = match tls_mode {
        None => {
            config.ssl_mode(tokio_postgres::config::SslMode::Disable);
            let (client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(failed)?;
            tokio::spawn(drive(connection, tx, held_off.ear()));
            (client, None)
        }
        Some((ssl_mode, verify)) => {
            config.ssl_mode(ssl_mode);
            let tls = MakeRustlsConnect::new(tls::client_config(verify, &want.files)?);
            let (client, connection) = config.connect(tls.clone()).await.map_err(failed)?;
            tokio::spawn(drive(connection, tx, held_off.ear()));
            (client, Some(tls))
        }
    };
    Ok(Opened {
        held_off,
        cancel: CancelHandle {
            token: client.cancel_token(),
            tls,
        },
        client,
        notifications: rx,
    })
}

/// Polls a connection until it closes, forwarding notifications (and the
/// error that ends it) to `tx`, and the takeover trigger's notices of who
/// held a takeover off to `ear`.
pub(super) async fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    tx: Option<mpsc::UnboundedSender<Result<String, tokio_postgres::Error>>>,
    ear: Arc<Mutex<Vec<String>>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notification(n))) => {
                if let Some(tx) = &tx {
                    let _ = tx.send(Ok(n.payload().to_owned()));
                }
            }
            Some(Ok(AsyncMessage::Notice(n))) if n.code().code() == held_off::CODE => {
                HeldOff::hear(&ear, n.message());
            }
            // Other notices (e.g. "there is no transaction in progress"):
            // nothing to act on.
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                if let Some(tx) = &tx {
                    let _ = tx.send(Err(e));
                }
                return;
            }
            None => return,
        }
    }
}

/// What cancels a statement on one connection: its cancel token and the TLS
/// it was opened with (a cancel request is a new connection to the server;
/// none over a Unix socket).
#[derive(Clone)]
pub(crate) struct CancelHandle {
    pub(super) token: tokio_postgres::CancelToken,
    pub(super) tls: Option<MakeRustlsConnect>,
}

impl CancelHandle {
    pub(crate) async fn cancel(self) -> Result<(), StoreError> {
        let sent = match self.tls {
            Some(tls) => self.token.cancel_query(tls).await,
            None => self.token.cancel_query(tokio_postgres::NoTls).await,
        };
        sent.map_err(|e| StoreError::Local(format!("cancel request failed: {e}")))
    }
}
