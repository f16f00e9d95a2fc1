//! A minimal HTTP/1.1 client for the two requests leaderd makes itself: the
//! app's health check (`app_health`) and `leaderd release` asking the local
//! daemon to step down. Plain HTTP to a nearby host only; it reads the status
//! line, the body and the daemon's warning header, nothing more.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response: status code, body, and the daemon's warning (the
/// `Leaderd-Warning` header), if any.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub warning: Option<String>,
}

/// The header in which the daemon warns the client of a consequence of
/// its request.
pub const WARNING_HEADER: &str = "leaderd-warning";

/// Why a request got no reply.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not an HTTP reply")]
    Malformed,
}

/// Sends `method target` to `host:port` (with `Connection: close` and
/// `headers`) and reads the whole reply, within `timeout`.
pub async fn request(
    host: &str,
    port: u16,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<Reply, ClientError> {
    tokio::time::timeout(timeout, exchange(host, port, method, target, headers))
        .await
        .map_err(|_| ClientError::Timeout(timeout))?
}

async fn exchange(
    host: &str,
    port: u16,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> Result<Reply, ClientError> {
    let mut stream =
        TcpStream::connect((host, port))
            .await
            .map_err(|source| ClientError::Connect {
                addr: format!("{host}:{port}"),
                source,
            })?;
    let host_header = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: leaderd\r\n\
         {extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let mut raw = Vec::new();
    // Bounded: a health endpoint or the daemon answers in a few hundred bytes.
    stream.take(64 * 1024).read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse().ok())
        .ok_or(ClientError::Malformed)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let warning = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case(WARNING_HEADER)
            .then(|| value.trim().to_owned())
    });
    Ok(Reply {
        status,
        body: body.to_owned(),
        warning,
    })
}
