//! Prometheus metrics: a few series per election, the rest once per daemon.
//!
//! Per election (labelled `election`), only what has an answer per
//! election: whether this replica leads, the token, the lease left, the
//! changes of leader, whether it competes and its hold. Seven series an
//! election; with `election_metrics = "is_leader"`, `leaderd_is_leader`
//! alone, which the alerts need (they give the daemon's own series to each
//! election it leads by joining on it). The default test run counts both
//! at 1,000 elections.
//!
//! Once per daemon (no `election` label): whether the database answers
//! (one connection for all), the elections another process holds under
//! this replica's id, the attempts' and renewals' duration histograms
//! (every election's observations together), the renew interval and
//! budget (one timing for all), the app's health, and the counters that
//! are the daemon's own (failed attempts, which fail with its one
//! connection; dropped log lines; held-off takeovers).
//!
//! Counters and histograms are plain atomics (an election's are two
//! counters, 16 bytes); the gauges that describe leadership are read from a
//! fresh [`View`] at scrape time, so they are never staler than the scrape.
//! The daemon's families are built at scrape time and written by
//! prometheus' text encoder; the elections' are written straight into the
//! text (as messages first, 10,000 elections' series cost a scrape 12 MiB
//! of allocations, which the allocator kept).

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use prometheus::proto::{
    Bucket, Counter as CounterValue, Gauge, Histogram as HistogramValue, LabelPair, Metric,
    MetricFamily, MetricType,
};
use prometheus::{Encoder, TextEncoder};

use leaderd_core::View;

use crate::settings::ElectionMetrics;

/// The attempt histograms' upper bounds, in seconds (`+Inf` is implied).
/// Fine around the renewal budgets of short leases (17 ms at ttl 100 ms,
/// 50 ms at 150 ms, 150 ms at 300 ms), so that a p99 against the budget
/// reads true.
const BUCKETS: [f64; 18] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25,
    0.5, 0.75, 1.0, 2.5,
];

/// A counter that only goes up.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Observations counted per bucket (made cumulative at scrape time), with
/// their count and sum.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Per bucket of [`BUCKETS`], then one past the last bound.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    count: AtomicU64,
    /// The sum's `f64` bits.
    sum: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, value: f64) {
        let i = BUCKETS
            .iter()
            .position(|&bound| value <= bound)
            .unwrap_or(BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn value(&self) -> HistogramValue {
        let mut cumulative = 0;
        let buckets = BUCKETS
            .iter()
            .zip(&self.buckets)
            .map(|(&bound, n)| {
                cumulative += n.load(Ordering::Relaxed);
                let mut b = Bucket::default();
                b.set_upper_bound(bound);
                b.set_cumulative_count(cumulative);
                b
            })
            .collect();
        let mut h = HistogramValue::default();
        h.set_bucket(buckets);
        // Never below the buckets' total, whatever an observation in flight.
        let overflow = self.buckets[BUCKETS.len()].load(Ordering::Relaxed);
        h.set_sample_count(
            self.count
                .load(Ordering::Relaxed)
                .max(cumulative + overflow),
        );
        h.set_sample_sum(f64::from_bits(self.sum.load(Ordering::Relaxed)));
        h
    }
}

/// One election's counters, fed by its loop.
#[derive(Debug, Default)]
pub struct Metrics {
    pub acquired: Counter,
    pub lost: Counter,
}

/// The daemon's own metrics, once for all its elections.
#[derive(Debug)]
pub struct DaemonMetrics {
    /// Every election's attempts.
    pub heartbeat_duration: Histogram,
    /// The renewals among [`DaemonMetrics::heartbeat_duration`]: what a
    /// leader needs to keep its leases, apart from the followers' polls
    /// that outnumber them.
    pub renewal_duration: Histogram,
    /// Failed attempts, of any election (they fail with the daemon's one
    /// connection).
    pub heartbeat_errors: Counter,
    /// Whether the app passes its health check (always without one).
    pub app_healthy: AtomicBool,
}

impl Default for DaemonMetrics {
    fn default() -> Self {
        Self {
            heartbeat_duration: Histogram::default(),
            renewal_duration: Histogram::default(),
            heartbeat_errors: Counter::default(),
            app_healthy: AtomicBool::new(true),
        }
    }
}

/// What a scrape needs of the daemon.
#[derive(Debug)]
pub struct Daemonwide<'a> {
    pub metrics: &'a DaemonMetrics,
    /// How often a leader renews (`min(heartbeat, ttl/3)`).
    pub renew_every: Duration,
    /// How long a renewal may take for the leader to keep its lease
    /// (`Timing::renewal_budget`): what the renewals' durations are
    /// measured against.
    pub renewal_budget: Duration,
    /// Whether the database answers the daemon's connection (`/readyz`).
    pub db_up: bool,
    /// Which series each election gets.
    pub election_metrics: ElectionMetrics,
}

