//! End to end: a run directory on disk -> load -> analyze -> report files.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use forkd_analysis::{analyze, load_runs, write_report, AnalysisError, Format, Options};
use serde_json::{json, Value};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "forkd-analysis-{tag}-{}-{nanos}",
            std::process::id()
        ));
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

fn diff(files: &[(&str, &[&str])]) -> String {
    let mut out = String::new();
    for (path, lines) in files {
        out.push_str(&format!(
            "diff --git a/{path} b/{path}\nindex 0000000..1111111 100644\n--- a/{path}\n+++ b/{path}\n@@ -0,0 +1,{} @@\n",
            lines.len()
        ));
        for l in *lines {
            out.push_str(&format!("+{l}\n"));
        }
    }
    out
}

struct Trial {
    id: String,
    task: &'static str,
    condition: &'static str,
    state: &'static str,
    pred: Option<&'static str>,
    agent: &'static str,
    outcome: &'static str,
    steps: u64,
}

fn row(t: &Trial) -> Value {
    let submitted = matches!(t.outcome, "pass" | "fail");
    json!({
        "run_id": "run-1", "trial_id": t.id, "task": t.task, "condition": t.condition,
        "start_state": t.state, "predecessor": t.pred, "agent": t.agent, "replicate": 0,
        "outcome": t.outcome, "submitted": submitted,
        "tests": if t.outcome == "pass" { json!({"T1": "pass"}) } else { json!({"T1": "fail"}) },
        "steps": t.steps, "wall_ms": 1000, "infra_attempts": 1
    })
}

/// Two tasks (one with one state, one with two), agents A and B, clean and
/// residual trials with artifacts, and rescue trials on A's failures.
fn make_run(dir: &Path) {
    write(
        &dir.join("manifest.json"),
        r#"{"run_id": "run-1", "fingerprint": "abc"}"#,
    );
    for (task, files) in [("t1", vec!["a.go", "b.go"]), ("t2", vec!["c.go"])] {
        write(
            &dir.join(format!("tasks/{task}.json")),
            &json!({"task": task, "reference_changed_files": files, "f2p": ["T1"], "p2p": []})
                .to_string(),
        );
    }
    for (state, task) in [("s1", "t1"), ("s2a", "t2"), ("s2b", "t2")] {
        write(
            &dir.join(format!("states/{state}.json")),
            &json!({"state_id": state, "task": task, "predecessor": "P", "failing_tests": ["T1"], "patch": format!("{state}.patch")})
                .to_string(),
        );
        let file = if task == "t1" { "a.go" } else { "c.go" };
        write(
            &dir.join(format!("states/{state}.patch")),
            &diff(&[(file, &["l1", "l2"])]),
        );
    }
    let mut trials = Vec::new();
    let mut n = 0;
    let mut add = |task, condition, state, pred, agent, outcome, steps| {
        n += 1;
        trials.push(Trial {
            id: format!("tr{n:03}"),
            task,
            condition,
            state,
            pred,
            agent,
            outcome,
            steps,
        });
    };
    for agent in ["A", "B"] {
        add("t1", "clean", "clean", None, agent, "pass", 20);
        add(
            "t2",
            "clean",
            "clean",
            None,
            agent,
            if agent == "A" { "pass" } else { "fail" },
            40,
        );
        add("t1", "residual", "s1", Some("P"), agent, "fail", 10);
        add("t1", "residual", "s1", Some("P"), agent, "infra_error", 0);
        add("t2", "residual", "s2a", Some("P"), agent, "pass", 20);
        add(
            "t2",
            "residual",
            "s2b",
            Some("P"),
            agent,
            "budget_exhausted",
            99,
        );
    }
    for (agent, out) in [("A", "fail"), ("B", "pass")] {
        for task in ["t1", "t2"] {
            add(task, "rescue_notice", "fa", Some("A"), agent, out, 50);
            add(task, "rescue_note", "fa", Some("A"), agent, "fail", 50);
            add(
                task,
                "pristine_control",
                "clean",
                Some("A"),
                agent,
                if task == "t1" { "pass" } else { "fail" },
                50,
            );
        }
    }
    let mut results = String::new();
    for t in &trials {
        results.push_str(&row(t).to_string());
        results.push('\n');
        if matches!(t.condition, "clean" | "residual") && matches!(t.outcome, "pass" | "fail") {
            let tdir = dir.join("trials").join(&t.id);
            let final_patch = if t.condition == "residual" {
                diff(&[("a.go", &["l1", "changed"]), ("b.go", &["new"])])
            } else {
                diff(&[("b.go", &["x"])])
            };
            write(&tdir.join("final.patch"), &final_patch);
            let traj = [
                json!({"t_ms": 1, "shell": "git status && git diff --stat"}),
                json!({"t_ms": 2, "shell": "cat b.go | head -20"}),
                json!({"t_ms": 3, "argv": ["ls", "-la"]}),
            ];
            let text: Vec<String> = traj.iter().map(|v| v.to_string()).collect();
            write(&tdir.join("trajectory.jsonl"), &(text.join("\n") + "\n"));
        }
    }
    write(&dir.join("results.jsonl"), &results);
}

