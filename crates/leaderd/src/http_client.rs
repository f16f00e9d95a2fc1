//! A minimal HTTP/1.1 client for the two requests leaderd makes itself: the
//! app's health check (`app_health`) and `leaderd release` asking the local
//! daemon to step down. Plain HTTP to a nearby host only; it reads the status
//! line, the body and the daemon's warning header, nothing more.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

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
    #[error("a reply longer than {0} bytes")]
    TooLong(usize),
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
/// request and exits (`leaderd release`, `leaderd resume`): within
/// `timeout` in all, as [`request`], and the whole reply, unless it is
/// longer than `limit` bytes (an error, not a reply cut short).
pub fn request_blocking(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
    limit: usize,
) -> Result<Reply, ClientError> {
    let deadline = Instant::now() + timeout;
    // What is left of `timeout` (a socket's timeout cannot be zero).
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(ClientError::Timeout(timeout))
    };
    let timed_out = |e: std::io::Error| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => ClientError::Timeout(timeout),
        _ => ClientError::Io(e),
    };
    let mut stream = std::net::TcpStream::connect_timeout(&addr, left()?).map_err(|source| {
        ClientError::Connect {
            addr: addr.to_string(),
            source,
        }
    })?;
    stream.set_write_timeout(Some(left()?))?;
    let head = head(&addr.ip().to_string(), addr.port(), method, target, headers);
    stream.write_all(head.as_bytes()).map_err(timed_out)?;
    let mut raw = Vec::new();
    let mut chunk = [0; 8192];
    loop {
        stream.set_read_timeout(Some(left()?))?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&chunk[..n]);
                if raw.len() > limit {
                    return Err(ClientError::TooLong(limit));
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(timed_out(e)),
        }
    }
    parse(&raw)
}

/// What [`request`] reads at most: a health endpoint answers in a few
/// hundred bytes, and only its status matters.
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
        let started = Instant::now();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let err =
            request_blocking(addr, "POST", "/", &[], Duration::from_secs(30), 1024).unwrap_err();
        assert!(matches!(err, ClientError::Connect { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_daemon_that_never_answers_is_a_timeout() {
        // Connections complete into the backlog; nothing reads them.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let within = Duration::from_millis(200);
        let started = Instant::now();
        let err = request_blocking(addr, "POST", "/", &[], within, 1024).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(
            matches!(err, ClientError::Timeout(d) if d == within),
            "{err}"
        );
    }

    /// Serves one connection on a thread: reads the request's head, then
    /// writes `reply` and closes.
    fn serve_once(reply: Vec<u8>) -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut seen = Vec::new();
            let mut byte = [0; 1];
            while !seen.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap() == 1 {
                seen.push(byte[0]);
            }
            conn.write_all(&reply).unwrap();
        });
        addr
    }

    #[test]
    fn a_long_reply_is_read_whole_up_to_the_limit() {
        // A release of every election answers with a body for each: far
        // more than a health check's.
        let body = "x".repeat(300_000);
        let reply = format!("HTTP/1.1 200 OK\r\ncontent-length: 300000\r\n\r\n{body}");
        let addr = serve_once(reply.clone().into_bytes());
        let got =
            request_blocking(addr, "POST", "/", &[], Duration::from_secs(10), 1 << 20).unwrap();
        assert_eq!((got.status, got.body.len()), (200, body.len()));
        let addr = serve_once(reply.into_bytes());
        let err = request_blocking(addr, "POST", "/", &[], Duration::from_secs(10), 100_000);
        assert!(matches!(err, Err(ClientError::TooLong(100_000))), "{err:?}");
    }
}
