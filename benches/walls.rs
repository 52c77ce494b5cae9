//! What the walls cost: the system-call filter and disk limits, on forkd's own operations
//! and on syscall-heavy work inside a sandbox, beside podman's default seccomp profile on
//! the same work, in one run on one machine.
//!
//! Rows:
//! - create (API, until the sandbox is ready), `exec true`, live checkpoint of a busybox
//!   shell loop and fork of one branch of it, each in four variants: the default filter
//!   or `unconfined`, and no disk limit or `disk_bytes` 1 GiB (btrfs simple quotas);
//! - inside a Debian sandbox, with the filter and without: a Python loop of 200,000
//!   `os.stat` calls, and `make -j2 -B` of 24 small C files; each times itself inside
//!   (so start-up is not in it);
//! - podman: the same two workloads in a container with podman's default seccomp
//!   profile and with `--security-opt seccomp=unconfined`;
//! - the mechanism under disk limits, on three fresh volumes: no quotas, btrfs simple
//!   quotas (what forkd uses) and full qgroups (`btrfs quota enable`): a read-only
//!   snapshot of a layer holding 64 files (what a checkpoint takes), a subvolume made
//!   (what a create or a fork makes), and the deletion of each, with 200 snapshots alive.
//!
//! Output: `target/bench/walls.{json,md}`. Environment: `FORKD_BENCH_SAMPLES` (default
//! 30), `FORKD_BENCH_PODMAN=0` skips podman. Needs root, CRIU and the Debian fixture.

#![forbid(unsafe_code)]

mod common;
mod peers;

use anyhow::{anyhow, Context, Result};
use common::{sample, Check, DaemonGuard, Report, Table};
use peers::podman::{Podman, PodmanContainer, PODMAN_RUN_FLAGS};
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

const PODMAN_IMAGE: &str = "localhost/forkd-bench-walls-debian";
const COUNT: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done";

/// The two workloads; each prints its own duration in microseconds.
const STAT_LOOP: &str = "python3 -c 'import os,time; t=time.perf_counter_ns(); [os.stat(\"/\") for _ in range(200000)]; print((time.perf_counter_ns()-t)//1000)'";
const MAKE: &str = "mkdir -p /tmp/p && cd /tmp/p && for i in $(seq 1 24); do printf 'int f%d(int x){return x*%d;}\\n' $i $i > f$i.c; done && printf 'OBJ=$(patsubst %%.c,%%.o,$(wildcard *.c))\\nall: $(OBJ)\\n' > Makefile && s=$(date +%s%N) && make -s -j2 -B >/dev/null && e=$(date +%s%N) && echo $(((e-s)/1000))";

struct Variant {
    name: &'static str,
    seccomp: &'static str,
    disk: Option<u64>,
}

const VARIANTS: [Variant; 4] = [
    Variant {
        name: "filter",
        seccomp: "default",
        disk: None,
    },
    Variant {
        name: "unconfined",
        seccomp: "unconfined",
        disk: None,
    },
    Variant {
        name: "filter + disk 1 GiB",
        seccomp: "default",
        disk: Some(1 << 30),
    },
    Variant {
        name: "unconfined + disk 1 GiB",
        seccomp: "unconfined",
        disk: Some(1 << 30),
    },
];

