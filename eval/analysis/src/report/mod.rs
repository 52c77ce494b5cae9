//! Writing an [`Analysis`] out: a Markdown report, a self-contained HTML
//! page (inline CSS and inline SVG, no external resources), one CSV per
//! table and figure, one SVG file per figure; or a single JSON document.
//!
//! Every table is built once as a [`Table`] holding both a CSV form (one
//! column per number, full precision, empty for undefined) and a display
//! form (rounded, interval next to the estimate, "undefined" spelled out),
//! so the three outputs cannot disagree. Files are written atomically
//! (temporary file, then rename).

pub(crate) mod csv;
mod document;
mod figures;
mod format;
mod html;
mod markdown;
mod svg;
mod tables;

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::analysis::Analysis;
use crate::error::AnalysisError;

pub(crate) use figures::Figure;
pub use tables::Table;

/// What [`write_report`] produces.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Format {
    /// `report.md`, `report.html`, one CSV per table and figure, one SVG per figure.
    #[default]
    Report,
    /// `analysis.json`: the whole analysis for machines.
    Json,
}

/// Write the report files into `out` (created if needed) and return their
/// paths.
pub fn write_report(
    a: &Analysis,
    out: &Path,
    format: Format,
) -> Result<Vec<PathBuf>, AnalysisError> {
    fs::create_dir_all(out).map_err(|e| AnalysisError::io("creating", out, e))?;
    let mut written = Vec::new();
    match format {
        Format::Json => {
            let json = serde_json::to_vec_pretty(a).map_err(AnalysisError::Serialize)?;
            written.push(write_atomic(&out.join("analysis.json"), &json)?);
        }
        Format::Report => {
            let tables = tables::build(a);
            let figures = figures::figures(a);
            for t in &tables {
                written.push(write_atomic(
                    &out.join(format!("{}.csv", t.name)),
                    csv::render(t).as_bytes(),
                )?);
            }
            for f in &figures {
                let standalone =
                    f.svg
                        .replacen("<svg ", "<svg xmlns=\"http://www.w3.org/2000/svg\" ", 1);
                written.push(write_atomic(&out.join(f.file), standalone.as_bytes())?);
            }
            let md = markdown::render(a, &tables, &figures);
            written.push(write_atomic(&out.join("report.md"), md.as_bytes())?);
            let html = html::render(a, &tables, &figures);
            written.push(write_atomic(&out.join("report.html"), html.as_bytes())?);
        }
    }
    Ok(written)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<PathBuf, AnalysisError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("out");
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(AnalysisError::io("writing", path, e));
    }
    Ok(path.to_path_buf())
}

/// Escape text for HTML and SVG.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
