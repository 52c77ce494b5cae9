//! E2B's SDK on forkd, against forkd's own Python client, in one run on one daemon:
//! create -> first command -> kill (without a network, and with egress), and
//! `fork(count=16)` against forkd's live checkpoint and fork of 16. Both clients talk to
//! the daemon over loopback TCP with an API key.
//!
//! The measuring is in `benches/e2b/bench.py`, run with the pinned E2B SDK's venv
//! (`fixtures/setup.sh e2b`) and this checkout's `forkd` package; this file starts a
//! private daemon listening on TCP, imports the `e2b-base` image, makes a key, and
//! writes target/bench/e2b.json and .md. Environment: `FORKD_BENCH_SAMPLES` (20),
//! `FORKD_BENCH_FORKS` (16), `FORKD_BENCH_FORK_SAMPLES` (5). Needs root, CRIU and the
//! fixtures; without them it prints `SKIP`, an error under `CI=true`.

#![forbid(unsafe_code)]

mod common;

use anyhow::{Context, Result};
use common::{DaemonGuard, Report};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;

fn main() {
    common::install_interrupt_handler();
    if let Err(e) = run() {
        eprintln!("bench e2b: error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        return common::skip("bench e2b", "needs root (namespaces, mounts, cgroups)");
    }
    let base = common::fixture_image("e2b-base.tar.zst");
    let python = common::cache_dir().join("e2b/2.63/venv/bin/python");
    for (what, path) in [("fixture", &base), ("the E2B SDK's Python", &python)] {
        if !path.exists() {
            return common::skip(
                "bench e2b",
                &format!(
                    "{what} {} is missing (run fixtures/setup.sh e2b)",
                    path.display()
                ),
            );
        }
    }
    let samples = common::env_count("FORKD_BENCH_SAMPLES", 20)?;
    let forks = common::env_count("FORKD_BENCH_FORKS", 16)?;
    let fork_samples = common::env_count("FORKD_BENCH_FORK_SAMPLES", 5)?;
    let date = common::utc_now();
    let load_start = common::load_average();
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let listen = format!("tcp://127.0.0.1:{port}");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_forkd"));
    let d = DaemonGuard::start_with_env(&bin, &[("FORKD_LISTEN", &listen)])?;
    d.import(&base, "e2b-base")?;
    let key = Command::new(&bin)
        .args(["key", "create", "bench", "--root"])
        .arg(&d.root)
        .output()
        .context("forkd key create")?;
    anyhow::ensure!(
        key.status.success(),
        "forkd key create: {}",
        String::from_utf8_lossy(&key.stderr)
    );
    let key = String::from_utf8(key.stdout)?.trim().to_string();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out_dir = common::bench_output_dir();
    std::fs::create_dir_all(&out_dir)?;
    let raw = out_dir.join("e2b-python.json");
    let url = format!("http://127.0.0.1:{port}");
    let status = Command::new(&python)
        .arg(repo.join("benches/e2b/bench.py"))
        .arg("--out")
        .arg(&raw)
        .args(["--samples", &samples.to_string()])
        .args(["--fork-count", &forks.to_string()])
        .args(["--fork-samples", &fork_samples.to_string()])
        .env("PYTHONPATH", repo.join("python/src"))
        .env("E2B_API_KEY", &key)
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("FORKD_HOST", &listen)
        .env("FORKD_API_KEY", &key)
        .env("FORKD_TLS", "off")
        .status()
        .context("run benches/e2b/bench.py")?;
    anyhow::ensure!(
        status.success(),
        "benches/e2b/bench.py failed ({status})\n{}",
        d.log_tail(30)
    );
    let py: Value = serde_json::from_slice(&std::fs::read(&raw)?)?;
    let us = |k: &str| -> Vec<u64> {
        py[k]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_f64)
                    .map(|s| (s * 1e6) as u64)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut report = Report::new("e2b");
    for (net, label) in [("none", "no network"), ("egress", "egress")] {
        report.row(
            &format!("create -> first command -> kill, {label}: E2B SDK 2.63"),
            us(&format!("sdk_lifecycle_{net}")),
        );
        report.row(
            &format!("create -> first command -> kill, {label}: forkd's Python client (peer)"),
            us(&format!("native_lifecycle_{net}")),
        );
    }
    report.row(
        &format!("fork(count={forks}): E2B SDK 2.63"),
        us("sdk_fork"),
    );
    report.row(
        &format!("live checkpoint + fork of {forks}: forkd's Python client (peer)"),
        us("native_fork"),
    );
    let p50 = |k: &str| {
        let mut v = us(k);
        v.sort();
        v.get(v.len() / 2).copied()
    };
    let mut ratios = Vec::new();
    for (what, a, b) in [
        (
            "lifecycle p50, no network: E2B SDK / forkd client",
            "sdk_lifecycle_none",
            "native_lifecycle_none",
        ),
        (
            "lifecycle p50, egress: E2B SDK / forkd client",
            "sdk_lifecycle_egress",
            "native_lifecycle_egress",
        ),
        (
            "fork p50: E2B SDK / forkd client",
            "sdk_fork",
            "native_fork",
        ),
    ] {
        if let (Some(a), Some(b)) = (p50(a), p50(b)) {
            ratios.push((what.to_string(), format!("{:.3}", a as f64 / b as f64)));
        }
    }
    report.sections.push(("Ratios".into(), ratios));
    let cleanup = d.stop();
    let run = common::RunInfo::at_end(&date, &load_start);
    let header = run.header(
        json!({ "samples": samples, "forks": forks, "fork_samples": fork_samples, "image": "e2b-base", "transport": "loopback TCP, plain, API key" }),
        ("peers", json!({ "forkd_python_client": "python/src/forkd" })),
    );
    let title = run.title("peer: forkd's own Python client");
    let (json_path, md_path, md) = report.write(&header, &title)?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    drop(cleanup);
    Ok(())
}
