//! Sandbox lifecycle benchmark: forkd against podman on the same busybox image, in one
//! run on one machine.
//!
//! Rows (all client-side wall time unless noted):
//! - create -> first exec: a fresh sandbox per sample, from sending `POST /v1/sandboxes`
//!   to the end of the first `exec true`; removal is outside the timing. The daemon's own
//!   `create_us` (set-up until the init is ready) is reported beside it, and so is the
//!   removal time.
//! - exec round trip: `exec true` in one running sandbox through the API, and through the
//!   `forkd exec` binary (process start included).
//! - `forkd run --rm busybox -- true` as a whole CLI process (create, run, remove).
//! - podman: `podman run --rm ... true` per sample (its create-to-first-exec), and
//!   `podman exec CONTAINER true` against one detached container.
//! - density: N sandboxes alive at once (created one after another): daemon RSS, host
//!   memory per sandbox (MemAvailable delta / N), total create time, an exec in each.
//!
//! Output: `target/bench/sandbox.json` (samples, percentiles, machine, git revision) and
//! `target/bench/sandbox.md` (printed too). Progress goes to stderr.
//!
//! Environment: `FORKD_BENCH_SAMPLES` (default 100), `FORKD_BENCH_DENSITY` (default 200),
//! `FORKD_BENCH_PODMAN=0` skips the podman rows, `FORKD_CACHE` locates the fixture image
//! (`fixtures/setup.sh busybox`). Needs root; without it (or the fixture, or podman) the
//! run prints `SKIP` lines, which are errors under `CI=true`.

#![forbid(unsafe_code)]

mod common;
mod peers;

use anyhow::{Context, Result};
use common::{fmt_kib, fmt_us, sample, Check, DaemonGuard, Report};
use peers::podman::{Podman, PodmanContainer, PODMAN_RUN_FLAGS};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const IMAGE: &str = "busybox";
const PODMAN_IMAGE: &str = "localhost/forkd-bench-busybox";

const ROW_CREATE_EXEC: &str = "forkd create -> first exec (API)";
const ROW_CREATE_DAEMON: &str = "forkd create, daemon-side create_us";
const ROW_REMOVE: &str = "forkd rm -f (API, not in the row above)";
const ROW_EXEC_API: &str = "forkd exec true (API round trip)";
const ROW_EXEC_CLI: &str = "forkd exec true (CLI binary, process start included)";
const ROW_RUN_RM_CLI: &str = "forkd run --rm true (CLI binary, whole process)";
const ROW_EXEC_GRANT: &str = "forkd exec true through a grant's socket (API round trip)";
const ROW_PODMAN_RUN: &str = "podman run --rm true";
const ROW_PODMAN_EXEC: &str = "podman exec true";

struct Config {
    samples: usize,
    density: usize,
}

