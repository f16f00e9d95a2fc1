//! Graceful handover on every backend: SIGTERM and `leaderd release` wake the
//! waiting replicas at once (PostgreSQL `NOTIFY`, MySQL's named lock, SQLite's
//! wake file), the releaser holds off, and the app-health gate steps an
//! unhealthy app's replica down.

use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use leaderd_tests::app::App;
use leaderd_tests::{
    http_raw, http_raw_from, run_cli, serial, wait_for, wait_single_leader, Daemon, Scratch, TempDb,
};

/// What the docs promise for a graceful handover, on every backend.
const HANDOVER: Duration = Duration::from_millis(150);
const ROUNDS: usize = 8;
/// The releaser's hold in the release rounds.
const HOLD: Duration = Duration::from_millis(1000);

fn check_handovers(what: &str, took: &[Duration]) {
    leaderd_tests::check_handovers(what, took, HANDOVER);
}

/// Waits for one of `others` to lead; how long that took since `from`.
fn next_leader(others: &[&Daemon], from: Instant) -> (usize, Duration) {
    let i = wait_for(Duration::from_secs(5), "a new leader", || {
        others.iter().position(|d| d.is_leader())
    });
    (i, from.elapsed())
}

/// After the leader `ds[leader]` was asked to go at `from`: the others,
/// which of them leads next, and how long that took.
fn handed_over(ds: &[Daemon], leader: usize, from: Instant) -> (Vec<&Daemon>, usize, Duration) {
    let others: Vec<&Daemon> = (0..ds.len())
        .filter(|&i| i != leader)
        .map(|i| &ds[i])
        .collect();
    let (new, t) = next_leader(&others, from);
    (others, new, t)
}

/// How long, from now, until every follower but `others[new]` names it as
/// the leader on `/leader`, with the address it advertises (a follower
/// learns of a take by watching the released row, not at its next
/// heartbeat's poll).
fn followers_name(others: &[&Daemon], new: usize) -> Duration {
    let watchers: Vec<&Daemon> = (0..others.len())
        .filter(|&i| i != new)
        .map(|i| others[i])
        .collect();
    named_by(&watchers, others[new], Instant::now())
}

/// How long, from `from`, until each of `watchers` names `leader` on
/// `/leader`, with the address it advertises.
fn named_by(watchers: &[&Daemon], leader: &Daemon, from: Instant) -> Duration {
    let id = leader.id.as_str();
    let address = address_of(id);
    wait_for(
        Duration::from_secs(5),
        "the followers to name the new leader",
        || {
            watchers
                .iter()
                .all(|d| {
                    d.leader().is_some_and(|(_, body)| {
                        body["leader"] == id && body["leader_address"] == address.as_str()
                    })
                })
                .then_some(())
        },
    );
    from.elapsed()
}

/// What replica `id` advertises.
fn address_of(id: &str) -> String {
    format!("http://{id}.test:8080")
}

fn start(db: &TempDb, dir: &Scratch, id: &str) -> Daemon {
    Daemon::start(&db.url, id, dir, &["--advertise", &address_of(id)])
}

/// Eight SIGTERMs of the leader; each time another replica leads within
/// [`HANDOVER`]. The stopped replica is replaced by a new process.
fn sigterm_hands_over_at_once(db: TempDb) {
    let _s = serial();
    let dir = Scratch::new();
    let mut ds: Vec<Daemon> = ["a", "b", "c"]
        .iter()
        .map(|id| start(&db, &dir, id))
        .collect();
    let (mut took, mut named) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let refs: Vec<&Daemon> = ds.iter().collect();
        let leader = wait_single_leader(&refs, Duration::from_secs(10));
        // Let the followers settle into waiting (a fresh one polls first).
        std::thread::sleep(Duration::from_millis(300));
        let sent = Instant::now();
        ds[leader].sigterm();
        let (others, new, t) = handed_over(&ds, leader, sent);
        named.push(followers_name(&others, new));
        let new_log = others[new].log_text();
        took.push(t);
        assert_eq!(
            ds[leader]
                .wait_exit(Duration::from_secs(3))
                .and_then(|s| s.code()),
            Some(0)
        );
        if t > HANDOVER {
            eprintln!(
                "round {round} took {t:?}\n--- stopped leader:\n{}\n--- new leader:\n{new_log}",
                ds[leader].log_text(),
            );
        }
        let id = format!("r{round}");
        ds[leader] = start(&db, &dir, &id);
    }
    check_handovers("SIGTERM", &took);
    check_handovers("SIGTERM: the other follower naming the new leader", &named);
}

