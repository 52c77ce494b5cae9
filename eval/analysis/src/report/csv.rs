//! CSV per RFC 4180: comma separated, CRLF-free (`\n` line ends), fields
//! quoted when they contain a comma, a quote, or a line break, with quotes
//! doubled.

use super::Table;

/// One CSV field, quoted if it must be: the one quoting rule of every CSV forkd writes
/// (the report's tables, the evaluator's `results.csv`).
pub fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

pub(crate) fn render(t: &Table) -> String {
    let mut out = String::new();
    let line = |cells: &[String]| cells.iter().map(|c| field(c)).collect::<Vec<_>>().join(",");
    out.push_str(&line(&t.csv_header));
    out.push('\n');
    for row in &t.csv_rows {
        out.push_str(&line(row));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(field("plain"), "plain");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(field("two\nlines"), "\"two\nlines\"");
        assert_eq!(field("cr\rhere"), "\"cr\rhere\"");
        assert_eq!(field(""), "");
    }
}