fn main() {
    common::install_interrupt_handler();
    if let Err(e) = run() {
        eprintln!("bench sandbox: error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let cfg = Config {
        samples: common::env_usize("FORKD_BENCH_SAMPLES", 100)?,
        density: common::env_usize("FORKD_BENCH_DENSITY", 200)?,
    };
    if !nix::unistd::Uid::effective().is_root() {
        return common::skip("bench sandbox", "needs root (namespaces, mounts, cgroups)");
    }
    let tar = common::fixture_image("busybox.tar");
    if !tar.is_file() {
        return common::skip(
            "bench sandbox",
            &format!(
                "fixture {} is missing (run fixtures/setup.sh busybox)",
                tar.display()
            ),
        );
    }
    let podman = Podman::detect()?;
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_forkd"));

    let date = common::utc_now();
    let load_start = common::load_average();
    let mut report = Report::new("sandbox");
    let mut created: Vec<String> = Vec::new();
    eprintln!(
        "bench sandbox: {} samples, density {}, podman {}",
        cfg.samples,
        cfg.density,
        podman
            .as_ref()
            .map(|p| format!("{} ({})", p.version, p.runtime))
            .unwrap_or_else(|| "skipped".into())
    );

    let daemon = DaemonGuard::start(&bin)?;
    let temp_dir = daemon.dir.clone();
    eprintln!(
        "daemon pid {} on {} (log {})",
        daemon.pid()?,
        daemon.socket.display(),
        daemon.log.display()
    );
    let measured = measure(
        &daemon,
        &bin,
        &tar,
        podman.as_ref(),
        &cfg,
        &mut report,
        &mut created,
    );
    if measured.is_err() {
        eprintln!("daemon log (last lines):\n{}", daemon.log_tail(15));
    }
    let cleanup = daemon.stop();
    measured?;

    // What the run left behind, checked after the daemon is gone.
    let mounts = common::mounts_under(&temp_dir);
    let cgroups = common::cgroups_left(&created);
    report.extra.insert(
        "cleanup".into(),
        json!({
            "sandboxes_created": created.len(),
            "removed_at_shutdown": cleanup.sandboxes_removed,
            "problems": cleanup.problems,
            "mounts_left": mounts,
            "cgroups_left": cgroups,
        }),
    );
    let leaked = !mounts.is_empty() || !cgroups.is_empty() || !cleanup.problems.is_empty();
    report.sections.push((
        "Clean-up".into(),
        vec![
            (
                "sandboxes created in this run".into(),
                created.len().to_string(),
            ),
            (
                "mounts left under the temporary root".into(),
                mounts.len().to_string(),
            ),
            (
                "cgroups left for this run's sandboxes".into(),
                cgroups.len().to_string(),
            ),
            (
                "clean-up problems".into(),
                cleanup.problems.len().to_string(),
            ),
        ],
    ));

    let run = common::RunInfo::at_end(&date, &load_start);
    let header = run.header(
        json!({ "samples": cfg.samples, "density": cfg.density, "image": IMAGE }),
        (
            "peer",
            json!(podman.as_ref().map(|p| json!({
                "engine": "podman", "version": p.version, "runtime": p.runtime,
                "image": PODMAN_IMAGE, "flags": PODMAN_RUN_FLAGS,
            }))),
        ),
    );
    let title = run.title(&format!(
        "peer: {}",
        podman
            .as_ref()
            .map(|p| format!("podman {} with {}", p.version, p.runtime))
            .unwrap_or_else(|| "skipped".into()),
    ));
    let (json_path, md_path, md) = report.write(&header, &title)?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    if leaked {
        anyhow::bail!("the run left mounts, cgroups or clean-up problems behind (see above)");
    }
    Ok(())
}

fn measure(
    daemon: &DaemonGuard,
    bin: &Path,
    tar: &Path,
    podman: Option<&Podman>,
    cfg: &Config,
    report: &mut Report,
    created: &mut Vec<String>,
) -> Result<()> {
    let client = daemon.client();
    let t = Instant::now();
    let _: forkd::api::ImageInfo = client
        .call(
            "POST",
            "/v1/images",
            Some(&json!({ "source": tar.display().to_string(), "name": IMAGE })),
        )
        .with_context(|| format!("import {}", tar.display()))?;
    eprintln!(
        "imported {} as {IMAGE} in {}",
        tar.display(),
        fmt_us(t.elapsed().as_micros() as u64)
    );

    // 1. Create -> first exec, a fresh sandbox per sample.
    eprintln!("[1/4] forkd create -> first exec");
    let mut daemon_create = Vec::new();
    let mut removal = Vec::new();
    // `sample` runs the warm-ups first; their daemon-side numbers are not kept either.
    let warmup = 5;
    let mut warm = warmup;
    let create_exec = sample(ROW_CREATE_EXEC, warmup, cfg.samples, || {
        let t = Instant::now();
        let info = daemon.create(IMAGE)?;
        created.push(info.id.clone());
        let first = daemon.exec_ok(&info.id, &["true"]);
        let us = t.elapsed().as_micros() as u64;
        let t_rm = Instant::now();
        let removed = daemon.remove(&info.id);
        first?;
        removed?;
        if warm > 0 {
            warm -= 1;
        } else {
            daemon_create.push(info.create_us);
            removal.push(t_rm.elapsed().as_micros() as u64);
        }
        Ok(us)
    })?;
    report.row(ROW_CREATE_EXEC, create_exec);
    report.row(ROW_CREATE_DAEMON, daemon_create);
    report.row(ROW_REMOVE, removal);

    // 2. Exec round trip in one running sandbox: API, then the CLI binary.
    eprintln!("[2/4] forkd exec round trip");
    let info = daemon.create(IMAGE)?;
    created.push(info.id.clone());
    let id = info.id.clone();
    let n_exec = 2 * cfg.samples;
    let exec_api = sample(ROW_EXEC_API, 20, n_exec, || {
        let t = Instant::now();
        daemon.exec_ok(&id, &["true"])?;
        Ok(t.elapsed().as_micros() as u64)
    })?;
    report.row(ROW_EXEC_API, exec_api);
    let exec_cli = sample(ROW_EXEC_CLI, 5, n_exec, || {
        common::time_command(
            Command::new(bin)
                .arg("--socket")
                .arg(&daemon.socket)
                .args(["exec", &id, "--", "true"]),
        )
    })?;
    report.row(ROW_EXEC_CLI, exec_cli);
    // A whole `forkd run --rm`: the CLI process creates a sandbox, runs the command in
    // it, removes it and exits with the command's code (podman's `run --rm` peer below).
    let run_rm = sample(ROW_RUN_RM_CLI, 3, cfg.samples, || {
        common::time_command(
            Command::new(bin)
                .arg("--socket")
                .arg(&daemon.socket)
                .args(["run", "--rm", IMAGE, "--", "true"]),
        )
    })?;
    report.row(ROW_RUN_RM_CLI, run_rm);
    // The same exec through a grant (what a confined agent uses): admission, the step
    // count, then the same exec.
    let grant: forkd::api::GrantInfo = client
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/grants"),
            Some(&json!({ "uid": 2_000_000_000u32 })),
        )
        .context("grant on the exec sandbox")?;
    let granted = forkd::client::Client::new(Path::new(&grant.socket));
    let exec_grant = sample(ROW_EXEC_GRANT, 20, n_exec, || {
        let t = Instant::now();
        let r: forkd::api::ExecResult = granted
            .call(
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                Some(&json!({ "argv": ["true"] })),
            )
            .context("exec through the grant")?;
        anyhow::ensure!(
            r.exit.exit_code == 0,
            "exec through the grant exited {}",
            r.exit.exit_code
        );
        Ok(t.elapsed().as_micros() as u64)
    })?;
    report.row(ROW_EXEC_GRANT, exec_grant);
    daemon.remove(&id)?;

    // 3. The podman peer on the same image.
    match podman {
        Some(p) => measure_podman(p, tar, cfg, report)?,
        None => report
            .notes
            .push("podman rows skipped: no ratios against the peer".into()),
    }

    // 4. Density.
    measure_density(daemon, cfg, report, created)?;

    report.extra.insert(
        "daemon_metrics".into(),
        client
            .call::<Value>("GET", "/v1/metrics", None)
            .unwrap_or(Value::Null),
    );
    add_checks(report);
    Ok(())
}

