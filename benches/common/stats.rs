//! Sampling with warm-up, percentiles, and the formatting of times and sizes.

use super::env::check_interrupted;
use anyhow::{Context, Result};
use std::time::Instant;

/// Summary of one series of samples, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Summary {
    pub n: usize,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub mean: f64,
    pub min: u64,
    pub max: u64,
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn summarize(samples: &[u64]) -> Summary {
    let mut s = samples.to_vec();
    s.sort_unstable();
    if s.is_empty() {
        return Summary::default();
    }
    Summary {
        n: s.len(),
        p50: percentile(&s, 50.0),
        p90: percentile(&s, 90.0),
        p99: percentile(&s, 99.0),
        mean: s.iter().sum::<u64>() as f64 / s.len() as f64,
        min: s[0],
        max: s[s.len() - 1],
    }
}

/// Runs `warmup` untimed calls then `n` timed ones. `f` does one sample and returns
/// its time in microseconds, so it decides what is timed (set-up and clean-up of a
/// fresh object per sample stay outside). Progress goes to stderr every 25 samples.
pub fn sample(
    label: &str,
    warmup: usize,
    n: usize,
    mut f: impl FnMut() -> Result<u64>,
) -> Result<Vec<u64>> {
    let started = Instant::now();
    for i in 0..warmup {
        check_interrupted()?;
        f().with_context(|| format!("{label}: warm-up {}/{warmup}", i + 1))?;
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        check_interrupted()?;
        out.push(f().with_context(|| format!("{label}: sample {}/{n}", i + 1))?);
        if (i + 1) % 25 == 0 || i + 1 == n {
            eprintln!(
                "  {label}: {}/{n} (p50 so far {}, {:.1}s)",
                i + 1,
                fmt_us(summarize(&out).p50),
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(out)
}

/// Microseconds as milliseconds with two decimals.
pub fn fmt_ms(us: f64) -> String {
    format!("{:.2}", us / 1000.0)
}

/// Microseconds with a unit that keeps the number readable.
pub fn fmt_us(us: u64) -> String {
    if us >= 10_000_000 {
        format!("{:.1} s", us as f64 / 1e6)
    } else {
        format!("{:.2} ms", us as f64 / 1000.0)
    }
}

pub fn fmt_kib(kib: f64) -> String {
    if kib.abs() >= 10.0 * 1024.0 {
        format!("{:.1} MiB", kib / 1024.0)
    } else {
        format!("{kib:.0} KiB")
    }
}
