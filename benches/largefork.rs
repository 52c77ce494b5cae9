//! A fork of one branch by the size of the state: what a branch costs when the state
//! holds much memory. Not in CI (it takes minutes).
//!
//! A Debian sandbox whose python3 holds M MiB of written, incompressible memory
//! (`FORKD_LARGEFORK_MIB`, default `16,256,1024,4096`) is checkpointed live, then forked
//! one branch at a time (`FORKD_LARGEFORK_SAMPLES`, default 5, fewer for a peer whose
//! branches would not fit in half the host's free memory; a mode's branches are kept
//! alive until its samples are done), side by side with its peers in the same run:
//! - `template`: forkd as it is: branches restored from the checkpoint's restore template
//!   (the first fork reads its pages while it starts the template beside it; it is
//!   reported apart, with the time until the template holds the memory);
//! - `read`: forkd with `FORKD_TEMPLATES=off`: CRIU reads every page into every branch;
//! - `ksm`: the same with `share_memory` (KSM), memory at once and after
//!   `FORKD_LARGEFORK_SETTLE_SECS` (default 20);
//! - `podman`: `podman container restore --import` of an export of the same process;
//! - `fork()`: the floor, the same memory forked by a plain process (page tables copied).
//!
//! Time is the request's (or command's) wall clock; memory is what the host's
//! MemAvailable lost per branch, measured a second after the last. Writes
//! target/bench/largefork.json and .md.

#![forbid(unsafe_code)]

mod common;
#[path = "peers/mod.rs"]
mod peers;

use anyhow::{Context, Result};
use common::{summarize, DaemonGuard};
use peers::podman::{Podman, PodmanContainer};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_forkd");

/// The state: M MiB of random bytes held by python3, `/tmp/ready` once written.
fn holder(mib: usize) -> String {
    format!(
        "import os, time\nb = [os.urandom(1 << 20) for _ in range({mib})]\n\
         open('/tmp/ready', 'w').write('ok')\nwhile True:\n    time.sleep(10)\n"
    )
}

fn mem_available_mib() -> Result<f64> {
    Ok(common::mem_available_kib()? as f64 / 1024.0)
}

struct Row {
    mode: String,
    first_ms: Option<f64>,
    /// From the first fork's request until its template held the memory.
    ready_ms: Option<f64>,
    forks_us: Vec<u64>,
    mib_per_branch: f64,
    settled_mib: Option<f64>,
}

