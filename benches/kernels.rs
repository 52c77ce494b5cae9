//! forkd on older kernels, measured: create, live checkpoint and fork of one branch
//! inside QEMU (TCG) guests of Debian's own cloud kernels, bullseye's Linux 5.10 and
//! bookworm's 6.1, against trixie's current 6.12 booted the same way, one after the
//! other in the same run (TCG is slow, so guests are compared with guests, never with
//! the host). Each guest runs fixtures/kernels/bench.sh: FORKD_BENCH_KERNEL_N rounds
//! (default 15) of a sandbox running a shell loop, its live checkpoint, one branch; the
//! figures are the daemon's own latency record of each operation (`GET /v1/metrics`).
//! Writes target/bench/kernels.json and .md.

#![forbid(unsafe_code)]

mod common;

use anyhow::{bail, Context, Result};
use common::Report;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const SUITES: [(&str, &str); 3] = [
    ("bullseye", "Debian 11"),
    ("bookworm", "Debian 12"),
    ("trixie", "Debian 13"),
];
const OPS: [(&str, &str); 3] = [
    ("createSandbox", "create"),
    ("checkpointSandbox", "live checkpoint"),
    ("forkCheckpoint", "fork of one branch"),
];

fn main() {
    common::install_interrupt_handler();
    if let Err(e) = run() {
        eprintln!("bench kernels: error: {e:#}");
        std::process::exit(1);
    }
}

/// Boots `suite` with the bench script; returns (kernel release, the daemon's metrics).
fn boot(suite: &str, rounds: usize, dir: &Path) -> Result<(String, Value)> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kernels");
    // The rounds go in through the script: the guest has no other input.
    let script = dir.join(format!("bench-{suite}.sh"));
    let body = std::fs::read_to_string(here.join("bench.sh"))?;
    std::fs::write(
        &script,
        format!("#!/bin/sh\nexport FORKD_BENCH_N={rounds}\n{body}"),
    )?;
    let guest = dir.join(suite);
    let t = Instant::now();
    common::run_checked(
        Command::new("bash")
            .arg(here.join("boot.sh"))
            .args([
                suite,
                env!("CARGO_BIN_EXE_forkd"),
                env!("CARGO_BIN_EXE_forkd-init"),
            ])
            .arg(&script)
            .arg(&guest)
            .arg("1800"),
    )?;
    eprintln!(
        "  {suite}: guest done in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    let serial = guest.join("serial.log");
    let text = String::from_utf8_lossy(&std::fs::read(&serial)?).into_owned();
    if let Some(l) = text.lines().find(|l| l.contains("BENCH FAIL")) {
        bail!("{suite}: {l}\n{text}");
    }
    let release = text
        .lines()
        .find_map(|l| {
            l.find("BENCH kernel ")
                .map(|i| l[i + 13..].trim().to_string())
        })
        .with_context(|| format!("{suite}: no kernel line in {}", serial.display()))?;
    let begin = text.find("BENCH-METRICS-BEGIN").context("no metrics")?;
    let end = text
        .find("BENCH-METRICS-END")
        .context("no end of the metrics")?;
    let metrics: Value = serde_json::from_str(text[begin + 19..end].trim())
        .with_context(|| format!("{suite}: the metrics are not JSON"))?;
    Ok((release, metrics))
}

fn run() -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        return common::skip("bench kernels", "needs root (the guests' daemons run as root in the guest; the initramfs keeps ownership)");
    }
    for (suite, _) in SUITES {
        let k = common::cache_dir().join(format!("kernels/{suite}/vmlinuz"));
        if !k.exists() {
            return common::skip(
                "bench kernels",
                &format!(
                    "{} is missing (run fixtures/kernels/fetch.sh bullseye bookworm trixie)",
                    k.display()
                ),
            );
        }
    }
    let rounds = common::env_usize("FORKD_BENCH_KERNEL_N", 15)?;
    let date = common::utc_now();
    let load_start = common::load_average();
    let dir: PathBuf = common::unique_temp_dir("forkd-bench-kernels")?;
    let mut results = Vec::new();
    for (suite, name) in SUITES {
        eprintln!("booting {name} ({suite}), {rounds} rounds ...");
        let (release, metrics) = boot(suite, rounds, &dir)?;
        results.push((suite, name, release, metrics));
    }
    let mut report = Report::new("kernels");
    let ms = |m: &Value, op: &str, q: &str| m[op][q].as_u64().map(|us| us as f64 / 1000.0);
    let current = &results.last().expect("three suites").3;
    for (op, label) in OPS {
        let mut rows = Vec::new();
        for (_, name, release, m) in &results {
            let (p50, p90, p99) = (
                ms(m, op, "p50_us"),
                ms(m, op, "p90_us"),
                ms(m, op, "p99_us"),
            );
            let ratio = match (p50, ms(current, op, "p50_us")) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "-".into(),
            };
            let f = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
            rows.push((
                format!("{name} (Linux {release})"),
                format!(
                    "n {} · p50 {} ms · p90 {} ms · p99 {} ms · p50 / Debian 13: {ratio}",
                    m[op]["count"],
                    f(p50),
                    f(p90),
                    f(p99)
                ),
            ));
        }
        report
            .sections
            .push((format!("{label} ({op}), inside the guest"), rows));
    }
    report.extra.insert(
        "guests".into(),
        Value::Array(
            results
                .iter()
                .map(|(suite, name, release, m)| json!({"suite": suite, "name": name, "release": release, "metrics": m}))
                .collect(),
        ),
    );
    report.notes.push(
        "QEMU TCG guests, -smp 2 -m 3072, booted one after the other; the daemon's own latency of each API operation".into(),
    );
    let _ = std::fs::remove_dir_all(&dir);
    let run = common::RunInfo::at_end(&date, &load_start);
    let header = run.header(
        json!({ "rounds": rounds }),
        (
            "peers",
            json!({ "current kernel": "Debian 13's 6.12, same guest setup" }),
        ),
    );
    let title = run.title("guests of Debian 11, 12 and 13 kernels");
    let (json_path, md_path, md) = report.write(&header, &title)?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}
