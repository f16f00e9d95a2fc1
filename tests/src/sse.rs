//! A client of `/leader/watch` for tests: reads the event stream on a thread
//! and hands over each event with the boot-clock time it arrived.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// Microseconds since boot (`CLOCK_BOOTTIME`), as leaderd's logs carry them.
pub fn boot_us() -> u64 {
    u64::try_from(leaderd_store::boot_now().since_boot().as_micros()).unwrap_or(u64::MAX)
}

/// One open `/leader/watch` stream.
#[derive(Debug)]
pub struct Watcher {
    events: mpsc::Receiver<(u64, Value)>,
    stream: TcpStream,
}

impl Watcher {
    /// Opens the stream; `None` when the daemon refuses it (status not 200).
    pub fn open(port: u16) -> Option<Watcher> {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
        // HTTP/1.0: the body is the rest of the connection, not chunked.
        stream
            .write_all(b"GET /leader/watch HTTP/1.0\r\nHost: x\r\n\r\n")
            .ok()?;
        let mut reader = BufReader::new(stream.try_clone().ok()?);
        let mut status = String::new();
        reader.read_line(&mut status).ok()?;
        if status.split(' ').nth(1) != Some("200") {
            return None;
        }
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            let mut in_body = false;
            let mut data = None;
            for line in reader.lines() {
                let Ok(line) = line else { return };
                let at = boot_us();
                if !in_body {
                    in_body = line.is_empty();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str::<Value>(d).ok();
                } else if line.is_empty() {
                    if let Some(v) = data.take() {
                        if tx.send((at, v)).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Some(Watcher { events, stream })
    }

    /// The next event and when it arrived, waiting up to `within`.
    pub fn next_at(&self, within: Duration) -> Option<(u64, Value)> {
        self.events.recv_timeout(within).ok()
    }

    /// The next event, waiting up to `within`.
    pub fn next(&self, within: Duration) -> Option<Value> {
        self.next_at(within).map(|(_, v)| v)
    }

    /// Waits up to `within` for an event matching `f`, skipping others.
    pub fn until(&self, within: Duration, f: impl Fn(&Value) -> bool) -> Option<(u64, Value)> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let (at, v) = self.next_at(left)?;
            if f(&v) {
                return Some((at, v));
            }
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}
