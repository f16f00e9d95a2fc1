//! A worker beside a leaderd replica, for the fenced-writes end-to-end test
//! (`tests/fenced_workers.rs`): an app that does singleton work while its
//! daemon says it leads.
//!
//! `fenced-writer PORT_FILE DATABASE_URL WRITER on|off LOG`
//!
//! It asks `GET /leader` of the daemon whose port `PORT_FILE` holds (read at
//! every ask: the daemon may be started again on another port). While the
//! answer is 200 it does a unit of work: [`BATCH`] writes, one transaction
//! each, then asks again. A write takes the next number from a counter row
//! (held until commit, so the numbers are the commit order) and appends
//! `(n, token, writer, seq)` to `fence_writes` (the test makes both tables:
//! `fence_ledger (id, n)` with the one row `id = 1`, and `fence_writes`). With `on` each transaction
//! first calls `leaderd_fence(election, token)`; a refusal ends the unit of
//! work and is appended to `LOG` as `refused TOKEN`.
//!
//! A pause (SIGSTOP) in the middle of a unit of work is what the test is
//! about: on waking the worker goes on with the token it was given, as a
//! real app would after a GC pause, and only the fence can stop it.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use mysql_async::prelude::Queryable;

/// Writes per unit of work (one ask of `/leader`).
const BATCH: usize = 20;
/// Between two writes of a unit of work.
const PACE: Duration = Duration::from_millis(10);
/// Between two asks while not leading.
const IDLE: Duration = Duration::from_millis(50);

struct Args {
    port_file: String,
    url: String,
    writer: String,
    fenced: bool,
    log: String,
}

fn args() -> Args {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let [port_file, url, writer, mode, log] = <[String; 5]>::try_from(a).unwrap_or_else(|_| {
        panic!("usage: fenced-writer PORT_FILE DATABASE_URL WRITER on|off LOG")
    });
    let fenced = match mode.as_str() {
        "on" => true,
        "off" => false,
        other => panic!("mode {other:?}: expected on or off"),
    };
    Args {
        port_file,
        url,
        writer,
        fenced,
        log,
    }
}

/// `/leader` of the daemon: its election and token while it leads.
fn ask(port_file: &str) -> Option<(String, i64)> {
    let port: u16 = std::fs::read_to_string(port_file)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let mut s =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
            .ok()?;
    // A daemon that does not answer (paused) is not leading, as far as
    // this worker can tell.
    s.set_read_timeout(Some(Duration::from_millis(300))).ok()?;
    s.write_all(b"GET /leader HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    if !reply.starts_with("HTTP/1.1 200") {
        return None;
    }
    let body: serde_json::Value = serde_json::from_str(reply.split_once("\r\n\r\n")?.1).ok()?;
    Some((
        body["election"].as_str()?.to_owned(),
        body["token"].as_i64()?,
    ))
}

/// One session, PostgreSQL or MariaDB by the URL.
enum Session {
    Pg(tokio_postgres::Client),
    My(mysql_async::Conn),
}

/// How a write ended.
enum Wrote {
    Committed,
    /// `LF001`: the token does not lead.
    Refused,
    /// Anything else (a session ended by the fence's bound, say): the
    /// session is not used again.
    Failed(String),
}

impl Session {
    async fn open(url: &str) -> Result<Session, String> {
        if url.starts_with("mysql:") {
            let conn = mysql_async::Conn::from_url(url)
                .await
                .map_err(|e| e.to_string())?;
            Ok(Session::My(conn))
        } else {
            let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            Ok(Session::Pg(client))
        }
    }

    async fn write(
        &mut self,
        fence: Option<(&str, i64)>,
        token: i64,
        writer: &str,
        seq: i64,
    ) -> Wrote {
        match self {
            Session::Pg(c) => {
                let r = async {
                    c.batch_execute("BEGIN").await?;
                    if let Some((election, t)) = fence {
                        c.query_one("SELECT leaderd_fence($1, $2)", &[&election, &t])
                            .await?;
                    }
                    c.execute(
                        "WITH l AS (UPDATE fence_ledger SET n = n + 1 WHERE id = 1 RETURNING n) \
                         INSERT INTO fence_writes (n, token, writer, seq) \
                         SELECT l.n, $1, $2, $3 FROM l",
                        &[&token, &writer, &seq],
                    )
                    .await?;
                    c.batch_execute("COMMIT").await
                }
                .await;
                match r {
                    Ok(()) => Wrote::Committed,
                    Err(e) => {
                        // Leaves no transaction open on a session kept.
                        let _ = c.batch_execute("ROLLBACK").await;
                        failed(e.code().is_some_and(|c| c.code() == "LF001"), &e)
                    }
                }
            }
            Session::My(c) => {
                let r = async {
                    c.query_drop("START TRANSACTION").await?;
                    if let Some((election, t)) = fence {
                        c.exec_drop("CALL leaderd_fence(?, ?, NULL)", (election, t))
                            .await?;
                    }
                    c.query_drop("UPDATE fence_ledger SET n = LAST_INSERT_ID(n + 1) WHERE id = 1")
                        .await?;
                    c.exec_drop(
                        "INSERT INTO fence_writes (n, token, writer, seq) \
                         VALUES (LAST_INSERT_ID(), ?, ?, ?)",
                        (token, writer, seq),
                    )
                    .await?;
                    c.query_drop("COMMIT").await
                }
                .await;
                match r {
                    Ok(()) => Wrote::Committed,
                    Err(e) => {
                        let _ = c.query_drop("ROLLBACK").await;
                        failed(
                            matches!(&e, mysql_async::Error::Server(s) if s.state == "LF001"),
                            &e,
                        )
                    }
                }
            }
        }
    }
}

/// A transaction that failed: refused by the fence, or anything else.
fn failed(refused: bool, e: &dyn std::fmt::Display) -> Wrote {
    if refused {
        Wrote::Refused
    } else {
        Wrote::Failed(e.to_string())
    }
}

fn note(log: &str, line: &str) {
    // One short write to an O_APPEND file: lines never interleave.
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(log) {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

async fn work(a: Args) {
    let mut session: Option<Session> = None;
    let mut seq: i64 = 0;
    loop {
        // The blocking ask on this (the only) thread: nothing else runs
        // meanwhile but the PostgreSQL connection task, which waits.
        let Some((election, token)) = ask(&a.port_file) else {
            tokio::time::sleep(IDLE).await;
            continue;
        };
        for _ in 0..BATCH {
            let s = match &mut session {
                Some(s) => s,
                None => match Session::open(&a.url).await {
                    Ok(s) => session.insert(s),
                    Err(e) => {
                        note(&a.log, &format!("error connect {e}"));
                        tokio::time::sleep(IDLE).await;
                        break;
                    }
                },
            };
            seq += 1;
            let fence = a.fenced.then_some((election.as_str(), token));
            match s.write(fence, token, &a.writer, seq).await {
                Wrote::Committed => {}
                Wrote::Refused => {
                    note(&a.log, &format!("refused {token}"));
                    break;
                }
                Wrote::Failed(e) => {
                    note(&a.log, &format!("error {token} {e}"));
                    session = None;
                    break;
                }
            }
            tokio::time::sleep(PACE).await;
        }
    }
}

fn main() {
    let a = args();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(work(a));
}