/// A live checkpoint of the holder in a Debian sandbox of `d` (the source removed).
fn state(d: &DaemonGuard, mib: usize) -> Result<String> {
    let sb = d.create("debian")?;
    let script = holder(mib);
    d.sh_ok(
        &sb.id,
        &format!("cat > /root/holder.py <<'EOF'\n{script}EOF"),
    )?;
    d.exec_detached(&sb.id, &["python3", "/root/holder.py"], "holder")?;
    let t = Instant::now();
    while d
        .sh_ok(&sb.id, "cat /tmp/ready 2>/dev/null || true")?
        .trim()
        != "ok"
    {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(300),
            "the holder never got ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ck = d.checkpoint(&sb.id, true, false)?;
    d.remove(&sb.id)?;
    Ok(ck.id)
}

/// `samples` forks of one branch each, all kept until the end; then removed.
fn forkd_row(
    d: &DaemonGuard,
    ck: &str,
    mode: &str,
    share: bool,
    samples: usize,
    first_apart: bool,
    settle: Duration,
) -> Result<Row> {
    let req = forkd::api::ForkRequest {
        count: Some(1),
        share_memory: share.then_some(true),
        ..Default::default()
    };
    let mut ids = Vec::new();
    let (mut first_ms, mut ready_ms) = (None, None);
    if first_apart {
        let t = Instant::now();
        let r = d.fork_with(ck, &req)?;
        first_ms = Some(t.elapsed().as_secs_f64() * 1000.0);
        for b in r.branches {
            d.remove(&b.id)?;
        }
        // The first branch read its pages while the template started beside it: the
        // samples begin once it holds the memory.
        let held = common::wait_until(Duration::from_secs(300), || {
            d.client()
                .call::<forkd::api::Health>("GET", "/v1/health", None)
                .is_ok_and(|h| h.templates.detail.starts_with("1 held"))
        });
        anyhow::ensure!(held, "the template never started: {}", d.log_tail(20));
        ready_ms = Some(t.elapsed().as_secs_f64() * 1000.0);
    }
    std::thread::sleep(Duration::from_secs(1));
    let before = mem_available_mib()?;
    let mut forks = Vec::new();
    for _ in 0..samples {
        let t = Instant::now();
        let r = d.fork_with(ck, &req)?;
        forks.push(t.elapsed().as_micros() as u64);
        ids.extend(r.branches.into_iter().map(|b| b.id));
    }
    std::thread::sleep(Duration::from_secs(1));
    let per = (before - mem_available_mib()?) / samples as f64;
    let settled = if share {
        std::thread::sleep(settle);
        Some((before - mem_available_mib()?) / samples as f64)
    } else {
        None
    };
    // Every branch answers.
    for id in &ids {
        d.sh_ok(id, "cat /tmp/ready")?;
    }
    for id in &ids {
        d.remove(id)?;
    }
    Ok(Row {
        mode: mode.into(),
        first_ms,
        ready_ms,
        forks_us: forks,
        mib_per_branch: per,
        settled_mib: settled,
    })
}

/// podman: the same holder in a container, exported once, restored `samples` times.
fn podman_row(p: &Podman, image: &str, mib: usize, samples: usize, work: &Path) -> Result<Row> {
    let script = work.join("holder.py");
    std::fs::write(&script, holder(mib))?;
    let src_name = "forkd-largefork-src";
    let bind = format!("{}:/holder.py:ro", script.display());
    let mut flags: Vec<&str> = peers::podman::PODMAN_RUN_FLAGS.to_vec();
    flags.extend(["-v", &bind]);
    let src = PodmanContainer::start_with(p, src_name, image, &flags, &["python3", "/holder.py"])?;
    let t = Instant::now();
    loop {
        let out = Command::new("podman")
            .args(["exec", &src.name, "cat", "/tmp/ready"])
            .output()?;
        if String::from_utf8_lossy(&out.stdout).trim() == "ok" {
            break;
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(300),
            "the podman holder never got ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let export = work.join(format!("podman-{mib}.tar"));
    common::run_checked(&mut p.checkpoint_export(&[], &export, &src.name))?;
    drop(src);
    std::thread::sleep(Duration::from_secs(1));
    let before = mem_available_mib()?;
    let mut times = Vec::new();
    let mut kept = Vec::new();
    for i in 0..samples {
        let name = format!("forkd-largefork-{mib}-{i}");
        let t = Instant::now();
        common::run_checked(p.restore_import(&[], &export).args(["--name", &name]))?;
        times.push(t.elapsed().as_micros() as u64);
        kept.push(PodmanContainer { name });
    }
    std::thread::sleep(Duration::from_secs(1));
    let per = (before - mem_available_mib()?) / samples as f64;
    drop(kept);
    let _ = std::fs::remove_file(&export);
    Ok(Row {
        mode: "podman".into(),
        first_ms: None,
        ready_ms: None,
        forks_us: times,
        mib_per_branch: per,
        settled_mib: None,
    })
}

/// The floor: a process holding M MiB forks (the child exits at once), `samples` times.
fn fork_floor(mib: usize, samples: usize) -> Result<Row> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import os, time\nb = [os.urandom(1 << 20) for _ in range({mib})]\n\
             for _ in range({samples}):\n    t = time.perf_counter()\n    pid = os.fork()\n\
             \n    if pid == 0:\n        os._exit(0)\n    print(int((time.perf_counter() - t) * 1e6))\n    os.waitpid(pid, 0)\n"
        ))
        .output()?;
    anyhow::ensure!(out.status.success(), "python3 fork floor failed");
    let forks = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    Ok(Row {
        mode: "fork()".into(),
        first_ms: None,
        ready_ms: None,
        forks_us: forks,
        mib_per_branch: f64::NAN,
        settled_mib: None,
    })
}

