//! Per-operation latency, kept in memory and served at `GET /v1/metrics`.

use super::Lock as _;
use crate::api::OpStats;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

/// Samples kept per operation (a sliding window).
const WINDOW: usize = 4096;

#[derive(Default)]
pub struct Metrics {
    ops: Mutex<BTreeMap<String, (VecDeque<u64>, u64, u64)>>,
}

impl Metrics {
    pub fn record(&self, op: &str, micros: u64, ok: bool) {
        let mut ops = self.ops.locked();
        let (samples, count, errors) = ops.entry(op.to_string()).or_default();
        if samples.len() == WINDOW {
            samples.pop_front();
        }
        samples.push_back(micros);
        *count += 1;
        if !ok {
            *errors += 1;
        }
    }

    pub fn snapshot(&self) -> BTreeMap<String, OpStats> {
        let ops = self.ops.locked();
        ops.iter()
            .map(|(op, (samples, count, errors))| {
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
            })
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