fn main() {
    common::install_interrupt_handler();
    if let Err(e) = run() {
        eprintln!("bench walls: error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let samples = common::env_usize("FORKD_BENCH_SAMPLES", 30)?;
    let Some(debian) = common::root_and_debian("bench walls")? else {
        return Ok(());
    };
    let busybox = common::fixture_image("busybox.tar");
    let podman = Podman::detect()?;
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_forkd"));
    let date = common::utc_now();
    let load_start = common::load_average();
    let mut report = Report::new("walls");
    mechanism(samples.max(50), &mut report)?;
    let daemon = DaemonGuard::start(&bin)?;
    let measured = measure(
        &daemon,
        &busybox,
        &debian,
        podman.as_ref(),
        samples,
        &mut report,
    );
    if measured.is_err() {
        eprintln!("daemon log (last lines):\n{}", daemon.log_tail(15));
    }
    let _ = daemon.stop();
    measured?;
    let run = common::RunInfo::at_end(&date, &load_start);
    let header = run.header(
        json!({ "samples": samples }),
        (
            "peer",
            json!(podman.as_ref().map(
                |p| json!({ "engine": "podman", "version": p.version, "runtime": p.runtime })
            )),
        ),
    );
    let title = run.title(&format!(
        "peer: {}",
        podman
            .as_ref()
            .map(|p| format!("podman {} with {}", p.version, p.runtime))
            .unwrap_or_else(|| "skipped".into())
    ));
    let (json_path, md_path, md) = report.write(&header, &title)?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}

fn body(v: &Variant, image: &str, command: Option<&str>) -> serde_json::Value {
    let mut b = json!({ "image": image, "seccomp": v.seccomp });
    if let Some(d) = v.disk {
        b["limits"] = json!({ "disk_bytes": d });
    }
    if let Some(c) = command {
        b["command"] = json!({ "shell": c });
    }
    b
}

fn us(t: Instant) -> u64 {
    t.elapsed().as_micros() as u64
}

fn measure(
    d: &DaemonGuard,
    busybox: &std::path::Path,
    debian: &std::path::Path,
    podman: Option<&Podman>,
    n: usize,
    report: &mut Report,
) -> Result<()> {
    d.import(busybox, "busybox")?;
    d.import(debian, "debian")?;
    let quotas: forkd::api::Health = d.client().call("GET", "/v1/health", None)?;
    let mut table = Vec::new();
    for v in &VARIANTS {
        if v.disk.is_some() && !quotas.disk_limits.ok {
            report.notes.push(format!(
                "{}: skipped, {}",
                v.name, quotas.disk_limits.detail
            ));
            continue;
        }
        let create = sample(&format!("{}: create", v.name), 3, n, || {
            let t = Instant::now();
            let sb = d.create_with(&body(v, "busybox", None))?;
            let took = us(t);
            d.remove(&sb.id)?;
            Ok(took)
        })?;
        let sb = d.create_with(&body(v, "busybox", Some(COUNT)))?;
        let exec = sample(&format!("{}: exec", v.name), 5, n, || {
            let t = Instant::now();
            d.exec_ok(&sb.id, &["true"])?;
            Ok(us(t))
        })?;
        let mut forks = Vec::new();
        let ckpt = sample(&format!("{}: live checkpoint", v.name), 1, n, || {
            let t = Instant::now();
            let ck = d.checkpoint(&sb.id, true, false)?;
            let took = us(t);
            let t = Instant::now();
            let f = d.fork(&ck.id, 1, false)?;
            forks.push(us(t));
            let b = &f.branches[0].id;
            d.sh_ok(b, "cat /tmp/n")?;
            d.remove(b)?;
            d.remove_checkpoint(&ck.id)?;
            Ok(took)
        })?;
        d.remove(&sb.id)?;
        let rows = [
            ("create", create),
            ("exec true", exec),
            ("live checkpoint", ckpt),
            ("fork of one branch", forks),
        ];
        let mut line = vec![v.name.to_string()];
        for (what, s) in rows {
            let sum = report.row(&format!("{}: {what}", v.name), s);
            line.push(common::fmt_us(sum.p50));
        }
        table.push(line);
    }
    report.tables.push(Table::new(
        "forkd's operations (p50)",
        &[
            "variant",
            "create",
            "exec true",
            "live checkpoint",
            "fork of one branch",
        ],
        table,
    ));
    ratio(
        report,
        "filter: create",
        "unconfined: create",
        "create with the filter / without",
    );
    ratio(
        report,
        "filter: exec true",
        "unconfined: exec true",
        "exec with the filter / without",
    );
    ratio(
        report,
        "filter: live checkpoint",
        "unconfined: live checkpoint",
        "live checkpoint with the filter / without",
    );
    ratio(
        report,
        "filter: fork of one branch",
        "unconfined: fork of one branch",
        "fork with the filter / without",
    );
    ratio(
        report,
        "filter + disk 1 GiB: create",
        "filter: create",
        "create with a disk limit / without",
    );
    ratio(
        report,
        "filter + disk 1 GiB: live checkpoint",
        "filter: live checkpoint",
        "live checkpoint with a disk limit / without",
    );
    ratio(
        report,
        "filter + disk 1 GiB: fork of one branch",
        "filter: fork of one branch",
        "fork with a disk limit / without",
    );

    // Workloads in Debian.
    let mut work = Vec::new();
    for seccomp in ["default", "unconfined"] {
        let sb = d.create_with(&json!({ "image": "debian", "seccomp": seccomp }))?;
        for (what, line) in [("os.stat loop", STAT_LOOP), ("make -j2", MAKE)] {
            let s = sample(&format!("forkd {seccomp}: {what}"), 2, n, || {
                let out = d.sh_ok(&sb.id, line)?;
                out.trim()
                    .parse::<u64>()
                    .with_context(|| format!("{what} printed {out:?}"))
            })?;
            let sum = report.row(&format!("forkd, filter {seccomp}: {what}"), s);
            work.push(vec![
                "forkd".into(),
                seccomp.into(),
                what.into(),
                common::fmt_us(sum.p50),
            ]);
        }
        d.remove(&sb.id)?;
    }
    if let Some(p) = podman {
        p.import(debian, PODMAN_IMAGE)?;
        for (seccomp, extra) in [
            ("default", None),
            ("unconfined", Some("seccomp=unconfined")),
        ] {
            let mut flags: Vec<&str> = PODMAN_RUN_FLAGS.to_vec();
            if let Some(e) = extra {
                flags.extend(["--security-opt", e]);
            }
            let name = format!("forkd-bench-walls-{seccomp}");
            let c = PodmanContainer::start_with(
                p,
                &name,
                PODMAN_IMAGE,
                &flags,
                &["sleep", "infinity"],
            )?;
            for (what, line) in [("os.stat loop", STAT_LOOP), ("make -j2", MAKE)] {
                let s = sample(&format!("podman {seccomp}: {what}"), 2, n, || {
                    let out = Command::new("podman")
                        .args(["exec", &c.name, "sh", "-c", line])
                        .output()?;
                    if !out.status.success() {
                        return Err(anyhow!(
                            "podman exec: {}",
                            String::from_utf8_lossy(&out.stderr)
                        ));
                    }
                    let text = String::from_utf8_lossy(&out.stdout);
                    text.trim()
                        .parse::<u64>()
                        .with_context(|| format!("{what} printed {text:?}"))
                })?;
                let sum = report.row(&format!("podman, seccomp {seccomp}: {what}"), s);
                work.push(vec![
                    "podman".into(),
                    seccomp.into(),
                    what.into(),
                    common::fmt_us(sum.p50),
                ]);
            }
        }
    }
    report.tables.push(Table::new(
        "Syscall-heavy work inside (p50, timed inside)",
        &["engine", "filter", "workload", "time"],
        work,
    ));
    for what in ["os.stat loop", "make -j2"] {
        ratio(
            report,
            &format!("forkd, filter default: {what}"),
            &format!("forkd, filter unconfined: {what}"),
            &format!("forkd {what}: filter / none"),
        );
        ratio(
            report,
            &format!("podman, seccomp default: {what}"),
            &format!("podman, seccomp unconfined: {what}"),
            &format!("podman {what}: default seccomp / none"),
        );
        ratio(
            report,
            &format!("forkd, filter default: {what}"),
            &format!("podman, seccomp default: {what}"),
            &format!("{what}: forkd's filter / podman's default"),
        );
    }
    Ok(())
}

/// Snapshot, subvolume and deletion times on volumes without quotas, with simple quotas
/// and with full qgroups.
fn mechanism(n: usize, report: &mut Report) -> Result<()> {
    use forkd_volume::Volume;
    use std::path::Path;
    let mut lines = Vec::new();
    for mode in ["none", "simple quotas", "qgroups"] {
        let state = common::unique_temp_dir("forkd-bench-walls-vol")?;
        let vol = Volume::open(&state, &forkd::daemon::config::Config::from_env()?.volume)
            .map_err(|e| anyhow!("open a volume: {e}"))?;
        let done = (|| -> Result<()> {
            match mode {
                "simple quotas" => vol.enable_quotas().map_err(|e| anyhow!(e))?,
                "qgroups" => {
                    common::run_checked(
                        Command::new("btrfs")
                            .args(["quota", "enable"])
                            .arg(vol.path()),
                    )?;
                }
                _ => {}
            }
            let root = vol.path();
            vol.create_subvolume(Path::new("layer"))?;
            for i in 0..64 {
                std::fs::write(root.join(format!("layer/f{i}")), vec![i as u8; 64 << 10])?;
            }
            std::fs::create_dir_all(root.join("snaps"))?;
            std::fs::create_dir_all(root.join("subs"))?;
            // Snapshots alive while measuring, as checkpoints are.
            for i in 0..200 {
                vol.snapshot_readonly(
                    Path::new("layer"),
                    &Path::new("snaps").join(format!("k{i}")),
                )?;
            }
            let mut i = 0;
            let snap = sample(&format!("{mode}: snapshot"), 3, n, || {
                i += 1;
                // A write first, as a checkpoint follows a sandbox's writes.
                std::fs::write(root.join("layer/changing"), i.to_string())?;
                let t = Instant::now();
                vol.snapshot_readonly(
                    Path::new("layer"),
                    &Path::new("snaps").join(format!("s{i}")),
                )?;
                Ok(us(t))
            })?;
            let mut j = 0;
            let sub = sample(&format!("{mode}: subvolume"), 3, n, || {
                j += 1;
                let t = Instant::now();
                vol.create_subvolume(&Path::new("subs").join(format!("b{j}")))?;
                Ok(us(t))
            })?;
            let mut k = 0;
            let del = sample(&format!("{mode}: delete"), 0, n, || {
                k += 1;
                let t = Instant::now();
                vol.delete_subvolume(&Path::new("snaps").join(format!("s{k}")))?;
                vol.delete_subvolume(&Path::new("subs").join(format!("b{k}")))?;
                Ok(us(t))
            })?;
            let mut line = vec![mode.to_string()];
            for (what, s) in [
                ("snapshot", snap),
                ("subvolume", sub),
                ("delete a snapshot and a subvolume", del),
            ] {
                let sum = report.row(&format!("volume, {mode}: {what}"), s);
                line.push(common::fmt_us(sum.p50));
            }
            lines.push(line);
            Ok(())
        })();
        let unmounted = vol.unmount();
        let _ = std::fs::remove_dir_all(&state);
        done?;
        unmounted.map_err(|e| anyhow!("unmount the bench's volume: {e}"))?;
    }
    report.tables.push(Table::new(
        "Disk-limit mechanisms (p50, 200 snapshots alive)",
        &[
            "quotas",
            "snapshot",
            "subvolume",
            "delete a snapshot and a subvolume",
        ],
        lines,
    ));
    for what in ["snapshot", "subvolume", "delete a snapshot and a subvolume"] {
        for mode in ["simple quotas", "qgroups"] {
            ratio(
                report,
                &format!("volume, {mode}: {what}"),
                &format!("volume, none: {what}"),
                &format!("{what}: {mode} / none"),
            );
        }
    }
    Ok(())
}

/// A p50 ratio of two rows, when both were measured.
fn ratio(report: &mut Report, a: &str, b: &str, name: &str) {
    if let (Some(x), Some(y)) = (report.p50(a), report.p50(b)) {
        let r = x as f64 / y.max(1) as f64;
        report.checks.push(Check {
            name: name.into(),
            value: Some(r),
            shown: format!("{r:.3}"),
            goal: "measured".into(),
            met: None,
        });
    }
}
