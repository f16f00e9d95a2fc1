//! A real Prometheus (Debian's `prometheus` binary) scraping three real
//! daemons every second, with the shipped alert rules (holds scaled down) and
//! the shipped Grafana dashboard's queries:
//! - every metric the rules and the dashboard use exists, labelled
//!   `instance`, `job` (and `namespace`, added by the scrape config as the
//!   Prometheus Operator does), and `election` unless it is one of the
//!   daemon's own;
//! - every dashboard query (template variables substituted) and variable
//!   query answers without error and with data;
//! - after a SIGKILL of the leader `sum(leaderd_is_leader)` is 1 again and no
//!   alert fires;
//! - with both left held (`/release?hold=`) `LeaderdNoLeader` fires, and
//!   `LeaderdDatabaseDown` stays quiet past its hold (`leaderd_db_up` 1,
//!   `/readyz` 200, `leaderd_competing` 0);
//! - with every daemon stopped (no series at all) `LeaderdNoLeader` fires.
//!
//! Skipped, saying why, only when no `prometheus` binary can be found
//! (`$PROMETHEUS_BIN`, `PATH`, `/usr/bin`); `scripts/test` installs it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leaderd_tests::{
    free_port, run_cli, serial, wait_for, wait_single_leader, Daemon, Scratch, TempDb, Value,
};

const ELECTION: &str = "prom-test";
const NAMESPACE: &str = "leaderd-test";
/// The shipped holds assume a 15 s scrape; this Prometheus scrapes every 1 s.
/// Holds are divided by this (at least 2 s), in this test's copy only.
const HOLD_DIVISOR: u64 = 10;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository root")
        .to_path_buf()
}

fn rules_file() -> PathBuf {
    repo_root().join("helm/leaderd/files/prometheus-rules.yaml")
}

fn dashboard_file() -> PathBuf {
    repo_root().join("helm/leaderd/files/leaderd-dashboard.json")
}

/// `$PROMETHEUS_BIN`, else `prometheus` on the `PATH`, else Debian's.
fn prometheus_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PROMETHEUS_BIN") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("prometheus"))
        .chain([PathBuf::from("/usr/bin/prometheus")])
        .find(|p| p.is_file())
}

/// A Prometheus duration (`30s`, `1m`, `1m30s`) in seconds.
fn duration_secs(d: &str) -> u64 {
    let (mut total, mut n) = (0, 0);
    for c in d.chars() {
        match c {
            '0'..='9' => n = n * 10 + u64::from(c.to_digit(10).expect("digit")),
            's' => (total, n) = (total + n, 0),
            'm' => (total, n) = (total + 60 * n, 0),
            'h' => (total, n) = (total + 3600 * n, 0),
            _ => panic!("unexpected duration {d:?}"),
        }
    }
    total
}

/// The shipped rules with every `for:` divided by [`HOLD_DIVISOR`].
fn scaled_rules() -> String {
    let text = std::fs::read_to_string(rules_file()).expect("read the rules");
    let mut scaled = 0;
    let out: Vec<String> = text
        .lines()
        .map(|line| match line.trim_start().strip_prefix("for: ") {
            Some(hold) => {
                scaled += 1;
                let indent = &line[..line.len() - line.trim_start().len()];
                let secs = (duration_secs(hold.trim()) / HOLD_DIVISOR).max(2);
                format!("{indent}for: {secs}s")
            }
            None => line.to_owned(),
        })
        .collect();
    assert!(scaled >= 5, "expected a `for:` per alert, scaled {scaled}");
    out.join("\n") + "\n"
}

/// Metric names (`leaderd_…`) in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("leaderd_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// The families a daemon serves once, with no `election` label: those
/// `per_daemon` builds in the binary's metrics (their histograms' series
/// included).
fn daemon_metrics() -> Vec<String> {
    let src = std::fs::read_to_string(repo_root().join("crates/leaderd/src/outputs/metrics.rs"))
        .expect("read metrics.rs");
    let body = src
        .split_once("fn per_daemon(")
        .and_then(|(_, rest)| rest.split_once("\n}\n"))
        .expect("per_daemon in metrics.rs")
        .0;
    let names: Vec<String> = body
        .split('"')
        .filter(|w| w.starts_with("leaderd_"))
        .map(str::to_owned)
        .collect();
    assert!(names.len() > 3, "{names:?}");
    names
}

