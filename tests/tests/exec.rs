//! `leaderd exec` with real processes: the children of three replicas never
//! run at once, across SIGTERM and SIGKILL of leaderd, a child exiting by
//! itself, a blackholed database and a database restart
//!.
//!
//! Each child (`lease-child`) holds an exclusive `flock` for its whole life,
//! which the kernel drops the instant it dies, however it dies: a child that
//! finds the lock taken records an overlap. That checks the promise itself,
//! not a sample of it.

use std::time::Duration;

use leaderd_tests::pgserver::PgServer;
use leaderd_tests::proxy::Fault;
use leaderd_tests::replicas::Replicas;
use leaderd_tests::{serial, wait_for, Daemon, Scratch};

const CHILD: &str = env!("CARGO_BIN_EXE_lease-child");
const TTL: Duration = Duration::from_millis(1200);
const SLACK: Duration = Duration::from_secs(2);

/// One line of `lives.log`.
#[derive(Debug, Clone)]
struct Life {
    kind: String,
    id: String,
    token: i64,
    pid: i32,
}

fn lives(dir: &Scratch) -> Vec<Life> {
    std::fs::read_to_string(dir.path("lives.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Life {
                kind: f[0].to_owned(),
                id: f[1].to_owned(),
                token: f[2].parse().expect("token"),
                pid: f[3].parse().expect("pid"),
            }
        })
        .collect()
}

fn starts(dir: &Scratch) -> Vec<Life> {
    lives(dir)
        .into_iter()
        .filter(|l| l.kind == "start")
        .collect()
}

/// Waits for the `n`th child (1-based) to start.
fn nth_start(dir: &Scratch, n: usize, within: Duration) -> Life {
    wait_for(within, &format!("child number {n} to start"), || {
        starts(dir).get(n - 1).cloned()
    })
}

fn alive(pid: i32) -> bool {
    // A zombie counts as dead: its status line says so.
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        !s.lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'))
    })
}

/// Replicas `e0`, `e1`, … each running `command` under `leaderd exec`,
/// each behind its own proxy.
fn replicas(url: &str, n: usize, command: Vec<String>) -> Replicas {
    Replicas::proxied(url, n, "e", move |launch| {
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        launch.exec(&command)
    })
}

/// Prints the children's lives when a test fails (beside the replicas'
/// logs, which [`Replicas`] prints).
struct LivesOnFailure<'a>(&'a Scratch);

impl Drop for LivesOnFailure<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- lives -----\n{}",
                std::fs::read_to_string(self.0.path("lives.log")).unwrap_or_default()
            );
        }
    }
}

fn child_command(dir: &Scratch) -> Vec<String> {
    vec![CHILD.to_owned(), dir.0.display().to_string()]
}

fn assert_no_overlap(dir: &Scratch) {
    let all = lives(dir);
    assert!(
        !all.iter().any(|l| l.kind == "overlap"),
        "two children ran at once: {all:?}"
    );
    let tokens: Vec<i64> = starts(dir).iter().map(|l| l.token).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "no child runs under an older token: {tokens:?}"
    );
}

