//! Prometheus metrics, every series labelled `election`.
//!
//! Each election keeps only its counters and its two attempt histograms
//! (every attempt; a leader's renewals alone), as plain atomics (about 300
//! bytes); the gauges that describe leadership
//! (`is_leader`, token, lease remaining, db up) are read from a fresh
//! [`View`] at scrape time, so they are never staler than the scrape. The
//! families are built at scrape time for every election at once and
//! written by prometheus' text encoder. A prometheus registry per election
//! cost about 4 KiB each (by heaptrack, 1,000 elections: 4 MiB).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use prometheus::proto::{
    Bucket, Counter as CounterValue, Gauge, Histogram as HistogramValue, LabelPair, Metric,
    MetricFamily, MetricType,
};
use prometheus::{Encoder, TextEncoder};

use leaderd_core::View;

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

/// One election's counters, fed by its loop (and the app-health check).
#[derive(Debug)]
pub struct Metrics {
    pub acquired: Counter,
    pub lost: Counter,
    pub heartbeat_duration: Histogram,
    /// The renewals among [`Metrics::heartbeat_duration`]: what a leader
    /// needs to keep its lease, apart from the followers' polls that
    /// outnumber them.
    pub renewal_duration: Histogram,
    pub heartbeat_errors: Counter,
    pub duplicate_id: Counter,
    /// Whether the app passes its health check (always without one).
    pub app_healthy: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            acquired: Counter::default(),
            lost: Counter::default(),
            heartbeat_duration: Histogram::default(),
            renewal_duration: Histogram::default(),
            heartbeat_errors: Counter::default(),
            duplicate_id: Counter::default(),
            app_healthy: AtomicBool::new(true),
        }
    }
}

/// What a scrape needs of one election.
#[derive(Debug)]
pub struct Scraped<'a> {
    pub election: &'a str,
    pub metrics: &'a Metrics,
    pub view: View,
    pub db_up: bool,
    /// How often a leader renews (`min(heartbeat, ttl/3)`).
    pub renew_every: std::time::Duration,
    /// How long a renewal may take for the leader to keep its lease
    /// (`Timing::renewal_budget`): what the renewals' durations are
    /// measured against.
    pub renewal_budget: std::time::Duration,
}

/// One family: name, help, type and a value for each election (labels
/// besides `election` come first, as prometheus orders them).
fn family(
    name: &str,
    help: &str,
    kind: MetricType,
    series: impl Iterator<Item = (Vec<(&'static str, String)>, Metric)>,
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

/// Prometheus text for `elections`: one family per metric name (sorted by
/// name), one series per election in the given order.
pub fn render(elections: &[Scraped<'_>]) -> String {
    let by = |e: &Scraped<'_>| vec![("election", e.election.to_owned())];
    let gauges = |name: &str, help: &str, value: &dyn Fn(&Scraped<'_>) -> f64| {
        let series = elections.iter().map(|e| (by(e), gauge(value(e))));
        family(name, help, MetricType::GAUGE, series)
    };
    let counters = |name: &str, help: &str, value: &dyn Fn(&Scraped<'_>) -> u64| {
        let series = elections.iter().map(|e| (by(e), counter(value(e))));
        family(name, help, MetricType::COUNTER, series)
    };
    let dropped = crate::outputs::logging::dropped_lines();
    let held_off = leaderd_store::takeovers_held_off_total();
    let histograms = |name: &str, help: &str, which: &dyn Fn(&Metrics) -> &Histogram| {
        let series = elections.iter().map(|e| {
            let mut m = Metric::default();
            m.set_histogram(which(e.metrics).value());
            (by(e), m)
        });
        family(name, help, MetricType::HISTOGRAM, series)
    };
    let transitions = elections.iter().flat_map(|e| {
        [("acquired", &e.metrics.acquired), ("lost", &e.metrics.lost)].map(|(kind, n)| {
            (
                vec![
                    ("kind", kind.to_owned()),
                    ("election", e.election.to_owned()),
                ],
                counter(n.get()),
            )
        })
    });
    let families = [
        gauges(
            "leaderd_app_healthy",
            "1 while the app passes its health check (app_health), else 0; 1 when none is set",
            &|e| f64::from(u8::from(e.metrics.app_healthy.load(Ordering::Relaxed))),
        ),
        gauges(
            "leaderd_competing",
            "1 while this replica asks for the row; 0 while its app fails, it is held, draining or stopping (see /leader's not_competing)",
            &|e| f64::from(u8::from(e.view.standing.competing())),
        ),
        gauges(
            "leaderd_db_up",
            "1 when the database answered within max(3 x heartbeat, ttl), whether this replica competes or not",
            &|e| f64::from(u8::from(e.db_up)),
        ),
        counters(
            "leaderd_duplicate_id_total",
            "Times the row carried this replica's id with another process's instance",
            &|e| e.metrics.duplicate_id.get(),
        ),
        gauges(
            "leaderd_fencing_token",
            "Fencing token of the current leader as last seen (0 when unknown)",
            // Tokens stay below 2^53 (microseconds since 1970 and counts).
            #[allow(clippy::cast_precision_loss)]
            &|e| e.view.token.unwrap_or(0) as f64,
        ),
        histograms(
            "leaderd_heartbeat_duration_seconds",
            "Duration of acquire-or-renew attempts, connection included",
            &|m| &m.heartbeat_duration,
        ),
        counters(
            "leaderd_heartbeat_errors_total",
            "Failed acquire-or-renew attempts",
            &|e| e.metrics.heartbeat_errors.get(),
        ),
        gauges(
            "leaderd_hold_remaining_seconds",
            "What is left of this replica's hold or drain (0 when none): it competes again then, or at leaderd resume",
            &|e| {
                e.view
                    .standing
                    .hold_remaining
                    .map_or(0.0, |d| d.as_secs_f64())
            },
        ),
        gauges(
            "leaderd_is_leader",
            "1 while this replica leads, else 0",
            &|e| f64::from(u8::from(e.view.is_leader)),
        ),
        gauges(
            "leaderd_lease_remaining_seconds",
            "Local lease left when leading, else the holder's lease as last observed",
            &|e| e.view.lease_remaining.map_or(0.0, |d| d.as_secs_f64()),
        ),
        counters(
            "leaderd_log_lines_dropped_total",
            "Log lines dropped because stderr did not drain (logging never blocks the daemon)",
            &|_| dropped,
        ),
        gauges(
            "leaderd_renew_interval_seconds",
            "How often a leader renews: min(heartbeat, ttl/3)",
            &|e| e.renew_every.as_secs_f64(),
        ),
        gauges(
            "leaderd_renewal_budget_seconds",
            "How long a renewal may take for the leader to keep its lease: \
             ttl - safety margin - renew interval",
            &|e| e.renewal_budget.as_secs_f64(),
        ),
        histograms(
            "leaderd_renewal_duration_seconds",
            "Duration of a leader's renewals (a subset of the attempts), from before the send, \
             as the lease is counted",
            &|m| &m.renewal_duration,
        ),
        counters(
            "leaderd_takeovers_held_off_total",
            "Sessions seen holding this daemon's takeovers off for longer than a lease \
             (PostgreSQL; each logged at WARN with its pid and role)",
            &|_| held_off,
        ),
        family(
            "leaderd_transitions_total",
            "Leadership changes of this replica",
            MetricType::COUNTER,
            transitions,
        ),
    ];
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&families, &mut out)
        .expect("text encoding into a Vec cannot fail");
    String::from_utf8(out).expect("prometheus text is UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

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
