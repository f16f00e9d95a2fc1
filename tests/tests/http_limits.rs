//! HTTP limits against a real daemon: slow and idle clients cannot exhaust
//! it, and `/leader` stays fast meanwhile.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use leaderd_tests::sse::Watcher;
use leaderd_tests::{http_get, serial, wait_for, Daemon, Scratch, TempDb};

/// The chart's memory limit for the sidecar.
const RSS_LIMIT_KIB: u64 = 32 * 1024;
/// The idle footprint target of the release image, which the footprint
/// bench measures (BENCHMARKS.md).
const IDLE_TARGET_KIB: u64 = 10 * 1024;
/// What the connections may add: the chart's limit less the idle image.
/// Measured as growth because the tests run the debug build, whose idle RSS
/// (about 22 MiB, mostly unoptimised code) says nothing about the image.
const GROWTH_LIMIT_KIB: u64 = RSS_LIMIT_KIB - IDLE_TARGET_KIB;

fn raise_open_files_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = limit.maximum;
    setrlimit(Resource::Nofile, limit).expect("raise the open-files limit");
}

fn rss_kib(pid: i32) -> u64 {
    leaderd_tests::status_kib(pid, "VmRSS:").expect("VmRSS")
}

fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// One request on a keep-alive connection, then the connection sits idle.
fn idle_connection(port: u16) -> TcpStream {
    let mut s = connect(port);
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !(got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"}")) {
        let n = s.read(&mut buf).expect("a reply");
        assert!(n > 0, "closed before replying");
        got.extend_from_slice(&buf[..n]);
    }
    s
}

/// Whether the server has closed the connection (EOF or reset), reading
/// away whatever it answered first.
fn closed(s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    let result = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) => break e.kind() != std::io::ErrorKind::WouldBlock,
        }
    };
    s.set_nonblocking(false).unwrap();
    result
}

/// Whether every connection has been closed (each one polled every time).
fn all_closed(conns: &mut [TcpStream]) -> bool {
    conns.iter_mut().map(closed).filter(|c| !c).count() == 0
}

/// One daemon on SQLite, leading, with the open-files limit raised for the
/// many connections the tests open.
fn lone_leader() -> (TempDb, Scratch, Daemon) {
    raise_open_files_limit();
    let db = TempDb::sqlite();
    let dir = Scratch::new();
    let d = Daemon::start(&db.url, "a", &dir, &[]);
    wait_for(Duration::from_secs(10), "leadership", || {
        d.is_leader().then_some(())
    });
    (db, dir, d)
}

fn leader_p99(port: u16) -> Duration {
    let mut took: Vec<Duration> = (0..200)
        .map(|_| {
            let t = Instant::now();
            assert!(
                http_get(port, "/leader").is_some(),
                "/leader did not answer"
            );
            t.elapsed()
        })
        .collect();
    took.sort();
    took[took.len() * 99 / 100]
}

