//! Number and cell formatting shared by the tables and the figures: the raw
//! CSV form of an estimate (full precision, empty when undefined) and the
//! rounded display forms (percent, percentage points, rates, signed
//! differences, shares and means with their counts).

use crate::analysis::{Estimate, Mean, Share};

pub(super) fn raw(v: Option<f64>) -> String {
    v.map(|v| format!("{v}")).unwrap_or_default()
}

pub(super) fn est_csv(e: &Estimate) -> Vec<String> {
    vec![
        raw(e.value),
        raw(e.ci.map(|c| c.lo)),
        raw(e.ci.map(|c| c.hi)),
        e.tasks.to_string(),
    ]
}

pub(super) fn est_hdr(p: &str) -> Vec<String> {
    vec![
        p.to_string(),
        format!("{p}_lo"),
        format!("{p}_hi"),
        format!("{p}_tasks"),
    ]
}

pub(super) fn with_ci(e: &Estimate, f: impl Fn(f64) -> String) -> String {
    match (e.value, e.ci) {
        (None, _) => "undefined".into(),
        (Some(v), Some(ci)) => format!("{} [{}, {}]", f(v), f(ci.lo), f(ci.hi)),
        (Some(v), None) => f(v),
    }
}

pub(super) fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

pub(super) fn pct0(v: f64) -> String {
    format!("{:.0}%", v * 100.0)
}

pub(super) fn pp(v: f64) -> String {
    format!("{v:+.1}")
}

pub(super) fn rate(v: f64) -> String {
    format!("{v:.3}")
}

pub(super) fn signed(v: f64) -> String {
    // Keep "+0.000" from printing as "-0.000".
    let v = if v.abs() < 5e-4 { 0.0 } else { v };
    format!("{v:+.3}")
}

pub(super) fn ratio_axis(v: f64) -> String {
    format!("{v:.2}")
}

pub(super) fn share_view(s: &Share) -> String {
    let unknown = if s.unknown > 0 {
        format!("; {} unknown", s.unknown)
    } else {
        String::new()
    };
    match s.value {
        Some(v) => format!("{} ({}/{}{unknown})", pct(v), s.count, s.of),
        None => format!("undefined (0/0{unknown})"),
    }
}

pub(super) fn mean_view(m: &Mean) -> String {
    let undefined = if m.undefined > 0 {
        format!("; {} undefined", m.undefined)
    } else {
        String::new()
    };
    match m.value {
        Some(v) => format!("{} (n={}{undefined})", pct(v), m.n),
        None => format!("undefined (n=0{undefined})"),
    }
}

pub(super) fn opt_view(v: Option<f64>, f: fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "undefined".into())
}

pub(super) fn with_tasks(e: &Estimate, f: fn(f64) -> String) -> String {
    format!("{} (n={})", with_ci(e, f), e.tasks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Interval;

    fn est(value: Option<f64>, ci: Option<(f64, f64)>, tasks: usize) -> Estimate {
        Estimate {
            value,
            ci: ci.map(|(lo, hi)| Interval {
                lo,
                hi,
                undefined_draws: 0,
            }),
            tasks,
        }
    }

    #[test]
    fn estimates_in_csv_and_display_form() {
        let e = est(Some(0.25), Some((0.125, 0.5)), 4);
        assert_eq!(est_csv(&e), ["0.25", "0.125", "0.5", "4"]);
        assert_eq!(
            est_hdr("clean"),
            ["clean", "clean_lo", "clean_hi", "clean_tasks"]
        );
        assert_eq!(with_ci(&e, pct), "25.0% [12.5%, 50.0%]");
        assert_eq!(with_tasks(&e, rate), "0.250 [0.125, 0.500] (n=4)");
        let undefined = est(None, None, 0);
        assert_eq!(est_csv(&undefined), ["", "", "", "0"]);
        assert_eq!(with_ci(&undefined, pct), "undefined");
        assert_eq!(with_ci(&est(Some(-3.0), None, 2), pp), "-3.0");
    }

    #[test]
    fn signed_never_prints_negative_zero() {
        assert_eq!(signed(-0.0001), "+0.000");
        assert_eq!(signed(-0.0006), "-0.001");
        assert_eq!(signed(0.25), "+0.250");
        assert_eq!(pct0(0.5), "50%");
        assert_eq!(ratio_axis(0.5), "0.50");
    }

    #[test]
    fn shares_and_means_show_their_counts() {
        let s = Share {
            count: 1,
            of: 4,
            value: Some(0.25),
            unknown: 2,
        };
        assert_eq!(share_view(&s), "25.0% (1/4; 2 unknown)");
        let none = Share {
            count: 0,
            of: 0,
            value: None,
            unknown: 0,
        };
        assert_eq!(share_view(&none), "undefined (0/0)");
        let m = Mean {
            value: Some(0.5),
            n: 3,
            undefined: 0,
        };
        assert_eq!(mean_view(&m), "50.0% (n=3)");
        let m = Mean {
            value: None,
            n: 0,
            undefined: 1,
        };
        assert_eq!(mean_view(&m), "undefined (n=0; 1 undefined)");
        assert_eq!(opt_view(None, rate), "undefined");
        assert_eq!(opt_view(Some(1.0), rate), "1.000");
    }
}
