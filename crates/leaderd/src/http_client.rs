//! A minimal HTTP/1.1 client for the two requests leaderd makes itself: the
//! app's health check (`app_health`) and `leaderd release` asking the local
//! daemon to step down. Plain HTTP to a nearby host only; it reads the status
//! line, the body and the daemon's warning header, nothing more.

use std::io::{Read as _, Write as _};
use std::net::ToSocketAddrs;
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
    stream
        .write_all(head(host, port, method, target, headers).as_bytes())
        .await?;
    let mut raw = Vec::new();
    stream.take(REPLY_LIMIT).read_to_end(&mut raw).await?;
    parse(&raw)
}

/// [`request`] without an async runtime, for a command that makes this one
/// request and exits (`leaderd release`): building a runtime for it cost
/// the command's start more than the exchange. `timeout` bounds each read
/// and write, and the connect to any but a loopback address.
pub fn request_blocking(
    host: &str,
    port: u16,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<Reply, ClientError> {
    let timed_out = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            ClientError::Timeout(timeout)
        }
        _ => ClientError::Io(e),
    };
    let connect_error = |source| ClientError::Connect {
        addr: format!("{host}:{port}"),
        source,
    };
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(connect_error)?
        .next()
        .ok_or_else(|| connect_error(std::io::ErrorKind::NotFound.into()))?;
    let mut stream = if addr.ip().is_loopback() {
        // Completes or is refused within the call (the kernel bounds a
        // full backlog's retries at about two minutes); waiting for it
        // with a timeout cost a poll and a wake-up more.
        std::net::TcpStream::connect(addr)
    } else {
        std::net::TcpStream::connect_timeout(&addr, timeout)
    }
    .map_err(connect_error)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream
        .write_all(head(host, port, method, target, headers).as_bytes())
        .map_err(timed_out)?;
    let mut raw = Vec::new();
    stream
        .take(REPLY_LIMIT)
        .read_to_end(&mut raw)
        .map_err(timed_out)?;
    parse(&raw)
}

/// Bounded: a health endpoint or the daemon answers in a few hundred bytes.
const REPLY_LIMIT: u64 = 64 * 1024;

/// The request's head: `Connection: close`, so the reply ends with the
/// connection.
fn head(host: &str, port: u16, method: &str, target: &str, headers: &[(&str, &str)]) -> String {
    let host_header = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    format!(
        "{method} {target} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: leaderd\r\n\
         {extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
}

/// The status, the body and the warning header of a whole reply.
fn parse(raw: &[u8]) -> Result<Reply, ClientError> {
    let text = String::from_utf8_lossy(raw);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_gives_its_status_body_and_warning() {
        let reply = parse(
            b"HTTP/1.1 409 Conflict\r\ncontent-type: application/json\r\n\
              Leaderd-Warning: nobody else competes\r\n\r\n{\"is_leader\":false}",
        )
        .unwrap();
        assert_eq!(reply.status, 409);
        assert_eq!(reply.body, "{\"is_leader\":false}");
        assert_eq!(reply.warning.as_deref(), Some("nobody else competes"));
    }

    #[test]
    fn anything_but_http_is_malformed() {
        for raw in [&b""[..], b"SSH-2.0-OpenSSH\r\n", b"HTTP/1.1 abc\r\n\r\n"] {
            assert!(matches!(parse(raw), Err(ClientError::Malformed)), "{raw:?}");
        }
    }

    #[test]
    fn the_head_names_an_ipv6_host_in_brackets() {
        let head = head("::1", 4041, "POST", "/release", &[("Leaderd-Release", "1")]);
        assert!(head.starts_with("POST /release HTTP/1.1\r\nHost: [::1]:4041\r\n"));
        assert!(head.contains("\r\nLeaderd-Release: 1\r\n"));
        assert!(head.ends_with("Connection: close\r\n\r\n"));
    }

    #[test]
    fn no_daemon_is_a_connect_error_at_once() {
        // A port just freed: nothing listens on it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let started = std::time::Instant::now();
        let err = request_blocking("127.0.0.1", port, "POST", "/", &[], Duration::from_secs(30))
            .unwrap_err();
        assert!(matches!(err, ClientError::Connect { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_daemon_that_never_answers_is_a_timeout() {
        // Connections complete into the backlog; nothing reads them.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let within = Duration::from_millis(200);
        let err = request_blocking("127.0.0.1", port, "POST", "/", &[], within).unwrap_err();
        assert!(
            matches!(err, ClientError::Timeout(d) if d == within),
            "{err}"
        );
    }
}
