//! Rendering the report's document model to Markdown (`report.md`): tables
//! as pipe tables of their display form, figures as image links to their
//! SVG files, every table followed by its notes and the name of its CSV.

use std::fmt::Write;

use super::document::{document, rows_shown, Block};
use super::tables::Table;
use super::Figure;
use crate::analysis::Analysis;

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The whole report as Markdown.
pub(crate) fn render(a: &Analysis, tables: &[Table], figures: &[Figure]) -> String {
    let mut out = String::new();
    for block in document(a, tables, figures) {
        match block {
            Block::H1(s) => {
                let _ = writeln!(out, "# {s}\n");
            }
            Block::H2(s) => {
                let _ = writeln!(out, "## {s}\n");
            }
            Block::H3(s) => {
                let _ = writeln!(out, "### {s}\n");
            }
            Block::Para(s) => {
                let _ = writeln!(out, "{s}\n");
            }
            Block::List(items) => {
                for i in items {
                    let _ = writeln!(out, "- {i}");
                }
                out.push('\n');
            }
            Block::Figure(f) => {
                let _ = writeln!(out, "![{}]({})\n", f.title, f.file);
            }
            Block::Table(t) => table(&mut out, t),
        }
    }
    out
}

/// A table with its notes and data pointer; a table without rows is one line.
fn table(out: &mut String, t: &Table) {
    if t.view_rows.is_empty() {
        let _ = writeln!(out, "_No rows._ (`{}.csv`)\n", t.name);
        return;
    }
    let header: Vec<String> = t.view_header.iter().map(|h| md_cell(h)).collect();
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
    let shown = rows_shown(t);
    for row in t.view_rows.iter().take(shown) {
        let cells: Vec<String> = row.iter().map(|c| md_cell(c)).collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    if t.view_rows.len() > shown {
        let _ = writeln!(
            out,
            "\n... and {} more rows in `{}.csv`.",
            t.view_rows.len() - shown,
            t.name
        );
    }
    out.push('\n');
    for n in &t.notes {
        let _ = writeln!(out, "{n}\n");
    }
    let _ = writeln!(out, "Data: `{}.csv`.\n", t.name);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo(name: &'static str, rows: Vec<Vec<&str>>) -> Table {
        let mut t = Table::new(name, "Demo", &["agent", "value"], &["Agent", "Value"]);
        t.view_rows = rows
            .into_iter()
            .map(|r| r.into_iter().map(String::from).collect())
            .collect();
        t
    }

    #[test]
    fn table_as_pipe_table_with_notes() {
        let mut t = demo("demo", vec![vec!["a|b", "1.0%"], vec!["c\nd", "undefined"]]);
        t.notes.push("Note with `code`.".into());
        let mut out = String::new();
        table(&mut out, &t);
        assert_eq!(
            out,
            "| Agent | Value |\n\
             |---|---|\n\
             | a\\|b | 1.0% |\n\
             | c d | undefined |\n\
             \n\
             Note with `code`.\n\
             \n\
             Data: `demo.csv`.\n\
             \n"
        );
    }

    #[test]
    fn empty_table_is_one_line() {
        let mut out = String::new();
        table(&mut out, &demo("demo", vec![]));
        assert_eq!(out, "_No rows._ (`demo.csv`)\n\n");
    }

    #[test]
    fn exclusions_are_cut_after_200_rows() {
        let t = demo("exclusions", vec![vec!["x", "y"]; 203]);
        let mut out = String::new();
        table(&mut out, &t);
        assert_eq!(out.matches("| x | y |").count(), 200);
        assert!(out.contains("| x | y |\n\n... and 3 more rows in `exclusions.csv`.\n\nData:"));
        // Any other table is listed whole.
        let mut out = String::new();
        table(&mut out, &demo("other", vec![vec!["x", "y"]; 203]));
        assert_eq!(out.matches("| x | y |").count(), 203);
        assert!(!out.contains("more rows"));
    }

    #[test]
    fn document_sections_in_order() {
        use crate::testutil::two_task_residuals;
        use crate::{analyze, Options};
        let a = analyze(
            &two_task_residuals("A"),
            &Options {
                draws: 0,
                ..Options::default()
            },
        );
        let tables = crate::report::tables::build(&a);
        let figures = crate::report::figures::figures(&a);
        let md = render(&a, &tables, &figures);
        let headings: Vec<&str> = md.lines().filter(|l| l.starts_with('#')).collect();
        assert_eq!(
            headings,
            [
                "# forkd evaluation report",
                "## Trial outcomes",
                "## Inherited starts",
                "### Clean vs residual start",
                "### By predecessor",
                "### Behaviour signatures",
                "## Recovery",
                "## Left out of the numbers",
                "## Definitions",
            ]
        );
        assert!(md.contains(
            "\n![Clean vs residual start, per agent (95% CI)](clean_vs_residual.svg)\n\n"
        ));
        assert!(md.contains("\n| A | 2 (2) | 100.0% | 25.0% | +75.0 | 75.0% (n=2) | 0 |\n"));
        assert!(md.contains("\nNo rescue or pristine-control trials.\n"));
        assert!(md.contains("\nNothing: every task in scope entered every number.\n"));
    }
}