/// Eight releases through `leaderd release`; each time another replica
/// leads within [`HANDOVER`], and the releaser does not take it back.
fn release_hands_over_at_once(db: TempDb) {
    let _s = serial();
    let dir = Scratch::new();
    let ds: Vec<Daemon> = ["a", "b", "c"]
        .iter()
        .map(|id| start(&db, &dir, id))
        .collect();
    let refs: Vec<&Daemon> = ds.iter().collect();
    let (mut took, mut named, mut releaser_named) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let leader = wait_single_leader(&refs, Duration::from_secs(10));
        // Past the last releaser's hold, and the followers settled.
        std::thread::sleep(HOLD + Duration::from_millis(300));
        let listen = format!("127.0.0.1:{}", ds[leader].port);
        let sent = Instant::now();
        let hold = format!("{}ms", HOLD.as_millis());
        let (code, out, err) = run_cli(&["release", "--listen", &listen, "--hold", &hold], &[]);
        assert_eq!(code, 0, "{out}{err}");
        let body: leaderd_tests::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(body["is_leader"], false, "{out}");
        let (others, new, t) = handed_over(&ds, leader, sent);
        named.push(followers_name(&others, new));
        // The releaser too, though its hold keeps it from asking: it looks
        // (timed from the release asked for).
        releaser_named.push(named_by(&[&ds[leader]], others[new], sent));
        took.push(t);
        if t > HANDOVER {
            eprintln!(
                "release took {t:?}\n--- releaser:\n{}\n--- new leader:\n{}",
                ds[leader].log_text(),
                others[new].log_text(),
            );
        }
        assert!(!ds[leader].is_leader(), "the releaser took it back");
        // A follower has nothing to release: exit 3. (With a hold as
        // short as it gets: a release drains the replica for its hold, and
        // a draining replica learns of the next take only at its next poll.)
        let follower = format!("127.0.0.1:{}", ds[leader].port);
        assert_eq!(
            run_cli(&["release", "--listen", &follower, "--hold", "1ms"], &[]).0,
            3
        );
    }
    check_handovers("release", &took);
    check_handovers("release: the other follower naming the new leader", &named);
    check_handovers(
        "release: the releaser naming the new leader",
        &releaser_named,
    );
}

/// Releases `d` once it leads, with `hold`, and checks through the hold
/// (but its last 100 ms) that it does not lead again, and `also`.
fn hold_off(d: &Daemon, hold: Duration, also: impl Fn(Duration)) {
    wait_for(Duration::from_secs(10), "leadership", || {
        d.is_leader().then_some(())
    });
    let listen = format!("127.0.0.1:{}", d.port);
    let hold_arg = format!("{}ms", hold.as_millis());
    let released = Instant::now();
    assert_eq!(
        run_cli(&["release", "--listen", &listen, "--hold", &hold_arg], &[]).0,
        0
    );
    while released.elapsed() < hold - Duration::from_millis(100) {
        let into = released.elapsed();
        assert!(!d.is_leader(), "led again {into:?} into a {hold:?} hold");
        also(into);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Alone in its election, a releaser stays out for its hold, then leads
/// again.
fn the_releaser_holds_off(db: TempDb) {
    let _s = serial();
    let dir = Scratch::new();
    let d = start(&db, &dir, "a");
    hold_off(&d, Duration::from_millis(1500), |_| {});
    wait_for(Duration::from_secs(3), "leadership after the hold", || {
        d.is_leader().then_some(())
    });
}

/// A replica holding off after a release still goes round its loop: a hold
/// longer than the `/healthz` watchdog's limit (here 2.5 s against 2 s)
/// never reads as a stuck daemon (its liveness probe would restart the pod).
#[test]
fn a_replica_holding_off_stays_healthy() {
    let db = TempDb::sqlite();
    let dir = Scratch::new();
    let timing = ["--heartbeat", "200ms", "--ttl", "600ms"];
    let d = Daemon::start(&db.url, "a", &dir, &timing);
    hold_off(&d, Duration::from_millis(2500), |into| {
        let health = leaderd_tests::http_get(d.port, "/healthz").map(|r| r.0);
        assert_eq!(health, Some(200), "{into:?} into the hold");
    });
}

macro_rules! per_backend {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn sigterm_hands_over_at_once() {
                super::sigterm_hands_over_at_once($make);
            }

            #[test]
            fn release_hands_over_at_once() {
                super::release_hands_over_at_once($make);
            }

            #[test]
            fn the_releaser_holds_off() {
                super::the_releaser_holds_off($make);
            }
        }
    };
}