fn measure_podman(p: &Podman, tar: &Path, cfg: &Config, report: &mut Report) -> Result<()> {
    eprintln!("[3/4] podman peer");
    let t = Instant::now();
    p.import(tar, PODMAN_IMAGE)?;
    eprintln!(
        "  podman import {} as {PODMAN_IMAGE} in {}",
        tar.display(),
        fmt_us(t.elapsed().as_micros() as u64)
    );
    let run = sample(ROW_PODMAN_RUN, 3, cfg.samples, || {
        common::time_command(
            p.command()
                .args(["run", "--rm"])
                .args(PODMAN_RUN_FLAGS)
                .args([PODMAN_IMAGE, "true"]),
        )
    })?;
    report.row(ROW_PODMAN_RUN, run);

    let name = format!("forkd-bench-{}", std::process::id());
    let container = PodmanContainer::start(p, &name, PODMAN_IMAGE, &["sleep", "100000"])?;
    let exec = sample(ROW_PODMAN_EXEC, 5, cfg.samples, || {
        common::time_command(p.command().args(["exec", &container.name, "true"]))
    })?;
    report.row(ROW_PODMAN_EXEC, exec);
    drop(container);
    Ok(())
}

fn measure_density(
    daemon: &DaemonGuard,
    cfg: &Config,
    report: &mut Report,
    created: &mut Vec<String>,
) -> Result<()> {
    let n = cfg.density;
    eprintln!("[4/4] density: {n} sandboxes alive at once");
    let settle = Duration::from_millis(500);
    std::thread::sleep(settle);
    let rss_before = daemon.rss_kib()?;
    let avail_before = common::mem_available_kib()?;

    let mut alive = Vec::with_capacity(n);
    let mut creates = Vec::with_capacity(n);
    let t_all = Instant::now();
    for i in 0..n {
        common::check_interrupted()?;
        let t = Instant::now();
        let info = daemon
            .create(IMAGE)
            .with_context(|| format!("density: sandbox {}/{n}", i + 1))?;
        creates.push(t.elapsed().as_micros() as u64);
        created.push(info.id.clone());
        alive.push(info.id);
        if (i + 1) % 25 == 0 || i + 1 == n {
            eprintln!(
                "  density: {}/{n} alive ({:.1}s)",
                i + 1,
                t_all.elapsed().as_secs_f64()
            );
        }
    }
    let create_total = t_all.elapsed();
    std::thread::sleep(settle);
    let rss_after = daemon.rss_kib()?;
    let avail_after = common::mem_available_kib()?;

    let mut execs = Vec::with_capacity(n);
    for (i, id) in alive.iter().enumerate() {
        common::check_interrupted()?;
        let t = Instant::now();
        daemon
            .exec_ok(id, &["true"])
            .with_context(|| format!("density: exec in sandbox {}/{n}", i + 1))?;
        execs.push(t.elapsed().as_micros() as u64);
    }
    eprintln!("  density: all {n} answered `exec true`");
    let listed: Vec<forkd::api::SandboxInfo> =
        daemon.client().call("GET", "/v1/sandboxes", None)?;
    let running = listed
        .iter()
        .filter(|s| s.status == forkd::api::SandboxStatus::Running)
        .count();
    // Two views that other processes on the machine do not disturb: what each
    // sandbox's cgroup is charged, and the proportional memory of its init.
    let cgroup_kib: Vec<u64> = listed
        .iter()
        .filter_map(|s| s.memory_bytes)
        .map(|b| b / 1024)
        .collect();
    let init_pss_kib: Vec<u64> = listed
        .iter()
        .filter_map(|s| s.init_pid)
        .filter_map(|pid| common::pss_kib(pid as u32).ok())
        .collect();
    let mean = |v: &[u64]| {
        if v.is_empty() {
            None
        } else {
            Some(v.iter().sum::<u64>() as f64 / v.len() as f64)
        }
    };
    let (cgroup_mean, pss_mean) = (mean(&cgroup_kib), mean(&init_pss_kib));
    let shown = |m: Option<f64>, k: usize| {
        m.map(|m| format!("{} ({k} of {n} read)", fmt_kib(m)))
            .unwrap_or_else(|| "n/a".into())
    };

    let t_rm = Instant::now();
    for id in &alive {
        common::check_interrupted()?;
        daemon.remove(id)?;
    }
    let remove_total = t_rm.elapsed();
    std::thread::sleep(settle);
    let rss_end = daemon.rss_kib()?;
    let avail_end = common::mem_available_kib()?;
    eprintln!(
        "  density: removed all {n} in {}",
        fmt_us(remove_total.as_micros() as u64)
    );

    let create_row = format!("forkd create with 0..{n} alive (density run)");
    let exec_row = format!("forkd exec true in each of {n} alive (API)");
    let cs = report.row(&create_row, creates);
    report.row(&exec_row, execs);

    let per = |kib: i64| kib as f64 / n as f64;
    let host_used = avail_before as i64 - avail_after as i64;
    let rss_delta = rss_after as i64 - rss_before as i64;
    report.sections.push((
        format!("Density: {n} sandboxes alive at once"),
        vec![
            (
                "sandboxes running (listed by the daemon)".into(),
                format!("{running} of {n}"),
            ),
            (
                "total create time (sequential)".into(),
                format!(
                    "{:.2} s ({} mean each)",
                    create_total.as_secs_f64(),
                    fmt_us(cs.mean as u64)
                ),
            ),
            (
                "daemon RSS before -> with all alive".into(),
                format!(
                    "{} -> {}",
                    fmt_kib(rss_before as f64),
                    fmt_kib(rss_after as f64)
                ),
            ),
            ("daemon RSS per sandbox".into(), fmt_kib(per(rss_delta))),
            (
                "host memory per sandbox (MemAvailable delta / N)".into(),
                fmt_kib(per(host_used)),
            ),
            (
                "cgroup memory charged per sandbox (mean)".into(),
                shown(cgroup_mean, cgroup_kib.len()),
            ),
            (
                "init process PSS per sandbox (mean)".into(),
                shown(pss_mean, init_pss_kib.len()),
            ),
            (
                "host memory used by all, total".into(),
                fmt_kib(host_used as f64),
            ),
            (
                "remove all (sequential, rm -f)".into(),
                format!("{:.2} s", remove_total.as_secs_f64()),
            ),
            (
                "daemon RSS after removing all".into(),
                fmt_kib(rss_end as f64),
            ),
            (
                "host memory still used after removing all (MemAvailable vs before)".into(),
                fmt_kib(avail_before as f64 - avail_end as f64),
            ),
        ],
    ));
    report.extra.insert(
        "density".into(),
        json!({
            "sandboxes": n,
            "running": running,
            "create_total_us": create_total.as_micros() as u64,
            "remove_total_us": remove_total.as_micros() as u64,
            "daemon_rss_kib": { "before": rss_before, "alive": rss_after, "after_remove": rss_end },
            "daemon_rss_per_sandbox_kib": per(rss_delta),
            "mem_available_kib": { "before": avail_before, "alive": avail_after, "after_remove": avail_end },
            "host_memory_per_sandbox_kib": per(host_used),
            "cgroup_memory_per_sandbox_kib": cgroup_mean,
            "init_pss_per_sandbox_kib": pss_mean,
        }),
    );
    report.notes.push(format!(
        "host memory per sandbox is the drop of MemAvailable over the whole machine while \
         {n} sandboxes were alive (settled {} ms), so other activity on the machine adds noise",
        settle.as_millis()
    ));
    if running != n {
        anyhow::bail!("density: only {running} of {n} sandboxes were listed as running");
    }
    Ok(())
}

