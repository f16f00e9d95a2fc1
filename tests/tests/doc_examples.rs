//! Every runnable example in README.md and docs/*.md, run as printed.
//!
//! A fenced block of shell, SQL, Python or Go must say, in an HTML comment on
//! the line just before it, what it is (a block that says nothing fails the
//! suite, so an example cannot quietly stop being tested):
//!
//! - `<!-- run -->`: run against a fresh PostgreSQL database
//!   (`DATABASE_URL`); `<!-- run: mysql -->` against a fresh MariaDB one;
//!   `<!-- run: sqlite -->` with no `DATABASE_URL` (the daemon's default
//!   SQLite file). Shell runs under `bash -euo pipefail`, SQL with `psql` or
//!   the `mariadb` client (stopping at the first error), Python with
//!   `python3` (psycopg 3 and PyMySQL installed by `scripts/test`).
//! - `<!-- run: release -->`: shell run by `scripts/container-test`, not
//!   here, in the directory `scripts/release` made (with podman, helm and
//!   jq on `PATH`): the blocks that verify and use a release's files.
//! - `<!-- file: NAME -->`: written to NAME (executable when it starts with
//!   `#!`) for the page's later blocks.
//! - `<!-- not run: WHY -->`: kept out (a cluster, a toolchain this machine
//!   lacks).
//!
//! A page's blocks run in order in one scratch directory, with `leaderd`
//! (this build) on `PATH`; what a block leaves running in the background
//! (a daemon) serves the page's later blocks and is stopped when the page
//! ends. A block must exit 0 within [`BLOCK_LIMIT`]; it checks its own
//! claims (`curl -f`, `grep -q`, `test`), so a wrong example fails here.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leaderd_tests::{leaderd_bin, serial, Scratch, TempDb};

/// Longest a block may take.
const BLOCK_LIMIT: Duration = Duration::from_secs(60);
/// How long the page's background processes get to stop after SIGTERM.
const STOP_LIMIT: Duration = Duration::from_secs(5);
/// Block languages that must carry a marker.
const CODE: &[&str] = &["sh", "bash", "shell", "console", "sql", "python", "go"];

#[derive(Debug, Clone, PartialEq)]
enum Marker {
    Run(Backend),
    /// Run by scripts/container-test, in a release's directory.
    Release,
    File(String),
    NotRun,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Backend {
    Postgres,
    Mysql,
    Sqlite,
}

#[derive(Debug)]
struct Block {
    line: usize,
    lang: String,
    marker: Option<Marker>,
    text: String,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository")
        .to_owned()
}

/// README.md and every page under docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn marker(line: &str) -> Result<Option<Marker>, String> {
    let Some(inner) = line
        .trim()
        .strip_prefix("<!--")
        .and_then(|l| l.strip_suffix("-->"))
    else {
        return Ok(None);
    };
    let inner = inner.trim();
    Ok(Some(match inner {
        "run" => Marker::Run(Backend::Postgres),
        "run: mysql" => Marker::Run(Backend::Mysql),
        "run: sqlite" => Marker::Run(Backend::Sqlite),
        "run: release" => Marker::Release,
        _ if inner.starts_with("not run:") && inner.len() > "not run:".len() + 1 => Marker::NotRun,
        _ => match inner.strip_prefix("file:").map(str::trim) {
            Some(name) if !name.is_empty() && !name.contains('/') => Marker::File(name.into()),
            _ if inner.starts_with("run") || inner.starts_with("not run") => {
                return Err(format!("unknown marker {line:?}"))
            }
            _ => return Ok(None),
        },
    }))
}

/// The fenced blocks of a page, with the marker before each.
fn blocks(text: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let indent = lines[i].len() - lines[i].trim_start().len();
        let Some(info) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let lang = info.split_whitespace().next().unwrap_or("").to_owned();
        let marker = match i.checked_sub(1) {
            Some(prev) => marker(lines[prev]).map_err(|e| format!("line {}: {e}", prev + 1))?,
            None => None,
        };
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            let l = lines[i];
            body.push(
                l.get(indent.min(l.len() - l.trim_start().len())..)
                    .unwrap_or(""),
            );
            i += 1;
        }
        if i == lines.len() {
            return Err(format!("line {}: the block never ends", start + 1));
        }
        out.push(Block {
            line: start + 1,
            lang,
            marker,
            text: body.join("\n") + "\n",
        });
        i += 1;
    }
    Ok(out)
}

fn name(page: &Path) -> String {
    page.strip_prefix(repo())
        .unwrap_or(page)
        .display()
        .to_string()
}

