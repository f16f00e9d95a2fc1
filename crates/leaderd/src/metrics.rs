//! Prometheus metrics, every series labelled `election`.
//!
//! Gauges that describe leadership (`is_leader`, token, lease remaining, db
//! up) are set from a fresh [`View`] at scrape time, so they are never staler
//! than the scrape; counters and the histogram are fed by the election loop.

use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use leaderd_core::View;

#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    is_leader: IntGauge,
    fencing_token: IntGauge,
    lease_remaining: Gauge,
    db_up: IntGauge,
    pub transitions: IntCounterVec,
    pub heartbeat_duration: Histogram,
    pub heartbeat_errors: IntCounter,
    pub duplicate_id: IntCounter,
    /// 1 while the app passes its health check (always 1 without one).
    pub app_healthy: IntGauge,
    /// Follows `logging::dropped_lines` at scrape time.
    log_lines_dropped: IntCounter,
}

impl Metrics {
    pub fn new(election: &str) -> Self {
        let labels = [("election".to_owned(), election.to_owned())]
            .into_iter()
            .collect();
        let registry = Registry::new_custom(None, Some(labels)).expect("valid registry labels");
        let is_leader =
            IntGauge::new("leaderd_is_leader", "1 while this replica leads, else 0").unwrap();
        let fencing_token = IntGauge::new(
            "leaderd_fencing_token",
            "Fencing token of the current leader as last seen (0 when unknown)",
        )
        .unwrap();
        let lease_remaining = Gauge::new(
            "leaderd_lease_remaining_seconds",
            "Local lease left when leading, else the holder's lease as last observed",
        )
        .unwrap();
        let db_up = IntGauge::new(
            "leaderd_db_up",
            "1 when a database round trip succeeded within max(3 x heartbeat, ttl)",
        )
        .unwrap();
        let transitions = IntCounterVec::new(
            Opts::new(
                "leaderd_transitions_total",
                "Leadership changes of this replica",
            ),
            &["kind"],
        )
        .unwrap();
        let heartbeat_duration = Histogram::with_opts(
            HistogramOpts::new(
                "leaderd_heartbeat_duration_seconds",
                "Duration of acquire-or-renew attempts, connection included",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
        )
        .unwrap();
        let heartbeat_errors = IntCounter::new(
            "leaderd_heartbeat_errors_total",
            "Failed acquire-or-renew attempts",
        )
        .unwrap();
        let duplicate_id = IntCounter::new(
            "leaderd_duplicate_id_total",
            "Times the row carried this replica's id with another process's instance",
        )
        .unwrap();
        let app_healthy = IntGauge::new(
            "leaderd_app_healthy",
            "1 while the app passes its health check (app_health), else 0; 1 when none is set",
        )
        .unwrap();
        app_healthy.set(1);
        let log_lines_dropped = IntCounter::new(
            "leaderd_log_lines_dropped_total",
            "Log lines dropped because stderr did not drain (logging never blocks the daemon)",
        )
        .unwrap();
        for c in [
            Box::new(is_leader.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(fencing_token.clone()),
            Box::new(lease_remaining.clone()),
            Box::new(db_up.clone()),
            Box::new(transitions.clone()),
            Box::new(heartbeat_duration.clone()),
            Box::new(heartbeat_errors.clone()),
            Box::new(duplicate_id.clone()),
            Box::new(app_healthy.clone()),
            Box::new(log_lines_dropped.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        // Show both kinds from the start so rate() works on the first change.
        transitions.with_label_values(&["acquired"]);
        transitions.with_label_values(&["lost"]);
        Self {
            registry,
            is_leader,
            fencing_token,
            lease_remaining,
            db_up,
            transitions,
            heartbeat_duration,
            heartbeat_errors,
            duplicate_id,
            app_healthy,
            log_lines_dropped,
        }
    }

    /// The metric families of a scrape taken now.
    pub fn gather(&self, view: &View, db_up: bool) -> Vec<MetricFamily> {
        self.is_leader.set(i64::from(view.is_leader));
        self.fencing_token.set(view.token.unwrap_or(0));
        self.lease_remaining
            .set(view.lease_remaining.map_or(0.0, |d| d.as_secs_f64()));
        self.db_up.set(i64::from(db_up));
        let dropped = crate::logging::dropped_lines();
        self.log_lines_dropped
            .inc_by(dropped.saturating_sub(self.log_lines_dropped.get()));
        self.registry.gather()
    }
}

/// Prometheus text of `families`.
pub fn encode(families: &[MetricFamily]) -> String {
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(families, &mut out)
        .expect("text encoding into a Vec cannot fail");
    String::from_utf8(out).expect("prometheus text is UTF-8")
}
