//! Harness benchmark: what a Python agent harness pays per command and per step on
//! forkd, next to the peers a user has here without Docker, in the same run.
//!
//! - exec round trip of `true`: the forkd Python client; `podman exec` into a running
//!   container of the same Debian image; a host subprocess (the floor, no isolation);
//! - mini-swe-agent's `execute` (interpreter included): `ForkdEnvironment`, its own
//!   `DockerEnvironment` with `executable=podman`, and its `LocalEnvironment` on the host;
//! - one mini-swe-agent step (DefaultAgent, the model's answer already known with its
//!   DeterministicModel) on each.
//!
//! The measuring is in `benches/harness/steps.py`, run with the harness environment's
//! Python (`FORKD_PYTHON`, made by `fixtures/setup.sh python`); this file starts a
//! private daemon, imports the Debian fixture into it and into podman, and writes the
//! report: target/bench/harness.json and harness.md.
//!
//! Knobs: FORKD_BENCH_SAMPLES (forkd and host samples, default 300; podman gets a
//! tenth, at least 20), FORKD_BENCH_PODMAN=0.

#![forbid(unsafe_code)]

mod common;
mod peers;

use anyhow::{Context, Result};
use common::{DaemonGuard, Report};
use peers::podman::Podman;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;

const PODMAN_IMAGE: &str = "localhost/forkd-bench-debian";

/// (row name in the report, key in the Python half's output)
const ROWS: &[(&str, &str)] = &[
    ("exec true: forkd Python client", "exec_forkd_client"),
    (
        "exec true: forkd Python client, merged output",
        "exec_forkd_client_merged",
    ),
    ("exec true: podman exec (peer)", "exec_podman"),
    ("exec true: host subprocess (floor)", "exec_local_true"),
    ("mini-swe-agent execute: ForkdEnvironment", "execute_forkd"),
    (
        "mini-swe-agent execute: DockerEnvironment on podman (peer)",
        "execute_podman",
    ),
    (
        "mini-swe-agent execute: LocalEnvironment (floor)",
        "execute_local",
    ),
    ("mini-swe-agent step: ForkdEnvironment", "step_forkd"),
    (
        "mini-swe-agent step: DockerEnvironment on podman (peer)",
        "step_podman",
    ),
    (
        "mini-swe-agent step: LocalEnvironment (floor)",
        "step_local",
    ),
];

fn main() {
    common::install_interrupt_handler();
    if let Err(e) = run() {
        eprintln!("bench harness: error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        return common::skip("bench harness", "needs root (namespaces, mounts, cgroups)");
    }
    let samples = common::env_usize("FORKD_BENCH_SAMPLES", 300)?;
    let debian = common::fixture_image("debian.tar.zst");
    if !debian.is_file() {
        return common::skip(
            "bench harness",
            &format!(
                "fixture {} is missing (run fixtures/setup.sh debian)",
                debian.display()
            ),
        );
    }
    let python = std::env::var("FORKD_PYTHON").unwrap_or_else(|_| {
        common::cache_dir()
            .join("python/venv/bin/python")
            .display()
            .to_string()
    });
    if !PathBuf::from(&python).exists() {
        return common::skip(
            "bench harness",
            &format!("{python} is missing (run fixtures/setup.sh python)"),
        );
    }
    let podman = Podman::detect()?;
    let date = common::utc_now();
    let load_start = common::load_average();
    let d = DaemonGuard::start(&PathBuf::from(env!("CARGO_BIN_EXE_forkd")))?;
    let took = d.import(&debian, "debian")?;
    eprintln!("bench harness: imported debian into forkd in {took:?}");
    if let Some(p) = &podman {
        p.import(&debian, PODMAN_IMAGE)?;
        eprintln!("bench harness: imported debian into podman as {PODMAN_IMAGE}");
    }
    let out_dir = common::bench_output_dir();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(&python);
    cmd.arg(repo.join("benches/harness/steps.py"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["--image", "debian", "--out"])
        .arg(&out_dir)
        .args(["--n", &samples.to_string()])
        .args(["--n-podman", &(samples / 10).max(20).to_string()])
        .env("PYTHONPATH", repo.join("python/src"))
        .env("MSWEA_SILENT_STARTUP", "1");
    if podman.is_some() {
        cmd.args(["--podman-image", PODMAN_IMAGE]);
    }
    let status = cmd.status().context("run benches/harness/steps.py")?;
    anyhow::ensure!(
        status.success(),
        "benches/harness/steps.py failed ({status})"
    );
    let path = out_dir.join("harness-python.json");
    let py: Value = serde_json::from_slice(
        &std::fs::read(&path).with_context(|| format!("read {}", path.display()))?,
    )?;

    let mut report = Report::new("harness");
    for (name, key) in ROWS {
        if let Some(s) = py[*key]["samples_us"].as_array() {
            report.row(name, s.iter().filter_map(Value::as_u64).collect());
        }
    }
    let p50 = |key: &str| py[key]["p50_us"].as_f64();
    let p99 = |key: &str| py[key]["p99_us"].as_f64();
    let mut ratios = Vec::new();
    for (what, ours, peer) in [
        (
            "exec round trip, p50: forkd client / podman exec",
            "exec_forkd_client",
            "exec_podman",
        ),
        (
            "exec round trip, p50: forkd client / host subprocess",
            "exec_forkd_client",
            "exec_local_true",
        ),
        (
            "execute, p50: ForkdEnvironment / DockerEnvironment on podman",
            "execute_forkd",
            "execute_podman",
        ),
        (
            "execute, p50: ForkdEnvironment / LocalEnvironment",
            "execute_forkd",
            "execute_local",
        ),
        ("one step, p50: forkd / podman", "step_forkd", "step_podman"),
        ("one step, p50: forkd / local", "step_forkd", "step_local"),
    ] {
        if let (Some(a), Some(b)) = (p50(ours), p50(peer)) {
            ratios.push((what.to_string(), format!("{:.3}", a / b)));
        }
    }
    for (what, ours, peer) in [
        (
            "exec round trip, p99: forkd client / podman exec",
            "exec_forkd_client",
            "exec_podman",
        ),
        ("one step, p99: forkd / podman", "step_forkd", "step_podman"),
    ] {
        if let (Some(a), Some(b)) = (p99(ours), p99(peer)) {
            ratios.push((what.to_string(), format!("{:.3}", a / b)));
        }
    }
    report.sections.push(("Ratios".into(), ratios));
    report.notes.push(format!(
        "step command: `{}`; Python {}",
        py["step_command"].as_str().unwrap_or(""),
        py["python"].as_str().unwrap_or("")
    ));
    let cleanup = d.stop();
    let run = common::RunInfo::at_end(&date, &load_start);
    let header = run.header(
        json!({ "samples": samples, "image": "debian" }),
        (
            "peers",
            json!({ "podman": podman.as_ref().map(|p| json!({"version": p.version, "runtime": p.runtime, "image": PODMAN_IMAGE})) }),
        ),
    );
    let title = run.title(&format!(
        "peers: {}, mini-swe-agent's DockerEnvironment (podman) and LocalEnvironment",
        podman
            .as_ref()
            .map(|p| format!("podman {} with {}", p.version, p.runtime))
            .unwrap_or_else(|| "podman skipped".into()),
    ));
    let (json_path, md_path, md) = report.write(&header, &title)?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    drop(cleanup);
    Ok(())
}