per_backend!(postgres, TempDb::postgres());
per_backend!(mysql, TempDb::mysql());
per_backend!(sqlite, TempDb::sqlite());

#[test]
fn release_without_a_daemon_exits_one() {
    let listen = format!("127.0.0.1:{}", leaderd_tests::free_port());
    let (code, _, err) = run_cli(&["release", "--listen", &listen], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no daemon"), "{err}");
    assert_eq!(run_cli(&["release", "--hold", "2h"], &[]).0, 2);
}

/// `POST /release` steps a leader down, so only this pod may send it: with
/// `listen` on every address (as in Kubernetes) it is served on a loopback
/// listener of its own (the next port), and there only with leaderd's
/// request header and without an `Origin` (a mesh forwards outside traffic
/// from loopback; a browser page can POST to localhost). `leaderd release`,
/// given the daemon's own `listen`, finds it.
#[test]
fn release_is_served_on_loopback_only_and_needs_its_header() {
    let _s = serial();
    let db = TempDb::sqlite();
    let dir = Scratch::new();
    let d = Daemon::launch(&db.url, "a", &dir, "a", &[])
        .listen_everywhere()
        .start();
    wait_for(Duration::from_secs(10), "a to lead", || {
        d.is_leader().then_some(())
    });
    let post = |port: u16, headers: &str| {
        let request = format!(
            "POST /release?hold=1s HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n"
        );
        http_raw(port, request.as_bytes())
    };
    let refused = [
        (d.port, "Leaderd-Release: 1\r\n", "the public listener"),
        (d.port + 1, "", "no header"),
        (
            d.port + 1,
            "Leaderd-Release: 1\r\nOrigin: http://localhost:3000\r\n",
            "a web page",
        ),
    ];
    for (port, headers, what) in refused {
        let reply = post(port, headers);
        assert!(reply.starts_with("HTTP/1.1 403"), "{what}: {reply}");
        assert!(d.is_leader(), "{what} stepped the leader down");
    }
    // A mesh forwards outside traffic to loopback from 127.0.0.6: with the
    // header, on the loopback listener, it is still not this pod.
    let request = "POST /release?hold=1s HTTP/1.1\r\nHost: x\r\nLeaderd-Release: 1\r\n\
                   Connection: close\r\n\r\n";
    let reply = http_raw_from(Ipv4Addr::new(127, 0, 0, 6), d.port + 1, request.as_bytes());
    assert!(reply.starts_with("HTTP/1.1 403"), "from 127.0.0.6: {reply}");
    assert!(
        d.is_leader(),
        "a release from 127.0.0.6 stepped the leader down"
    );
    let listen = format!("0.0.0.0:{}", d.port);
    // An election the daemon does not run is bad input (exit 2), named.
    for cmd in ["release", "resume"] {
        let (code, _, err) = run_cli(&[cmd, "--listen", &listen, "--election", "nope"], &[]);
        assert_eq!(code, 2, "{cmd}: {err}");
        assert!(err.contains("nope"), "{cmd}: {err}");
    }
    assert!(
        d.is_leader(),
        "a release of another election stepped it down"
    );
    let (code, out, err) = run_cli(&["release", "--listen", &listen, "--hold", "1s"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!d.is_leader(), "released");
}

#[test]
fn an_unhealthy_app_makes_its_replica_step_down() {
    let _s = serial();
    let db = TempDb::postgres();
    let dir = Scratch::new();
    let apps = [App::start(true), App::start(true)];
    let ds: Vec<Daemon> = ["a", "b"]
        .iter()
        .zip(&apps)
        .map(|(id, app)| Daemon::start(&db.url, id, &dir, &["--app-health", &app.url()]))
        .collect();
    let refs: Vec<&Daemon> = ds.iter().collect();
    let leader = wait_single_leader(&refs, Duration::from_secs(10));
    let body = ds[leader].leader().unwrap().1;
    assert_eq!(body["app_healthy"], true, "{body}");
    let failing = Instant::now();
    apps[leader].healthy.store(false, Ordering::SeqCst);
    // Three failed checks a heartbeat apart, then a release.
    let other = &ds[1 - leader];
    wait_for(Duration::from_secs(5), "the other replica to lead", || {
        other.is_leader().then_some(())
    });
    let took = failing.elapsed();
    assert!(
        took <= Duration::from_millis(3150),
        "stepped down after {took:?}"
    );
    let body = ds[leader].leader().unwrap().1;
    assert_eq!(body["app_healthy"], false, "{body}");
    assert!(ds[leader].log_text().contains("fails its health check"));
}

#[test]
fn a_replica_whose_app_never_became_healthy_never_leads() {
    let _s = serial();
    let db = TempDb::postgres();
    let dir = Scratch::new();
    let app = App::start(false);
    let d = Daemon::start(&db.url, "a", &dir, &["--app-health", &app.url()]);
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        assert!(!d.is_leader(), "led with an unhealthy app");
        std::thread::sleep(Duration::from_millis(50));
    }
    app.healthy.store(true, Ordering::SeqCst);
    wait_for(Duration::from_secs(5), "leadership once healthy", || {
        d.is_leader().then_some(())
    });
}

/// A replica whose app starts failing lets its presence row go at once, as
/// a drain does, so that no release names it successor meanwhile (it would
/// not take the row). Three times; the presence round is 1.2 s apart here,
/// so a row left to the next round would outlive the bound most times.
#[test]
fn a_failing_app_stops_its_replica_being_named_at_once() {
    let _s = serial();
    let db = TempDb::postgres();
    let dir = Scratch::new();
    let app = App::start(true);
    let url = app.url();
    let b = Daemon::start(
        &db.url,
        "b",
        &dir,
        &[
            "--app-health",
            &url,
            "--app-health-failures",
            "1",
            "--heartbeat",
            "3s",
            "--ttl",
            "3.6s",
        ],
    );
    wait_for(Duration::from_secs(10), "the table", || {
        db.has_table("service_leader_lock").then_some(())
    });
    let present = || {
        db.scalar(
            "SELECT count(*) FROM service_leader_lock WHERE name LIKE 'leaderd-presence/%' \
             AND name NOT LIKE 'leaderd-presence/away/%' AND holder = 'b' AND expires_at > now()",
        ) == "1"
    };
    for round in 0..3 {
        app.healthy.store(true, Ordering::SeqCst);
        wait_for(Duration::from_secs(10), "b's presence row", || {
            present().then_some(())
        });
        app.healthy.store(false, Ordering::SeqCst);
        wait_for(Duration::from_secs(10), "b to see its app fail", || {
            let body = b.leader()?.1;
            (body["app_healthy"] == false).then_some(())
        });
        let seen = Instant::now();
        wait_for(Duration::from_secs(5), "b's presence row to go", || {
            (!present()).then_some(())
        });
        let took = seen.elapsed();
        eprintln!("round {round}: presence row gone {took:?} after the app failed");
        assert!(
            took <= Duration::from_millis(300),
            "round {round}: b's presence row stayed {took:?} after its app failed"
        );
    }
}
