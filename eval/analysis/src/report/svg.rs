//! Hand-written SVG charts: horizontal dot-and-whisker plots (estimates with
//! intervals, forest plots) and grouped horizontal bars. Every chart is one
//! `<svg>` element with a `viewBox`, fixed fonts and no external resources,
//! so it can be inlined in HTML or written as a file.

use std::fmt::Write;

use super::esc;

/// Okabe-Ito colours, readable with colour-vision deficiencies.
const PALETTE: [&str; 6] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
];

const WIDTH: f64 = 760.0;
const LEFT: f64 = 200.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 56.0;
const BOTTOM: f64 = 46.0;

/// One value of one series on a row.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub series: usize,
    pub value: Option<f64>,
    pub lo: Option<f64>,
    pub hi: Option<f64>,
}

#[derive(Debug, Clone)]
pub struct Row {
    pub label: String,
    pub points: Vec<Point>,
    /// Drawn as a summary row (bold label, diamond marker).
    pub emphasis: bool,
}

pub struct Axis {
    pub min: f64,
    pub max: f64,
    pub label: String,
    /// Formats a tick value.
    pub fmt: fn(f64) -> String,
    /// Formats a value in a tooltip (usually more precise than a tick).
    pub tip: fn(f64) -> String,
    /// Draw a reference line at zero.
    pub zero_line: bool,
}