#[test]
fn slow_and_idle_clients_cannot_exhaust_the_daemon() {
    let _s = serial();
    let (_db, _dir, d) = lone_leader();
    let pid = d.pid();
    let base_fds = open_fds(pid);
    let idle_rss = rss_kib(pid);
    // 500 idle keep-alive connections and 500 clients that never finish
    // their headers: 1,000 open at once, within the 1,024 served.
    let mut idle: Vec<TcpStream> = (0..500).map(|_| idle_connection(d.port)).collect();
    let started = Instant::now();
    let mut slow: Vec<TcpStream> = (0..500)
        .map(|_| {
            let mut s = connect(d.port);
            s.write_all(b"GET /leader HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .unwrap();
            s
        })
        .collect();
    let p99 = leader_p99(d.port);
    let rss = rss_kib(pid);
    eprintln!("with 500 idle and 500 slow connections: /leader p99 {p99:?}, RSS {rss} KiB (idle {idle_rss} KiB)");
    assert!(p99 < Duration::from_millis(10), "/leader p99 {p99:?}");
    assert!(
        rss - idle_rss < GROWTH_LIMIT_KIB,
        "RSS {rss} KiB, idle {idle_rss} KiB"
    );
    // The slow ones are cut after the header timeout, not before.
    assert!(!closed(&mut slow[0]) || started.elapsed() >= Duration::from_secs(5));
    wait_for(Duration::from_secs(9), "the slow clients to be cut", || {
        all_closed(&mut slow).then_some(())
    });
    assert!(
        started.elapsed() >= Duration::from_millis(4900),
        "{:?}",
        started.elapsed()
    );
    // The idle ones are still open (their limit is 60 s) and still served.
    assert!(
        !idle.iter_mut().any(closed),
        "an idle connection was cut early"
    );
    idle[0]
        .write_all(b"GET /leader HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 16];
    assert!(idle[0].read(&mut buf).unwrap() > 0);
    drop(idle);
    drop(slow);
    wait_for(
        Duration::from_secs(5),
        "descriptors to be given back",
        || (open_fds(pid) <= base_fds + 2).then_some(()),
    );
    // 1,000 connections each sending a large unfinished head: refused at
    // the buffer limit, memory stays bounded.
    let big = vec![b'a'; 64 * 1024];
    let mut heavy: Vec<TcpStream> = (0..1000)
        .map(|_| {
            let mut s = connect(d.port);
            let _ = s.write_all(b"GET /leader HTTP/1.1\r\nX-Big: ");
            let _ = s.write_all(&big[..20 * 1024]);
            s
        })
        .collect();
    // Refusing 20 MB of heads is work for the 2 cores; the promise here is
    // memory, and that /leader keeps answering. Not on one try: a request
    // that queued behind the 1,000 (its own read timeout is 2 s) once went
    // unanswered in a full run, so a few tries within a bound.
    let asked = Instant::now();
    wait_for(
        Duration::from_secs(6),
        "/leader to answer beside 1,000 oversized heads",
        || http_get(d.port, "/leader").map(drop),
    );
    let answered = asked.elapsed();
    let rss = rss_kib(pid);
    eprintln!(
        "with 1,000 oversized heads: /leader answered after {answered:?}, RSS {rss} KiB (idle {idle_rss} KiB)"
    );
    assert!(
        rss - idle_rss < GROWTH_LIMIT_KIB,
        "RSS {rss} KiB, idle {idle_rss} KiB"
    );
    wait_for(
        Duration::from_secs(9),
        "oversized heads to be refused",
        || all_closed(&mut heavy).then_some(()),
    );
    assert!(d.is_leader(), "the leader kept its lease throughout");
}

/// 1,000 watchers of the leader on `port`, each past its first event.
fn thousand_watchers(port: u16) -> Vec<Watcher> {
    let watchers: Vec<Watcher> = (0..1000)
        .map(|i| Watcher::open(port).unwrap_or_else(|| panic!("watcher {i} refused")))
        .collect();
    for w in &watchers {
        let first = w.next(Duration::from_secs(5)).expect("an event at connect");
        assert_eq!(first["is_leader"], true);
    }
    watchers
}

#[test]
fn a_thousand_idle_watchers_cost_nothing_and_all_hear_a_change() {
    let _s = serial();
    let (_db, _dir, d) = lone_leader();
    let watchers = thousand_watchers(d.port);
    // The cap keeps slots for probes.
    assert!(
        Watcher::open(d.port).is_none(),
        "watcher 1,001 was accepted"
    );
    let p99 = leader_p99(d.port);
    let before = leaderd_tests::cpu_ticks(d.pid()).expect("stat");
    std::thread::sleep(Duration::from_secs(3));
    let idle_ticks = leaderd_tests::cpu_ticks(d.pid()).expect("stat") - before;
    eprintln!("with 1,000 watchers: /leader p99 {p99:?}, {idle_ticks} CPU ticks in 3 s idle");
    assert!(p99 < Duration::from_millis(10), "/leader p99 {p99:?}");
    // Renewals alone: a poll per watcher would cost far more than this.
    assert!(idle_ticks < 30, "{idle_ticks} ticks (1/100 s) in 3 s");
    d.release("");
    for w in &watchers {
        let (_, v) = w
            .until(Duration::from_secs(2), |v| v["is_leader"] == false)
            .expect("every watcher hears of the step-down");
        assert_eq!(v["leader"], serde_json::Value::Null);
    }
}

/// Probes always get in: with 1,024 connections open of
/// any mix — 1,000 watchers, idle keep-alives, slow heads — `/healthz`,
/// `/readyz` and `/leader` still answer within 100 ms, so nobody who can
/// reach the port can fail the kubelet's liveness probe.
#[test]
fn probes_get_in_whatever_holds_the_1024_connections() {
    let _s = serial();
    let (_db, _dir, d) = lone_leader();
    let _watchers = thousand_watchers(d.port);
    let idle: Vec<TcpStream> = (0..12).map(|_| idle_connection(d.port)).collect();
    let slow: Vec<TcpStream> = (0..12)
        .map(|_| {
            let mut s = connect(d.port);
            s.write_all(b"GET /leader HTTP/1.1\r\n").unwrap();
            s
        })
        .collect();
    let mut worst = Duration::ZERO;
    for round in 0..20 {
        for path in ["/healthz", "/readyz", "/leader"] {
            let t = Instant::now();
            let (status, _) =
                http_get(d.port, path).unwrap_or_else(|| panic!("{path} got no answer ({round})"));
            let took = t.elapsed();
            assert!(status == 200, "{path}: {status}");
            assert!(
                took < Duration::from_millis(100),
                "{path} took {took:?} ({round})"
            );
            worst = worst.max(took);
        }
    }
    // A stream cannot take a probe's slot.
    assert!(
        Watcher::open(d.port).is_none(),
        "a watcher got a probe slot"
    );
    eprintln!("with 1,000 watchers, 12 idle and 12 slow connections: slowest probe {worst:?}");
    drop((idle, slow));
}

/// One probe as the kubelet sends it (a new connection, `Connection:
/// close`, the chart's 1 s timeout): whether `path` answered 200 in time.
fn probe(port: u16, path: &str, timeout: Duration) -> bool {
    let started = Instant::now();
    let Ok(mut s) = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout) else {
        return false;
    };
    let left = |started: Instant| timeout.saturating_sub(started.elapsed());
    if left(started).is_zero() || s.set_read_timeout(Some(left(started))).is_err() {
        return false;
    }
    let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    if s.write_all(head.as_bytes()).is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
        let left = left(started);
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            break;
        }
    }
    answer.starts_with(b"HTTP/1.1 200") && started.elapsed() < timeout
}