/// The metric names the rules' expressions use (not their annotations).
fn rule_metrics() -> Vec<String> {
    let text = std::fs::read_to_string(rules_file()).expect("read the rules");
    text.lines()
        .map(str::trim_start)
        .filter(|l| {
            !(l.starts_with('#') || l.starts_with("summary:") || l.starts_with("description:"))
        })
        .flat_map(metric_names)
        .collect()
}

/// Every panel's (title, expr) of the dashboard, rows included.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(dashboard_file()).expect("read the dashboard");
    let dash: Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut out = Vec::new();
    let mut queue: std::collections::VecDeque<Value> = dash["panels"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into();
    while let Some(panel) = queue.pop_front() {
        queue.extend(panel["panels"].as_array().cloned().unwrap_or_default());
        for t in panel["targets"].as_array().cloned().unwrap_or_default() {
            let title = panel["title"].as_str().unwrap_or("?").to_owned();
            out.push((title, t["expr"].as_str().unwrap_or_default().to_owned()));
        }
    }
    assert!(!out.is_empty(), "the dashboard has no queries");
    out
}

/// The dashboard's `label_values(SELECTOR, LABEL)` variable queries.
fn dashboard_variables() -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(dashboard_file()).expect("read the dashboard");
    let dash: Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut out = Vec::new();
    for var in dash["templating"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let Some(q) = var["query"]["query"].as_str() else {
            continue;
        };
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .unwrap_or_else(|| panic!("unexpected variable query {q}"));
        let (selector, label) = inner
            .rsplit_once(',')
            .expect("label_values(selector, label)");
        let name = var["name"].as_str().expect("variable name").to_owned();
        out.push((name, selector.trim().to_owned(), label.trim().to_owned()));
    }
    out
}

/// Grafana's variables as this test's Prometheus (1 s scrape) sees them.
fn substitute(expr: &str) -> String {
    [
        ("$__rate_interval", "5s"),
        ("$__interval", "1s"),
        ("$__range", "1m"),
        ("$namespace", NAMESPACE),
        ("$election", ELECTION),
    ]
    .iter()
    .fold(expr.to_owned(), |e, (var, value)| {
        e.replace(&format!("${{{}}}", &var[1..]), value)
            .replace(var, value)
    })
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One real Prometheus, killed when dropped.
struct Prometheus {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl std::fmt::Debug for Prometheus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Prometheus(:{})", self.port)
    }
}

