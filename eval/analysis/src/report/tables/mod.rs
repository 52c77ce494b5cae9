//! The report's tables: the [`Table`] model (a CSV form and a display form
//! of the same rows) and [`build`], which makes every table of an
//! [`Analysis`] in report order. The builders live by subject: trial
//! bookkeeping ([`runs`]), inherited starts ([`inherited`]) and recovery
//! ([`recovery`]).

mod inherited;
mod recovery;
mod runs;

use crate::analysis::Analysis;

pub(super) use recovery::contrast_kinds;

/// A table in two forms: CSV (raw numbers) and display (rounded text).
#[derive(Debug, Clone)]
pub struct Table {
    /// CSV file stem.
    pub name: &'static str,
    pub title: String,
    pub csv_header: Vec<String>,
    pub csv_rows: Vec<Vec<String>>,
    pub view_header: Vec<String>,
    pub view_rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

impl Table {
    pub(super) fn new(
        name: &'static str,
        title: &str,
        csv_header: &[&str],
        view_header: &[&str],
    ) -> Self {
        Table {
            name,
            title: title.to_string(),
            csv_header: csv_header.iter().map(|s| s.to_string()).collect(),
            csv_rows: Vec::new(),
            view_header: view_header.iter().map(|s| s.to_string()).collect(),
            view_rows: Vec::new(),
            notes: Vec::new(),
        }
    }
}

/// Every table of the report, in report order.
pub(crate) fn build(a: &Analysis) -> Vec<Table> {
    vec![
        runs::outcomes(a),
        inherited::inherited(a, false),
        inherited::inherited(a, true),
        inherited::signatures(a),
        recovery::rescue_success(a),
        recovery::contrasts(a),
        recovery::decomposition(a),
        recovery::pooled(a),
        runs::exclusions(a),
        runs::losses(a),
        runs::losses_by(a, false),
        runs::losses_by(a, true),
        runs::drops(a),
    ]
}
