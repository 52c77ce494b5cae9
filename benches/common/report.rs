//! The report: rows of samples, checks, tables and sections, written as JSON for tools
//! and as markdown for people.

use super::stats::{fmt_ms, summarize, Summary};
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// One measured series.
pub struct Row {
    pub name: String,
    pub samples_us: Vec<u64>,
}

/// A ratio or threshold check, shown under the table.
pub struct Check {
    pub name: String,
    pub value: Option<f64>,
    /// How the value is printed, e.g. `0.041` or `0.52 ms`.
    pub shown: String,
    pub goal: String,
    pub met: Option<bool>,
}

/// A free-form markdown table: a view across rows (e.g. latency against size).
pub struct Table {
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: &str, header: &[&str], rows: Vec<Vec<String>>) -> Self {
        Table {
            title: title.into(),
            header: header.iter().map(|s| s.to_string()).collect(),
            rows,
        }
    }
}

/// The benchmark's results: rows of samples, checks, and free-form sections.
pub struct Report {
    pub benchmark: String,
    pub rows: Vec<Row>,
    pub checks: Vec<Check>,
    /// Extra tables, printed after the checks.
    pub tables: Vec<Table>,
    /// Extra markdown tables: (title, [(metric, value)]).
    pub sections: Vec<(String, Vec<(String, String)>)>,
    /// Everything else that goes into the JSON document.
    pub extra: serde_json::Map<String, Value>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn new(benchmark: &str) -> Report {
        Report {
            benchmark: benchmark.to_string(),
            rows: Vec::new(),
            checks: Vec::new(),
            tables: Vec::new(),
            sections: Vec::new(),
            extra: serde_json::Map::new(),
            notes: Vec::new(),
        }
    }

    pub fn row(&mut self, name: &str, samples_us: Vec<u64>) -> Summary {
        let s = summarize(&samples_us);
        self.rows.push(Row {
            name: name.to_string(),
            samples_us,
        });
        s
    }

    /// The summary of a row, if it exists and has samples.
    pub fn summary(&self, name: &str) -> Option<Summary> {
        self.rows
            .iter()
            .find(|r| r.name == name && !r.samples_us.is_empty())
            .map(|r| summarize(&r.samples_us))
    }

    pub fn p50(&self, name: &str) -> Option<u64> {
        self.rows
            .iter()
            .find(|r| r.name == name)
            .map(|r| summarize(&r.samples_us).p50)
    }

    pub fn to_json(&self, header: &Value) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                let s = summarize(&r.samples_us);
                json!({
                    "name": r.name,
                    "unit": "us",
                    "n": s.n,
                    "p50": s.p50,
                    "p90": s.p90,
                    "p99": s.p99,
                    "mean": (s.mean * 10.0).round() / 10.0,
                    "min": s.min,
                    "max": s.max,
                    "samples": r.samples_us,
                })
            })
            .collect();
        let checks: Vec<Value> = self
            .checks
            .iter()
            .map(|c| json!({ "name": c.name, "value": c.value, "goal": c.goal, "met": c.met }))
            .collect();
        let mut doc = serde_json::Map::new();
        doc.insert("benchmark".into(), json!(self.benchmark));
        if let Value::Object(h) = header {
            doc.extend(h.clone());
        }
        doc.insert("rows".into(), Value::Array(rows));
        doc.insert("checks".into(), Value::Array(checks));
        doc.extend(self.extra.clone());
        doc.insert("notes".into(), json!(self.notes));
        Value::Object(doc)
    }

    pub fn to_markdown(&self, title_line: &str) -> String {
        let mut md = format!("# forkd benchmark: {}\n\n{title_line}\n\n", self.benchmark);
        md.push_str(
            "| benchmark | n | p50 ms | p90 ms | p99 ms | mean ms | min ms | max ms |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.rows {
            let s = summarize(&r.samples_us);
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                r.name,
                s.n,
                fmt_ms(s.p50 as f64),
                fmt_ms(s.p90 as f64),
                fmt_ms(s.p99 as f64),
                fmt_ms(s.mean),
                fmt_ms(s.min as f64),
                fmt_ms(s.max as f64)
            ));
        }
        if !self.checks.is_empty() {
            md.push_str("\n| comparison | value | goal | met |\n|---|---:|---|---|\n");
            for c in &self.checks {
                let met = match c.met {
                    Some(true) => "yes",
                    Some(false) => "**no**",
                    None => "-",
                };
                md.push_str(&format!(
                    "| {} | {} | {} | {met} |\n",
                    c.name, c.shown, c.goal
                ));
            }
        }
        for t in &self.tables {
            md.push_str(&format!("\n**{}**\n\n", t.title));
            md.push_str(&format!("| {} |\n", t.header.join(" | ")));
            md.push_str(&format!(
                "|{}\n",
                t.header
                    .iter()
                    .enumerate()
                    .map(|(i, _)| if i == 0 { "---|" } else { "---:|" })
                    .collect::<String>()
            ));
            for r in &t.rows {
                md.push_str(&format!("| {} |\n", r.join(" | ")));
            }
        }
        for (title, items) in &self.sections {
            md.push_str(&format!(
                "\n**{title}**\n\n| metric | value |\n|---|---:|\n"
            ));
            for (k, v) in items {
                md.push_str(&format!("| {k} | {v} |\n"));
            }
        }
        if !self.notes.is_empty() {
            md.push('\n');
            for n in &self.notes {
                md.push_str(&format!("- {n}\n"));
            }
        }
        md
    }

    /// Writes `<target>/bench/<name>.json` and `.md`; returns their paths.
    pub fn write(&self, header: &Value, title_line: &str) -> Result<(PathBuf, PathBuf, String)> {
        let dir = bench_output_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let json_path = dir.join(format!("{}.json", self.benchmark));
        let md_path = dir.join(format!("{}.md", self.benchmark));
        let body = serde_json::to_string_pretty(&self.to_json(header))? + "\n";
        std::fs::write(&json_path, body)
            .with_context(|| format!("write {}", json_path.display()))?;
        let md = self.to_markdown(title_line);
        std::fs::write(&md_path, &md).with_context(|| format!("write {}", md_path.display()))?;
        Ok((json_path, md_path, md))
    }
}

/// Writes a benchmark's `NAME.json` and `NAME.md` to [`bench_output_dir`] and prints the
/// markdown.
pub fn write_outputs(name: &str, report: &Value, md: &str) -> Result<()> {
    let dir = bench_output_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let json_path = dir.join(format!("{name}.json"));
    std::fs::write(&json_path, serde_json::to_vec_pretty(report)?)
        .with_context(|| format!("write {}", json_path.display()))?;
    let md_path = dir.join(format!("{name}.md"));
    std::fs::write(&md_path, md).with_context(|| format!("write {}", md_path.display()))?;
    println!("{md}");
    Ok(())
}

/// `$CARGO_TARGET_DIR/bench`, or `target/bench` in the workspace.
pub fn bench_output_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|t| manifest.join(t))
        .unwrap_or_else(|| manifest.join("target"));
    target.join("bench")
}
