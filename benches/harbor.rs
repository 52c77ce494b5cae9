//! Harbor benchmark: `harbor run` of 8 concurrent trials of one task (`-k 8 -n 8`),
//! from the start of `harbor run` to each trial's first agent command, and Harbor's own
//! record of each trial's environment start-up; forkd's backend cold (the task's
//! Dockerfile built and the golden checkpoint made in the run) and warm (reused), next to
//! Harbor's podman backend building the same Dockerfile (FROM podman's copy of the
//! fixture) in the same run where it runs here (it needs podman-compose on PATH).
//!
//! The measuring is in `benches/harbor/bench.py`, run with the Harbor environment's
//! Python (`fixtures/setup.sh harbor`); this file starts a private daemon, imports the
//! Debian fixture into it and into podman, and writes target/bench/harbor.json and .md.

#![forbid(unsafe_code)]

mod common;
mod peers;

use anyhow::{Context, Result};
use common::{DaemonGuard, Report};
use peers::podman::{Podman, PODMAN_RUN_FLAGS};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;

const PODMAN_IMAGE: &str = "localhost/forkd-bench-debian";

fn main() {
    common::install_interrupt_handler();
    if let Err(e) = run() {
        eprintln!("bench harbor: error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        return common::skip("bench harbor", "needs root (namespaces, mounts, cgroups)");
    }
    let debian = common::fixture_image("debian.tar.zst");
    let python = common::cache_dir().join("harbor/venv/bin/python");
    for (what, path) in [("fixture", &debian), ("Harbor's Python", &python)] {
        if !path.exists() {
            return common::skip(
                "bench harbor",
                &format!(
                    "{what} {} is missing (run fixtures/setup.sh debian harbor)",
                    path.display()
                ),
            );
        }
    }
    let podman = Podman::detect()?;
    let date = common::utc_now();
    let load_start = common::load_average();
    let d = DaemonGuard::start(&PathBuf::from(env!("CARGO_BIN_EXE_forkd")))?;
    d.import(&debian, "debian")?;
    if let Some(p) = &podman {
        // The podman image with the task's workdir in it: Harbor's podman backend execs
        // in the workdir and waits for it to exist (forkd's backend makes it).
        p.import(&debian, PODMAN_IMAGE)?;
        let _ = p
            .command()
            .args(["rm", "-f", "forkd-bench-harbor-prep"])
            .output();
        common::run_checked(
            p.command()
                .args(["run", "--name", "forkd-bench-harbor-prep"])
                .args(PODMAN_RUN_FLAGS)
                .args([PODMAN_IMAGE, "mkdir", "-p", "/app"]),
        )?;
        common::run_checked(p.command().args([
            "commit",
            "-q",
            "forkd-bench-harbor-prep",
            PODMAN_IMAGE,
        ]))?;
        let _ = p
            .command()
            .args(["rm", "-f", "forkd-bench-harbor-prep"])
            .output();
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out_dir = common::bench_output_dir();
    let scratch = common::unique_temp_dir("forkd-bench-harbor")?;
    let mut cmd = Command::new(&python);
    cmd.arg(repo.join("benches/harbor/bench.py"))
        .arg("--task")
        .arg(repo.join("fixtures/harbor/tasks/edit-greeting"))
        .arg("--out")
        .arg(&out_dir)
        .arg("--scratch")
        .arg(&scratch)
        .env("FORKD_SOCKET", &d.socket)
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True");
    if podman.is_some() {
        cmd.args(["--podman-image", PODMAN_IMAGE]);
    }
    let status = cmd.status().context("run benches/harbor/bench.py")?;
    anyhow::ensure!(
        status.success(),
        "benches/harbor/bench.py failed ({status})"
    );
    let path = out_dir.join("harbor-python.json");
    let py: Value = serde_json::from_slice(
        &std::fs::read(&path).with_context(|| format!("read {}", path.display()))?,
    )?;
    let mut report = Report::new("harbor");
    let us = |v: &Value| -> Vec<u64> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_f64())
                    .map(|s| (s * 1e6) as u64)
                    .collect()
            })
            .unwrap_or_default()
    };
    for (key, label) in [
        (
            "forkd_cold",
            "forkd backend, cold (golden built in the run)",
        ),
        (
            "forkd_warm",
            "forkd backend, warm (golden checkpoint reused)",
        ),
        ("podman", "Harbor's podman backend (peer)"),
    ] {
        let v = &py[key];
        if v.is_null() {
            continue;
        }
        report.row(
            &format!("harbor run -> first command: {label}"),
            us(&v["to_first_command_s"]),
        );
        report.row(
            &format!("environment setup: {label}"),
            us(&v["environment_setup_s"]),
        );
        if !v["errors"].as_array().map(|a| a.is_empty()).unwrap_or(true) || v["exit"] != 0 {
            report.notes.push(format!(
                "{label}: exit {}, errors {}, log tail: {}",
                v["exit"],
                v["errors"],
                v["log_tail"].as_str().unwrap_or("").replace('\n', " ")
            ));
        }
    }
    let mut ratios = Vec::new();
    for (what, ours, peer, field) in [
        (
            "first command p50: forkd warm / podman",
            "forkd_warm",
            "podman",
            "to_first_command_s",
        ),
        (
            "first command p50: forkd cold / podman",
            "forkd_cold",
            "podman",
            "to_first_command_s",
        ),
        (
            "environment setup p50: forkd warm / podman",
            "forkd_warm",
            "podman",
            "environment_setup_s",
        ),
    ] {
        let p50 = |k: &str| {
            let mut v = us(&py[k][field]);
            v.sort();
            v.get(v.len() / 2).copied()
        };
        if let (Some(a), Some(b)) = (p50(ours), p50(peer)) {
            ratios.push((what.to_string(), format!("{:.3}", a as f64 / b as f64)));
        }
    }
    report.sections.push(("Ratios".into(), ratios));
    let cleanup = d.stop();
    let _ = std::fs::remove_dir_all(&scratch);
    let run = common::RunInfo::at_end(&date, &load_start);
    let header = run.header(
        json!({ "trials": 8, "concurrent": 8, "task": "fixtures/harbor/tasks/edit-greeting" }),
        ("peers", json!({ "podman": podman.as_ref().map(|p| json!({"version": p.version, "runtime": p.runtime})) })),
    );
    let title = run.title("peer: Harbor's podman backend");
    let (json_path, md_path, md) = report.write(&header, &title)?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    drop(cleanup);
    Ok(())
}