/// The headline comparisons and goals.
fn add_checks(report: &mut Report) {
    let exec = report.p50(ROW_EXEC_API);
    let podman_run = report.p50(ROW_PODMAN_RUN);
    let podman_exec = report.p50(ROW_PODMAN_EXEC);
    let (create, run_rm, exec_cli) = (
        report.p50(ROW_CREATE_EXEC),
        report.p50(ROW_RUN_RM_CLI),
        report.p50(ROW_EXEC_CLI),
    );
    // A ratio of two p50s, with the goal it must stay within, if it has one.
    let ratio =
        |report: &mut Report, name: &str, a: Option<u64>, b: Option<u64>, goal: Option<f64>| {
            let r = match (a, b) {
                (Some(a), Some(b)) if b > 0 => Some(a as f64 / b as f64),
                _ => None,
            };
            report.checks.push(Check {
                name: name.into(),
                value: r,
                shown: r.map(|v| format!("{v:.3}")).unwrap_or_else(|| "n/a".into()),
                goal: goal
                    .map(|g| format!("<= {g}"))
                    .unwrap_or_else(|| "-".into()),
                met: goal.and_then(|g| r.map(|v| v <= g)),
            });
        };
    ratio(
        report,
        "forkd create -> first exec p50 / podman run p50",
        create,
        podman_run,
        Some(0.1),
    );
    let e = exec.map(|us| us as f64 / 1000.0);
    report.checks.push(Check {
        name: "forkd exec round trip p50 (API)".into(),
        value: e,
        shown: e
            .map(|v| format!("{v:.2} ms"))
            .unwrap_or_else(|| "n/a".into()),
        goal: "< 5 ms".into(),
        met: e.map(|v| v < 5.0),
    });
    ratio(
        report,
        "forkd exec p50 (API) / podman exec p50",
        exec,
        podman_exec,
        None,
    );
    ratio(
        report,
        "forkd run --rm p50 (CLI, whole process) / podman run --rm p50",
        run_rm,
        podman_run,
        Some(0.1),
    );
    ratio(
        report,
        "forkd exec p50 (CLI) / podman exec p50",
        exec_cli,
        podman_exec,
        None,
    );
}
