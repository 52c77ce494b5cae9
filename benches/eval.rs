//! Evaluator benchmark: the overhead the evaluator adds to a trial (fork the start state,
//! seal the final state, bring up a pristine fork for grading and copy the hidden tests in;
//! the agent's and the verifier's own time excluded), p50/p99, next to bringing the same
//! states up with podman in the same run; and trials per minute on this machine.
//!
//! Runs the mini suite (busybox; a filesystem task and a live terminal task) and, when the
//! bundled suite is built, the real tasks (Debian), with the `noop` agent so that what is
//! measured is the evaluator. Results: target/bench/eval.json and eval.md.
//!
//! Also the cost of grading as a terminal task's harness grades, against grading its files
//! alone: the Harbor fixture suite (Debian) run as it is (live: each trial's final state
//! sealed with its processes, graded in a live fork) and declared files-only (`live =
//! false` in a forkd.toml beside each task), alternating, the same trials each way.
//!
//! Knobs: FORKD_BENCH_TRIALS (replicates per cell, default 20), FORKD_BENCH_PODMAN=0,
//! FORKD_BENCH_ROUNDS (live/files alternations, default 3).

#![forbid(unsafe_code)]

mod common;

use anyhow::{Context, Result};
use common::{summarize, DaemonGuard};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_forkd");

fn cache() -> PathBuf {
    forkd::api::defaults::cache()
}

/// The phases of a trial that are the evaluator's, not the agent's or the verifier's.
const OVERHEAD_PHASES: [&str; 9] = [
    "fork",
    "seal",
    "remove",
    "grade_fork",
    "grade_processes",
    "grade_diff",
    "grade_copy_tests",
    "grade_remove",
    "remove_final",
];

/// Per-trial overhead (µs) from the attempts' phase timings, by task.
fn overheads(run: &Path) -> Result<Vec<(String, u64, u64)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(run.join("trials"))?.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("predecessor.") {
            continue;
        }
        let text = std::fs::read_to_string(e.path().join("attempts.jsonl")).unwrap_or_default();
        let Some(last) = text.lines().last() else {
            continue;
        };
        let v: Value = serde_json::from_str(last)?;
        let p = &v["phases_ms"];
        let get = |k: &str| p[k].as_f64().unwrap_or(0.0);
        let overhead = OVERHEAD_PHASES.iter().map(|k| get(k)).sum::<f64>();
        let verifier = get("grade_verifier");
        out.push((
            name.split('.').next().unwrap_or("").to_string(),
            (overhead * 1000.0) as u64,
            (verifier * 1000.0) as u64,
        ));
    }
    Ok(out)
}