#[test]
fn every_code_block_says_whether_it_runs() {
    let mut problems = Vec::new();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("page");
        match blocks(&text) {
            Err(e) => problems.push(format!("{}: {e}", name(&page))),
            Ok(blocks) => {
                for b in blocks {
                    let kind = match &b.marker {
                        Some(Marker::Run(_)) | Some(Marker::Release) => "run",
                        Some(Marker::File(_)) => "file",
                        Some(Marker::NotRun) => "not run",
                        None if CODE.contains(&b.lang.as_str()) => {
                            problems.push(format!(
                                "{}:{}: a {} block with no <!-- run -->, <!-- file: NAME --> \
                                 or <!-- not run: WHY --> before it",
                                name(&page),
                                b.line,
                                b.lang
                            ));
                            continue;
                        }
                        None => continue,
                    };
                    if kind == "run" && !["sh", "bash", "sql", "python"].contains(&b.lang.as_str())
                    {
                        problems.push(format!(
                            "{}:{}: cannot run a {:?} block",
                            name(&page),
                            b.line,
                            b.lang
                        ));
                    }
                    *counts.entry(kind).or_default() += 1;
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    eprintln!("code blocks: {counts:?}");
    // The harness is worth something only while most examples run.
    assert!(counts.get("run").copied().unwrap_or(0) >= 10, "{counts:?}");
    assert!(
        counts.get("not run").copied().unwrap_or(0) * 2 <= counts.get("run").copied().unwrap_or(0),
        "more examples are kept out than run: {counts:?}"
    );
}

#[test]
fn the_harness_reads_markers_and_blocks_as_documented() {
    let page = "text\n<!-- run: mysql -->\n```sql\nSELECT 1;\n```\n\n  <!-- file: job.sh -->\n  ```sh\n  #!/bin/sh\n  echo hi\n  ```\n```yaml\na: 1\n```\n";
    let b = blocks(page).unwrap();
    assert_eq!(b.len(), 3);
    assert_eq!(b[0].marker, Some(Marker::Run(Backend::Mysql)));
    assert_eq!(
        (b[0].lang.as_str(), b[0].text.as_str()),
        ("sql", "SELECT 1;\n")
    );
    assert_eq!(b[1].marker, Some(Marker::File("job.sh".into())));
    assert_eq!(b[1].text, "#!/bin/sh\necho hi\n");
    assert_eq!((b[2].lang.as_str(), &b[2].marker), ("yaml", &None));
    assert!(blocks("<!-- run: oracle -->\n```sql\n```\n").is_err());
    let release = blocks("<!-- run: release -->\n```sh\nsha256sum -c SHA256SUMS\n```\n").unwrap();
    assert_eq!(release[0].marker, Some(Marker::Release));
    assert!(blocks("```sh\nnever closed\n").is_err());
}

/// A page's state: its directory, databases and background processes.
struct PageRun {
    page: String,
    dir: Scratch,
    dbs: HashMap<Backend, TempDb>,
    groups: Vec<i32>,
}

impl PageRun {
    fn url(&mut self, backend: Backend) -> Option<String> {
        let db = match backend {
            Backend::Sqlite => return None,
            Backend::Postgres => TempDb::postgres,
            Backend::Mysql => TempDb::mysql,
        };
        Some(self.dbs.entry(backend).or_insert_with(db).url.clone())
    }

    fn run(&mut self, b: &Block, backend: Backend) {
        let url = self.url(backend);
        let file = self.dir.path(&format!("block-{}.{}", b.line, b.lang));
        std::fs::write(&file, &b.text).unwrap();
        let mut cmd = match (b.lang.as_str(), backend) {
            ("sh" | "bash", _) => {
                let mut c = Command::new("bash");
                c.args(["-euo", "pipefail"]).arg(&file);
                c
            }
            ("sql", Backend::Postgres) => {
                let mut c = Command::new("psql");
                c.arg(url.as_deref().unwrap())
                    .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f"])
                    .arg(&file);
                c
            }
            ("sql", Backend::Mysql) => {
                let db = &self.dbs[&Backend::Mysql];
                let mut c = Command::new("mariadb");
                c.args(mariadb_args(&db.url))
                    .stdin(Stdio::from(std::fs::File::open(&file).unwrap()));
                c
            }
            ("python", _) => {
                let mut c = Command::new("python3");
                c.arg(&file);
                c
            }
            (lang, _) => panic!("{}:{}: cannot run {lang} here", self.page, b.line),
        };
        let bin = leaderd_bin();
        let path = format!(
            "{}:{}",
            bin.parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cmd.current_dir(&self.dir.0).env("PATH", path);
        // The examples configure leaderd themselves; nothing of the test's
        // own environment leaks in.
        for (k, _) in std::env::vars() {
            if k.starts_with("LEADERD_") || k == "DATABASE_URL" {
                cmd.env_remove(&k);
            }
        }
        if let Some(url) = &url {
            cmd.env("DATABASE_URL", url);
        }
        let out = self.dir.path(&format!("block-{}.out", b.line));
        let log = std::fs::File::create(&out).unwrap();
        cmd.stdout(log.try_clone().unwrap()).stderr(log);
        if b.lang == "sh" || b.lang == "bash" || b.lang == "python" {
            cmd.stdin(Stdio::null());
        }
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().expect("start the block");
        self.groups.push(child.id() as i32);
        let began = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if began.elapsed() > BLOCK_LIMIT {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if status.is_none_or(|s| !s.success()) {
            let printed = std::fs::read_to_string(&out).unwrap_or_default();
            self.stop();
            panic!(
                "{}:{}: the {} example {} ({:?} in)\n--- the block ---\n{}--- what it printed ---\n{}",
                self.page,
                b.line,
                b.lang,
                match status {
                    Some(s) => format!("failed: {s}"),
                    None => format!("did not end within {BLOCK_LIMIT:?}"),
                },
                began.elapsed(),
                b.text,
                printed
            );
        }
    }

    /// Stops what the page's blocks left running: SIGTERM (daemons release
    /// their rows), then SIGKILL for what is still there.
    fn stop(&mut self) {
        use rustix::process::{kill_process_group, test_kill_process_group, Pid, Signal};
        let groups: Vec<Pid> = self.groups.drain(..).filter_map(Pid::from_raw).collect();
        for g in &groups {
            let _ = kill_process_group(*g, Signal::TERM);
        }
        let deadline = Instant::now() + STOP_LIMIT;
        while Instant::now() < deadline
            && groups.iter().any(|g| test_kill_process_group(*g).is_ok())
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        for g in &groups {
            let _ = kill_process_group(*g, Signal::KILL);
        }
    }
}

impl Drop for PageRun {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `mariadb` client arguments for a `mysql://user[:pw]@host:port/db` URL.
fn mariadb_args(url: &str) -> Vec<String> {
    let rest = url.strip_prefix("mysql://").expect("a mysql:// URL");
    let rest = rest.split('?').next().unwrap();
    let (user, rest) = rest.split_once('@').expect("user@host");
    let (host, db) = rest.split_once('/').expect("host/db");
    let (host, port) = host.split_once(':').unwrap_or((host, "3306"));
    let (user, pw) = user.split_once(':').unwrap_or((user, ""));
    let mut args = vec![
        format!("--host={host}"),
        format!("--port={port}"),
        format!("--user={user}"),
    ];
    if !pw.is_empty() {
        args.push(format!("--password={pw}"));
    }
    args.push(db.to_owned());
    args
}

fn python_has_drivers() -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-c", "import psycopg, pymysql"])
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "the Python examples need psycopg 3 and PyMySQL (scripts/test installs them): {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn every_runnable_example_runs() {
    let _s = serial();
    let mut ran = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("page");
        let blocks = blocks(&text).expect("the blocks (see the marker test)");
        if !blocks
            .iter()
            .any(|b| matches!(b.marker, Some(Marker::Run(_))))
        {
            continue;
        }
        if blocks
            .iter()
            .any(|b| b.lang == "python" && matches!(b.marker, Some(Marker::Run(_))))
        {
            python_has_drivers().unwrap();
        }
        let mut run = PageRun {
            page: name(&page),
            dir: Scratch::new(),
            dbs: HashMap::new(),
            groups: Vec::new(),
        };
        let began = Instant::now();
        for b in &blocks {
            match &b.marker {
                Some(Marker::File(file)) => {
                    let path = run.dir.path(file);
                    let mut f = std::fs::File::create(&path).unwrap();
                    f.write_all(b.text.as_bytes()).unwrap();
                    if b.text.starts_with("#!") {
                        use std::os::unix::fs::PermissionsExt;
                        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                            .unwrap();
                    }
                }
                Some(Marker::Run(backend)) => {
                    run.run(b, *backend);
                    ran += 1;
                }
                _ => {}
            }
        }
        run.stop();
        eprintln!("{}: examples ran in {:?}", run.page, began.elapsed());
    }
    assert!(ran >= 10, "only {ran} examples ran");
}