/// What a scrape needs of one election.
#[derive(Debug)]
pub struct Scraped<'a> {
    pub election: &'a str,
    pub metrics: &'a Metrics,
    pub view: View,
    /// Another process holds it under this replica's id (see
    /// [`leaderd_core::Engine::duplicate_held`]).
    pub duplicate: bool,
}

/// One family: name, help, type and its series.
fn family(
    name: &str,
    help: &str,
    kind: MetricType,
    series: impl Iterator<Item = Series>,
) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_owned());
    f.set_help(help.to_owned());
    f.set_field_type(kind);
    *f.mut_metric() = series
        .map(|(labels, mut m)| {
            m.set_label(
                labels
                    .into_iter()
                    .map(|(k, v)| {
                        let mut pair = LabelPair::default();
                        pair.set_name(k.to_owned());
                        pair.set_value(v);
                        pair
                    })
                    .collect(),
            );
            m
        })
        .collect();
    f
}

fn gauge(value: f64) -> Metric {
    let mut g = Gauge::default();
    g.set_value(value);
    Metric::from_gauge(g)
}

fn counter(value: u64) -> Metric {
    let mut c = CounterValue::default();
    // Counts stay far below 2^53, where an f64 is exact.
    #[allow(clippy::cast_precision_loss)]
    c.set_value(value as f64);
    let mut m = Metric::default();
    m.set_counter(c);
    m
}

/// One series of a family: its labels (besides `election`, first, as
/// prometheus orders them) and its value.
type Series = (Vec<(&'static str, String)>, Metric);

/// Prometheus text for the daemon and its `elections`: one family per
/// metric name, the daemon's first (sorted by name), then the elections'
/// (one series per election, in the given order).
pub fn render(daemon: &Daemonwide<'_>, elections: &[Scraped<'_>]) -> String {
    let mut families = per_daemon(daemon, elections);
    families.sort_by(|a, b| a.name().cmp(b.name()));
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&families, &mut out)
        .expect("text encoding into a Vec cannot fail");
    let mut out = String::from_utf8(out).expect("prometheus text is UTF-8");
    match daemon.election_metrics {
        ElectionMetrics::All => per_election(&mut out, elections),
        ElectionMetrics::IsLeader => is_leader(&mut out, elections),
    }
    out
}

