//! Logs to stderr that never hold up the daemon.
//!
//! A stderr that stops draining (a stalled log collector, Docker's blocking
//! log mode, a pipe that an `exec` command filled) would stop whichever
//! thread logs next: the election loop before a step-down, `exec` before a
//! SIGKILL, the signal handler before shutdown. So a log call only hands its
//! line to one writer thread through a bounded queue; when the queue is full
//! the line is dropped and counted (`leaderd_log_lines_dropped_total`).
//!
//! What this does not do: keep every line. A stalled stderr loses lines; the
//! metric says how many.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

use crate::settings::LogFormat;

/// Lines queued for the writer thread at most: about 0.5 MiB of JSON lines,
/// far more than a healthy stderr ever has waiting.
const QUEUE_LINES: usize = 2048;

enum Message {
    Line(Vec<u8>),
    /// Answered once every line queued before it was written.
    Flush(SyncSender<()>),
}

/// A `MakeWriter` whose writers queue each line for one writer thread and
/// never block; see the module docs.
#[derive(Debug, Clone)]
pub struct Lossy {
    queue: SyncSender<Message>,
    dropped: Arc<AtomicU64>,
}

impl Lossy {
    /// Starts the writer thread on `sink`.
    pub fn new(sink: impl Write + Send + 'static, lines: usize) -> io::Result<Self> {
        let (queue, rx) = mpsc::sync_channel::<Message>(lines);
        std::thread::Builder::new()
            .name("leaderd-log".into())
            .spawn(move || {
                let mut sink = sink;
                for message in rx {
                    match message {
                        Message::Line(line) => {
                            let _ = sink.write_all(&line);
                        }
                        Message::Flush(done) => {
                            let _ = sink.flush();
                            let _ = done.send(());
                        }
                    }
                }
            })?;
        Ok(Self {
            queue,
            dropped: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Lines dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Waits until what was logged before this call is written, for at most
    /// `within` (a stalled stderr must not hold up the exit).
    pub fn flush(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let (done, wait) = mpsc::sync_channel(1);
        let mut message = Message::Flush(done);
        loop {
            match self.queue.try_send(message) {
                Ok(()) => break,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(m)) => {
                    if Instant::now() >= deadline {
                        return false;
                    }
                    message = m;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        !matches!(
            wait.recv_timeout(left),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected)
        )
    }
}

impl Write for Lossy {
    /// Takes the whole of `buf` (tracing's formatter writes one event per
    /// call) and never blocks.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.queue.try_send(Message::Line(buf.to_vec())).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Lossy {
    type Writer = Lossy;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// The process's log writer, once [`init`] ran.
static WRITER: OnceLock<Lossy> = OnceLock::new();

/// Sets up `tracing` to stderr through a [`Lossy`] writer.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = io::IsTerminal::is_terminal(&io::stderr());
    let writer = match Lossy::new(io::stderr(), QUEUE_LINES) {
        Ok(w) => WRITER.get_or_init(|| w).clone(),
        Err(e) => {
            // No thread: without logs rather than with logs that can block.
            eprintln!("leaderd: cannot start the log writer ({e}); logging is off");
            return;
        }
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// Lines dropped so far (0 before [`init`]).
pub fn dropped_lines() -> u64 {
    WRITER.get().map_or(0, Lossy::dropped)
}

/// Writes out what was logged, for at most `within`; at exit.
pub fn flush(within: Duration) {
    if let Some(w) = WRITER.get() {
        w.flush(within);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A sink that blocks every write until `open` is set, like a pipe
    /// nobody drains.
    struct Stalled {
        open: Arc<(Mutex<bool>, std::sync::Condvar)>,
        written: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let (lock, cv) = &*self.open;
            let mut open = lock.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
            self.written.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_sink_drops_and_counts_lines_but_never_blocks() {
        let open = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let written = Arc::new(Mutex::new(Vec::new()));
        let lossy = Lossy::new(
            Stalled {
                open: open.clone(),
                written: written.clone(),
            },
            4,
        )
        .unwrap();
        let started = Instant::now();
        let mut w = lossy.make_writer();
        for i in 0..100 {
            w.write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "writes never wait"
        );
        // One line is held by the blocked thread, four wait in the queue.
        assert!((95..=96).contains(&lossy.dropped()), "{}", lossy.dropped());
        assert!(
            !lossy.flush(Duration::from_millis(50)),
            "a flush is bounded"
        );
        *open.0.lock().unwrap() = true;
        open.1.notify_all();
        assert!(lossy.flush(Duration::from_secs(5)));
        let text = String::from_utf8(written.lock().unwrap().clone()).unwrap();
        assert!(text.starts_with("line 0\n"), "{text}");
    }

    #[test]
    fn lines_arrive_whole_and_in_order() {
        let written = Arc::new(Mutex::new(Vec::new()));
        let lossy = Lossy::new(
            Stalled {
                open: Arc::new((Mutex::new(true), std::sync::Condvar::new())),
                written: written.clone(),
            },
            QUEUE_LINES,
        )
        .unwrap();
        let mut w = lossy.make_writer();
        for i in 0..1000 {
            w.write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
        assert!(lossy.flush(Duration::from_secs(5)));
        let text = String::from_utf8(written.lock().unwrap().clone()).unwrap();
        let expected: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        assert_eq!(text, expected);
        assert_eq!(lossy.dropped(), 0);
    }
}