fn read_csv(path: &Path) -> Vec<Vec<String>> {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

#[test]
fn report_files_from_a_run_directory() {
    let tmp = TempDir::new("report");
    let run = tmp.0.join("run");
    make_run(&run);
    let ds = load_runs(std::slice::from_ref(&run)).unwrap();
    assert_eq!(ds.trials.len(), 24);
    let a = analyze(
        &ds,
        &Options {
            draws: 500,
            ..Options::default()
        },
    );

    // A: clean (1, 1), residual t1 = 0 (s1 fail), t2 = (1 + 0) / 2.
    let ra = &a.inherited.by_agent[0];
    assert_eq!((ra.agent.as_str(), ra.tasks, ra.states), ("A", 2, 3));
    assert_eq!(ra.clean.value, Some(1.0));
    assert_eq!(ra.residual.value, Some(0.25));
    assert_eq!(ra.gap_pp.value, Some(75.0));
    assert_eq!(a.meta.infra_errors_excluded, 2);
    let sig = &a.inherited.signatures[0];
    assert_eq!((sig.continuations, sig.not_normally_submitted), (2, 1));
    // Kept: l1 of (l1, l2) on t1; c.go's lines are gone on t2.
    assert_eq!(sig.kept.value, Some(0.25));
    assert_eq!(sig.left_out.opened.value, Some(1.0));

    let out = tmp.0.join("out");
    let files = write_report(&a, &out, Format::Report).unwrap();
    for name in [
        "report.md",
        "report.html",
        "inherited_by_agent.csv",
        "inherited_by_predecessor.csv",
        "signatures.csv",
        "recovery_success.csv",
        "recovery_contrasts.csv",
        "recovery_decomposition.csv",
        "recovery_pooled.csv",
        "exclusions.csv",
        "outcomes.csv",
        "clean_vs_residual.svg",
        "contrasts_forest.svg",
        "signatures.svg",
        "rescue_success.svg",
    ] {
        assert!(out.join(name).is_file(), "{name} missing");
        assert!(files.contains(&out.join(name)), "{name} not returned");
    }
    let html = fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<svg"));
    assert!(html.contains("<style>"));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "external reference in HTML"
    );
    assert!(!html.contains("<script") && !html.contains("<link"));
    let md = fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("## Inherited starts") && md.contains("## Recovery"));

    // The CSV rows are the analysis' numbers.
    let rows = read_csv(&out.join("inherited_by_agent.csv"));
    let header = &rows[0];
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    assert_eq!(rows.len(), 1 + a.inherited.by_agent.len());
    for (r, csv) in a.inherited.by_agent.iter().zip(&rows[1..]) {
        assert_eq!(csv[col("agent")], r.agent);
        assert_eq!(csv[col("tasks")], r.tasks.to_string());
        assert_eq!(
            csv[col("clean")].parse::<f64>().unwrap(),
            r.clean.value.unwrap()
        );
        assert_eq!(
            csv[col("residual")].parse::<f64>().unwrap(),
            r.residual.value.unwrap()
        );
        assert_eq!(
            csv[col("gap_pp")].parse::<f64>().unwrap(),
            r.gap_pp.value.unwrap()
        );
        assert_eq!(
            csv[col("clean_lo")].parse::<f64>().unwrap(),
            r.clean.ci.unwrap().lo
        );
    }
    let rows = read_csv(&out.join("recovery_contrasts.csv"));
    let hrg: Vec<_> = rows
        .iter()
        .filter(|r| r[2] == "HRG" && r[0] == "direction")
        .collect();
    assert_eq!(hrg.len(), 1);
    assert_eq!(hrg[0][1], "A->B");
    // B rescues both of A's failures, A none: HRG = 1.
    assert_eq!(hrg[0][3], "1");
    let rows = read_csv(&out.join("exclusions.csv"));
    assert_eq!(rows.len(), 1, "no exclusions expected: {rows:?}");

    // JSON for machines.
    let files = write_report(&a, &out, Format::Json).unwrap();
    assert_eq!(files, vec![out.join("analysis.json")]);
    let v: Value =
        serde_json::from_str(&fs::read_to_string(out.join("analysis.json")).unwrap()).unwrap();
    assert_eq!(
        v["inherited"]["by_agent"][0]["gap_pp"]["value"],
        json!(75.0)
    );
    assert_eq!(v["recovery"]["directions"].as_array().unwrap().len(), 2);
}

#[test]
fn bad_rows_name_the_file_and_line() {
    let tmp = TempDir::new("bad");
    let run = tmp.0.join("run");
    make_run(&run);
    let results = run.join("results.jsonl");
    let mut text = fs::read_to_string(&results).unwrap();
    text.push_str("{\"run_id\": \"run-1\", \"trial_id\": \"x\"}\n");
    fs::write(&results, &text).unwrap();
    let err = load_runs(std::slice::from_ref(&run)).unwrap_err();
    assert!(
        matches!(err, AnalysisError::Json { line: Some(25), .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("results.jsonl:25"), "{err}");

    // A clean trial with a predecessor breaks the contract.
    let mut lines: Vec<String> = fs::read_to_string(&results)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    lines.pop();
    let mut v: Value = serde_json::from_str(&lines[0]).unwrap();
    v["predecessor"] = json!("P");
    lines.push(v.to_string());
    fs::write(&results, lines.join("\n") + "\n").unwrap();
    let err = load_runs(&[run]).unwrap_err();
    assert!(
        err.to_string()
            .contains("results.jsonl:25: a clean trial has no predecessor"),
        "{err}"
    );
}
