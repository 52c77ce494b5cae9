//! Rendering the report's document model to one self-contained HTML page
//! (`report.html`): inline CSS, figures as inline SVG, every text escaped
//! and `code` spans turned into `<code>`.

use std::fmt::Write;

use super::document::{document, rows_shown, Block};
use super::tables::Table;
use super::{esc, Figure};
use crate::analysis::Analysis;

/// HTML-escape text and turn `code` spans into `<code>`.
fn inline_html(s: &str) -> String {
    let mut out = String::new();
    for (i, part) in s.split('`').enumerate() {
        if i % 2 == 1 {
            let _ = write!(out, "<code>{}</code>", esc(part));
        } else {
            out.push_str(&esc(part));
        }
    }
    out
}

const CSS: &str = "body{font-family:Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}\
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}h3{margin-top:1.5em}\
table{border-collapse:collapse;margin:.8em 0;font-size:.88em}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}\
th{background:#f2f2f2}tr:nth-child(even) td{background:#fafafa}code{background:#f3f3f3;padding:0 .2em;border-radius:3px}\
figure{margin:1em 0}figcaption{font-size:.85em;color:#555}.note{font-size:.88em;color:#444}.chart{max-width:100%;height:auto}";

/// The whole report as one HTML page.
pub(crate) fn render(a: &Analysis, tables: &[Table], figures: &[Figure]) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" \
         content=\"width=device-width, initial-scale=1\"><title>forkd evaluation report</title><style>{CSS}</style></head><body>\n"
    );
    for block in document(a, tables, figures) {
        match block {
            Block::H1(s) => {
                let _ = writeln!(out, "<h1>{}</h1>", esc(&s));
            }
            Block::H2(s) => {
                let _ = writeln!(out, "<h2>{}</h2>", esc(&s));
            }
            Block::H3(s) => {
                let _ = writeln!(out, "<h3>{}</h3>", esc(&s));
            }
            Block::Para(s) => {
                let _ = writeln!(out, "<p>{}</p>", inline_html(&s));
            }
            Block::List(items) => {
                out.push_str("<ul>");
                for i in items {
                    let _ = write!(out, "<li>{}</li>", inline_html(&i));
                }
                out.push_str("</ul>\n");
            }
            Block::Figure(f) => {
                let _ = writeln!(
                    out,
                    "<figure>{}<figcaption>Data: <code>{}.csv</code></figcaption></figure>",
                    f.svg, f.table
                );
            }
            Block::Table(t) => table(&mut out, t),
        }
    }
    out.push_str("</body></html>\n");
    out
}

/// A table with its caption, notes and data pointer; a table without rows
/// is one line.
fn table(out: &mut String, t: &Table) {
    if t.view_rows.is_empty() {
        let _ = writeln!(
            out,
            "<p><em>No rows.</em> (<code>{}.csv</code>)</p>",
            t.name
        );
        return;
    }
    let _ = write!(
        out,
        "<table><caption>{}</caption><thead><tr>",
        esc(&t.title)
    );
    for h in &t.view_header {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>\n");
    let shown = rows_shown(t);
    for row in t.view_rows.iter().take(shown) {
        out.push_str("<tr>");
        for c in row {
            let _ = write!(out, "<td>{}</td>", esc(c));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table>\n");
    if t.view_rows.len() > shown {
        let _ = writeln!(
            out,
            "<p class=\"note\">... and {} more rows in <code>{}.csv</code>.</p>",
            t.view_rows.len() - shown,
            t.name
        );
    }
    for n in &t.notes {
        let _ = writeln!(out, "<p class=\"note\">{}</p>", inline_html(n));
    }
    let _ = writeln!(
        out,
        "<p class=\"note\">Data: <code>{}.csv</code></p>",
        t.name
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_titles_and_notes_are_escaped() {
        let mut t = Table::new("demo", "A < B & \"C\"", &["a"], &["<th>", "it's"]);
        t.view_rows
            .push(vec!["x < y & z".into(), "say \"hi\"".into()]);
        t.notes.push("see `a<b` & more".into());
        let mut out = String::new();
        table(&mut out, &t);
        assert!(out.contains("<caption>A &lt; B &amp; &quot;C&quot;</caption>"));
        assert!(out.contains("<th>&lt;th&gt;</th><th>it&#39;s</th>"));
        assert!(out.contains("<td>x &lt; y &amp; z</td><td>say &quot;hi&quot;</td>"));
        assert!(out.contains("<p class=\"note\">see <code>a&lt;b</code> &amp; more</p>"));
        assert_eq!(
            out,
            "<table><caption>A &lt; B &amp; &quot;C&quot;</caption><thead><tr>\
             <th>&lt;th&gt;</th><th>it&#39;s</th></tr></thead><tbody>\n\
             <tr><td>x &lt; y &amp; z</td><td>say &quot;hi&quot;</td></tr>\n\
             </tbody></table>\n\
             <p class=\"note\">see <code>a&lt;b</code> &amp; more</p>\n\
             <p class=\"note\">Data: <code>demo.csv</code></p>\n"
        );
    }

    #[test]
    fn empty_table_is_one_line() {
        let t = Table::new("demo", "Demo", &["a"], &["A"]);
        let mut out = String::new();
        table(&mut out, &t);
        assert_eq!(out, "<p><em>No rows.</em> (<code>demo.csv</code>)</p>\n");
    }

    #[test]
    fn a_hostile_agent_name_never_reaches_the_page_raw() {
        use crate::testutil::two_task_residuals;
        use crate::{analyze, Options};
        let name = "<b>&\"x\"";
        let a = analyze(
            &two_task_residuals(name),
            &Options {
                draws: 0,
                ..Options::default()
            },
        );
        let tables = crate::report::tables::build(&a);
        let figures = crate::report::figures::figures(&a);
        let page = render(&a, &tables, &figures);
        assert!(page.starts_with("<!DOCTYPE html>\n<html lang=\"en\">"));
        assert!(page.ends_with("</body></html>\n"));
        assert!(!page.contains(name));
        assert!(page.contains("<td>&lt;b&gt;&amp;&quot;x&quot;</td>"));
        // Inline code in paragraphs becomes <code>.
        assert!(page.contains("<code>infra_error</code>"));
    }
}
