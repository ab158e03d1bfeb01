//! What the clients record: each successful operation's latencies into HDR histograms, each
//! failure by its gRPC code, each answer by its outcome.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Longest latency the histograms hold (a minute, in microseconds); longer saturates.
const MAX_MICROS: u64 = 60_000_000;
/// The latencies recorded per operation: the operation's, and its parts'.
pub(crate) const PARTS: [&str; 4] = ["op", "claim", "complete", "waiting claim"];
pub(crate) const OP: usize = 0;
pub(crate) const CLAIM: usize = 1;
pub(crate) const COMPLETE: usize = 2;
pub(crate) const WAIT: usize = 3;

/// One successful operation: its latency and its parts' (indexed by [`PARTS`]).
pub(crate) struct Sample {
    pub(crate) times: [Option<Duration>; 4],
    pub(crate) outcome: &'static str,
}

impl Sample {
    pub(crate) fn single(op: Duration, outcome: &'static str) -> Sample {
        Sample {
            times: [Some(op), None, None, None],
            outcome,
        }
    }
}

/// One client's (then the run's) figures.
pub(crate) struct Tally {
    pub(crate) hists: [Histogram<u64>; 4],
    pub(crate) errors: BTreeMap<String, u64>,
    pub(crate) outcomes: BTreeMap<String, u64>,
    pub(crate) last_end: Option<Instant>,
}

impl Tally {
    pub(crate) fn new() -> Result<Tally, hdrhistogram::CreationError> {
        let h = || Histogram::new_with_bounds(1, MAX_MICROS, 3);
        Ok(Tally {
            hists: [h()?, h()?, h()?, h()?],
            errors: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            last_end: None,
        })
    }

    pub(crate) fn record(&mut self, result: Result<Sample, String>, end: Instant) {
        self.last_end = Some(self.last_end.map_or(end, |e| e.max(end)));
        match result {
            Ok(s) => {
                for (h, t) in self.hists.iter_mut().zip(s.times) {
                    if let Some(t) = t {
                        h.saturating_record(u64::try_from(t.as_micros()).unwrap_or(MAX_MICROS));
                    }
                }
                *self.outcomes.entry(s.outcome.to_string()).or_default() += 1;
            }
            Err(code) => *self.errors.entry(code).or_default() += 1,
        }
    }

    pub(crate) fn merge(&mut self, other: Tally) {
        for (h, o) in self.hists.iter_mut().zip(&other.hists) {
            // Same bounds everywhere, so adding cannot fail.
            let _ = h.add(o);
        }
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        for (k, v) in other.outcomes {
            *self.outcomes.entry(k).or_default() += v;
        }
        self.last_end = self.last_end.max(other.last_end);
    }
}

/// Percentiles of one histogram, in milliseconds.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Latency {
    /// Operations recorded.
    pub count: u64,
    /// Their mean.
    pub mean: f64,
    /// The median.
    pub p50: f64,
    /// The 90th percentile.
    pub p90: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The 99.9th percentile.
    pub p999: f64,
    /// The longest.
    pub max: f64,
}

impl Latency {
    pub(crate) fn of(h: &Histogram<u64>) -> Option<Latency> {
        let ms = |us: u64| us as f64 / 1000.0;
        (!h.is_empty()).then(|| Latency {
            count: h.len(),
            mean: h.mean() / 1000.0,
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        })
    }
}