impl Axis {
    /// A range that covers every value and interval end (and zero when a
    /// zero line is wanted), padded by 5%.
    pub fn fit(
        rows: &[Row],
        label: &str,
        fmt: fn(f64) -> String,
        tip: fn(f64) -> String,
        zero_line: bool,
    ) -> Axis {
        let mut lo = f64::INFINITY;
        let mut hi = f64::NEG_INFINITY;
        for p in rows.iter().flat_map(|r| &r.points) {
            for v in [p.value, p.lo, p.hi].into_iter().flatten() {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
        if zero_line || !lo.is_finite() {
            lo = lo.min(0.0);
            hi = hi.max(0.0);
        }
        if hi - lo < 1e-9 {
            lo -= 0.05;
            hi += 0.05;
        }
        let pad = (hi - lo) * 0.05;
        Axis {
            min: lo - pad,
            max: hi + pad,
            label: label.to_string(),
            fmt,
            tip,
            zero_line,
        }
    }
}

fn x_of(axis: &Axis, v: f64) -> f64 {
    let w = WIDTH - LEFT - RIGHT;
    LEFT + (v - axis.min) / (axis.max - axis.min) * w
}

/// About five round tick values inside the axis range.
fn ticks(axis: &Axis) -> Vec<f64> {
    let range = axis.max - axis.min;
    let raw = range / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut t = (axis.min / step).ceil() * step;
    let mut out = Vec::new();
    while t <= axis.max + step * 1e-9 {
        // Avoid printing -0.
        out.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    out
}

/// Title, legend, alternating row stripes `(y, height)`, grid and axis.
fn frame(
    out: &mut String,
    title: &str,
    series: &[&str],
    height: f64,
    axis: &Axis,
    stripes: &[(f64, f64)],
) {
    let _ = write!(
        out,
        "<svg class=\"chart\" viewBox=\"0 0 {WIDTH} {height}\" width=\"{WIDTH}\" height=\"{height}\" role=\"img\" \
         font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\"><title>{}</title>",
        esc(title)
    );
    let _ = write!(
        out,
        "<text x=\"{}\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{}</text>",
        10,
        esc(title)
    );
    let mut x = LEFT;
    for (i, s) in series.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        let _ = write!(
            out,
            "<circle cx=\"{:.1}\" cy=\"36\" r=\"5\" fill=\"{c}\"/><text x=\"{:.1}\" y=\"40\">{}</text>",
            x,
            x + 9.0,
            esc(s)
        );
        x += 24.0 + 7.0 * s.chars().count() as f64;
    }
    for (y, h) in stripes {
        let _ = write!(
            out,
            "<rect x=\"{LEFT}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"#f4f4f4\"/>",
            WIDTH - LEFT - RIGHT
        );
    }
    let bottom = height - BOTTOM;
    for t in ticks(axis) {
        let tx = x_of(axis, t);
        let _ = write!(
            out,
            "<line x1=\"{tx:.1}\" y1=\"{TOP}\" x2=\"{tx:.1}\" y2=\"{bottom:.1}\" stroke=\"#e4e4e4\"/>\
             <text x=\"{tx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#444\">{}</text>",
            bottom + 16.0,
            esc(&(axis.fmt)(t))
        );
    }
    if axis.zero_line && axis.min <= 0.0 && axis.max >= 0.0 {
        let zx = x_of(axis, 0.0);
        let _ = write!(
            out,
            "<line x1=\"{zx:.1}\" y1=\"{TOP}\" x2=\"{zx:.1}\" y2=\"{bottom:.1}\" stroke=\"#222\" stroke-dasharray=\"4 3\"/>"
        );
    }
    let _ = write!(
        out,
        "<line x1=\"{LEFT}\" y1=\"{bottom:.1}\" x2=\"{:.1}\" y2=\"{bottom:.1}\" stroke=\"#888\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#222\">{}</text>",
        WIDTH - RIGHT,
        (LEFT + WIDTH - RIGHT) / 2.0,
        height - 8.0,
        esc(&axis.label)
    );
}

/// Every other row gets a light background.
fn stripes(rows: usize, row_h: f64) -> Vec<(f64, f64)> {
    (0..rows)
        .filter(|i| i % 2 == 1)
        .map(|i| (TOP + row_h * i as f64, row_h))
        .collect()
}

fn row_label(out: &mut String, row: &Row, y: f64) {
    let weight = if row.emphasis {
        " font-weight=\"bold\""
    } else {
        ""
    };
    let _ = write!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\"{weight}>{}</text>",
        LEFT - 8.0,
        y + 4.0,
        esc(&row.label)
    );
}

/// Estimates with interval whiskers, one row per label.
pub fn dot_whisker(title: &str, series: &[&str], rows: &[Row], axis: &Axis) -> String {
    // Points of a row are stacked in the order given, 10 px apart.
    let slots = rows
        .iter()
        .map(|r| r.points.len())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let row_h = 10.0 + 10.0 * slots;
    let height = TOP + BOTTOM + row_h * rows.len().max(1) as f64;
    let mut out = String::new();
    frame(
        &mut out,
        title,
        series,
        height,
        axis,
        &stripes(rows.len(), row_h),
    );
    for (i, row) in rows.iter().enumerate() {
        let y0 = TOP + row_h * i as f64;
        let mid = y0 + row_h / 2.0;
        row_label(&mut out, row, mid);
        let n = row.points.len() as f64;
        for (j, p) in row.points.iter().enumerate() {
            let c = PALETTE[p.series % PALETTE.len()];
            let offset = (j as f64 - (n - 1.0) / 2.0) * 10.0;
            let y = mid + offset;
            if let (Some(lo), Some(hi)) = (p.lo, p.hi) {
                let (x1, x2) = (x_of(axis, lo), x_of(axis, hi));
                let _ = write!(
                    out,
                    "<line x1=\"{x1:.1}\" y1=\"{y:.1}\" x2=\"{x2:.1}\" y2=\"{y:.1}\" stroke=\"{c}\" stroke-width=\"2\"/>\
                     <line x1=\"{x1:.1}\" y1=\"{:.1}\" x2=\"{x1:.1}\" y2=\"{:.1}\" stroke=\"{c}\" stroke-width=\"2\"/>\
                     <line x1=\"{x2:.1}\" y1=\"{:.1}\" x2=\"{x2:.1}\" y2=\"{:.1}\" stroke=\"{c}\" stroke-width=\"2\"/>",
                    y - 4.0,
                    y + 4.0,
                    y - 4.0,
                    y + 4.0
                );
            }
            match p.value {
                Some(v) => {
                    let x = x_of(axis, v);
                    let tip = match (p.lo, p.hi) {
                        (Some(lo), Some(hi)) => format!(
                            "{}: {} [{}, {}]",
                            series.get(p.series).unwrap_or(&""),
                            (axis.tip)(v),
                            (axis.tip)(lo),
                            (axis.tip)(hi)
                        ),
                        _ => format!("{}: {}", series.get(p.series).unwrap_or(&""), (axis.tip)(v)),
                    };
                    if row.emphasis {
                        let _ = write!(
                            out,
                            "<path d=\"M{:.1} {y:.1} L{x:.1} {:.1} L{:.1} {y:.1} L{x:.1} {:.1} Z\" fill=\"{c}\"><title>{}</title></path>",
                            x - 7.0,
                            y - 6.0,
                            x + 7.0,
                            y + 6.0,
                            esc(&tip)
                        );
                    } else {
                        let _ = write!(
                            out,
                            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4.5\" fill=\"{c}\"><title>{}</title></circle>",
                            esc(&tip)
                        );
                    }
                }
                None => {
                    let _ = write!(
                        out,
                        "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#888\" font-style=\"italic\">undefined</text>",
                        LEFT + 6.0,
                        y + 4.0
                    );
                }
            }
        }
    }
    out.push_str("</svg>");
    out
}

/// Grouped horizontal bars from zero, one group per row.
pub fn bars(title: &str, series: &[&str], rows: &[Row], axis: &Axis) -> String {
    let per_series = series.len().max(1) as f64;
    let bar_h = 9.0;
    let row_h = 12.0 + bar_h * per_series;
    let height = TOP + BOTTOM + row_h * rows.len().max(1) as f64;
    let mut out = String::new();
    frame(
        &mut out,
        title,
        series,
        height,
        axis,
        &stripes(rows.len(), row_h),
    );
    let x0 = x_of(axis, 0.0_f64.max(axis.min));
    for (i, row) in rows.iter().enumerate() {
        let y0 = TOP + row_h * i as f64 + 6.0;
        row_label(&mut out, row, y0 + bar_h * per_series / 2.0);
        for p in &row.points {
            let c = PALETTE[p.series % PALETTE.len()];
            let y = y0 + bar_h * p.series as f64;
            match p.value {
                Some(v) => {
                    let x = x_of(axis, v);
                    let (xa, w) = if x >= x0 { (x0, x - x0) } else { (x, x0 - x) };
                    let _ = write!(
                        out,
                        "<rect x=\"{xa:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{c}\"><title>{}: {}</title></rect>",
                        w.max(0.5),
                        bar_h - 1.5,
                        esc(series.get(p.series).unwrap_or(&"")),
                        esc(&(axis.tip)(v))
                    );
                }
                None => {
                    let _ = write!(
                        out,
                        "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#888\" font-size=\"9\" font-style=\"italic\">{}: undefined</text>",
                        x0 + 4.0,
                        y + bar_h - 2.0,
                        esc(series.get(p.series).unwrap_or(&""))
                    );
                }
            }
        }
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pct(v: f64) -> String {
        format!("{:.0}%", v * 100.0)
    }

    #[test]
    fn ticks_are_round_and_in_range() {
        let axis = Axis {
            min: -0.05,
            max: 1.05,
            label: String::new(),
            fmt: pct,
            tip: pct,
            zero_line: false,
        };
        assert_eq!(ticks(&axis), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        let axis = Axis {
            min: -0.13,
            max: 0.07,
            label: String::new(),
            fmt: pct,
            tip: pct,
            zero_line: true,
        };
        let t = ticks(&axis);
        assert!(
            t.contains(&0.0) && t.iter().all(|v| *v >= -0.13 && *v <= 0.07),
            "{t:?}"
        );
    }

    #[test]
    fn charts_escape_text_and_mark_undefined_values() {
        let rows = vec![Row {
            label: "a<b>&c".into(),
            points: vec![
                Point {
                    series: 0,
                    value: Some(0.5),
                    lo: Some(0.4),
                    hi: Some(0.6),
                },
                Point {
                    series: 1,
                    value: None,
                    lo: None,
                    hi: None,
                },
            ],
            emphasis: false,
        }];
        let axis = Axis::fit(&rows, "x", pct, pct, false);
        let svg = dot_whisker("t", &["one", "two"], &rows, &axis);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("a&lt;b&gt;&amp;c"));
        assert!(svg.contains("undefined"));
        assert!(svg.contains("one: 50% [40%, 60%]"));
        let svg = bars("t", &["one", "two"], &rows, &axis);
        assert!(svg.contains("<rect") && svg.contains("two: undefined"));
    }
}