#[test]
fn children_never_overlap_and_carry_the_token() {
    let _s = serial();
    let server = PgServer::start();
    let dir = Scratch::new();
    let _lives = LivesOnFailure(&dir);
    let mut r = replicas(&server.url(), 3, child_command(&dir));

    let first = nth_start(&dir, 1, Duration::from_secs(10));
    let l = r.index(&first.id);
    assert_eq!(
        r.token(l),
        Some(first.token),
        "the child carries /leader's token"
    );
    // Stable leadership: the child runs undisturbed for over 10 s.
    std::thread::sleep(Duration::from_millis(10_500));
    assert_eq!(starts(&dir).len(), 1, "{:?}", lives(&dir));
    assert!(alive(first.pid), "the first child still runs");
    assert_eq!(r.token(l), Some(first.token));

    // SIGTERM: the child gets SIGTERM, leaderd exits with its status.
    r.daemons[l].sigterm();
    let status = r.daemons[l]
        .wait_exit(Duration::from_secs(3))
        .expect("exit");
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "the child's status: killed by SIGTERM"
    );
    let second = nth_start(&dir, 2, SLACK);
    assert_ne!(second.id, first.id);
    r.restart_same(l);

    // SIGKILL of leaderd: the child dies with it (parent-death signal).
    let l = r.index(&second.id);
    r.daemons[l].sigkill();
    r.daemons[l]
        .wait_exit(Duration::from_secs(1))
        .expect("killed");
    wait_for(Duration::from_secs(1), "the orphan to die", || {
        (!alive(second.pid)).then_some(())
    });
    let third = nth_start(&dir, 3, TTL + SLACK);
    assert_ne!(third.id, second.id);
    r.restart_same(l);

    // The child exits by itself: leaderd releases and exits with its status.
    let l = r.index(&third.id);
    std::fs::write(dir.path("exit-now"), b"").unwrap();
    let status = r.daemons[l]
        .wait_exit(Duration::from_secs(3))
        .expect("exit");
    assert_eq!(status.code(), Some(3));
    let fourth = nth_start(&dir, 4, SLACK);
    r.restart_same(l);

    // A blackholed database: the child is told to stop before the lease
    // could pass, and the next starts elsewhere only after.
    let l = r.index(&fourth.id);
    r.proxies[l].set(Fault::Blackhole);
    let fifth = nth_start(&dir, 5, TTL + SLACK);
    assert_ne!(fifth.id, fourth.id);
    let stops = r.daemons[l].logged("stopping the command");
    let term = stops.first().expect("the child was stopped");
    assert_eq!(term["signal"], "SIGTERM", "{term}");
    r.proxies[l].heal();

    // A release on request: the row is freed only once the child is gone.
    let l = r.index(&fifth.id);
    r.daemons[l].release("");
    assert!(
        !alive(fifth.pid),
        "the child is gone when the release answers"
    );
    let sixth = nth_start(&dir, 6, SLACK);
    assert_ne!(sixth.id, fifth.id);

    // A database restart: whoever leads after it runs the one child.
    server.restart();
    wait_for(TTL + SLACK * 2, "one leader running its child", || {
        let leaders: Vec<i64> = (0..3).filter_map(|i| r.token(i)).collect();
        let last = starts(&dir).last().cloned()?;
        (leaders.len() == 1 && leaders[0] == last.token && alive(last.pid)).then_some(())
    });
    assert_no_overlap(&dir);
    eprintln!("{} children, none overlapping", starts(&dir).len());
}

#[test]
fn a_child_that_ignores_sigterm_is_killed_at_the_deadline() {
    let _s = serial();
    let server = PgServer::start();
    let dir = Scratch::new();
    let script = format!("trap '' TERM; exec {CHILD} {}", dir.0.display());
    let command = vec!["/bin/sh".to_owned(), "-c".to_owned(), script];
    let _lives = LivesOnFailure(&dir);
    let r = replicas(&server.url(), 1, command);
    let first = nth_start(&dir, 1, Duration::from_secs(10));
    r.proxies[0].set(Fault::Blackhole);
    wait_for(TTL + SLACK, "the child to be killed", || {
        (!alive(first.pid)).then_some(())
    });
    let stops = r.daemons[0].logged("stopping the command");
    let signals: Vec<&str> = stops.iter().filter_map(|e| e["signal"].as_str()).collect();
    assert_eq!(signals, ["SIGTERM", "SIGKILL"]);
    let lost = wait_for(SLACK, "the loss", || {
        r.daemons[0].logged("lost leadership").into_iter().next()
    });
    // Dead is not yet reaped (and logged).
    let exited = wait_for(SLACK, "the reaping", || {
        r.daemons[0].logged("the command exited").into_iter().next()
    });
    let deadline = lost["deadline_us"].as_u64().unwrap();
    let died = exited["at_us"].as_u64().unwrap();
    eprintln!(
        "killed {} µs after the deadline",
        died.saturating_sub(deadline)
    );
    assert!(
        died <= deadline + 50_000,
        "reaped at {died}, deadline {deadline}"
    );
    // Healed: it leads again and starts a new child under a new token.
    r.proxies[0].heal();
    let second = nth_start(&dir, 2, TTL + SLACK * 2);
    // The row stayed this instance's in the database (it expires there a
    // safety margin after the local deadline), so the token may be the same.
    assert!(second.token >= first.token);
    assert_no_overlap(&dir);
}

