//! Per-operation latency, kept in memory: percentiles over a sliding window served at
//! `GET /v1/metrics`, and cumulative histograms for Prometheus (`GET /metrics`).

use super::Lock as _;
use crate::api::OpStats;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

/// Samples kept per operation (a sliding window).
const WINDOW: usize = 4096;

/// Upper bounds of the latency histogram's buckets, in microseconds (the last bucket,
/// `+Inf`, is implied).
pub const BUCKETS_US: [u64; 16] = [
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    10_000_000,
    60_000_000,
    600_000_000,
];

#[derive(Default)]
pub struct Op {
    samples: VecDeque<u64>,
    pub count: u64,
    pub errors: u64,
    /// Requests at or under each bound of [`BUCKETS_US`] (not cumulative).
    pub buckets: [u64; BUCKETS_US.len()],
    pub sum_us: u64,
}

#[derive(Default)]
pub struct Metrics {
    ops: Mutex<BTreeMap<String, Op>>,
}

impl Metrics {
    pub fn record(&self, op: &str, micros: u64, ok: bool) {
        let mut ops = self.ops.locked();
        let o = match ops.get_mut(op) {
            Some(o) => o,
            None => ops.entry(op.to_string()).or_default(),
        };
        if o.samples.len() == WINDOW {
            o.samples.pop_front();
        }
        o.samples.push_back(micros);
        o.count += 1;
        if !ok {
            o.errors += 1;
        }
        o.sum_us += micros;
        if let Some(i) = BUCKETS_US.iter().position(|&b| micros <= b) {
            o.buckets[i] += 1;
        }
    }

    /// Calls `f` with each operation's record, in order.
    pub fn each(&self, mut f: impl FnMut(&str, &Op)) {
        for (op, o) in self.ops.locked().iter() {
            f(op, o)
        }
    }

    pub fn snapshot(&self) -> BTreeMap<String, OpStats> {
        let ops = self.ops.locked();
        ops.iter()
            .map(
                |(
                    op,
                    Op {
                        samples,
                        count,
                        errors,
                        ..
                    },
                )| {
                    let mut s: Vec<u64> = samples.iter().copied().collect();
                    s.sort_unstable();
                    let pct = |p: f64| {
                        s.get(((s.len() as f64 - 1.0) * p).round() as usize)
                            .copied()
                            .unwrap_or(0)
                    };
                    let stats = OpStats {
                        count: *count,
                        errors: *errors,
                        p50_us: pct(0.5),
                        p90_us: pct(0.9),
                        p99_us: pct(0.99),
                        max_us: s.last().copied().unwrap_or(0),
                    };
                    (op.clone(), stats)
                },
            )
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn percentiles_come_from_the_samples() {
        let m = super::Metrics::default();
        for i in 1..=100 {
            m.record("exec", i, i != 7);
        }
        let s = &m.snapshot()["exec"];
        assert_eq!(
            (s.count, s.errors, s.p50_us, s.p99_us, s.max_us),
            (100, 1, 51, 99, 100)
        );
    }
}
