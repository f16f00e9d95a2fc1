//! The binary's command line: exit codes, messages, and the subcommands
//! against a real PostgreSQL.

use leaderd_tests::{run_cli, TempDb};

#[test]
fn help_and_version_exit_zero() {
    let (code, out, _) = run_cli(&["--help"], &[]);
    assert_eq!(code, 0);
    assert!(out.contains("migrate") && out.contains("status") && out.contains("--database-url"));
    let (code, out, _) = run_cli(&["--version"], &[]);
    assert_eq!(code, 0);
    assert!(out.starts_with("leaderd "), "{out}");
}

#[test]
fn usage_errors_exit_two() {
    assert_eq!(run_cli(&["--no-such-flag"], &[]).0, 2);
    assert_eq!(run_cli(&["frobnicate"], &[]).0, 2);
}

#[test]
fn configuration_errors_exit_two_and_name_the_key() {
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (&["--ttl", "banana"], &[], "`ttl`"),
        (&["--heartbeat", "2s"], &[], "ttl"),
        (
            &[],
            &[("LEADERD_LISTEN", "not-an-address")],
            "LEADERD_LISTEN",
        ),
        (
            &["--database-url", "redis://u:hunter2@h/0"],
            &[],
            "unsupported scheme",
        ),
        (
            &["--database-url-file", "/nonexistent/secret"],
            &[],
            "`database_url_file`",
        ),
        (&["--election", &"e".repeat(101)], &[], "`election`"),
        (&["--id", &"i".repeat(101)], &[], "`id`"),
        (&["--log-format", "xml"], &[], "`log_format`"),
        (
            &["--flag-file", "/nonexistent/dir/leader"],
            &[],
            "`flag_file`",
        ),
        (
            &[],
            &[("KUBERNETES_SERVICE_HOST", "10.0.0.1")],
            "KUBERNETES_SERVICE_HOST",
        ),
        (
            &["--config", "/nonexistent/leaderd.toml"],
            &[],
            "config file",
        ),
    ];
    for (args, env, expect) in cases {
        let (code, out, err) = run_cli(args, env);
        assert_eq!(code, 2, "{args:?} {env:?}: {err}");
        assert!(
            err.contains(expect),
            "{args:?}: expected {expect:?} in {err}"
        );
        assert!(
            !err.contains("hunter2") && !out.contains("hunter2"),
            "password leaked: {err}"
        );
    }
}

#[test]
fn unknown_keys_in_a_config_file_exit_two() {
    let dir = leaderd_tests::Scratch::new();
    let path = dir.path("leaderd.toml");
    std::fs::write(&path, "election = \"x\"\ntttl = \"2s\"\n").unwrap();
    let (code, _, err) = run_cli(&["--config", path.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("tttl"), "{err}");
}

#[test]
fn migrate_then_status_on_postgres() {
    let db = TempDb::postgres();
    let (code, _, err) = run_cli(&["migrate", "--database-url", &db.url], &[]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run_cli(&["status", "--json", "--database-url", &db.url], &[]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v, serde_json::json!([]));
    let (code, out, _) = run_cli(&["status"], &[("DATABASE_URL", &db.url)]);
    assert_eq!(code, 0);
    assert!(out.starts_with("ELECTION"), "{out}");
}

#[test]
fn status_without_a_table_fails_with_one() {
    let db = TempDb::postgres();
    let (code, _, err) = run_cli(&["status", "--database-url", &db.url], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("service_leader_lock"), "{err}");
}

#[test]
fn an_unreachable_database_is_exit_one_without_the_password() {
    let url = format!(
        "postgres://app:hunter2@127.0.0.1:{}/x",
        leaderd_tests::free_port()
    );
    let (code, out, err) = run_cli(&["migrate", "--database-url", &url], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("REDACTED"), "{err}");
    assert!(
        !err.contains("hunter2") && !out.contains("hunter2"),
        "{err}"
    );
}
