//! Latency summaries.

use std::time::Duration;

/// p50, p90, p99 and max of a sample.
#[derive(Debug, Clone, Copy, Default)]
pub struct Summary {
    pub n: usize,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Summary {
    pub fn of(mut xs: Vec<Duration>) -> Summary {
        if xs.is_empty() {
            return Summary::default();
        }
        xs.sort_unstable();
        let at = |q: f64| xs[((xs.len() as f64 * q).ceil() as usize).clamp(1, xs.len()) - 1];
        Summary {
            n: xs.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: *xs.last().expect("not empty"),
        }
    }
}

/// Milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let s = Summary::of((1..=100).map(Duration::from_millis).collect());
        assert_eq!(s.p50, Duration::from_millis(50));
        assert_eq!(s.p90, Duration::from_millis(90));
        assert_eq!(s.p99, Duration::from_millis(99));
        assert_eq!(s.max, Duration::from_millis(100));
        assert_eq!(
            Summary::of(vec![Duration::from_millis(7)]).p99,
            Duration::from_millis(7)
        );
    }
}
