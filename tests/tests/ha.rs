//! HA PostgreSQL through libpq's multi-host URLs: hosts are tried in order, a host that is
//! down is skipped, `target_session_attrs=read-write` skips a read-only
//! standby, and when the primary fails and its standby is promoted the
//! replicas elect a leader there, never two at once and with tokens that
//! never go back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leaderd_tests::pgserver::PgServer;
use leaderd_tests::{free_port, serial, wait_single_leader, Daemon, Scratch, TempDb};

const TTL: Duration = Duration::from_millis(1200);

#[test]
fn a_host_that_is_down_is_skipped() {
    let _s = serial();
    let db = TempDb::postgres();
    let dir = Scratch::new();
    let down = free_port();
    let url = db.url.replacen(
        "@127.0.0.1:5432/",
        &format!("@127.0.0.1:{down},127.0.0.1:5432/"),
        1,
    );
    assert!(url.contains(','), "{url}");
    let d = Daemon::start(&url, "a", &dir, &[]);
    wait_single_leader(&[&d], Duration::from_secs(10));
}

/// A host that accepts TCP and never answers (a hung server, a half-open
/// load balancer) costs a connect its per-host bound, then the next host is
/// tried: `connect_timeout` when the URL sets it, as libpq reads it (the
/// whole start-up of one host, not its TCP connect only), else 4 s. Before,
/// the bound was the whole list's 10 s, and every connect began at the hung
/// host again: no leader, ever.
fn hung_first_host(params: &str, bound: Duration) {
    let _s = serial();
    let db = TempDb::postgres();
    let dir = Scratch::new();
    // The kernel completes the handshake; nobody ever reads or answers.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hung.local_addr().unwrap().port();
    let url = db.url.replacen(
        "@127.0.0.1:5432/",
        &format!("@127.0.0.1:{port},127.0.0.1:5432/"),
        1,
    );
    let url = format!("{url}{}{params}", if url.contains('?') { '&' } else { '?' });
    let started = Instant::now();
    let d = Daemon::start(&url, "a", &dir, &[]);
    wait_single_leader(&[&d], bound + 2 * TTL);
    eprintln!("led after {:?}", started.elapsed());
    drop(hung);
}

#[test]
fn a_hung_first_host_costs_connect_timeout_only() {
    hung_first_host(
        "connect_timeout=1&target_session_attrs=any",
        Duration::from_secs(1),
    );
}

#[test]
fn a_hung_first_host_costs_four_seconds_by_default() {
    hung_first_host("target_session_attrs=any", Duration::from_secs(4));
}

/// A `connect_timeout` longer than a connect's whole budget (10 s): the
/// hung host is marked when a connect reaches it, so the next connect, which
/// starts beside it after a heartbeat, tries the other host first (before:
/// every connect spent its budget on the hung host, for ever).
#[test]
fn a_hung_first_host_with_a_long_connect_timeout_is_tried_last() {
    hung_first_host(
        "connect_timeout=30&target_session_attrs=any",
        Duration::from_secs(1),
    );
}

/// When, and the leader's index and token, if any.
type Sample = (Instant, Option<(usize, i64)>);

/// Samples every daemon's `/leader` until stopped: at no sample do two
/// answer 200, and the tokens of 200s never go back.
struct Sampler {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Sample>>>,
    thread: Option<std::thread::JoinHandle<Result<usize, String>>>,
}

impl Sampler {
    fn start(ports: Vec<u16>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop2, seen2) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            let mut samples = 0;
            let mut highest = i64::MIN;
            while !stop2.load(Ordering::Relaxed) {
                let leaders: Vec<(usize, i64)> = ports
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &p)| {
                        let (status, body) = leaderd_tests::http_get(p, "/leader")?;
                        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
                        (status == 200).then(|| (i, v["token"].as_i64().unwrap_or(0)))
                    })
                    .collect();
                samples += 1;
                if leaders.len() > 1 {
                    return Err(format!("two leaders at once: {leaders:?}"));
                }
                if let Some(&(_, token)) = leaders.first() {
                    if token < highest {
                        return Err(format!("token went back: {token} after {highest}"));
                    }
                    highest = token;
                }
                seen2
                    .lock()
                    .unwrap()
                    .push((Instant::now(), leaders.first().copied()));
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(samples)
        });
        Sampler {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// Since when every sample has had a leader (`None`: the last had none).
    fn led_since(&self) -> Option<Instant> {
        let seen = self.seen.lock().unwrap();
        let mut since = None;
        for (at, leader) in seen.iter() {
            match leader {
                Some(_) => since = since.or(Some(*at)),
                None => since = None,
            }
        }
        since
    }

    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let result = self.thread.take().unwrap().join().unwrap();
        result.unwrap_or_else(|e| panic!("{e}"))
    }
}

#[test]
fn a_standby_is_skipped_and_a_promoted_one_takes_over() {
    let _s = serial();
    let primary = PgServer::start();
    let standby = PgServer::standby_of(&primary);
    // The standby first: read-write skips it while it is one.
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        standby.port, primary.port
    );
    let dir = Scratch::new();
    let daemons: Vec<Daemon> = (0..3)
        .map(|i| Daemon::start(&url, &format!("ha{i}"), &dir, &[]))
        .collect();
    let refs: Vec<&Daemon> = daemons.iter().collect();
    wait_single_leader(&refs, Duration::from_secs(15));
    let sampler = Sampler::start(daemons.iter().map(|d| d.port).collect());
    std::thread::sleep(Duration::from_secs(1));

    // The primary fails; with no writable host the leader steps down at
    // its deadline and every replica keeps reconnecting, backing off.
    primary.stop();
    leaderd_tests::wait_for(TTL * 3, "no leader without a primary", || {
        sampler.led_since().is_none().then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
    standby.promote();
    let promoted = Instant::now();
    // A leader that keeps leading for 2 s: it renews on the promoted one.
    let since = leaderd_tests::wait_for(Duration::from_secs(15), "a leader held for 2 s", || {
        sampler
            .led_since()
            .filter(|s| s.elapsed() >= Duration::from_secs(2))
    });
    let samples = sampler.finish();
    let took = since.saturating_duration_since(promoted);
    eprintln!("a leader {took:?} after the promotion; {samples} samples, never two leaders");
    assert!(
        took <= TTL + Duration::from_millis(300),
        "a leader only {took:?} after the promotion"
    );
    let now_leading = daemons.iter().filter(|d| d.is_leader()).count();
    assert_eq!(now_leading, 1);
}
