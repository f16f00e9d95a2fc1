//! The README's runnable examples, run as printed: each is read out of the
//! README itself, so an example that changes there is the one tested.

use std::time::Duration;

use leaderd_tests::{serial, wait_for, Daemon, Scratch, TempDb};

const README: &str = include_str!("../../README.md");

/// The fenced block of the README that begins with `first_line`.
fn block(first_line: &str) -> String {
    let start = README
        .find(&format!("```sh\n{first_line}\n"))
        .unwrap_or_else(|| panic!("no README block begins with {first_line}"))
        + "```sh\n".len();
    let len = README[start..].find("```").expect("the block's end");
    README[start..start + len].to_owned()
}

/// The cron-like singleton job under `leaderd exec`: it writes its token
/// with psql while its replica leads, and a SIGTERM to leaderd stops it
/// and leaderd with status 0 (the job's own, as it traps TERM).
#[test]
fn the_report_job_runs_under_leaderd_exec() {
    use std::os::unix::fs::PermissionsExt;
    let _s = serial();
    let db = TempDb::postgres();
    db.exec(&[
        "CREATE TABLE reports (generated_at TIMESTAMPTZ, fence BIGINT NOT NULL)",
        "INSERT INTO reports (fence) VALUES (0)",
    ]);
    let dir = Scratch::new();
    let script = dir.path("report-job.sh");
    std::fs::write(&script, block("#!/bin/sh")).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut daemon = Daemon::launch(&db.url, "a", &dir, "a", &[])
        .env("APP_DATABASE_URL", &db.url)
        .exec(&[script.to_str().unwrap()])
        .start();
    let token = wait_for(Duration::from_secs(15), "a to lead", || {
        daemon.token_held("")
    });
    wait_for(Duration::from_secs(10), "the job's write", || {
        (db.scalar("SELECT fence FROM reports") == token.to_string()).then_some(())
    });
    assert_ne!(
        db.scalar("SELECT generated_at IS NOT NULL FROM reports"),
        "false"
    );
    daemon.sigterm();
    let status = daemon.wait_exit(Duration::from_secs(5));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "{}",
        daemon.log_text()
    );
}
