//! The statistics machinery: a seeded PRNG, the task bootstrap, quantiles.
//!
//! Every estimate in the analysis is a ratio of per-task sums over one
//! *family* of tasks: `sum_t num[t] / sum_t den[t]`. A plain mean over the
//! family has `den = 1`; a mean over a subset of it has `den = 0` outside the
//! subset; the conditional failure rate has `num = c(1 - r)`, `den = c`; a
//! pooled estimate has `num` = the sum of a task's per-direction differences
//! and `den` = their number. A bootstrap draw resamples the family's tasks
//! with replacement once and evaluates every column of the family on that one
//! resample, so both sides of every contrast (and every term of the HRG
//! decomposition) move together: the bootstrap is paired by construction.
//! Each draw costs O(tasks x columns); the per-task values are computed once.
//!
//! Determinism: the stream of a family is seeded from the user's seed and a
//! hash of the family's key, so an interval depends only on (seed, key, data)
//! and not on which other families exist or the order they are computed in.

use serde::Serialize;

/// SplitMix64, used to expand one 64-bit seed into a xoshiro state.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// xoshiro256** (Blackman and Vigna), seeded through SplitMix64.
#[derive(Debug, Clone)]
pub struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    pub fn seed_from(seed: u64) -> Self {
        let mut sm = SplitMix64::new(seed);
        Xoshiro256 {
            s: [sm.next_u64(), sm.next_u64(), sm.next_u64(), sm.next_u64()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform integer in `0..n` without modulo bias (Lemire's method).
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "below(0)");
        let n = n as u64;
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (m >> 64) as usize
    }
}

/// FNV-1a over the key, mixed with the seed.
pub fn stream_seed(seed: u64, key: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01B3);
    }
    SplitMix64::new(seed ^ h).next_u64()
}

/// One ratio statistic over a family: per-task numerator and denominator.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    pub num: Vec<f64>,
    pub den: Vec<f64>,
}

impl Column {
    pub fn zeros(n: usize) -> Self {
        Column {
            num: vec![0.0; n],
            den: vec![0.0; n],
        }
    }

    /// A mean over the tasks where `values` is defined.
    pub fn mean_of(values: &[Option<f64>]) -> Self {
        let mut c = Column::zeros(values.len());
        for (t, v) in values.iter().enumerate() {
            if let Some(v) = v {
                c.num[t] = *v;
                c.den[t] = 1.0;
            }
        }
        c
    }

    /// Tasks in the column's domain (nonzero denominator).
    pub fn support(&self) -> usize {
        self.den.iter().filter(|d| **d != 0.0).count()
    }

    /// `sum num / sum den` over all tasks, `None` when the domain is empty.
    pub fn point(&self) -> Option<f64> {
        let den: f64 = self.den.iter().sum();
        (den != 0.0).then(|| self.num.iter().sum::<f64>() / den)
    }
}

/// A percentile bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    pub lo: f64,
    pub hi: f64,
    /// Draws in which the statistic was undefined (its resampled domain was
    /// empty) and which the percentiles therefore leave out.
    pub undefined_draws: usize,
}

/// 95% percentile intervals for every column of one family, from `draws`
/// resamples of its `n` tasks. `None` where no draw defined the statistic or
/// `draws == 0`.
pub fn bootstrap(columns: &[Column], draws: usize, seed: u64, key: &str) -> Vec<Option<Interval>> {
    let k = columns.len();
    let n = columns.first().map_or(0, |c| c.num.len());
    debug_assert!(columns.iter().all(|c| c.num.len() == n && c.den.len() == n));
    if draws == 0 || n == 0 || k == 0 {
        return vec![None; k];
    }
    let mut rng = Xoshiro256::seed_from(stream_seed(seed, key));
    let mut stats: Vec<Vec<f64>> = vec![Vec::with_capacity(draws); k];
    let mut idx = vec![0usize; n];
    for _ in 0..draws {
        for slot in idx.iter_mut() {
            *slot = rng.below(n);
        }
        for (col, out) in columns.iter().zip(stats.iter_mut()) {
            let (mut num, mut den) = (0.0, 0.0);
            for &t in &idx {
                num += col.num[t];
                den += col.den[t];
            }
            if den != 0.0 {
                out.push(num / den);
            }
        }
    }
    stats
        .into_iter()
        .map(|mut v| {
            if v.is_empty() {
                return None;
            }
            let undefined_draws = draws - v.len();
            v.sort_by(f64::total_cmp);
            Some(Interval {
                lo: quantile_sorted(&v, 0.025),
                hi: quantile_sorted(&v, 0.975),
                undefined_draws,
            })
        })
        .collect()
}