/// Writes a family's `# HELP` and `# TYPE` lines.
fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    // Our own texts: nothing in them needs escaping.
    debug_assert!(!help.contains(['\\', '\n']), "{help}");
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Writes `election="NAME"` with the name escaped as the text format wants
/// (a name may hold `"` or `\`; never a line break).
fn election_label(out: &mut String, name: &str) {
    out.push_str("election=\"");
    for c in name.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A gauge with one series per election.
fn gauges(
    out: &mut String,
    elections: &[Scraped<'_>],
    name: &str,
    help: &str,
    value: &dyn Fn(&Scraped<'_>) -> f64,
) {
    header(out, name, help, "gauge");
    for e in elections {
        out.push_str(name);
        out.push('{');
        election_label(out, e.election);
        let _ = writeln!(out, "}} {}", value(e));
    }
}

/// `leaderd_is_leader`, never left out: the alerts are built on it.
fn is_leader(out: &mut String, elections: &[Scraped<'_>]) {
    gauges(
        out,
        elections,
        "leaderd_is_leader",
        "1 while this replica leads, else 0",
        &|e| f64::from(u8::from(e.view.is_leader)),
    );
}

/// The families with one series per election (two for the transitions).
fn per_election(out: &mut String, elections: &[Scraped<'_>]) {
    // About 60 bytes a series, seven series an election.
    out.reserve(elections.len() * 7 * 64);
    let mut gauges = |name: &str, help: &str, value: &dyn Fn(&Scraped<'_>) -> f64| {
        gauges(out, elections, name, help, value);
    };
    gauges(
        "leaderd_competing",
        "1 while this replica asks for the row; 0 while its app fails, it is held, draining or stopping (see /leader's not_competing)",
        &|e| f64::from(u8::from(e.view.standing.competing())),
    );
    gauges(
        "leaderd_fencing_token",
        "Fencing token of the current leader as last seen (0 when unknown)",
        // Tokens stay below 2^53 (microseconds since 1970 and counts).
        #[allow(clippy::cast_precision_loss)]
        &|e| e.view.token.unwrap_or(0) as f64,
    );
    gauges(
        "leaderd_hold_remaining_seconds",
        "What is left of this replica's hold or drain (0 when none): it competes again then, or at leaderd resume",
        &|e| {
            e.view
                .standing
                .hold_remaining
                .map_or(0.0, |d| d.as_secs_f64())
        },
    );
    gauges(
        "leaderd_lease_remaining_seconds",
        "Local lease left when leading, else the holder's lease as last observed",
        &|e| e.view.lease_remaining.map_or(0.0, |d| d.as_secs_f64()),
    );
    is_leader(out, elections);
    let name = "leaderd_transitions_total";
    header(out, name, "Leadership changes of this replica", "counter");
    for e in elections {
        for (kind, n) in [("acquired", &e.metrics.acquired), ("lost", &e.metrics.lost)] {
            let _ = write!(out, "{name}{{kind=\"{kind}\",");
            election_label(out, e.election);
            let _ = writeln!(out, "}} {}", n.get());
        }
    }
}

/// The families of the daemon as a whole, one series each (a histogram's
/// buckets aside), whatever the number of elections.
fn per_daemon(daemon: &Daemonwide<'_>, elections: &[Scraped<'_>]) -> Vec<MetricFamily> {
    let one = |name: &str, help: &str, kind: MetricType, value: Metric| {
        family(
            name,
            help,
            kind,
            std::iter::once::<Series>((Vec::new(), value)),
        )
    };
    let histogram = |name: &str, help: &str, h: &Histogram| {
        let mut m = Metric::default();
        m.set_histogram(h.value());
        one(name, help, MetricType::HISTOGRAM, m)
    };
    let m = daemon.metrics;
    vec![
        one(
            "leaderd_app_healthy",
            "1 while the app passes its health check (app_health), else 0; 1 when none is set",
            MetricType::GAUGE,
            gauge(f64::from(u8::from(m.app_healthy.load(Ordering::Relaxed)))),
        ),
        one(
            "leaderd_db_up",
            "1 when the database answered within max(3 x heartbeat, ttl), whether this replica competes or not",
            MetricType::GAUGE,
            gauge(f64::from(u8::from(daemon.db_up))),
        ),
        one(
            "leaderd_duplicate_id_elections",
            "Elections whose lease another process holds under this replica's id, as last seen \
             (two replicas were given one id; a restart sees its former self for a lease at most)",
            MetricType::GAUGE,
            // Far below 2^53.
            #[allow(clippy::cast_precision_loss)]
            gauge(elections.iter().filter(|e| e.duplicate).count() as f64),
        ),
        histogram(
            "leaderd_heartbeat_duration_seconds",
            "Duration of acquire-or-renew attempts, connection included, of every election",
            &m.heartbeat_duration,
        ),
        one(
            "leaderd_heartbeat_errors_total",
            "Failed acquire-or-renew attempts, of every election",
            MetricType::COUNTER,
            counter(m.heartbeat_errors.get()),
        ),
        one(
            "leaderd_log_lines_dropped_total",
            "Log lines dropped because stderr did not drain (logging never blocks the daemon)",
            MetricType::COUNTER,
            counter(crate::outputs::logging::dropped_lines()),
        ),
        one(
            "leaderd_renew_interval_seconds",
            "How often a leader renews: min(heartbeat, ttl/3)",
            MetricType::GAUGE,
            gauge(daemon.renew_every.as_secs_f64()),
        ),
        one(
            "leaderd_renewal_budget_seconds",
            "How long a renewal may take for the leader to keep its lease: \
             ttl - safety margin - renew interval",
            MetricType::GAUGE,
            gauge(daemon.renewal_budget.as_secs_f64()),
        ),
        histogram(
            "leaderd_renewal_duration_seconds",
            "Duration of a leader's renewals (a subset of the attempts) of every election it leads, \
             from before the send, as the lease is counted",
            &m.renewal_duration,
        ),
        one(
            "leaderd_takeovers_held_off_total",
            "Sessions seen holding this daemon's takeovers off for longer than a lease \
             (PostgreSQL; each logged at WARN with its pid and role)",
            MetricType::COUNTER,
            counter(leaderd_store::takeovers_held_off_total()),
        ),
    ]
}

/// The families [`per_daemon`] serves, for the tests that tell them from an
/// election's.
#[cfg(test)]
pub const PER_DAEMON: [&str; 10] = [
    "leaderd_app_healthy",
    "leaderd_db_up",
    "leaderd_duplicate_id_elections",
    "leaderd_heartbeat_duration_seconds",
    "leaderd_heartbeat_errors_total",
    "leaderd_log_lines_dropped_total",
    "leaderd_renew_interval_seconds",
    "leaderd_renewal_budget_seconds",
    "leaderd_renewal_duration_seconds",
    "leaderd_takeovers_held_off_total",
];

#[cfg(test)]
mod tests {
    use super::*;

    use leaderd_core::{BootTime, Engine, Timing};

    /// A scrape of one daemon of `n` elections (each a follower that has
    /// not asked yet, the first held under this replica's id by another
    /// process), as Prometheus' text.
    fn scrape(n: usize, which: ElectionMetrics) -> String {
        let now = BootTime::from_since_boot(Duration::from_secs(60));
        let timing = Timing::new(Duration::from_secs(1), Duration::from_millis(1200)).unwrap();
        let view = Engine::new(timing, "a", "0/a", now).view(now);
        let names: Vec<String> = (0..n).map(|i| format!("e{i}")).collect();
        let metrics: Vec<Metrics> = names.iter().map(|_| Metrics::default()).collect();
        let elections: Vec<Scraped<'_>> = names
            .iter()
            .zip(&metrics)
            .enumerate()
            .map(|(i, (election, metrics))| Scraped {
                election,
                metrics,
                view: view.clone(),
                duplicate: i == 0,
            })
            .collect();
        let daemon = DaemonMetrics::default();
        daemon.renewal_duration.observe(0.003);
        let wide = Daemonwide {
            metrics: &daemon,
            renew_every: timing.renew_every(),
            renewal_budget: timing.renewal_budget(),
            db_up: true,
            election_metrics: which,
        };
        render(&wide, &elections)
    }

    /// Series per family name, the lines that are not comments.
    fn series(text: &str) -> std::collections::BTreeMap<String, usize> {
        let mut out = std::collections::BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line
                .split(['{', ' '])
                .next()
                .unwrap_or_default()
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            *out.entry(name.to_owned()).or_default() += 1;
        }
        out
    }

    /// The per-election families of `which`.
    fn per_election(which: ElectionMetrics) -> &'static [&'static str] {
        match which {
            ElectionMetrics::All => &[
                "leaderd_competing",
                "leaderd_fencing_token",
                "leaderd_hold_remaining_seconds",
                "leaderd_is_leader",
                "leaderd_lease_remaining_seconds",
                "leaderd_transitions_total",
            ],
            ElectionMetrics::IsLeader => &["leaderd_is_leader"],
        }
    }

    /// At 1,000 elections: seven series an election (one with
    /// `election_metrics = "is_leader"`), and the daemon's own once, well
    /// under 200 (the documented bounds: 10 and 200).
    #[test]
    fn a_thousand_elections_cost_seven_series_each_or_one_and_the_daemons_once() {
        for (which, each) in [(ElectionMetrics::All, 7), (ElectionMetrics::IsLeader, 1)] {
            let per_election = per_election(which);
            let one = series(&scrape(1, which));
            let thousand = series(&scrape(1_000, which));
            let mut names: Vec<&str> = per_election.iter().chain(&PER_DAEMON).copied().collect();
            names.sort_unstable();
            assert_eq!(thousand.keys().collect::<Vec<_>>(), names, "{which:?}");
            for name in PER_DAEMON {
                assert_eq!(thousand[name], one[name], "{name} grows with the elections");
            }
            for name in per_election {
                let n = if *name == "leaderd_transitions_total" {
                    2
                } else {
                    1
                };
                assert_eq!(thousand[*name], 1_000 * n, "{name}");
            }
            let total: usize = thousand.values().sum();
            let daemon: usize = PER_DAEMON.iter().map(|n| thousand[*n]).sum();
            assert_eq!(total - daemon, 1_000 * each, "{which:?}: {thousand:?}");
            // As docs/reference.md says: 50, two histograms of 21 and eight more.
            assert_eq!(daemon, 50, "series of the daemon's own");
            // The daemon's series carry no election label; the elections' do.
            let text = scrape(2, which);
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                let name = line.split(['{', ' ']).next().unwrap_or_default();
                let daemons = PER_DAEMON.iter().any(|d| name.starts_with(d));
                assert_eq!(!daemons, line.contains("election=\""), "{line}");
            }
            assert!(
                text.contains("\nleaderd_duplicate_id_elections 1\n"),
                "{text}"
            );
            assert!(text.contains("\nleaderd_db_up 1\n"), "{text}");
        }
    }

    /// A name may hold a quote or a backslash: escaped, so the line still
    /// parses and names the election.
    #[test]
    fn election_names_are_escaped_in_labels() {
        let mut out = String::new();
        election_label(&mut out, r#"a"b\c"#);
        assert_eq!(out, r#"election="a\"b\\c""#);
    }

    #[test]
    fn the_histogram_is_cumulative_with_count_and_sum() {
        let h = Histogram::default();
        for v in [0.0001, 0.0005, 0.003, 0.2, 9.0] {
            h.observe(v);
        }
        let v = h.value();
        let counts: Vec<u64> = v
            .get_bucket()
            .iter()
            .map(|b| b.cumulative_count())
            .collect();
        assert_eq!(
            counts,
            [2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4]
        );
        assert_eq!(v.get_sample_count(), 5);
        assert!((v.get_sample_sum() - 9.2036).abs() < 1e-9);
    }
}