#[test]
fn what_the_command_started_is_stopped_before_the_row_is_released() {
    let _s = serial();
    let db = leaderd_tests::TempDb::postgres();
    let dir = Scratch::new();
    // The command is a shell that dies at SIGTERM; the worker it started in
    // the background ignores SIGTERM and lives on in the group.
    let worker = format!("trap '' TERM; exec {CHILD} {}", dir.0.display());
    let script = format!("/bin/sh -c \"{worker}\" & exec sleep 3600");
    let command = vec!["/bin/sh".to_owned(), "-c".to_owned(), script];
    let _lives = LivesOnFailure(&dir);
    let mut r = replicas(&db.url, 2, command);
    let first = nth_start(&dir, 1, Duration::from_secs(10));
    let l = r.index(&first.id);
    r.daemons[l].release("");
    assert!(
        !alive(first.pid),
        "the worker is gone when the release answers"
    );
    let second = nth_start(&dir, 2, SLACK);
    assert_ne!(second.id, first.id);
    // SIGTERM: leaderd exits only once the worker is gone too.
    let l = r.index(&second.id);
    r.daemons[l].sigterm();
    r.daemons[l]
        .wait_exit(Duration::from_secs(3))
        .expect("exit");
    assert!(!alive(second.pid), "the worker outlived its leaderd");
    assert_no_overlap(&dir);
}

/// The command sees none of leaderd's database URL: not
/// `LEADERD_DATABASE_URL`, and not a `DATABASE_URL` that leaderd read; an
/// app's own `DATABASE_URL`, which leaderd did not use, is passed on.
#[test]
fn the_command_never_sees_leaderds_database_url() {
    let dir = Scratch::new();
    let run = |env: &[(&str, &str)], out: &str| {
        let port = leaderd_tests::free_port().to_string();
        let listen = format!("127.0.0.1:{port}");
        let script = format!("env > {}", dir.path(out).display());
        let (code, _, err) = leaderd_tests::run_cli(
            &["exec", "--listen", &listen, "--", "/bin/sh", "-c", &script],
            env,
        );
        assert_eq!(code, 0, "the command's status: {err}");
        std::fs::read_to_string(dir.path(out)).expect("the command ran")
    };
    // Trust authentication takes any password.
    let db = leaderd_tests::TempDb::postgres();
    let secret = db.url.replacen("postgres@", "postgres:Sup3rS3cret@", 1);
    assert!(secret.contains("Sup3rS3cret"), "{secret}");
    let seen = run(&[("DATABASE_URL", &secret)], "a.env");
    assert!(!seen.contains("Sup3rS3cret"), "{seen}");
    assert!(!seen.contains("DATABASE_URL="), "{seen}");
    assert!(seen.contains("LEADERD_TOKEN="), "{seen}");

    let seen = run(
        &[
            ("LEADERD_DATABASE_URL", &secret),
            ("DATABASE_URL", "app-own"),
        ],
        "b.env",
    );
    assert!(!seen.contains("Sup3rS3cret"), "{seen}");
    assert!(seen.lines().any(|l| l == "DATABASE_URL=app-own"), "{seen}");
}

/// A stderr that nobody drains (a stalled log collector; here the command
/// itself fills the pipe they share) delays no safety action:
/// with the row deleted under the leader, its command, which ignores
/// SIGTERM, is killed at the deadline, before the other replica's starts;
/// watchers hear the loss; and SIGTERM still ends leaderd within 2 s.
#[test]
fn a_stalled_stderr_delays_no_safety_action() {
    let _s = serial();
    let db = leaderd_tests::TempDb::postgres();
    let dir = Scratch::new();
    let script = format!(
        "trap '' TERM; head -c 1000000 /dev/zero >&2 & exec {CHILD} {}",
        dir.0.display()
    );
    let mut stalled = Daemon::launch(&db.url, "stalled", &dir, "stalled", &[])
        .env("RUST_LOG", "info")
        .exec(&["/bin/sh", "-c", &script])
        .stderr_undrained()
        .start();
    let first = nth_start(&dir, 1, Duration::from_secs(10));
    assert_eq!(first.id, "stalled");
    // The pipe (64 KiB, counted in pages) is full: from now on every write
    // to it blocks.
    wait_for(Duration::from_secs(5), "stderr to fill", || {
        (stalled.stderr_unread() >= 48 * 1024).then_some(())
    });
    let watcher = leaderd_tests::sse::Watcher::open(stalled.port).expect("watch");
    let other = Daemon::launch(&db.url, "other", &dir, "other", &[])
        .exec(&[CHILD, &dir.0.display().to_string()])
        .start();
    assert!(stalled.is_leader(), "still leads with stderr full");

    db.exec(&["DELETE FROM service_leader_lock"]);
    watcher
        .until(TTL + SLACK, |e| e["is_leader"] == false)
        .expect("the watcher hears the loss");
    wait_for(TTL + SLACK, "the command to be killed", || {
        (!alive(first.pid)).then_some(())
    });
    // Either replica may take the re-created row; the flock proves the
    // first command was gone before the second started.
    let second = nth_start(&dir, 2, TTL + SLACK * 2);
    assert_no_overlap(&dir);
    let leaders = [&stalled, &other].map(|d| d.is_leader());
    assert_eq!(leaders, [second.id == "stalled", second.id == "other"]);

    stalled.sigterm();
    let started = std::time::Instant::now();
    stalled
        .wait_exit(Duration::from_secs(2))
        .expect("SIGTERM ends leaderd within 2 s");
    eprintln!("exited {:?} after SIGTERM", started.elapsed());
}