/// Quantile of sorted data with linear interpolation between order
/// statistics (Hyndman and Fan type 7, the default of R and NumPy).
pub fn quantile_sorted(v: &[f64], p: f64) -> f64 {
    assert!(!v.is_empty(), "quantile of no data");
    let h = (v.len() - 1) as f64 * p;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(v.len() - 1);
    v[lo] + (h - lo as f64) * (v[hi] - v[lo])
}

/// Median (mean of the two middle values for an even count).
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// Mean, `None` for no data.
pub fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_and_xoshiro_reference_values() {
        // SplitMix64 from seed 0: the published first outputs.
        let mut sm = SplitMix64::new(0);
        assert_eq!(sm.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(sm.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        // xoshiro256** from state [1, 2, 3, 4]: reference output 11520, 0, 1509978240.
        let mut x = Xoshiro256 { s: [1, 2, 3, 4] };
        assert_eq!(x.next_u64(), 11520);
        assert_eq!(x.next_u64(), 0);
        assert_eq!(x.next_u64(), 1_509_978_240);
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut r = Xoshiro256::seed_from(7);
        let mut counts = [0usize; 3];
        for _ in 0..30_000 {
            counts[r.below(3)] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn quantiles_and_medians() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(quantile_sorted(&v, 0.0), 1.0);
        assert_eq!(quantile_sorted(&v, 0.5), 3.0);
        assert_eq!(quantile_sorted(&v, 0.25), 2.0);
        assert_eq!(quantile_sorted(&v, 0.975), 4.9);
        assert_eq!(quantile_sorted(&[2.0], 0.025), 2.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn bootstrap_is_deterministic_per_seed_and_key() {
        // Irregular values, so that different resamples give different quantiles.
        let values: Vec<Option<f64>> = (0..30)
            .map(|i| Some(((i * i * 7919) % 1000) as f64 / 1000.0))
            .collect();
        let col = Column::mean_of(&values);
        let mid = col.point().unwrap();
        let a = bootstrap(std::slice::from_ref(&col), 2000, 42, "k");
        let b = bootstrap(std::slice::from_ref(&col), 2000, 42, "k");
        let c = bootstrap(std::slice::from_ref(&col), 2000, 43, "k");
        let d = bootstrap(std::slice::from_ref(&col), 2000, 42, "other");
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
        let iv = a[0].unwrap();
        assert!(
            iv.lo < mid && iv.hi > mid && iv.lo >= 0.0 && iv.hi <= 1.0,
            "{iv:?}"
        );
        // Adding a column does not change the draws seen by the first.
        let both = bootstrap(&[col.clone(), col], 2000, 42, "k");
        assert_eq!(both[0], a[0]);
    }

    #[test]
    fn columns_share_one_resample() {
        // Two sides differing by exactly 0.25 on every task: the difference
        // has a zero-width interval only if both sides see the same draws.
        let x = [0.0, 0.25, 0.5, 0.75, 1.0, 0.5];
        let left = Column::mean_of(&x.map(Some));
        let right = Column::mean_of(&x.map(|v| Some(v + 0.25)));
        let diff = Column::mean_of(&x.map(|_| Some(0.25)));
        let iv = bootstrap(&[left, right, diff], 1000, 9, "pair");
        let (l, r, d) = (iv[0].unwrap(), iv[1].unwrap(), iv[2].unwrap());
        assert!(l.hi - l.lo > 0.1);
        assert_eq!((r.lo - l.lo, r.hi - l.hi), (0.25, 0.25));
        assert_eq!((d.lo, d.hi), (0.25, 0.25));
    }

    #[test]
    fn ratio_columns_skip_undefined_draws() {
        // Denominator nonzero on one task of ten: many resamples miss it.
        let mut c = Column::zeros(10);
        c.num[3] = 0.5;
        c.den[3] = 1.0;
        assert_eq!(c.point(), Some(0.5));
        assert_eq!(c.support(), 1);
        let iv = bootstrap(&[c], 1000, 1, "r")[0].unwrap();
        assert_eq!((iv.lo, iv.hi), (0.5, 0.5));
        // P(task 3 never drawn) = 0.9^10 ~ 0.35.
        assert!(
            (250..450).contains(&iv.undefined_draws),
            "{}",
            iv.undefined_draws
        );
        assert_eq!(bootstrap(&[Column::zeros(4)], 100, 1, "z"), vec![None]);
        assert_eq!(bootstrap(&[Column::zeros(4)], 0, 1, "z"), vec![None]);
    }
}
