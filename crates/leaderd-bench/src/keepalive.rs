//! One HTTP/1.1 connection kept open per pod, for a sampler that asks every
//! few milliseconds.
//!
//! A new connection per request leaves a socket in TIME_WAIT each (the
//! rolling part's 5 ms sweeps of up to ten pods: about 1,500 a second).
//! Measured: 31,000 such sockets on loopback, more than the ephemeral port
//! range holds, and both cores 93–97 % in the kernel for seconds at a time
//! during an update (the search for a free port); the daemons' round trips
//! took hundreds of milliseconds then, and the part measured the bench, not
//! the handovers. One kept connection per pod costs none of that.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// How long connecting, and reading one answer, may take: a pod that does
/// not answer in that time counts as not answering this sweep.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// A kept connection to one pod's HTTP port (made again when the pod closed
/// it).
#[derive(Debug)]
pub struct KeepAlive {
    port: u16,
    conn: Option<BufReader<TcpStream>>,
}

impl KeepAlive {
    pub fn new(port: u16) -> KeepAlive {
        KeepAlive { port, conn: None }
    }

    /// `GET path`: status and body, or `None` when the pod does not answer.
    /// A kept connection the server closed meanwhile (idle, or the pod
    /// restarted) is tried once more on a new one.
    pub fn get(&mut self, path: &str) -> Option<(u16, String)> {
        for _ in 0..2 {
            let fresh = self.conn.is_none();
            match self.ask(path) {
                Some(answer) => return Some(answer),
                None => {
                    self.conn = None;
                    if fresh {
                        return None;
                    }
                }
            }
        }
        None
    }

    fn ask(&mut self, path: &str) -> Option<(u16, String)> {
        if self.conn.is_none() {
            let s =
                TcpStream::connect_timeout(&([127, 0, 0, 1], self.port).into(), CONNECT_TIMEOUT)
                    .ok()?;
            s.set_read_timeout(Some(READ_TIMEOUT)).ok()?;
            s.set_nodelay(true).ok()?;
            self.conn = Some(BufReader::new(s));
        }
        let conn = self.conn.as_mut()?;
        write!(
            conn.get_mut(),
            "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n"
        )
        .ok()?;
        let mut line = String::new();
        conn.read_line(&mut line).ok()?;
        let status: u16 = line.split(' ').nth(1)?.parse().ok()?;
        let mut length = None;
        let mut close = false;
        loop {
            line.clear();
            if conn.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':')?;
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse::<usize>().ok();
            } else if name.eq_ignore_ascii_case("connection") {
                close = value.eq_ignore_ascii_case("close");
            }
        }
        // The daemon's answers here carry a length; one without (chunked)
        // is not what this reads.
        let mut body = vec![0; length?];
        conn.read_exact(&mut body).ok()?;
        if close {
            self.conn = None;
        }
        Some((status, String::from_utf8(body).ok()?))
    }
}