/// Several elections under one `leaderd exec` (docs/integrating.md: "one command per
/// election"), each command with a lock directory of its own: it runs only
/// while its replica leads its election, under that election's token; when
/// the spread moves an election to a second replica, its command moves
/// with it and the other runs on undisturbed; a command exiting by itself
/// ends its replica's run with its status, the other command stopped first.
#[test]
fn several_elections_each_run_their_own_command() {
    let _s = serial();
    let db = leaderd_tests::TempDb::postgres();
    let dir = Scratch::new();
    let names = ["jobs", "mailer"];
    let dirs = [Scratch::new(), Scratch::new()];
    let commands: Vec<(&str, String)> = names
        .iter()
        .zip(&dirs)
        .map(|(name, d)| (*name, format!("{CHILD} {}", d.0.display())))
        .collect();
    let start = |id: &str| {
        Daemon::launch(&db.url, id, &dir, id, &[])
            .elections(&names)
            .exec_each(&commands)
            .start()
    };
    let mut a = start("a");
    let first: Vec<Life> = dirs
        .iter()
        .map(|d| nth_start(d, 1, Duration::from_secs(10)))
        .collect();
    for (name, life) in names.iter().zip(&first) {
        assert_eq!(life.id, "a", "a leads both and runs both commands");
        assert_eq!(
            a.token_held(&format!("?election={name}")),
            Some(life.token),
            "{name}'s token"
        );
    }

    let mut b = start("b");
    let moved = wait_for(
        Duration::from_secs(15),
        "one election's command to move to b",
        || {
            dirs.iter()
                .position(|d| starts(d).last().is_some_and(|l| l.id == "b"))
        },
    );
    let stayed = 1 - moved;
    assert!(
        !alive(first[moved].pid),
        "a's command of the moved election is gone"
    );
    assert!(alive(first[stayed].pid), "the other runs on undisturbed");
    assert_eq!(starts(&dirs[stayed]).len(), 1, "{:?}", lives(&dirs[stayed]));
    let on_b = starts(&dirs[moved]).last().cloned().expect("b's command");
    assert_eq!(
        b.token_held(&format!("?election={}", names[moved])),
        Some(on_b.token)
    );

    // b's command exits by itself: b exits with its status, and a takes the
    // election (and starts its command) back.
    std::fs::write(dirs[moved].path("exit-now"), b"").unwrap();
    let status = b.wait_exit(Duration::from_secs(3)).expect("b exits");
    assert_eq!(status.code(), Some(3), "the command's own status");
    let back = nth_start(&dirs[moved], 3, TTL + SLACK);
    assert_eq!(back.id, "a");

    // Now one of a's two commands exits by itself: the other is stopped
    // before a exits, with the status of the one that ended the run.
    std::fs::write(dirs[stayed].path("exit-now"), b"").unwrap();
    let status = a.wait_exit(Duration::from_secs(3)).expect("a exits");
    assert_eq!(status.code(), Some(3));
    assert!(!alive(back.pid), "the other command was stopped first");
    for d in &dirs {
        assert_no_overlap(d);
    }
}

/// `leaderd exec` with several elections and a command missing for one:
/// exit 2 naming it, before anything starts.
#[test]
fn exec_names_the_elections_left_without_a_command() {
    let out = std::process::Command::new(leaderd_tests::leaderd_bin())
        .args(["exec", "--database-url", "sqlite:///nonexistent/x.db"])
        .args(["--election", "jobs", "--election", "mailer"])
        .args(["--exec", "mailer=/bin/true"])
        .env_remove("LEADERD_ELECTIONS")
        .output()
        .expect("run leaderd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("none is given for: jobs") && !stderr.contains("mailer,"),
        "{stderr}"
    );
}