fn main() -> Result<()> {
    common::install_interrupt_handler();
    let Some(debian) = common::root_and_debian("largefork")? else {
        return Ok(());
    };
    let sizes: Vec<usize> = std::env::var("FORKD_LARGEFORK_MIB")
        .unwrap_or_else(|_| "16,256,1024,4096".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .context("FORKD_LARGEFORK_MIB: MiB, comma-separated")
        })
        .collect::<Result<_>>()?;
    let samples = common::env_usize("FORKD_LARGEFORK_SAMPLES", 5)?;
    let settle = Duration::from_secs(common::env_usize("FORKD_LARGEFORK_SETTLE_SECS", 20)? as u64);
    let with_templates = DaemonGuard::start(Path::new(BIN))?;
    let without = DaemonGuard::start_with_env(Path::new(BIN), &[("FORKD_TEMPLATES", "off")])?;
    for d in [&with_templates, &without] {
        d.import(&debian, "debian")?;
    }
    let podman = Podman::detect()?;
    let work = common::unique_temp_dir("forkd-largefork")?;
    let podman_image = match &podman {
        Some(p) => {
            let tar = work.join("debian.tar");
            let ok = Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "zstd -dc '{}' > '{}'",
                    debian.display(),
                    tar.display()
                ))
                .status()?
                .success();
            anyhow::ensure!(ok, "decompress {}", debian.display());
            p.import(&tar, "localhost/forkd-largefork-debian")?;
            let _ = std::fs::remove_file(&tar);
            Some("localhost/forkd-largefork-debian".to_string())
        }
        None => None,
    };

    let mut md = format!(
        "# forkd benchmark: a fork of one branch by state size\n\n{} samples a mode (fewer for a peer whose branches would not fit in half the host's free memory); time p50/p90 of the request; memory: MemAvailable lost per branch, a second after the last. The template's first fork reads its pages while the template starts beside it; the samples begin once the template holds the memory (\"template ready\", from the first fork's request).\n\n\
         | state | mode | first fork ms | template ready ms | fork p50 ms | fork p90 ms | MiB a branch | after settle |\n|---:|---|---:|---:|---:|---:|---:|---:|\n",
        samples
    );
    let mut report = json!({ "machine": common::machine(), "git": common::git_revision().0, "samples": samples });
    let mut template_p50 = Vec::new();
    for &mib in &sizes {
        eprintln!("[bench] state of {mib} MiB");
        let mut rows = Vec::new();
        let ck = state(&with_templates, mib)?;
        rows.push(forkd_row(
            &with_templates,
            &ck,
            "template",
            false,
            samples,
            true,
            settle,
        )?);
        // Its template's memory back before the peers take theirs.
        with_templates.remove_checkpoint(&ck)?;
        let ck2 = state(&without, mib)?;
        // Peers' branches each hold the whole state: as many as fit in half of what is free.
        let fit = ((mem_available_mib()? * 0.5) / mib as f64) as usize;
        let peer_samples = samples.min(fit.max(1));
        rows.push(forkd_row(
            &without,
            &ck2,
            "read",
            false,
            peer_samples,
            false,
            settle,
        )?);
        rows.push(forkd_row(
            &without,
            &ck2,
            "ksm",
            true,
            peer_samples,
            false,
            settle,
        )?);
        without.remove_checkpoint(&ck2)?;
        if let (Some(p), Some(image)) = (&podman, &podman_image) {
            rows.push(podman_row(p, image, mib, peer_samples, &work)?);
        }
        rows.push(fork_floor(mib, samples.max(5))?);
        let mut size_json = serde_json::Map::new();
        for r in &rows {
            let s = summarize(&r.forks_us);
            if r.mode == "template" {
                template_p50.push((mib, s.p50));
            }
            md.push_str(&format!(
                "| {mib} MiB | {} | {} | {} | {:.1} | {:.1} | {} | {} |\n",
                r.mode,
                r.first_ms
                    .map(|m| format!("{m:.0}"))
                    .unwrap_or_else(|| "-".into()),
                r.ready_ms
                    .map(|m| format!("{m:.0}"))
                    .unwrap_or_else(|| "-".into()),
                s.p50 as f64 / 1000.0,
                s.p90 as f64 / 1000.0,
                if r.mib_per_branch.is_nan() {
                    "-".into()
                } else {
                    format!("{:.1}", r.mib_per_branch)
                },
                r.settled_mib
                    .map(|m| format!("{m:.1}"))
                    .unwrap_or_else(|| "-".into()),
            ));
            size_json.insert(
                r.mode.clone(),
                json!({ "first_ms": r.first_ms, "template_ready_ms": r.ready_ms, "forks_us": r.forks_us, "p50_us": s.p50,
                    "p90_us": s.p90, "mib_per_branch": if r.mib_per_branch.is_nan() { Value::Null } else { json!(r.mib_per_branch) },
                    "settled_mib": r.settled_mib }),
            );
        }
        // Ratios within the size: the template against its peers.
        let p50 = |m: &str| {
            rows.iter()
                .find(|r| r.mode == m)
                .map(|r| summarize(&r.forks_us).p50 as f64)
        };
        if let Some(t) = p50("template") {
            for peer in ["read", "ksm", "podman", "fork()"] {
                if let Some(v) = p50(peer) {
                    size_json.insert(format!("template_over_{peer}_p50"), json!(t / v.max(1.0)));
                    md.push_str(&format!(
                        "|  | template / {peer} p50 | | | {:.3} | | | |\n",
                        t / v.max(1.0)
                    ));
                }
            }
        }
        report[format!("{mib}_mib")] = Value::Object(size_json);
    }
    if let (Some(first), Some(last)) = (template_p50.first(), template_p50.last()) {
        let ratio = last.1 as f64 / first.1.max(1) as f64;
        report["template_largest_over_smallest_p50"] = json!(ratio);
        md.push_str(&format!(
            "\nA fork from a template: {} MiB state / {} MiB state, p50: {ratio:.2}x (goal: within 2x).\n",
            last.0, first.0
        ));
    }
    let _ = Command::new("podman")
        .args(["rmi", "-f", "localhost/forkd-largefork-debian"])
        .output();
    let _ = std::fs::remove_dir_all(&work);
    let a = with_templates.stop();
    let b = without.stop();
    report["cleanup_problems"] = json!([a.problems, b.problems]);
    common::write_outputs("largefork", &report, &md)?;
    println!("{md}");
    Ok(())
}