fn run_suite(
    d: &DaemonGuard,
    suite: &Path,
    out: &Path,
    k: usize,
    parallel: usize,
    conditions: &str,
) -> Result<(f64, usize)> {
    let t = Instant::now();
    let status = Command::new(BIN)
        .args(["--socket", d.socket.to_str().unwrap(), "eval", "run"])
        .arg(suite)
        .args([
            "--out",
            out.to_str().unwrap(),
            "--agents",
            "noop",
            "--conditions",
            conditions,
        ])
        .args(["-k", &k.to_string(), "--parallel", &parallel.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()?;
    anyhow::ensure!(
        status.success(),
        "forkd eval run {} failed",
        suite.display()
    );
    let rows = std::fs::read_to_string(out.join("results.jsonl"))?
        .lines()
        .count();
    Ok((t.elapsed().as_secs_f64(), rows))
}

/// The phases of every trial of a run (the last attempt's), milliseconds by name.
fn trial_phases(run: &Path) -> Result<Vec<serde_json::Map<String, Value>>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(run.join("trials"))?.flatten() {
        let text = std::fs::read_to_string(e.path().join("attempts.jsonl")).unwrap_or_default();
        if let Some(last) = text.lines().last() {
            let v: Value = serde_json::from_str(last)?;
            if let Some(p) = v["phases_ms"].as_object() {
                out.push(p.clone());
            }
        }
    }
    Ok(out)
}

/// Live grading against files-only grading on the Harbor fixture suite: per trial, the
/// seal of the final state, the grading fork, the evaluator's whole overhead and the
/// verifier, p50/p99 each way and their ratio. Rounds alternate the two ways.
fn live_against_files(d: &DaemonGuard, work: &Path, k: usize) -> Result<(Value, String)> {
    let rounds = common::env_usize("FORKD_BENCH_ROUNDS", 3)?;
    let harbor = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/harbor/tasks");
    let live = work.join("harbor-live");
    let files = work.join("harbor-files");
    std::fs::create_dir_all(&live)?;
    std::fs::create_dir_all(&files)?;
    for e in std::fs::read_dir(&harbor)?.flatten() {
        let name = e.file_name();
        for (dir, forkd_toml) in [
            (&live, None),
            (&files, Some("[environment]\nlive = false\n")),
        ] {
            let dest = dir.join(&name);
            let s = Command::new("cp")
                .arg("-a")
                .arg(e.path())
                .arg(&dest)
                .status()?;
            anyhow::ensure!(s.success(), "cp {}", e.path().display());
            if let Some(t) = forkd_toml {
                std::fs::write(dest.join("forkd.toml"), t)?;
            }
        }
    }
    // Images built and clean states made once each way, not measured.
    for (mode, suite) in [("live", &live), ("files", &files)] {
        run_suite(
            d,
            suite,
            &work.join(format!("harbor-{mode}-warm")),
            1,
            1,
            "clean",
        )?;
    }
    let keys = ["seal", "grade_fork", "overhead", "grade_verifier"];
    let mut samples: std::collections::BTreeMap<(&str, &str), Vec<u64>> = Default::default();
    for r in 0..rounds {
        for (mode, suite) in [("live", &live), ("files", &files)] {
            eprintln!(
                "[bench] harbor suite graded {mode}, round {}/{rounds}, {k} replicates",
                r + 1
            );
            let out = work.join(format!("harbor-{mode}-{r}"));
            run_suite(d, suite, &out, k, 1, "clean")?;
            for p in trial_phases(&out)? {
                let get = |k: &str| p.get(k).and_then(Value::as_f64).unwrap_or(0.0);
                let overhead: f64 = OVERHEAD_PHASES.iter().map(|k| get(k)).sum();
                for key in keys {
                    let ms = if key == "overhead" {
                        overhead
                    } else {
                        get(key)
                    };
                    samples
                        .entry((mode, key))
                        .or_default()
                        .push((ms * 1000.0) as u64);
                }
            }
        }
    }
    let mut md = String::from(
        "\n## Grading live against grading files, Harbor fixture suite (noop, 1 at a time)\n\n\
         | per trial | live p50 ms | live p99 ms | files p50 ms | files p99 ms | live / files p50 |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    let mut json = serde_json::Map::new();
    for key in keys {
        let l = summarize(&samples[&("live", key)]);
        let f = summarize(&samples[&("files", key)]);
        let ratio = l.p50 as f64 / f.p50.max(1) as f64;
        md.push_str(&format!(
            "| {key} | {:.1} | {:.1} | {:.1} | {:.1} | {ratio:.2} |\n",
            l.p50 as f64 / 1000.0,
            l.p99 as f64 / 1000.0,
            f.p50 as f64 / 1000.0,
            f.p99 as f64 / 1000.0
        ));
        json.insert(
            key.to_string(),
            json!({ "live_us": samples[&("live", key)], "files_us": samples[&("files", key)],
                "live_p50_ms": l.p50 as f64 / 1000.0, "files_p50_ms": f.p50 as f64 / 1000.0,
                "ratio_p50": ratio }),
        );
    }
    md.push_str(&format!(
        "\n{} trials each way ({rounds} rounds alternating). overhead = fork of the start state, seal, \
         removals, the grading fork, listing a live state's processes, diff and copying the tests in.\n",
        samples[&("live", "seal")].len()
    ));
    Ok((Value::Object(json), md))
}

/// Bringing the clean state and a grading copy up with podman: a container of an image
/// holding the state, removed, then a second one with the hidden tests copied in.
fn podman_trial(image: &str, tests: &Path) -> Result<u64> {
    let run = |name: &str| -> Result<()> {
        let s = Command::new("podman")
            .args([
                "run",
                "-d",
                "--name",
                name,
                "--network",
                "none",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1000:1000",
                image,
                "sleep",
                "1000",
            ])
            .stdout(std::process::Stdio::null())
            .status()?;
        anyhow::ensure!(s.success(), "podman run {image}");
        Ok(())
    };
    let rm = |name: &str| {
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", name])
            .stdout(std::process::Stdio::null())
            .status();
    };
    let t = Instant::now();
    run("forkd-bench-trial")?;
    rm("forkd-bench-trial");
    run("forkd-bench-grade")?;
    let s = Command::new("podman")
        .args(["cp"])
        .arg(tests)
        .arg("forkd-bench-grade:/testbed/.tests")
        .status()?;
    rm("forkd-bench-grade");
    anyhow::ensure!(s.success(), "podman cp");
    Ok(t.elapsed().as_micros() as u64)
}

fn main() -> Result<()> {
    common::install_interrupt_handler();
    let k = common::env_usize("FORKD_BENCH_TRIALS", 20)?;
    let busybox_tar = cache().join("images/busybox.tar");
    anyhow::ensure!(
        busybox_tar.exists(),
        "{} missing: run fixtures/setup.sh busybox",
        busybox_tar.display()
    );
    let d = DaemonGuard::start(Path::new(BIN))?;
    let work = d.dir.join("work");
    std::fs::create_dir_all(&work)?;
    let mini = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/suites/mini");
    let mut rows_md = Vec::new();
    let mut report = json!({ "machine": common::machine(), "git": common::git_revision().0, "load_average": common::load_average() });

    let mut suites = vec![("mini", mini.clone())];
    let bundled = cache().join("suite");
    if bundled.join("mi-windowed-step").is_dir() {
        suites.push(("bundled", bundled));
    } else {
        common::skip("bundled suite", "not built (fixtures/setup.sh suite)")?;
    }
    for (label, suite) in &suites {
        for parallel in [1usize, 2] {
            eprintln!("[bench] suite {label}, {k} replicates, {parallel} at a time");
            let out = work.join(format!("{label}-p{parallel}"));
            let (secs, trials) = run_suite(&d, suite, &out, k, parallel, "clean,residual")
                .with_context(|| format!("suite {label}"))?;
            let per_minute = trials as f64 / secs * 60.0;
            let samples = overheads(&out)?;
            let mut tasks: Vec<String> = samples.iter().map(|s| s.0.clone()).collect();
            tasks.sort();
            tasks.dedup();
            let mut per_task = serde_json::Map::new();
            for t in &tasks {
                let o: Vec<u64> = samples.iter().filter(|s| &s.0 == t).map(|s| s.1).collect();
                let v: Vec<u64> = samples.iter().filter(|s| &s.0 == t).map(|s| s.2).collect();
                let so = summarize(&o);
                let sv = summarize(&v);
                rows_md.push(format!(
                    "| {label} | {t} | {parallel} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
                    so.n,
                    so.p50 as f64 / 1000.0,
                    so.p99 as f64 / 1000.0,
                    sv.p50 as f64 / 1000.0,
                    per_minute
                ));
                per_task.insert(t.clone(), json!({ "overhead_us": o, "verifier_us": v, "p50_ms": so.p50 as f64 / 1000.0, "p99_ms": so.p99 as f64 / 1000.0 }));
            }
            report[format!("{label}_p{parallel}")] = json!({ "trials": trials, "seconds": secs, "trials_per_minute": per_minute, "tasks": per_task });
        }
    }

    let mut live_md = String::new();
    if cache().join("images/debian.tar.zst").exists() {
        let (v, m) = live_against_files(&d, &work, k)?;
        report["live_against_files"] = v;
        live_md = m;
    } else {
        common::skip(
            "live against files grading",
            "no Debian image (fixtures/setup.sh debian)",
        )?;
    }

    // The podman peer: the same busybox state (the mini `add` task's clean state) brought up
    // as a committed image, once for the trial and once for grading.
    let mut podman_md = String::new();
    if std::env::var("FORKD_BENCH_PODMAN").as_deref() != Ok("0")
        && Command::new("podman").arg("--version").output().is_ok()
    {
        let st = Command::new("podman")
            .args([
                "import",
                busybox_tar.to_str().unwrap(),
                "localhost/forkd-bench-busybox",
            ])
            .stdout(std::process::Stdio::null())
            .status()?;
        anyhow::ensure!(st.success(), "podman import");
        // The clean state: environment copied and set up, committed as an image.
        let _ = Command::new("podman")
            .args(["rm", "-f", "forkd-bench-setup"])
            .output();
        let ok = Command::new("podman")
            .args([
                "run",
                "-d",
                "--name",
                "forkd-bench-setup",
                "--network",
                "none",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1000:1000",
                "localhost/forkd-bench-busybox",
                "sleep",
                "1000",
            ])
            .stdout(std::process::Stdio::null())
            .status()?
            .success()
            && Command::new("podman")
                .args(["exec", "forkd-bench-setup", "mkdir", "-p", "/testbed"])
                .status()?
                .success()
            && Command::new("podman")
                .arg("cp")
                .arg(mini.join("add/environment/app"))
                .arg("forkd-bench-setup:/testbed/app")
                .status()?
                .success()
            && Command::new("podman")
                .args([
                    "commit",
                    "-q",
                    "forkd-bench-setup",
                    "localhost/forkd-bench-add-clean",
                ])
                .stdout(std::process::Stdio::null())
                .status()?
                .success();
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", "forkd-bench-setup"])
            .output();
        anyhow::ensure!(ok, "podman: preparing the clean state image failed");
        let n = k.min(20);
        let samples = common::sample("podman trial overhead", 1, n, || {
            podman_trial("localhost/forkd-bench-add-clean", &mini.join("add/tests"))
        })?;
        let s = summarize(&samples);
        let _ = Command::new("podman")
            .args(["rmi", "-f", "localhost/forkd-bench-add-clean"])
            .output();
        podman_md = format!(
            "| podman (peer) | add | 1 | {} | {:.1} | {:.1} | - | - |",
            s.n,
            s.p50 as f64 / 1000.0,
            s.p99 as f64 / 1000.0
        );
        report["podman_trial_overhead_us"] = json!(samples);
        let forkd_add: Vec<u64> = overheads(&work.join("mini-p1"))?
            .into_iter()
            .filter(|s| s.0 == "add")
            .map(|s| s.1)
            .collect();
        let ratio = summarize(&forkd_add).p50 as f64 / s.p50.max(1) as f64;
        report["ratio_forkd_to_podman_add_p50"] = json!(ratio);
        podman_md.push_str(&format!(
            "\n\nforkd / podman overhead p50, task add, 1 at a time: {ratio:.3}"
        ));
    } else {
        common::skip("podman peer", "podman missing or FORKD_BENCH_PODMAN=0")?;
    }
    let cleanup = d.stop();
    report["cleanup_problems"] = json!(cleanup.problems);
    let md = format!(
        "# forkd benchmark: evaluator overhead per trial\n\n{}\n\nOverhead = fork of the start state + sealing the final state + the pristine grading fork + copying the hidden tests in (+ queueing removals); the agent (noop) and the verifier are excluded. Goal: under 100 ms.\n\n| suite | task | parallel | trials | overhead p50 ms | overhead p99 ms | verifier p50 ms | trials/min |\n|---|---|---:|---:|---:|---:|---:|---:|\n{}\n{}\n",
        report["load_average"].as_str().unwrap_or(""),
        rows_md.join("\n"),
        podman_md
    ) + &live_md;
    common::write_outputs("eval", &report, &md)?;
    anyhow::ensure!(
        cleanup.problems.is_empty(),
        "clean-up problems: {:?}",
        cleanup.problems
    );
    Ok(())
}