/// Connections that send nothing, each made again as soon as the daemon
/// closes it, until `stop`; counts the connections made.
fn silent_flood(
    port: u16,
    count: usize,
    stop: &std::sync::atomic::AtomicBool,
    made: &std::sync::atomic::AtomicUsize,
) {
    use std::sync::atomic::Ordering;
    let mut conns: Vec<Option<TcpStream>> = (0..count).map(|_| None).collect();
    let addr = ([127, 0, 0, 1], port).into();
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        for slot in &mut conns {
            let open = slot.as_mut().is_some_and(|s| match s.read(&mut buf) {
                Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
                Ok(n) => n > 0,
            });
            if !open {
                *slot = TcpStream::connect_timeout(&addr, Duration::from_millis(100))
                    .ok()
                    .filter(|s| s.set_nonblocking(true).is_ok());
                if slot.is_some() {
                    made.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Anyone who can reach the port floods it: 1,030 idle keep-alive
/// connections (more than the 1,024 served at once) and 700 connections
/// that send nothing, each made again as soon as the daemon closes it.
/// The kubelet's probes, as the chart sets them (a new connection each, a
/// 1 s timeout), still answer: at least 9 of 10.
#[test]
fn probes_answer_under_a_flood_of_idle_and_silent_connections() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let _s = serial();
    let (_db, _dir, d) = lone_leader();
    let idle_rss = rss_kib(d.pid());
    let idle: Vec<TcpStream> = (0..1030).map(|_| idle_connection(d.port)).collect();
    let stop = AtomicBool::new(false);
    let made = AtomicUsize::new(0);
    let (answered, made, rss) = std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| silent_flood(d.port, 350, &stop, &made));
        }
        wait_for(Duration::from_secs(10), "700 silent connections", || {
            (made.load(Ordering::Relaxed) >= 700).then_some(())
        });
        std::thread::sleep(Duration::from_secs(1));
        let answered = (0..10)
            .filter(|_| {
                let ok = probe(d.port, "/healthz", Duration::from_secs(1));
                std::thread::sleep(Duration::from_millis(300));
                ok
            })
            .count();
        let rss = rss_kib(d.pid());
        stop.store(true, Ordering::Relaxed);
        (answered, made.load(Ordering::Relaxed), rss)
    });
    eprintln!("under 1,030 idle and 700 silent connections ({made} made): {answered} of 10 probes answered within 1 s, RSS {rss} KiB (idle {idle_rss} KiB)");
    assert!(
        rss - idle_rss < GROWTH_LIMIT_KIB,
        "RSS {rss} KiB, idle {idle_rss} KiB"
    );
    // The flood was one: the silent connections were closed and made again.
    assert!(made >= 1400, "{made} silent connections made");
    assert!(answered >= 9, "{answered} of 10 probes answered within 1 s");
    drop(idle);
}
