//! The report's figures: which charts an [`Analysis`] gets and the data
//! behind each (clean vs residual per agent and per predecessor, behaviour
//! signatures, rescue success, the contrasts forest), assembled from the
//! chart primitives of [`super::svg`].

use super::format::{pct, pct0, rate, ratio_axis, signed};
use super::svg::{bars, dot_whisker, Axis, Point, Row};
use super::tables::contrast_kinds;
use crate::analysis::{Analysis, Estimate, InheritedRow};

/// A chart and the table behind it.
pub(crate) struct Figure {
    pub file: &'static str,
    pub title: String,
    pub svg: String,
    pub table: &'static str,
}

fn point(series: usize, e: &Estimate) -> Point {
    Point {
        series,
        value: e.value,
        lo: e.ci.map(|c| c.lo),
        hi: e.ci.map(|c| c.hi),
    }
}

/// A [0, 1] axis, in percent (inherited starts) or as a rate (recovery,
/// matching its tables).
fn rate_axis(label: &str, as_rate: bool) -> Axis {
    Axis {
        min: -0.02,
        max: 1.02,
        label: label.to_string(),
        fmt: if as_rate { ratio_axis } else { pct0 },
        tip: if as_rate { rate } else { pct },
        zero_line: false,
    }
}

/// Every figure of the report, in report order; charts with no data are
/// left out.
pub(crate) fn figures(a: &Analysis) -> Vec<Figure> {
    let mut out = Vec::new();
    let clean_res = |rows: &[InheritedRow], with_pred: bool| -> Vec<Row> {
        rows.iter()
            .map(|r| Row {
                label: match (&r.predecessor, with_pred) {
                    (Some(p), true) => format!("{} <- {p}", r.agent),
                    _ => r.agent.clone(),
                },
                points: vec![point(0, &r.clean), point(1, &r.residual)],
                emphasis: false,
            })
            .collect()
    };
    if !a.inherited.by_agent.is_empty() {
        let title = "Clean vs residual start, per agent (95% CI)";
        out.push(Figure {
            file: "clean_vs_residual.svg",
            title: title.into(),
            svg: dot_whisker(
                title,
                &["Clean", "Residual"],
                &clean_res(&a.inherited.by_agent, false),
                &rate_axis("success rate", false),
            ),
            table: "inherited_by_agent",
        });
    }
    if !a.inherited.by_predecessor.is_empty() {
        let title = "Clean vs residual start, by predecessor (agent <- predecessor)";
        out.push(Figure {
            file: "clean_vs_residual_by_predecessor.svg",
            title: title.into(),
            svg: dot_whisker(
                title,
                &["Clean", "Residual"],
                &clean_res(&a.inherited.by_predecessor, true),
                &rate_axis("success rate", false),
            ),
            table: "inherited_by_predecessor",
        });
    }
    let overall: Vec<_> = a
        .inherited
        .signatures
        .iter()
        .filter(|s| s.predecessor.is_none())
        .collect();
    if !overall.is_empty() {
        let rows: Vec<Row> = overall
            .iter()
            .map(|s| {
                let v = |i: usize, value: Option<f64>| Point {
                    series: i,
                    value,
                    lo: None,
                    hi: None,
                };
                Row {
                    label: s.agent.clone(),
                    points: vec![
                        v(0, s.same_failing.value),
                        v(1, s.kept.value),
                        v(2, s.left_out.opened.value),
                        v(3, s.left_out.changed.value),
                        v(4, s.left_out.clean_changed.value),
                    ],
                    emphasis: false,
                }
            })
            .collect();
        let title = "Behaviour signatures of residual continuations";
        out.push(Figure {
            file: "signatures.svg",
            title: title.into(),
            svg: bars(
                title,
                &[
                    "same-failing",
                    "kept lines",
                    "left-out opened",
                    "left-out changed",
                    "clean runs changed",
                ],
                &rows,
                &rate_axis("share", false),
            ),
            table: "signatures",
        });
    }
    if !a.recovery.directions.is_empty() {
        let rows: Vec<Row> = a
            .recovery
            .directions
            .iter()
            .map(|d| Row {
                label: format!("{}->{}", d.predecessor, d.rescuer),
                points: vec![
                    point(0, &d.rescue),
                    point(1, &d.rescue_note),
                    point(2, &d.control),
                ],
                emphasis: false,
            })
            .collect();
        let title = "Rescue success per direction A->B (95% CI)";
        out.push(Figure {
            file: "rescue_success.svg",
            title: title.into(),
            svg: dot_whisker(
                title,
                &["R(A->B)", "Rnote(A->B)", "C(B)"],
                &rows,
                &rate_axis("success rate", true),
            ),
            table: "recovery_success",
        });
        let mut rows = Vec::new();
        for (i, (kind, pick)) in contrast_kinds().into_iter().enumerate() {
            for d in &a.recovery.directions {
                if let Some(c) = pick(d) {
                    rows.push(Row {
                        label: format!("{kind} {}->{}", d.predecessor, d.rescuer),
                        points: vec![point(i, &c.estimate)],
                        emphasis: false,
                    });
                }
            }
            for p in &a.recovery.pooled {
                let e = match kind {
                    "HRG" => &p.hrg,
                    "FTV" => &p.ftv,
                    _ => &p.ctv,
                };
                rows.push(Row {
                    label: format!("{kind} pooled {}", p.scope),
                    points: vec![point(i, e)],
                    emphasis: true,
                });
            }
        }
        let title = "Recovery contrasts (95% CI; diamonds: pooled)";
        let axis = Axis::fit(
            &rows,
            "difference in success rate",
            ratio_axis,
            signed,
            true,
        );
        out.push(Figure {
            file: "contrasts_forest.svg",
            title: title.into(),
            svg: dot_whisker(title, &["HRG", "FTV", "CTV"], &rows, &axis),
            table: "recovery_contrasts",
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::two_task_residuals;
    use crate::{analyze, Options};

    #[test]
    fn inherited_figures_from_a_small_analysis() {
        let opts = Options {
            draws: 0,
            ..Options::default()
        };
        let a = analyze(&two_task_residuals("A"), &opts);
        let figs = figures(&a);
        // No rescue or control trials: no recovery figures.
        let files: Vec<&str> = figs.iter().map(|f| f.file).collect();
        assert_eq!(
            files,
            [
                "clean_vs_residual.svg",
                "clean_vs_residual_by_predecessor.svg",
                "signatures.svg"
            ]
        );
        let tables: Vec<&str> = figs.iter().map(|f| f.table).collect();
        assert_eq!(
            tables,
            [
                "inherited_by_agent",
                "inherited_by_predecessor",
                "signatures"
            ]
        );
        let f = &figs[0];
        assert_eq!(f.title, "Clean vs residual start, per agent (95% CI)");
        // One dot per series, tooltips in percent; no interval without draws.
        assert!(f.svg.starts_with("<svg "));
        assert!(f.svg.contains("<title>Clean: 100.0%</title>"));
        assert!(f.svg.contains("<title>Residual: 25.0%</title>"));
        assert!(!f.svg.contains("% ["));
        // The by-predecessor rows are labelled "agent <- predecessor", escaped.
        assert!(figs[1].svg.contains(">A &lt;- P</text>"));
    }
}