impl Prometheus {
    fn start(bin: &Path, dir: &Scratch, targets: &[u16]) -> Prometheus {
        let rules = dir.path("rules.yaml");
        std::fs::write(&rules, scaled_rules()).expect("write rules");
        let targets: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
             rule_files: ['{rules}']\n\
             scrape_configs:\n  - job_name: leaderd\n    static_configs:\n      - targets: [{targets}]\n        labels:\n          namespace: {NAMESPACE}\n",
            rules = rules.display(),
            targets = targets.join(", "),
        );
        let config_path = dir.path("prometheus.yml");
        std::fs::write(&config_path, config).expect("write config");
        let port = free_port();
        let log = dir.path("prometheus.log");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path("prometheus-data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn prometheus");
        let mut p = Prometheus { child, port, log };
        let ready = Instant::now() + Duration::from_secs(30);
        while !matches!(get(port, "/-/ready"), Some((200, _))) {
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!("prometheus exited with {status}:\n{}", p.log_text());
            }
            assert!(
                Instant::now() < ready,
                "prometheus not ready within 30 s:\n{}",
                p.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        p
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// An instant query: the result vector, or Prometheus's error.
    fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let path = format!("/api/v1/query?query={}", url_encode(expr));
        let (_, body) = get(self.port, &path).ok_or("no answer")?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if v["status"] != "success" {
            return Err(format!("{expr}: {}", v["error"]));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// The value of a query that yields one sample, if it yields one.
    fn value(&self, expr: &str) -> Option<f64> {
        let result = self.query(expr).ok()?;
        result.first()?["value"][1].as_str()?.parse().ok()
    }

    /// The alerts as `/api/v1/alerts` lists them.
    fn alerts(&self) -> Vec<Value> {
        get(self.port, "/api/v1/alerts")
            .and_then(|(_, b)| serde_json::from_str::<Value>(&b).ok())
            .and_then(|v| v["data"]["alerts"].as_array().cloned())
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP/1.0 GET (so the answer is never chunked): status and body.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500))
            .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split(' ').nth(1)?.parse().ok()?;
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

#[test]
fn real_prometheus_scrapes_daemons_and_the_rules_and_dashboard_work() {
    let Some(bin) = prometheus_bin() else {
        eprintln!(
            "SKIP: no prometheus binary ($PROMETHEUS_BIN, PATH, /usr/bin/prometheus); \
             `apt-get install prometheus` (scripts/test installs it)"
        );
        return;
    };
    let _serial = serial();
    let db = TempDb::sqlite();
    let dir = Scratch::new();
    let mut ds: Vec<Daemon> = ["a", "b", "c"]
        .iter()
        .map(|id| Daemon::start(&db.url, id, &dir, &["--election", ELECTION]))
        .collect();
    let refs: Vec<&Daemon> = ds.iter().collect();
    let leader = wait_single_leader(&refs, Duration::from_secs(10));
    let ports: Vec<u16> = ds.iter().map(|d| d.port).collect();
    let prom = Prometheus::start(&bin, &dir, &ports);
    eprintln!("prometheus on :{} scraping {ports:?}", prom.port);

    wait_for(
        Duration::from_secs(30),
        "three targets up and one leader in Prometheus",
        || {
            (prom.value(r#"sum(up{job="leaderd"})"#) == Some(3.0)
                && prom.value("sum(leaderd_is_leader)") == Some(1.0))
            .then_some(())
        },
    );

    // Every metric the rules and the dashboard use, with the labels they
    // group and filter by.
    let mut metrics = rule_metrics();
    metrics.extend(
        dashboard_queries()
            .iter()
            .flat_map(|(_, e)| metric_names(e)),
    );
    metrics.sort();
    metrics.dedup();
    let daemons = daemon_metrics();
    for metric in &metrics {
        let series = wait_for(Duration::from_secs(20), metric, || {
            let r = prom.query(metric).unwrap_or_else(|e| panic!("{e}"));
            (!r.is_empty()).then_some(r)
        });
        // A daemon's own series carry no election; an election's carry it.
        let daemons_own = daemons.iter().any(|d| metric.starts_with(d.as_str()));
        for s in &series {
            let labels = &s["metric"];
            if daemons_own {
                assert!(labels.get("election").is_none(), "{metric}: {labels}");
            } else {
                assert_eq!(labels["election"], ELECTION, "{metric}: {labels}");
            }
            assert_eq!(labels["job"], "leaderd", "{metric}: {labels}");
            assert_eq!(labels["namespace"], NAMESPACE, "{metric}: {labels}");
            assert!(
                labels["instance"].as_str().is_some_and(|i| !i.is_empty()),
                "{metric}: {labels}"
            );
        }
        eprintln!("{metric}: {} series", series.len());
    }

    // Every dashboard query answers, with data.
    for (title, expr) in dashboard_queries() {
        let expr = substitute(&expr);
        let result = wait_for(
            Duration::from_secs(20),
            &format!("data for panel {title:?}: {expr}"),
            || {
                let r = prom
                    .query(&expr)
                    .unwrap_or_else(|e| panic!("panel {title:?}: {e}"));
                (!r.is_empty()).then_some(r)
            },
        );
        eprintln!("panel {title:?}: {} series", result.len());
    }
    for (name, selector, label) in dashboard_variables() {
        let path = format!(
            "/api/v1/label/{label}/values?match[]={}",
            url_encode(&substitute(&selector))
        );
        let (status, body) = get(prom.port, &path).expect("prometheus answers");
        assert_eq!(status, 200, "variable {name}: {body}");
        let values: Value = serde_json::from_str(&body).expect("JSON");
        let want = if label == "namespace" {
            NAMESPACE
        } else {
            ELECTION
        };
        assert!(
            values["data"]
                .as_array()
                .is_some_and(|v| v.iter().any(|x| x == want)),
            "variable {name} ({selector}, {label}) misses {want}: {body}"
        );
    }

    // SIGKILL the leader: another takes over, Prometheus sees one leader
    // again (the dead target's series go stale), and no alert fires.
    let killed = ds[leader].port;
    ds[leader].sigkill();
    ds[leader].wait_exit(Duration::from_secs(5));
    let killed_at = Instant::now();
    let rest: Vec<&Daemon> = ds.iter().filter(|d| d.port != killed).collect();
    wait_single_leader(&rest, Duration::from_secs(10));
    let instance = format!("127.0.0.1:{killed}");
    wait_for(
        Duration::from_secs(30),
        "Prometheus to see the killed target down and one leader",
        || {
            let down = prom.value(&format!(r#"up{{instance="{instance}"}}"#)) == Some(0.0);
            let leaders = prom.query("leaderd_is_leader == 1").ok()?;
            (down
                && leaders.len() == 1
                && leaders[0]["metric"]["instance"] != instance.as_str()
                && prom.value("sum(leaderd_is_leader)") == Some(1.0))
            .then_some(())
        },
    );
    eprintln!(
        "one leader again in Prometheus {:?} after the SIGKILL",
        killed_at.elapsed()
    );
    // Longer than any scaled hold: nothing may fire through the failover.
    let quiet_until = killed_at + Duration::from_secs(10);
    while Instant::now() < quiet_until {
        let firing: Vec<Value> = prom
            .alerts()
            .into_iter()
            .filter(|a| a["state"] == "firing")
            .collect();
        assert!(
            firing.is_empty(),
            "alerts fired through a failover: {firing:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Both left held (a release with a hold, one after the other): nobody
    // leads, and the database is fine. LeaderdNoLeader fires; the
    // replicas' readiness and leaderd_db_up stay up, and
    // LeaderdDatabaseDown stays quiet past its hold.
    for _ in 0..2 {
        let rest: Vec<&Daemon> = ds.iter().filter(|d| d.port != killed).collect();
        let i = wait_single_leader(&rest, Duration::from_secs(10));
        rest[i].release("?hold=10m");
    }
    let alert = wait_for(
        Duration::from_secs(60),
        "LeaderdNoLeader to fire with every replica held",
        || {
            prom.alerts()
                .into_iter()
                .find(|a| a["labels"]["alertname"] == "LeaderdNoLeader" && a["state"] == "firing")
        },
    );
    eprintln!("LeaderdNoLeader firing with every replica held: {alert}");
    let held_at = Instant::now();
    let quiet_for = Duration::from_secs(duration_secs("1m") / HOLD_DIVISOR + 4);
    while held_at.elapsed() < quiet_for {
        let db_down: Vec<Value> = prom
            .alerts()
            .into_iter()
            .filter(|a| a["labels"]["alertname"] == "LeaderdDatabaseDown")
            .collect();
        assert!(
            db_down.is_empty(),
            "held replicas read as a database down: {db_down:?}"
        );
        assert_eq!(prom.value("min(leaderd_db_up)"), Some(1.0));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(prom.value("max(leaderd_competing)"), Some(0.0));
    for d in ds.iter().filter(|d| d.port != killed) {
        assert_eq!(
            get(d.port, "/readyz").map(|(status, _)| status),
            Some(200),
            "a held replica is ready"
        );
    }

    // `leaderd resume` on both: one leads again, and the alert resolves.
    for d in ds.iter().filter(|d| d.port != killed) {
        let listen = format!("127.0.0.1:{}", d.port);
        let (code, _, err) = run_cli(&["resume", "--listen", &listen], &[]);
        assert_eq!(code, 0, "{err}");
    }
    wait_for(
        Duration::from_secs(30),
        "one leader again and LeaderdNoLeader resolved",
        || {
            (prom.value("sum(leaderd_is_leader)") == Some(1.0)
                && !prom
                    .alerts()
                    .iter()
                    .any(|a| a["labels"]["alertname"] == "LeaderdNoLeader"))
            .then_some(())
        },
    );

    // Every replica gone: no series at all, and still a no-leader alert.
    for d in &mut ds {
        d.sigterm();
        d.wait_exit(Duration::from_secs(5));
    }
    let stopped_at = Instant::now();
    let alert = wait_for(
        Duration::from_secs(60),
        "LeaderdNoLeader to fire with every daemon stopped",
        || {
            prom.alerts()
                .into_iter()
                .find(|a| a["labels"]["alertname"] == "LeaderdNoLeader" && a["state"] == "firing")
        },
    );
    assert_eq!(alert["labels"]["election"], ELECTION, "{alert}");
    assert_eq!(alert["labels"]["namespace"], NAMESPACE, "{alert}");
    assert_eq!(
        prom.query("leaderd_is_leader").expect("query"),
        Vec::<Value>::new(),
        "no series left"
    );
    eprintln!(
        "LeaderdNoLeader firing {:?} after every daemon stopped: {alert}",
        stopped_at.elapsed()
    );
}
