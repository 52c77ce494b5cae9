//! Checkpoint and fork benchmark: forkd next to the tools it stands in for, measured in
//! one run on one machine.
//!
//! 1. Filesystem checkpoints against the size of the sandbox's writable layer (1 MiB to
//!    1 GiB of random data written in a busybox sandbox). Two cases: the data synced to
//!    disk first, and the data just written (still dirty in the page cache, which the
//!    btrfs snapshot must flush). A fresh checkpoint per sample, removed once its
//!    background tree hash is done, so samples do not overlap. Rows: API latency and the
//!    daemon's phases (freeze, snapshot, total), the time until the tree hash appears,
//!    and the peer: `tar -C <upper> -cf - . | zstd -T0 -3` of the same directory.
//! 2. Live forks of a small process tree: busybox (a shell loop and a sleep), and, when
//!    the Debian fixture exists, the real case (a shell and python3). A live checkpoint
//!    is forked with one request of N = 1, 10, 100 branches; per-branch time is the
//!    branch's `phases_us.total`, next to the request's wall time / N. Peers, for each
//!    tree: `podman container restore --import` of the same tree (a container of the
//!    same rootfs running the same shell line), and the raw CRIU command line
//!    (`criu restore -d`) restoring the very images forkd restores, into an overlay
//!    mounted by hand over the checkpoint's layers (root, lowers and an empty upper on the
//!    same btrfs volume), killed and unmounted after each copy. The peers' restores are
//!    interleaved with forkd's N = 1 samples, one of each per round, so that load on a
//!    shared machine weighs on all of them alike.
//! 3. A 256 MiB QEMU guest (TCG) in a Debian sandbox: dump time, then eager and lazy
//!    time to running (from sending the fork request until the branch's serial log shows
//!    a counter past the checkpointed one, read through the branch's root on the host
//!    every 2 ms) and memory per branch 10 s after its fork (cgroup charge, and PSS and
//!    RSS summed over the processes of its cgroup).
//! 4. The largest fork of part 2 (N = FORKD_BENCH_BRANCHES) alive at once: host memory
//!    (MemAvailable before and after), the branches' cgroup charge and PSS, then removal.
//!
//! Service states (redis with its data and client connections, PostgreSQL) next to
//! podman `checkpoint --tcp-established` are in benches/services.rs.
//!
//! Output: `target/bench/checkpoint.json` (samples, percentiles, machine, git revision,
//! load averages) and `target/bench/checkpoint.md` (printed too). Progress goes to stderr.
//!
//! Environment: `FORKD_BENCH_SAMPLES` (default 10), `FORKD_BENCH_BRANCHES` (largest fork,
//! default 100), `FORKD_BENCH_SIZES` (default `1M,16M,256M,1G`), `FORKD_BENCH_PODMAN=0`
//! and `FORKD_BENCH_QEMU=0` skip those parts, `FORKD_CACHE` locates the fixtures
//! (`fixtures/setup.sh busybox debian qemu criu`). Needs root and CRIU 4; what cannot
//! run prints `SKIP`, which is an error under `CI=true`.

#![forbid(unsafe_code)]

mod common;

use anyhow::{anyhow, bail, Context, Result};
use common::{
    fmt_kib, fmt_ms, fmt_us, sample, Check, DaemonGuard, Podman, PodmanContainer, Report, Summary,
    Table, PODMAN_RUN_FLAGS,
};
use forkd::api::{BranchInfo, CheckpointInfo, SandboxStatus};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BUSYBOX: &str = "busybox";
const DEBIAN: &str = "debian";

/// Goals, checked under the table.
const FS_CHECKPOINT_GOAL_MS: f64 = 20.0;
const PODMAN_RATIO_GOAL: f64 = 1.0 / 8.0;
const RAW_CRIU_RATIO_GOAL: f64 = 1.5;
const LAZY_RUNNING_GOAL_MS: f64 = 200.0;

/// A small process tree to checkpoint and fork.
struct Tree {
    name: &'static str,
    image: &'static str,
    /// The sandbox's command (`/bin/sh -c`), started by its init so it is in the
    /// init's process tree, which is what a live checkpoint dumps.
    shell: &'static str,
    /// Process names that every restored copy must have running.
    expect: &'static [&'static str],
    /// The fixture rootfs archive (under the cache's images/) and the name podman's
    /// peer imports it under.
    fixture: &'static str,
    podman_image: &'static str,
}

const BUSYBOX_TREE: Tree = Tree {
    name: "busybox sh+sleep",
    image: BUSYBOX,
    shell: "while true; do sleep 1; done & exec sleep 100000",
    expect: &["sh", "sleep"],
    fixture: "busybox.tar",
    podman_image: "localhost/forkd-bench-busybox",
};

const DEBIAN_TREE: Tree = Tree {
    name: "debian sh+python3",
    image: DEBIAN,
    shell: "python3 -c 'import time\nwhile True: time.sleep(1)' & while true; do sleep 1; done",
    expect: &["sh", "python3"],
    fixture: "debian.tar.zst",
    podman_image: "localhost/forkd-bench-debian",
};

const GUEST_SERIAL: &str = "guest/serial.log";

struct Config {
    samples: usize,
    /// Branch counts of the fork requests of part 2; the last is the largest.
    branch_counts: Vec<usize>,
    sizes: Vec<u64>,
    qemu: bool,
}

impl Config {
    fn from_env() -> Result<Config> {
        let samples = common::env_usize("FORKD_BENCH_SAMPLES", 10)?;
        let max = common::env_usize("FORKD_BENCH_BRANCHES", 100)?;
        let mut branch_counts: Vec<usize> = [1, 10, 100].into_iter().filter(|&n| n < max).collect();
        branch_counts.push(max);
        let sizes = match std::env::var("FORKD_BENCH_SIZES") {
            Ok(v) if !v.trim().is_empty() => v
                .split(',')
                .map(|s| parse_size(s.trim()))
                .collect::<Result<Vec<u64>>>()
                .with_context(|| format!("FORKD_BENCH_SIZES={v:?}"))?,
            _ => vec![1 << 20, 16 << 20, 256 << 20, 1 << 30],
        };
        let qemu = !std::env::var("FORKD_BENCH_QEMU").is_ok_and(|v| v == "0");
        Ok(Config {
            samples,
            branch_counts,
            sizes,
            qemu,
        })
    }
}

/// `1M`, `16M`, `1G`, `512K` (also `1MiB`) or plain bytes; binary multiples.
fn parse_size(s: &str) -> Result<u64> {
    let upper = s.to_ascii_uppercase();
    let t = upper.trim_end_matches("IB").trim_end_matches('B');
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'K')) => (&t[..i], 10),
        Some((i, 'M')) => (&t[..i], 20),
        Some((i, 'G')) => (&t[..i], 30),
        _ => (t, 0),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow!("{s:?}: expected a size such as 16M or 1G"))?;
    if n == 0 {
        bail!("{s:?}: the size must be positive");
    }
    Ok(n << shift)
}

fn size_label(bytes: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes & ((1 << shift) - 1) == 0 {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}

/// What every part needs.
struct Ctx<'a> {
    d: &'a DaemonGuard,
    cfg: &'a Config,
    /// A host directory of this run for archives and exports; removed at the end.
    scratch: PathBuf,
    /// The daemon's data volume (`<state root>/vol`, or the state root on btrfs).
    data: PathBuf,
    podman_prefix: String,
}

/// What the run produced and what it must clean up or check for leaks.
struct Out {
    report: Report,
    /// Every sandbox created (branches included), for the cgroup leak check.
    created: Vec<String>,
    /// Host pids of trees restored with the raw CRIU command line.
    raw_pids: Vec<i32>,
}

fn main() {
    common::install_interrupt_handler();
    if let Err(e) = run() {
        eprintln!("bench checkpoint: error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let cfg = Config::from_env()?;
    if !nix::unistd::Uid::effective().is_root() {
        return common::skip(
            "bench checkpoint",
            "needs root (namespaces, mounts, cgroups, CRIU)",
        );
    }
    let busybox = common::fixture_image("busybox.tar");
    if !busybox.is_file() {
        return common::skip(
            "bench checkpoint",
            &format!(
                "fixture {} is missing (run fixtures/setup.sh busybox)",
                busybox.display()
            ),
        );
    }
    let podman = Podman::detect()?;
    let criu = match forkd_criu::Criu::locate(None) {
        Ok(c) => Some(c),
        Err(e) => {
            common::skip("live checkpoints and forks (parts 2-4)", &e.to_string())?;
            None
        }
    };
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_forkd"));
    let date = common::utc_now();
    let load_start = common::load_average();
    eprintln!(
        "bench checkpoint: {} samples, sizes {}, forks of {:?} branches, podman {}, CRIU {}, QEMU {}",
        cfg.samples,
        cfg.sizes
            .iter()
            .map(|s| size_label(*s))
            .collect::<Vec<_>>()
            .join(", "),
        cfg.branch_counts,
        podman
            .as_ref()
            .map(|p| format!("{} ({})", p.version, p.runtime))
            .unwrap_or_else(|| "skipped".into()),
        criu.as_ref()
            .map(|c| format!("{} at {}", c.version, c.path.display()))
            .unwrap_or_else(|| "missing".into()),
        if cfg.qemu { "on" } else { "off" },
    );

    let scratch = common::unique_temp_dir("forkd-bench-scratch")?;
    let podman_prefix = format!("forkd-bench-ckpt-{}", std::process::id());
    let mut out = Out {
        report: Report::new("checkpoint"),
        created: Vec::new(),
        raw_pids: Vec::new(),
    };
    let daemon = match DaemonGuard::start(&bin) {
        Ok(d) => d,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&scratch);
            return Err(e);
        }
    };
    let temp_dir = daemon.dir.clone();
    eprintln!(
        "daemon pid {} on {} (log {})",
        daemon.pid()?,
        daemon.socket.display(),
        daemon.log.display()
    );
    let measured = measure(
        &daemon,
        &cfg,
        &scratch,
        &podman_prefix,
        &busybox,
        podman.as_ref(),
        criu.as_ref(),
        &mut out,
    );
    if let Err(e) = &measured {
        eprintln!("bench checkpoint: failed: {e:#}");
        eprintln!("daemon log (last lines):\n{}", daemon.log_tail(25));
    }
    let metrics = daemon
        .client()
        .call::<Value>("GET", "/v1/metrics", None)
        .unwrap_or(Value::Null);
    out.report.extra.insert("daemon_metrics".into(), metrics);
    let cleanup = daemon.stop();
    // The daemon's own complaints; its log goes with its temporary directory.
    let warnings: Vec<String> = cleanup
        .log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .map(str::to_string)
        .collect();
    if !warnings.is_empty() {
        out.report.notes.push(format!(
            "the daemon logged {} warnings; the first: `{}`",
            warnings.len(),
            warnings[0]
        ));
    }
    out.report
        .extra
        .insert("daemon_warnings".into(), json!(warnings));

    // What the run left behind, checked after the daemon is gone.
    let mut problems = cleanup.problems.clone();
    let scratch_mounts = common::mounts_under(&scratch);
    if scratch_mounts.is_empty() {
        if let Err(e) = std::fs::remove_dir_all(&scratch) {
            problems.push(format!("remove {}: {e}", scratch.display()));
        }
    }
    let mut mounts = common::mounts_under(&temp_dir);
    mounts.extend(scratch_mounts);
    let cgroups = common::cgroups_left(&out.created);
    let raw_alive: Vec<i32> = out
        .raw_pids
        .iter()
        .copied()
        .filter(|p| Path::new(&format!("/proc/{p}")).exists() && !is_zombie(*p))
        .collect();
    let podman_left = podman
        .as_ref()
        .map(|_| podman_containers(&podman_prefix))
        .unwrap_or_default();
    let temp_left = [&temp_dir, &scratch]
        .iter()
        .filter(|d| d.exists())
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>();
    out.report.extra.insert(
        "cleanup".into(),
        json!({
            "sandboxes_created": out.created.len(),
            "sandboxes_removed_at_shutdown": cleanup.sandboxes_removed,
            "checkpoints_removed_at_shutdown": cleanup.checkpoints_removed,
            "problems": problems,
            "mounts_left": mounts,
            "cgroups_left": cgroups,
            "raw_criu_trees_alive": raw_alive,
            "podman_containers_left": podman_left,
            "temp_dirs_left": temp_left,
        }),
    );
    let leaked = !mounts.is_empty()
        || !cgroups.is_empty()
        || !problems.is_empty()
        || !raw_alive.is_empty()
        || !podman_left.is_empty()
        || !temp_left.is_empty();
    out.report.sections.push((
        "Clean-up".into(),
        vec![
            (
                "sandboxes created in this run (branches included)".into(),
                out.created.len().to_string(),
            ),
            (
                "sandboxes / checkpoints the daemon still had at shutdown".into(),
                format!(
                    "{} / {}",
                    cleanup.sandboxes_removed, cleanup.checkpoints_removed
                ),
            ),
            ("mounts left".into(), mounts.len().to_string()),
            (
                "cgroups left for this run's sandboxes".into(),
                cgroups.len().to_string(),
            ),
            (
                "raw-CRIU trees still alive".into(),
                raw_alive.len().to_string(),
            ),
            (
                "podman containers left".into(),
                podman_left.len().to_string(),
            ),
            (
                "temporary directories left".into(),
                temp_left.len().to_string(),
            ),
            ("clean-up problems".into(), problems.len().to_string()),
            ("daemon log warnings".into(), warnings.len().to_string()),
        ],
    ));
    if let Err(e) = &measured {
        out.report
            .notes
            .insert(0, format!("**the run failed, results are partial**: {e:#}"));
    }

    let run = common::RunInfo::at_end(&date, &load_start);
    let header = run.header(
        json!({
            "samples": cfg.samples,
            "branch_counts": cfg.branch_counts,
            "sizes_bytes": cfg.sizes,
            "qemu": cfg.qemu,
        }),
        (
            "peers",
            json!({
                "podman": podman.as_ref().map(|p| json!({
                    "version": p.version, "runtime": p.runtime,
                    "images": [BUSYBOX_TREE.podman_image, DEBIAN_TREE.podman_image],
                    "flags": PODMAN_RUN_FLAGS,
                })),
                "criu": criu.as_ref().map(|c| json!({
                    "path": c.path, "version": c.version,
                })),
            }),
        ),
    );
    let title = run.title(&format!(
        "peers: {}, {}",
        podman
            .as_ref()
            .map(|p| format!("podman {} with {}", p.version, p.runtime))
            .unwrap_or_else(|| "podman skipped".into()),
        criu.as_ref()
            .map(|c| format!("CRIU {} command line", c.version))
            .unwrap_or_else(|| "CRIU missing".into()),
    ));
    let (json_path, md_path, md) = out.report.write(&header, &title)?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    measured?;
    if leaked {
        bail!("the run left mounts, cgroups, processes, containers or clean-up problems behind (see above)");
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn measure(
    d: &DaemonGuard,
    cfg: &Config,
    scratch: &Path,
    podman_prefix: &str,
    busybox: &Path,
    podman: Option<&Podman>,
    criu: Option<&forkd_criu::Criu>,
    out: &mut Out,
) -> Result<()> {
    let took = d.import(busybox, BUSYBOX)?;
    eprintln!(
        "imported {} as {BUSYBOX} in {}",
        busybox.display(),
        fmt_us(took.as_micros() as u64)
    );
    // The data volume, from where the daemon put a sandbox's writable layer:
    // <data>/sandboxes/<id>/layer/upper.
    let probe = d.create(BUSYBOX)?;
    out.created.push(probe.id.clone());
    let data = Path::new(&probe.upper)
        .ancestors()
        .nth(4)
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow!("unexpected upper directory {}", probe.upper))?;
    d.remove(&probe.id)?;
    if !data.join("checkpoints").is_dir() {
        bail!(
            "{} has no checkpoints/: the data volume layout is not the expected one",
            data.display()
        );
    }
    let ctx = Ctx {
        d,
        cfg,
        scratch: scratch.to_path_buf(),
        data,
        podman_prefix: podman_prefix.to_string(),
    };

    fs_checkpoints(&ctx, out)?;

    let Some(criu) = criu else {
        out.report
            .notes
            .push("parts 2-4 skipped: no usable CRIU".into());
        return Ok(());
    };
    let debian_tar = common::fixture_image("debian.tar.zst");
    let debian = if debian_tar.is_file() {
        eprintln!("importing {} as {DEBIAN} ...", debian_tar.display());
        let took = d.import(&debian_tar, DEBIAN)?;
        eprintln!("  imported in {}", fmt_us(took.as_micros() as u64));
        true
    } else {
        let why = format!(
            "fixture {} is missing (run fixtures/setup.sh debian)",
            debian_tar.display()
        );
        common::skip("the Debian sh+python3 tree and the QEMU guest", &why)?;
        out.report.notes.push(format!(
            "the Debian tree (sh + python3) and the QEMU guest were skipped: {why}"
        ));
        false
    };

    if podman.is_none() {
        out.report
            .notes
            .push("podman peer skipped: no ratio against podman".into());
    }
    let trees: &[&Tree] = if debian {
        &[&BUSYBOX_TREE, &DEBIAN_TREE]
    } else {
        &[&BUSYBOX_TREE]
    };
    for tree in trees {
        let mut podman_peer = match podman {
            Some(p) => Some(PodmanPeer::new(&ctx, out, p, tree)?),
            None => None,
        };
        live_forks(&ctx, out, tree, criu, podman_peer.as_mut())?;
    }
    fork_checks(&mut out.report, cfg, debian);

    if !cfg.qemu {
        println!("SKIP QEMU guest (part 3): FORKD_BENCH_QEMU=0");
        out.report
            .notes
            .push("part 3 (QEMU guest) skipped: FORKD_BENCH_QEMU=0".into());
    } else if debian {
        qemu_guest(&ctx, out)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Part 1: filesystem checkpoints against the size of the writable layer

fn fs_checkpoints(ctx: &Ctx, out: &mut Out) -> Result<()> {
    let (d, n) = (ctx.d, ctx.cfg.samples);
    eprintln!("[1/4] filesystem checkpoints against the size of the writable layer");
    let mut table = Table {
        title: "Part 1: filesystem checkpoint against the size of the writable layer (p50 ms; goal < 20 ms whatever the size)".into(),
        header: [
            "written",
            "upper",
            "synced: API p50",
            "API p99",
            "snapshot p50",
            "unsynced: API p50",
            "API p99",
            "freeze p50",
            "snapshot p50",
            "tree hash ready p50",
            "tar+zstd p50",
            "tar+zstd / checkpoint (synced)",
        ]
        .map(String::from)
        .to_vec(),
        rows: Vec::new(),
    };
    let mut archives = Vec::new();
    for &size in &ctx.cfg.sizes {
        common::check_interrupted()?;
        let label = size_label(size);
        let sb = d.create(BUSYBOX)?;
        out.created.push(sb.id.clone());
        let id = sb.id.clone();
        let upper = PathBuf::from(&sb.upper);
        let t = Instant::now();
        d.sh_ok(
            &id,
            &format!("mkdir -p /data && head -c {size} /dev/urandom > /data/blob && sync"),
        )?;
        let upper_bytes = tree_bytes(&upper);
        eprintln!(
            "  {label}: written and synced in {}; upper {} holds {}",
            fmt_us(t.elapsed().as_micros() as u64),
            upper.display(),
            fmt_kib(upper_bytes as f64 / 1024.0)
        );

        let synced = fs_checkpoint_series(
            ctx,
            out,
            &id,
            &format!("fs checkpoint, {label} synced"),
            None,
        )?;
        // Rewritten before each sample and not synced: the snapshot has to flush it.
        let rewrite = format!("head -c {size} /dev/urandom > /data/blob");
        let unsynced = fs_checkpoint_series(
            ctx,
            out,
            &id,
            &format!("fs checkpoint, {label} unsynced (rewritten just before)"),
            Some(&rewrite),
        )?;
        d.sh_ok(&id, "sync")?;

        let archive = ctx.scratch.join("upper.tar.zst");
        let mut archive_bytes = 0;
        let tar_row = format!("tar + zstd -T0 -3 of the upper dir, {label} (peer)");
        let tar = sample(&tar_row, 1, n, || {
            let us = common::time_command(
                Command::new("bash")
                    .args([
                        "-o",
                        "pipefail",
                        "-c",
                        r#"tar -C "$0" -cf - . | zstd -T0 -3 -q -c > "$1""#,
                    ])
                    .arg(&upper)
                    .arg(&archive),
            )?;
            archive_bytes = std::fs::metadata(&archive).map(|m| m.len()).unwrap_or(0);
            std::fs::remove_file(&archive)
                .with_context(|| format!("remove {}", archive.display()))?;
            Ok(us)
        })?;
        let tar = out.report.row(&tar_row, tar);
        archives.push(
            json!({ "written": size, "upper_bytes": upper_bytes, "archive_bytes": archive_bytes }),
        );
        d.remove(&id)?;

        let p50 = |s: Option<&Summary>| s.map(|s| fmt_ms(s.p50 as f64)).unwrap_or("-".into());
        table.rows.push(vec![
            label.clone(),
            fmt_kib(upper_bytes as f64 / 1024.0),
            fmt_ms(synced.api.p50 as f64),
            fmt_ms(synced.api.p99 as f64),
            p50(synced.phases.get("snapshot")),
            fmt_ms(unsynced.api.p50 as f64),
            fmt_ms(unsynced.api.p99 as f64),
            p50(unsynced.phases.get("freeze")),
            p50(unsynced.phases.get("snapshot")),
            p50(Some(&synced.hash_ready)),
            fmt_ms(tar.p50 as f64),
            format!("{:.0}x", tar.p50 as f64 / synced.api.p50.max(1) as f64),
        ]);
        for (case, s) in [("synced", &synced.api), ("unsynced", &unsynced.api)] {
            let ms = s.p50 as f64 / 1000.0;
            out.report.checks.push(Check {
                name: format!("fs checkpoint p50 (API), {label} {case}"),
                value: Some(ms),
                shown: format!("{ms:.2} ms"),
                goal: format!("< {FS_CHECKPOINT_GOAL_MS} ms"),
                met: Some(ms < FS_CHECKPOINT_GOAL_MS),
            });
        }
    }
    out.report.tables.push(table);
    out.report
        .extra
        .insert("fs_checkpoint_archives".into(), Value::Array(archives));
    dirty_bound_tradeoff(ctx, out)?;
    out.report.notes.push(
        "part 1: `synced` checkpoints a layer whose data is on disk; `unsynced` rewrites the \
         blob (not synced) right before each sample, so the btrfs snapshot has to write the \
         dirty data out; `tree hash ready` is the time from the checkpoint's answer until \
         its background tree hash appears (the next sample waits for it)"
            .into(),
    );
    Ok(())
}

/// The volume's dirty bound (`FORKD_DIRTY_LIMIT`), which a sample can lift: the
/// sysfs directory of the volume's writeback device, when the daemon set a bound.
struct DirtyBound {
    bdi: PathBuf,
}

impl DirtyBound {
    fn of(ctx: &Ctx) -> Option<DirtyBound> {
        let bdi = forkd_volume::bdi_of_mount(&ctx.data)?;
        let strict = std::fs::read_to_string(bdi.join("strict_limit")).ok()?;
        (strict.trim() == "1").then_some(DirtyBound { bdi })
    }

    fn bytes(&self) -> u64 {
        std::fs::read_to_string(self.bdi.join("max_bytes"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Runs `f` with the bound lifted (`strict_limit` 0), then sets it again.
    fn lifted<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let strict = self.bdi.join("strict_limit");
        let set = |v: &str| {
            std::fs::write(&strict, v).with_context(|| format!("write {}", strict.display()))
        };
        set("0")?;
        let r = f();
        set("1")?;
        r
    }
}

/// What the volume's dirty bound (`FORKD_DIRTY_LIMIT`) costs writers and saves
/// checkpoints: the largest size written (from a copy in the page cache, so the source
/// is not what is measured) and then checkpointed, with the bound on and, by turning
/// off its `strict_limit` for the sample, off; interleaved, same sandbox.
fn dirty_bound_tradeoff(ctx: &Ctx, out: &mut Out) -> Result<()> {
    let Some(&size) = ctx.cfg.sizes.iter().max() else {
        return Ok(());
    };
    let Some(bound) = DirtyBound::of(ctx) else {
        out.report.notes.push(
            "part 1b skipped: the volume has no dirty bound (not a loop mount made by forkd, \
             or FORKD_DIRTY_LIMIT=0)"
                .into(),
        );
        return Ok(());
    };
    let d = ctx.d;
    let label = size_label(size);
    let sb = d.create(BUSYBOX)?;
    out.created.push(sb.id.clone());
    d.sh_ok(
        &sb.id,
        &format!("mkdir -p /data && head -c {size} /dev/urandom > /data/src && sync"),
    )?;
    let samples = ctx.cfg.samples.clamp(1, 3);
    let mut rows: BTreeMap<(bool, &str), Vec<u64>> = BTreeMap::new();
    for i in 0..samples * 2 {
        common::check_interrupted()?;
        let on = i % 2 == 0;
        let write_then_checkpoint = || {
            let t = Instant::now();
            d.sh_ok(&sb.id, "cat /data/src > /data/blob")?;
            let write_us = t.elapsed().as_micros() as u64;
            let t = Instant::now();
            let c = d.checkpoint(&sb.id, false, false)?;
            Ok((write_us, t.elapsed().as_micros() as u64, c))
        };
        let (write_us, ck_us, c) = if on {
            write_then_checkpoint()?
        } else {
            bound.lifted(write_then_checkpoint)?
        };
        d.remove_checkpoint(&c.id)?;
        d.sh_ok(&sb.id, "rm /data/blob && sync")?;
        rows.entry((on, "write")).or_default().push(write_us);
        rows.entry((on, "checkpoint")).or_default().push(ck_us);
        rows.entry((on, "total"))
            .or_default()
            .push(write_us + ck_us);
        eprintln!(
            "  write {label} then checkpoint, bound {}: write {}, checkpoint {}",
            if on { "on" } else { "off" },
            fmt_us(write_us),
            fmt_us(ck_us)
        );
    }
    d.remove(&sb.id)?;
    let mut table = Table {
        title: format!(
            "Writing {label} then checkpointing: the dirty bound ({} MiB) on and off",
            bound.bytes() >> 20
        ),
        header: [
            "bound",
            "write p50",
            "checkpoint p50",
            "write + checkpoint p50",
        ]
        .map(String::from)
        .to_vec(),
        rows: Vec::new(),
    };
    for on in [true, false] {
        let name = if on { "on" } else { "off" };
        let mut cells = vec![name.to_string()];
        for part in ["write", "checkpoint", "total"] {
            let v = rows.remove(&(on, part)).unwrap_or_default();
            let s = out.report.row(
                &format!("write {label} then checkpoint, bound {name}: {part}"),
                v,
            );
            cells.push(fmt_ms(s.p50 as f64));
        }
        table.rows.push(cells);
    }
    out.report.tables.push(table);
    Ok(())
}

struct FsSeries {
    api: Summary,
    phases: BTreeMap<String, Summary>,
    hash_ready: Summary,
}

/// Checkpoints sandbox `id` (filesystem only) once to warm up and then `samples` times,
/// a fresh checkpoint per sample; `before` runs in the sandbox before each, untimed.
/// Each checkpoint is removed once its background tree hash is done, so that hashing
/// does not overlap the next sample.
fn fs_checkpoint_series(
    ctx: &Ctx,
    out: &mut Out,
    id: &str,
    name: &str,
    before: Option<&str>,
) -> Result<FsSeries> {
    let d = ctx.d;
    let warmup = 1;
    let mut phases: Vec<BTreeMap<String, u64>> = Vec::new();
    let mut hash_ready = Vec::new();
    let api_row = format!("{name}: API");
    let api = sample(&api_row, warmup, ctx.cfg.samples, || {
        if let Some(line) = before {
            d.sh_ok(id, line)?;
        }
        let t = Instant::now();
        let c = d.checkpoint(id, false, false)?;
        let us = t.elapsed().as_micros() as u64;
        let answered = Instant::now();
        phases.push(c.phases_us.clone());
        hash_ready.push(wait_tree_hash(d, &c.id, answered)?);
        d.remove_checkpoint(&c.id)?;
        Ok(us)
    })?;
    phases.drain(..warmup.min(phases.len()));
    hash_ready.drain(..warmup.min(hash_ready.len()));
    let api = out.report.row(&api_row, api);
    let keys: BTreeSet<String> = phases.iter().flat_map(|p| p.keys().cloned()).collect();
    let mut by_phase = BTreeMap::new();
    for k in keys {
        let v: Vec<u64> = phases.iter().filter_map(|p| p.get(&k).copied()).collect();
        by_phase.insert(k.clone(), out.report.row(&format!("{name}: daemon {k}"), v));
    }
    let hash_ready = out.report.row(
        &format!("{name}: tree hash ready after the answer"),
        hash_ready,
    );
    Ok(FsSeries {
        api,
        phases: by_phase,
        hash_ready,
    })
}

/// Polls a checkpoint until its tree hash is computed; returns microseconds since `from`.
fn wait_tree_hash(d: &DaemonGuard, id: &str, from: Instant) -> Result<u64> {
    let deadline = from + Duration::from_secs(300);
    loop {
        let c: CheckpointInfo = d
            .client()
            .call("GET", &format!("/v1/checkpoints/{id}"), None)
            .with_context(|| format!("inspect checkpoint {id}"))?;
        if c.tree_hash.is_some() {
            return Ok(from.elapsed().as_micros() as u64);
        }
        if Instant::now() > deadline {
            bail!("checkpoint {id}: no tree hash after 300 s");
        }
        common::check_interrupted()?;
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Bytes of the regular files below `dir`.
fn tree_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => tree_bytes(&e.path()),
                    Ok(m) if m.is_file() => m.len(),
                    _ => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// Part 2 (and 4): live forks of a small process tree

fn row_fork(tree: &Tree, n: usize, mode: &str, what: &str) -> String {
    format!("live fork N={n} {mode}, {}: {what}", tree.name)
}

fn row_raw(tree: &Tree, with_mount: bool) -> String {
    if with_mount {
        format!(
            "raw CRIU: overlay mount + criu restore -d, {} (peer)",
            tree.name
        )
    } else {
        format!("raw CRIU: criu restore -d, {} (peer)", tree.name)
    }
}

fn row_podman_checkpoint(tree: &Tree) -> String {
    format!(
        "podman container checkpoint --leave-running --export, {} (peer)",
        tree.name
    )
}

fn row_podman_restore(tree: &Tree) -> String {
    format!("podman container restore --import, {} (peer)", tree.name)
}

fn row_podman_restore_concurrent(tree: &Tree, parallel: usize) -> String {
    format!(
        "podman container restore --import, {parallel} at a time, {} (peer)",
        tree.name
    )
}

/// How many restores of podman's run concurrently (at most): enough for a p50.
const PODMAN_CONCURRENT_COPIES: usize = 20;

/// Waits until the processes a tree needs are running in a sandbox's cgroup.
fn wait_tree(cgroup: &str, tree: &Tree, limit: Duration) -> Result<()> {
    let t = Instant::now();
    loop {
        let names = common::comms(&common::cgroup_pids(cgroup));
        if tree.expect.iter().all(|e| names.iter().any(|n| n == e)) {
            return Ok(());
        }
        if t.elapsed() > limit {
            bail!(
                "{}: processes {:?} not all running in cgroup {cgroup} after {limit:?} (found {names:?})",
                tree.name,
                tree.expect
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Does a branch run the whole tree (read from its cgroup)?
fn branch_has_tree(id: &str, tree: &Tree) -> bool {
    let names = common::comms(&common::cgroup_pids(&format!("forkd/{id}")));
    tree.expect.iter().all(|e| names.iter().any(|n| n == e))
}

/// How many of the branches run the whole tree (read before they are removed).
fn count_with_tree(branches: &[BranchInfo], tree: &Tree) -> usize {
    branches
        .iter()
        .filter(|b| branch_has_tree(&b.id, tree))
        .count()
}

/// Per-branch numbers of one or more fork requests.
#[derive(Default)]
struct ForkSeries {
    totals: Vec<u64>,
    /// Every branch's phases as the daemon reported them.
    phases: Vec<BTreeMap<String, u64>>,
    /// The request's wall time divided by its branch count, one per request.
    wall_per_branch: Vec<u64>,
    requests: usize,
    branches: usize,
    with_tree: usize,
}

impl ForkSeries {
    /// Adds one request's branches, `with_tree` of which were seen running the tree.
    fn add(&mut self, branches: &[BranchInfo], wall_us: u64, with_tree: usize) {
        self.requests += 1;
        self.branches += branches.len();
        self.with_tree += with_tree;
        self.wall_per_branch
            .push(wall_us / branches.len().max(1) as u64);
        for b in branches {
            self.totals
                .push(b.phases_us.get("total").copied().unwrap_or(0));
            self.phases.push(b.phases_us.clone());
        }
    }

    /// One phase across branches; `other` is what the named phases leave of the total
    /// (for a lazy branch: starting its lazy-pages daemon).
    fn phase(&self, name: &str) -> Vec<u64> {
        self.phases
            .iter()
            .filter_map(|p| {
                if name == "other" {
                    let named: u64 = ["prepare", "restore", "ready"]
                        .iter()
                        .filter_map(|k| p.get(*k))
                        .sum();
                    p.get("total").map(|t| t.saturating_sub(named))
                } else {
                    p.get(name).copied()
                }
            })
            .collect()
    }
}

/// The columns of a fork table, after the first ones.
const FORK_COLUMNS: [&str; 9] = [
    "per-branch p50",
    "p90",
    "p99",
    "prepare p50",
    "restore p50",
    "ready p50",
    "other p50",
    "request wall / N p50",
    "branches with the tree running",
];

fn fork_cells(s: &ForkSeries) -> Vec<String> {
    let t = common::summarize(&s.totals);
    let p50 = |name: &str| fmt_ms(common::summarize(&s.phase(name)).p50 as f64);
    vec![
        fmt_ms(t.p50 as f64),
        fmt_ms(t.p90 as f64),
        fmt_ms(t.p99 as f64),
        p50("prepare"),
        p50("restore"),
        p50("ready"),
        p50("other"),
        fmt_ms(common::summarize(&s.wall_per_branch).p50 as f64),
        format!("{} of {}", s.with_tree, s.branches),
    ]
}

fn fork_timed(
    ctx: &Ctx,
    out: &mut Out,
    ck: &str,
    n: usize,
    lazy: bool,
) -> Result<(Vec<BranchInfo>, u64)> {
    let t = Instant::now();
    let r = ctx.d.fork(ck, n, lazy)?;
    let wall = t.elapsed().as_micros() as u64;
    out.created.extend(r.branches.iter().map(|b| b.id.clone()));
    if r.branches.len() != n {
        bail!("asked for {n} branches of {ck}, got {}", r.branches.len());
    }
    Ok((r.branches, wall))
}

fn live_forks(
    ctx: &Ctx,
    out: &mut Out,
    tree: &Tree,
    criu: &forkd_criu::Criu,
    mut podman: Option<&mut PodmanPeer>,
) -> Result<()> {
    let (d, n) = (ctx.d, ctx.cfg.samples);
    eprintln!("[2/4] live checkpoint and forks of {}", tree.name);
    let sb = d.create_with(&json!({ "image": tree.image, "command": { "shell": tree.shell } }))?;
    out.created.push(sb.id.clone());
    wait_tree(&sb.cgroup, tree, Duration::from_secs(20))?;

    // Live checkpoints: a fresh one per sample.
    let ck_row = format!("live checkpoint, {}: API", tree.name);
    let mut phases: Vec<BTreeMap<String, u64>> = Vec::new();
    let api = sample(&ck_row, 1, n, || {
        let t = Instant::now();
        let c = d.checkpoint(&sb.id, true, false)?;
        let us = t.elapsed().as_micros() as u64;
        phases.push(c.phases_us.clone());
        // Its background tree hash must not overlap the next sample.
        wait_tree_hash(d, &c.id, Instant::now())?;
        d.remove_checkpoint(&c.id)?;
        Ok(us)
    })?;
    // The warm-up's phases are not kept.
    phases.drain(..1.min(phases.len()));
    out.report.row(&ck_row, api);
    for k in ["dump", "snapshot"] {
        let v: Vec<u64> = phases.iter().filter_map(|p| p.get(k).copied()).collect();
        let what = if k == "snapshot" {
            "daemon snapshot (tree frozen)".to_string()
        } else {
            format!("daemon {k}")
        };
        out.report
            .row(&format!("live checkpoint, {}: {what}", tree.name), v);
    }
    let ck = d.checkpoint(&sb.id, true, false)?;
    wait_tree_hash(d, &ck.id, Instant::now())?;
    eprintln!(
        "  checkpoint {} (CRIU images {})",
        ck.id,
        fmt_kib(ck.images_bytes as f64 / 1024.0)
    );

    // N = 1, eager: one request per sample, the branch removed after it. The peers
    // restore the same state in the same loop, one copy each per sample, so that all
    // of them see the same machine (load drifts on a shared one).
    let mut raw = RawCriuPeer::new(ctx, &ck, criu)?;
    let mut series: Vec<(usize, &str, ForkSeries)> = Vec::new();
    let mut s = ForkSeries::default();
    let (mut raw_restore, mut raw_total, mut podman_restore) = (Vec::new(), Vec::new(), Vec::new());
    let mut round = 0;
    let label = row_fork(tree, 1, "eager", "request wall");
    let walls = sample(&label, 1, n, || {
        // The order rotates, so that no one always follows the same one's clean-up.
        let (mut fork, mut raw_us, mut pod) = (None, None, None);
        for slot in 0..3 {
            match (slot + round) % 3 {
                0 => {
                    let (b, wall) = fork_timed(ctx, out, &ck.id, 1, false)?;
                    let alive = count_with_tree(&b, tree);
                    d.remove(&b[0].id)?;
                    fork = Some((b, wall, alive));
                }
                1 => raw_us = Some(raw.restore_once(tree, out)?),
                _ => {
                    pod = podman
                        .as_deref_mut()
                        .map(|p| p.restore_once())
                        .transpose()?
                }
            }
        }
        let (b, wall, alive) = fork.expect("the fork ran");
        let (r, t) = raw_us.expect("the raw restore ran");
        // The first round is the warm-up: its numbers are not kept.
        if round > 0 {
            s.add(&b, wall, alive);
            raw_restore.push(r);
            raw_total.push(t);
            podman_restore.extend(pod);
        }
        round += 1;
        Ok(wall)
    })?;
    out.report.row(
        &row_fork(tree, 1, "eager", "branch total (daemon)"),
        s.totals.clone(),
    );
    out.report.row(
        &row_fork(tree, 1, "eager", "branch restore phase"),
        s.phase("restore"),
    );
    out.report.row(&label, walls);
    out.report.row(&row_raw(tree, false), raw_restore);
    out.report.row(&row_raw(tree, true), raw_total);
    if let Some(p) = podman.as_deref() {
        out.report.row(&row_podman_restore(tree), podman_restore);
        p.note_failures(out);
    }
    raw.finish(tree, out)?;
    series.push((1, "eager", s));

    // N = 1, lazy.
    let mut s = ForkSeries::default();
    let label = row_fork(tree, 1, "lazy", "request wall");
    let walls = sample(&label, 0, n, || {
        let (b, wall) = fork_timed(ctx, out, &ck.id, 1, true)?;
        s.add(&b, wall, count_with_tree(&b, tree));
        d.remove(&b[0].id)?;
        Ok(wall)
    })?;
    out.report.row(
        &row_fork(tree, 1, "lazy", "branch total (daemon)"),
        s.totals.clone(),
    );
    out.report.row(
        &row_fork(tree, 1, "lazy", "branch restore phase"),
        s.phase("restore"),
    );
    out.report.row(&label, walls);
    series.push((1, "lazy", s));

    // N > 1 eager: one request each; the largest is also part 4 (all alive at once).
    let largest = *ctx.cfg.branch_counts.last().unwrap_or(&1);
    for &count in ctx.cfg.branch_counts.iter().filter(|&&c| c > 1) {
        common::check_interrupted()?;
        let settle = Duration::from_secs(1);
        std::thread::sleep(settle);
        let before = (common::mem_available_kib()?, d.rss_kib()?);
        eprintln!("  fork of {count} eager branches in one request ...");
        let (branches, wall) = fork_timed(ctx, out, &ck.id, count, false)?;
        let mut s = ForkSeries::default();
        s.add(&branches, wall, count_with_tree(&branches, tree));
        eprintln!(
            "  {count} branches in {} ({} per branch), {} with the tree running",
            fmt_us(wall),
            fmt_us(wall / count as u64),
            s.with_tree
        );
        out.report.row(
            &row_fork(tree, count, "eager", "per-branch total (daemon)"),
            s.totals.clone(),
        );
        out.report.row(
            &row_fork(tree, count, "eager", "per-branch restore phase"),
            s.phase("restore"),
        );
        out.report.row(
            &row_fork(tree, count, "eager", "request wall / N"),
            s.wall_per_branch.clone(),
        );
        if count == largest {
            density(ctx, out, tree, &branches, before, wall)?;
        } else {
            for b in &branches {
                d.remove(&b.id)?;
            }
        }
        series.push((count, "eager", s));
    }

    // podman at the same concurrency as the daemon's restore workers, so that forkd's
    // per-branch latency at N > 1 (its branches restored that many at a time) has a peer
    // measured under the same load.
    if let Some(p) = podman.as_deref_mut() {
        if largest > 1 {
            let parallel = forkd::daemon::fork_parallelism();
            let copies = largest.min(PODMAN_CONCURRENT_COPIES);
            eprintln!("  podman: {copies} restores, {parallel} at a time ...");
            let us = p.restore_concurrently(copies, parallel)?;
            out.report
                .row(&row_podman_restore_concurrent(tree, parallel), us);
            p.note_failures(out);
        }
    }

    // The table for this tree.
    let mut table = Table {
        title: format!(
            "Part 2: live fork of {} (ms; per-branch = the branch's phases_us.total)",
            tree.name
        ),
        header: ["N", "mode", "requests"]
            .into_iter()
            .chain(FORK_COLUMNS)
            .map(String::from)
            .collect(),
        rows: Vec::new(),
    };
    let mut forks_json = Vec::new();
    for (count, mode, s) in &series {
        let mut cells = vec![count.to_string(), mode.to_string(), s.requests.to_string()];
        cells.extend(fork_cells(s));
        table.rows.push(cells);
        forks_json.push(json!({
            "tree": tree.name, "n": count, "mode": mode, "requests": s.requests,
            "branches": s.branches, "with_tree_running": s.with_tree,
            "branch_phases_us": s.phases, "wall_per_branch_us": s.wall_per_branch,
        }));
    }
    for name in [row_raw(tree, false), row_raw(tree, true)] {
        if let Some(s) = out.report.summary(&name) {
            let mut cells = vec![
                "1".into(),
                name.trim_end_matches(" (peer)")
                    .trim_end_matches(tree.name)
                    .trim_end_matches(", ")
                    .to_string(),
                s.n.to_string(),
                fmt_ms(s.p50 as f64),
                fmt_ms(s.p90 as f64),
                fmt_ms(s.p99 as f64),
            ];
            cells.resize(3 + FORK_COLUMNS.len(), "-".into());
            table.rows.push(cells);
        }
    }
    out.report.tables.push(table);
    let all_ok = series.iter().all(|(_, _, s)| s.with_tree == s.branches);
    match out.report.extra.get_mut("forks") {
        Some(Value::Array(a)) => a.extend(forks_json),
        _ => {
            out.report
                .extra
                .insert("forks".into(), Value::Array(forks_json));
        }
    }
    d.remove_checkpoint(&ck.id)?;
    d.remove(&sb.id)?;
    if !all_ok {
        out.report.notes.push(format!(
            "**{}: some branches did not have all of {:?} running right after the fork** (see the table)",
            tree.name, tree.expect
        ));
    }
    Ok(())
}

/// Part 4: the branches of the largest fork, alive at once.
fn density(
    ctx: &Ctx,
    out: &mut Out,
    tree: &Tree,
    branches: &[BranchInfo],
    (avail_before, rss_before): (u64, u64),
    fork_wall_us: u64,
) -> Result<()> {
    let d = ctx.d;
    let n = branches.len();
    eprintln!("[4/4] {n} live branches of {} alive at once", tree.name);
    let settle = Duration::from_secs(2);
    std::thread::sleep(settle);
    let avail_alive = common::mem_available_kib()?;
    let rss_alive = d.rss_kib()?;
    let ids: BTreeSet<&str> = branches.iter().map(|b| b.id.as_str()).collect();
    let listed: Vec<forkd::api::SandboxInfo> = d.client().call("GET", "/v1/sandboxes", None)?;
    let mine: Vec<&forkd::api::SandboxInfo> = listed
        .iter()
        .filter(|s| ids.contains(s.id.as_str()))
        .collect();
    let running = mine
        .iter()
        .filter(|s| s.status == SandboxStatus::Running)
        .count();
    let charged: Vec<u64> = mine.iter().filter_map(|s| s.memory_bytes).collect();
    let with_tree = count_with_tree(branches, tree);
    let mut pss_total = 0u64;
    let mut procs = 0usize;
    for b in branches {
        for pid in common::cgroup_pids(&format!("forkd/{}", b.id)) {
            if let Ok(k) = common::pss_kib(pid) {
                pss_total += k;
                procs += 1;
            }
        }
    }
    let t = Instant::now();
    for b in branches {
        common::check_interrupted()?;
        d.remove(&b.id)?;
    }
    let remove_us = t.elapsed().as_micros() as u64;
    std::thread::sleep(settle);
    let avail_end = common::mem_available_kib()?;
    let rss_end = d.rss_kib()?;
    eprintln!("  removed all {n} in {}", fmt_us(remove_us));

    let host_used = avail_before as i64 - avail_alive as i64;
    let charged_kib = charged.iter().sum::<u64>() as f64 / 1024.0;
    let per = |kib: f64| fmt_kib(kib / n as f64);
    out.report.sections.push((
        format!("Part 4: {n} live branches of {} alive at once", tree.name),
        vec![
            (
                "branches running (listed by the daemon) / with the tree running".into(),
                format!("{running} / {with_tree} of {n}"),
            ),
            (
                "fork request (all branches)".into(),
                format!(
                    "{:.2} s ({} per branch)",
                    fork_wall_us as f64 / 1e6,
                    fmt_us(fork_wall_us / n as u64)
                ),
            ),
            (
                "host memory used by all (MemAvailable delta)".into(),
                fmt_kib(host_used as f64),
            ),
            (
                "host memory per branch (MemAvailable delta / N)".into(),
                per(host_used as f64),
            ),
            (
                format!("cgroup memory charged, sum ({} of {n} read)", charged.len()),
                fmt_kib(charged_kib),
            ),
            ("cgroup memory charged per branch".into(), per(charged_kib)),
            (
                format!("PSS of the branches' processes, sum ({procs} processes)"),
                fmt_kib(pss_total as f64),
            ),
            ("PSS per branch".into(), per(pss_total as f64)),
            (
                "daemon RSS before -> with all alive -> after removing all".into(),
                format!(
                    "{} -> {} -> {}",
                    fmt_kib(rss_before as f64),
                    fmt_kib(rss_alive as f64),
                    fmt_kib(rss_end as f64)
                ),
            ),
            (
                "remove all (sequential, rm -f)".into(),
                format!("{:.2} s", remove_us as f64 / 1e6),
            ),
            (
                "host memory still used after removing all (MemAvailable vs before)".into(),
                fmt_kib(avail_before as f64 - avail_end as f64),
            ),
        ],
    ));
    let entry = json!({
        "tree": tree.name,
        "branches": n,
        "running": running,
        "with_tree_running": with_tree,
        "fork_wall_us": fork_wall_us,
        "mem_available_kib": { "before": avail_before, "alive": avail_alive, "after_remove": avail_end },
        "daemon_rss_kib": { "before": rss_before, "alive": rss_alive, "after_remove": rss_end },
        "host_memory_per_branch_kib": host_used as f64 / n as f64,
        "cgroup_memory_bytes": charged,
        "pss_total_kib": pss_total,
        "processes": procs,
        "remove_total_us": remove_us,
    });
    if !out.report.notes.iter().any(|n| n.starts_with("part 4:")) {
        out.report.notes.push(format!(
            "part 4: host memory is the drop of MemAvailable over the whole machine while the \
             branches were alive (settled {} ms), so other activity on the machine adds noise \
             (it can even come out negative); the cgroup charge and PSS are per branch",
            settle.as_millis()
        ));
    }
    match out.report.extra.get_mut("density") {
        Some(Value::Array(a)) => a.push(entry),
        _ => {
            out.report
                .extra
                .insert("density".into(), Value::Array(vec![entry]));
        }
    }
    if running != n {
        bail!("density: only {running} of {n} branches were listed as running");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Peer: the raw CRIU command line on the same images

/// The directory of a layer of a checkpoint's stack (`CheckpointInfo::layers`).
fn lower_dir(data: &Path, layer: &str) -> Result<PathBuf> {
    let p = match layer.split_once(':') {
        Some(("checkpoint", id)) => data.join("checkpoints").join(id).join("fs/upper"),
        Some(("layer", hex)) => data.join("layers").join(hex).join("tree"),
        _ => bail!("unknown layer reference {layer:?}"),
    };
    if !p.is_dir() {
        bail!("layer {layer}: {} is not a directory", p.display());
    }
    Ok(p)
}

/// Makes this process the reaper of orphaned descendants while it lives: `criu restore
/// -d` exits after the restore, and the restored tree's root is reparented to us, so we
/// can reap it after killing it.
struct Subreaper;

impl Subreaper {
    fn on() -> Result<Subreaper> {
        nix::sys::prctl::set_child_subreaper(true).context("become a child subreaper")?;
        Ok(Subreaper)
    }
}

impl Drop for Subreaper {
    fn drop(&mut self) {
        let _ = nix::sys::prctl::set_child_subreaper(false);
    }
}

/// One copy restored with the raw CRIU command line: its directory on the volume
/// (`upper`, `work`, `root`, `log`), the overlay at `root`, the restored tree.
struct RawCopy {
    dir: PathBuf,
    mounted: bool,
    pid: Option<i32>,
    done: bool,
}

impl RawCopy {
    fn new(dir: PathBuf) -> Result<RawCopy> {
        for sub in ["upper", "work", "root", "log"] {
            let p = dir.join(sub);
            std::fs::create_dir_all(&p).with_context(|| format!("create {}", p.display()))?;
        }
        Ok(RawCopy {
            dir,
            mounted: false,
            pid: None,
            done: false,
        })
    }

    fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    fn mount(&mut self, lowers: &[PathBuf]) -> Result<()> {
        let esc = |p: &Path| {
            p.display()
                .to_string()
                .replace('\\', "\\\\")
                .replace(':', "\\:")
                .replace(',', "\\,")
        };
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lowers.iter().map(|p| esc(p)).collect::<Vec<_>>().join(":"),
            esc(&self.dir.join("upper")),
            esc(&self.dir.join("work"))
        );
        nix::mount::mount(
            Some("overlay"),
            &self.root(),
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(opts.as_str()),
        )
        .with_context(|| format!("mount overlay on {} ({opts})", self.root().display()))?;
        self.mounted = true;
        Ok(())
    }

    /// Kills the restored tree, reaps its root, unmounts the overlay and removes the
    /// directory.
    fn teardown(&mut self) -> Result<()> {
        self.done = true;
        if let Some(pid) = self.pid.take() {
            let p = nix::unistd::Pid::from_raw(pid);
            // The root is the init of its own pid namespace: killing it kills the tree.
            let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGKILL);
            // Our child once criu exited (we are a subreaper); ECHILD otherwise.
            let _ = nix::sys::wait::waitpid(p, None);
            let t = Instant::now();
            while Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid) {
                if t.elapsed() > Duration::from_secs(10) {
                    bail!("the tree restored by raw CRIU (pid {pid}) did not die within 10 s");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if self.mounted {
            let root = self.root();
            let t = Instant::now();
            loop {
                match nix::mount::umount2(&root, nix::mount::MntFlags::empty()) {
                    Ok(()) => break,
                    Err(nix::errno::Errno::EBUSY) if t.elapsed() < Duration::from_secs(5) => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => return Err(e).with_context(|| format!("unmount {}", root.display())),
                }
            }
            self.mounted = false;
        }
        std::fs::remove_dir_all(&self.dir).with_context(|| format!("remove {}", self.dir.display()))
    }
}

impl Drop for RawCopy {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = self.teardown() {
                eprintln!("cleanup: raw CRIU copy {}: {e:#}", self.dir.display());
            }
        }
    }
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// Command names of a process and all its descendants.
fn tree_comms(pid: i32) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![pid.to_string()];
    while let Some(p) = todo.pop() {
        if let Ok(c) = std::fs::read_to_string(format!("/proc/{p}/comm")) {
            out.push(c.trim().to_string());
        }
        if let Ok(rd) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in rd.flatten() {
                if let Ok(ch) = std::fs::read_to_string(t.path().join("children")) {
                    todo.extend(ch.split_whitespace().map(str::to_string));
                }
            }
        }
    }
    out
}

/// The raw CRIU command line restoring a forkd checkpoint's images, one copy at a time,
/// each into its own overlay on the data volume.
struct RawCriuPeer<'a> {
    criu: &'a forkd_criu::Criu,
    images: PathBuf,
    lowers: Vec<PathBuf>,
    /// `<data>/bench-raw-criu-<pid>`: one directory per copy below it.
    base: PathBuf,
    copies: usize,
    with_tree: usize,
    /// The daemon's private `/run` for CRIU (its kernel-facts cache), if it has one.
    run_dir: Option<PathBuf>,
}

impl<'a> RawCriuPeer<'a> {
    fn new(ctx: &Ctx, ck: &CheckpointInfo, criu: &'a forkd_criu::Criu) -> Result<Self> {
        let lowers = ck
            .layers
            .iter()
            .map(|l| lower_dir(&ctx.data, l))
            .collect::<Result<Vec<_>>>()?;
        let base = ctx
            .data
            .join(format!("bench-raw-criu-{}", std::process::id()));
        std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
        Ok(RawCriuPeer {
            criu,
            images: ctx.data.join("checkpoints").join(&ck.id).join("criu"),
            lowers,
            base,
            copies: 0,
            with_tree: 0,
            run_dir: Some(ctx.d.root.join("criu-run")).filter(|d| d.join("criu.kdat").exists()),
        })
    }

    /// Mounts an overlay, restores one copy with `criu restore -d`, checks that the
    /// tree runs, kills it and unmounts. Returns (criu restore wall time, mount +
    /// restore wall time), microseconds.
    fn restore_once(&mut self, tree: &Tree, out: &mut Out) -> Result<(u64, u64)> {
        self.copies += 1;
        let mut copy = RawCopy::new(self.base.join(self.copies.to_string()))?;
        let log_dir = copy.dir.join("log");
        let pidfile = log_dir.join("pid");
        let t = Instant::now();
        copy.mount(&self.lowers)?;
        let mut cmd = Command::new(&self.criu.path);
        cmd.arg("restore")
            .arg("-D")
            .arg(&self.images)
            .arg("--root")
            .arg(copy.root())
            .args([
                "-d",
                "--network-lock",
                "skip",
                // As forkd asks over RPC: file locks, cgroups left alone.
                "--file-locks",
                "--manage-cgroups=ignore",
                "-o",
                "restore.log",
                "-W",
            ])
            .arg(&log_dir)
            .arg("--pidfile")
            .arg(&pidfile)
            // forkd's log level.
            .arg(format!("-v{}", forkd_criu::log_level()))
            // The images mark the sandbox's network namespace as external: like forkd,
            // hand the tree a new one with loopback up.
            .arg("--inherit-fd")
            .arg(format!("fd[3]:{}", forkd_criu::NETNS_KEY))
            .stdin(Stdio::null())
            // Files, not pipes: the restored tree must not hold our end of anything.
            .stdout(File::create(log_dir.join("stdout"))?)
            .stderr(File::create(log_dir.join("stderr"))?);
        // `criu restore -d` exits after the restore and the tree's root is reparented:
        // to us while we are a subreaper, so that we can reap it after killing it. Only
        // for this copy: podman's monitors must not end up here.
        forkd_sys::fresh_netns_fd(&mut cmd, 3);
        // Like forkd's, with CRIU's kernel facts cached on a tmpfs `/run` (this host's
        // `/run` is not one; without it every CRIU start probes the kernel, ~40 ms).
        if let Some(dir) = &self.run_dir {
            forkd_sys::with_own_run(&mut cmd, dir, &[])?;
        }
        let reaper = Subreaper::on()?;
        let t_restore = Instant::now();
        let status = cmd
            .status()
            .with_context(|| format!("run {}", common::describe(&cmd)))?;
        let restore_us = t_restore.elapsed().as_micros() as u64;
        let total_us = t.elapsed().as_micros() as u64;
        let pid = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        if let Some(pid) = pid {
            copy.pid = Some(pid);
            out.raw_pids.push(pid);
        }
        if !status.success() || pid.is_none() {
            bail!(
                "{} failed ({status}): {}{}",
                common::describe(&cmd),
                std::fs::read_to_string(log_dir.join("stderr"))
                    .unwrap_or_default()
                    .trim(),
                forkd_criu::log_tail(&log_dir.join("restore.log"))
            );
        }
        let names = tree_comms(pid.unwrap_or(0));
        if tree.expect.iter().all(|e| names.iter().any(|n| n == e)) {
            self.with_tree += 1;
        }
        copy.teardown()?;
        drop(reaper);
        Ok((restore_us, total_us))
    }

    /// Removes the peer's directory; notes copies that did not run the whole tree.
    fn finish(self, tree: &Tree, out: &mut Out) -> Result<()> {
        if self.with_tree < self.copies {
            out.report.notes.push(format!(
                "**raw CRIU, {}: only {} of {} restored trees had all of {:?} running**",
                tree.name, self.with_tree, self.copies, tree.expect
            ));
        }
        Ok(())
    }
}

impl Drop for RawCriuPeer<'_> {
    fn drop(&mut self) {
        // Each copy removed its own directory (or its guard did, on failure).
        if let Err(e) = std::fs::remove_dir(&self.base) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("cleanup: remove {}: {e}", self.base.display());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Peer: podman checkpoint/restore of the same process tree

fn podman_containers(prefix: &str) -> Vec<String> {
    Command::new("podman")
        .args(["ps", "-a", "--format", "{{.Names}}"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.starts_with(prefix))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// podman's checkpoint of a tree: a detached container of the same rootfs running the
/// same shell line, one `checkpoint --export` measured `samples` times (the last export
/// kept), then one `restore --import` per call, each copy removed after it.
struct PodmanPeer {
    podman: Podman,
    prefix: String,
    expect: &'static [&'static str],
    export: PathBuf,
    copies: usize,
    running: usize,
    /// Declared last: dropped (removed) after the fields above.
    _source: PodmanContainer,
}

impl PodmanPeer {
    fn new(ctx: &Ctx, out: &mut Out, p: &Podman, tree: &Tree) -> Result<PodmanPeer> {
        eprintln!(
            "[2/4] podman peer: import {}, checkpoint --export of {}",
            tree.fixture, tree.name
        );
        let tar = common::fixture_image(tree.fixture);
        p.import(&tar, tree.podman_image)?;
        let prefix = format!("{}-{}", ctx.podman_prefix, tree.image);
        let source = PodmanContainer::start(
            p,
            &format!("{prefix}-src"),
            tree.podman_image,
            &["sh", "-c", tree.shell],
        )?;
        let peer = PodmanPeer {
            podman: p.clone(),
            prefix,
            expect: tree.expect,
            export: ctx
                .scratch
                .join(format!("podman-checkpoint-{}.tar", tree.image)),
            copies: 0,
            running: 0,
            _source: source,
        };
        let t = Instant::now();
        while !peer.has_tree(&peer._source.name) {
            if t.elapsed() > Duration::from_secs(20) {
                bail!(
                    "podman container {} did not run all of {:?} within 20 s",
                    peer._source.name,
                    tree.expect
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let export = peer.export.clone();
        let row = row_podman_checkpoint(tree);
        let checkpoints = sample(&row, 1, ctx.cfg.samples, || {
            let _ = std::fs::remove_file(&export);
            common::time_command(
                p.command()
                    .args(["container", "checkpoint", "--leave-running", "--export"])
                    .arg(&export)
                    .arg(&peer._source.name),
            )
        })?;
        out.report.row(&row, checkpoints);
        Ok(peer)
    }

    /// Whether a container runs every process the tree needs.
    fn has_tree(&self, name: &str) -> bool {
        let top = self
            .podman
            .command()
            .args(["top", name, "comm"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        self.expect
            .iter()
            .all(|e| top.lines().any(|l| l.trim() == *e))
    }

    /// One `podman container restore --import` under a new name; its wall time, in
    /// microseconds. The copy is removed (outside the timing).
    fn restore_once(&mut self) -> Result<u64> {
        self.copies += 1;
        let copy = PodmanContainer {
            name: format!("{}-r{}", self.prefix, self.copies),
        };
        let us = common::time_command(
            self.podman
                .command()
                .args(["container", "restore", "--import"])
                .arg(&self.export)
                .args(["--name", &copy.name]),
        )?;
        if self.has_tree(&copy.name) {
            self.running += 1;
        }
        drop(copy);
        Ok(us)
    }

    /// `copies` restores, `parallel` at a time, each timed on its own (in microseconds);
    /// the copies are checked and removed once all are done, outside the timing.
    fn restore_concurrently(&mut self, copies: usize, parallel: usize) -> Result<Vec<u64>> {
        let names: Vec<String> = (0..copies)
            .map(|i| format!("{}-c{}", self.prefix, self.copies + 1 + i))
            .collect();
        self.copies += copies;
        let export = &self.export;
        let podman = &self.podman;
        let next = std::sync::atomic::AtomicUsize::new(0);
        let timed: Vec<Result<Vec<u64>>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..parallel.max(1))
                .map(|_| {
                    scope.spawn(|| -> Result<Vec<u64>> {
                        let mut us = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            let Some(name) = names.get(i) else {
                                return Ok(us);
                            };
                            us.push(common::time_command(
                                podman
                                    .command()
                                    .args(["container", "restore", "--import"])
                                    .arg(export)
                                    .args(["--name", name]),
                            )?);
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| {
                    w.join()
                        .unwrap_or_else(|_| Err(anyhow!("a restore thread panicked")))
                })
                .collect()
        });
        for name in &names {
            if self.has_tree(name) {
                self.running += 1;
            }
            drop(PodmanContainer { name: name.clone() });
        }
        let mut all = Vec::new();
        for t in timed {
            all.extend(t?);
        }
        Ok(all)
    }

    fn note_failures(&self, out: &mut Out) {
        if self.running < self.copies {
            out.report.notes.push(format!(
                "**podman: only {} of {} restored containers had all of {:?} running**",
                self.running, self.copies, self.expect
            ));
        }
    }
}

impl Drop for PodmanPeer {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.export) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("cleanup: remove {}: {e}", self.export.display());
            }
        }
    }
}

/// The goals of part 2.
fn fork_checks(report: &mut Report, cfg: &Config, debian: bool) {
    let ratio = |report: &Report, a: &str, b: &str| match (report.p50(a), report.p50(b)) {
        (Some(a), Some(b)) if b > 0 => Some(a as f64 / b as f64),
        _ => None,
    };
    let largest = *cfg.branch_counts.last().unwrap_or(&1);
    // forkd's rows compared: per branch (the daemon's total) and per request (the
    // client's wall time / N), for one branch and for the largest fork.
    let forkd_rows = |t: &Tree| {
        let mut rows = vec![
            (
                row_fork(t, 1, "eager", "branch total (daemon)"),
                "N=1 branch total".to_string(),
            ),
            (
                row_fork(t, 1, "eager", "request wall"),
                "N=1 request wall".to_string(),
            ),
        ];
        if largest > 1 {
            rows.push((
                row_fork(t, largest, "eager", "per-branch total (daemon)"),
                format!("N={largest} per-branch total"),
            ));
            rows.push((
                row_fork(t, largest, "eager", "request wall / N"),
                format!("N={largest} request wall / N"),
            ));
        }
        rows
    };
    let trees: Vec<&Tree> = if debian {
        vec![&BUSYBOX_TREE, &DEBIAN_TREE]
    } else {
        vec![&BUSYBOX_TREE]
    };
    // Each peer: its row for a tree, its name, the goal, the goal as shown, digits shown.
    type PeerRow = fn(&Tree) -> String;
    let peers: [(PeerRow, &str, f64, String, usize); 2] = [
        (
            row_podman_restore,
            "podman restore --import",
            PODMAN_RATIO_GOAL,
            format!("<= {PODMAN_RATIO_GOAL:.3} (1/8)"),
            3,
        ),
        (
            |t| row_raw(t, false),
            "raw criu restore -d",
            RAW_CRIU_RATIO_GOAL,
            format!("<= {RAW_CRIU_RATIO_GOAL}"),
            2,
        ),
    ];
    for (peer_row, peer, goal, shown_goal, digits) in &peers {
        for t in &trees {
            for (row, what) in forkd_rows(t) {
                let r = ratio(report, &row, &peer_row(t));
                report.checks.push(Check {
                    name: format!("live fork p50 ({what}) / {peer} p50, {}", t.name),
                    value: r,
                    shown: r
                        .map(|v| format!("{v:.digits$}"))
                        .unwrap_or_else(|| "n/a".into()),
                    goal: shown_goal.clone(),
                    met: r.map(|v| v <= *goal),
                });
            }
        }
    }
    // The largest fork's per-branch latency is that of restores run by several workers at
    // once; next to it, podman's restores run as many at a time.
    if largest > 1 {
        let parallel = forkd::daemon::fork_parallelism();
        for t in &trees {
            let r = ratio(
                report,
                &row_fork(t, largest, "eager", "per-branch total (daemon)"),
                &row_podman_restore_concurrent(t, parallel),
            );
            report.checks.push(Check {
                name: format!(
                    "live fork p50 (N={largest} per-branch total) / podman restore --import p50 \
                     {parallel} at a time (the same concurrency), {}",
                    t.name
                ),
                value: r,
                shown: r.map(|v| format!("{v:.3}")).unwrap_or_else(|| "n/a".into()),
                goal: format!("<= {PODMAN_RATIO_GOAL:.3} (1/8)"),
                met: r.map(|v| v <= PODMAN_RATIO_GOAL),
            });
        }
        report.notes.push(format!(
            "part 2: at N={largest} the daemon restores {parallel} branches at a time (its \
             workers), so each branch's own time is that of a restore sharing the machine; \
             the `{parallel} at a time` podman row restores copies of the same export with as \
             many concurrent `podman container restore --import` commands, which is the peer \
             for that latency (the one-at-a-time podman row is the peer for N=1). Throughput \
             is `request wall / N`"
        ));
    }
    report.notes.push(
        "part 2: the raw CRIU peer restores the very images of forkd's checkpoint with \
         `criu restore -d --root <overlay> --network-lock skip --file-locks \
         --manage-cgroups=ignore -v<forkd's level, 2 unless FORKD_CRIU_LOG_LEVEL> \
         --inherit-fd fd[3]:forkd-netns` (the options forkd sends over RPC, a new network \
         namespace with loopback up on fd 3, and CRIU's kernel facts cached as forkd \
         keeps them: this host's /run is not a tmpfs, without which every CRIU start \
         probes the kernel for some 40 ms); its row is the \
         command's wall time, process start included; the `overlay mount +` row adds \
         mounting the root. A forkd branch's total also covers its writable subvolume, \
         overlay, cgroup and the wait for its init's control socket. The peers' restores \
         are interleaved with forkd's N=1 eager samples (one of each per round, in rotating \
         order), so all three see the same machine; `other` is a branch's total minus its \
         named phases (for a lazy branch: starting its `criu lazy-pages` daemon). With N > 1 \
         the daemon restores a request's branches on several workers at once \
         (FORKD_FORK_PARALLEL, default the CPU count), so branch totals overlap and \
         `request wall / N` is the cost per branch"
            .into(),
    );
}

// ---------------------------------------------------------------------------------------
// Part 3: a QEMU guest

/// The last counter of complete `forkd-guest counter=N ...` lines in a serial log.

struct GuestMemory {
    cgroup_bytes: Option<u64>,
    pss_kib: u64,
    rss_kib: u64,
}

fn branch_memory(d: &DaemonGuard, id: &str) -> Result<GuestMemory> {
    let info = d.inspect(id)?;
    let (mut pss, mut rss) = (0, 0);
    for pid in common::cgroup_pids(&info.cgroup) {
        pss += common::pss_kib(pid).unwrap_or(0);
        rss += common::rss_kib(pid).unwrap_or(0);
    }
    Ok(GuestMemory {
        cgroup_bytes: info.memory_bytes,
        pss_kib: pss,
        rss_kib: rss,
    })
}

fn qemu_guest(ctx: &Ctx, out: &mut Out) -> Result<()> {
    let d = ctx.d;
    eprintln!("[3/4] QEMU guest (256 MiB, TCG) in a Debian sandbox");
    let cache = common::cache_dir();
    let kernel = cache.join("qemu/vmlinuz");
    let initrd = cache.join("qemu/initrd.gz");
    if let Some(f) = [&kernel, &initrd].iter().find(|f| !f.is_file()) {
        let why = format!(
            "fixture {} is missing (run fixtures/setup.sh qemu)",
            f.display()
        );
        out.report
            .notes
            .push(format!("part 3 (QEMU guest) skipped: {why}"));
        return common::skip("QEMU guest (part 3)", &why);
    }
    let sb = d.create(DEBIAN)?;
    out.created.push(sb.id.clone());
    if d.sh_ok(&sb.id, "command -v qemu-system-x86_64").is_err() {
        d.remove(&sb.id)?;
        let why =
            "the Debian image has no qemu-system-x86_64 (rebuild it: fixtures/setup.sh debian)";
        out.report
            .notes
            .push(format!("part 3 (QEMU guest) skipped: {why}"));
        return common::skip("QEMU guest (part 3)", why);
    }
    d.put_files(&sb.id, "/guest", &[&kernel, &initrd])?;
    let booted = Instant::now();
    d.exec_detached(&sb.id, &common::qemu_argv(), "qemu")?;
    let serial = Path::new(&sb.rootfs).join(GUEST_SERIAL);
    loop {
        if common::read_guest_counter(&serial).is_some_and(|c| c >= 5) {
            break;
        }
        if booted.elapsed() > Duration::from_secs(90) {
            let log = d
                .client()
                .raw(
                    "GET",
                    &format!("/v1/sandboxes/{}/logs?name=qemu", sb.id),
                    b"",
                )
                .map(|r| String::from_utf8_lossy(&r.body).to_string())
                .unwrap_or_default();
            bail!(
                "the guest printed no counter within 90 s; serial:\n{}\nqemu log:\n{log}",
                std::fs::read_to_string(&serial).unwrap_or_default()
            );
        }
        common::check_interrupted()?;
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "  guest counting after {}",
        fmt_us(booted.elapsed().as_micros() as u64)
    );
    let q = ctx.cfg.samples.min(5);

    // Dumps: a fresh checkpoint per sample, the guest running on.
    let row = "QEMU 256 MiB guest: live checkpoint, API";
    let mut phases = Vec::new();
    let dumps = sample(row, 0, q, || {
        let t = Instant::now();
        let c = d.checkpoint(&sb.id, true, false)?;
        let us = t.elapsed().as_micros() as u64;
        phases.push(c.phases_us.clone());
        // Its background tree hash must not overlap the next sample.
        wait_tree_hash(d, &c.id, Instant::now())?;
        d.remove_checkpoint(&c.id)?;
        Ok(us)
    })?;
    out.report.row(row, dumps);
    let dump: Vec<u64> = phases
        .iter()
        .filter_map(|p: &BTreeMap<String, u64>| p.get("dump").copied())
        .collect();
    out.report
        .row("QEMU 256 MiB guest: live checkpoint, daemon dump", dump);
    // The same with the volume's dirty bound lifted for the sample: CRIU writes the
    // guest's memory into the volume, so the bound paces it (see part 1b).
    if let Some(bound) = DirtyBound::of(ctx) {
        let row = "QEMU 256 MiB guest: live checkpoint with the dirty bound off, API";
        let unbounded = sample(row, 0, q, || {
            let (us, c) = bound.lifted(|| {
                let t = Instant::now();
                let c = d.checkpoint(&sb.id, true, false)?;
                Ok((t.elapsed().as_micros() as u64, c))
            })?;
            wait_tree_hash(d, &c.id, Instant::now())?;
            d.remove_checkpoint(&c.id)?;
            Ok(us)
        })?;
        out.report.row(row, unbounded);
    }
    // The checkpoint to fork; the source stops with it, so that the branches measured
    // next do not share the 2 CPUs with a running source guest.
    let ck = d.checkpoint(&sb.id, true, true)?;
    wait_tree_hash(d, &ck.id, Instant::now())?;
    let ck_serial = ctx
        .data
        .join("checkpoints")
        .join(&ck.id)
        .join("fs/upper")
        .join(GUEST_SERIAL);
    let at_checkpoint = common::read_guest_counter(&ck_serial)
        .ok_or_else(|| anyhow!("no counter in the checkpoint's {}", ck_serial.display()))?;
    eprintln!(
        "  checkpoint {}: CRIU images {}, counter {at_checkpoint} in its serial log",
        ck.id,
        fmt_kib(ck.images_bytes as f64 / 1024.0)
    );

    let mut mem_items = Vec::new();
    let mut mem_json = Vec::new();
    let mut table = Table {
        title: "Part 3: QEMU 256 MiB guest, one branch per fork request (ms)".into(),
        header: ["mode", "requests", "time to running p50"]
            .into_iter()
            .chain(FORK_COLUMNS[..FORK_COLUMNS.len() - 1].iter().copied())
            .map(String::from)
            .collect(),
        rows: Vec::new(),
    };
    for (mode, lazy) in [("eager", false), ("lazy", true)] {
        let row = format!("QEMU guest fork, {mode}: time to running (request to next serial line)");
        let mut series = ForkSeries::default();
        let mut mems = Vec::new();
        let ttr = sample(&row, 0, q, || {
            let t0 = Instant::now();
            let (b, wall) = fork_timed(ctx, out, &ck.id, 1, lazy)?;
            series.add(&b, wall, 0);
            let b = &b[0];
            // A branch's root is attached in its own mount namespace only.
            let path =
                PathBuf::from(format!("/proc/{}/root", b.init_pid.unwrap_or(0))).join(GUEST_SERIAL);
            let running = loop {
                if common::read_guest_counter(&path).is_some_and(|c| c > at_checkpoint) {
                    break t0.elapsed();
                }
                if t0.elapsed() > Duration::from_secs(60) {
                    bail!(
                        "{mode} branch {}: the guest's counter did not pass {at_checkpoint} within 60 s",
                        b.id
                    );
                }
                std::thread::sleep(Duration::from_millis(2));
            };
            let at = t0 + Duration::from_secs(10);
            while Instant::now() < at {
                common::check_interrupted()?;
                std::thread::sleep(Duration::from_millis(50));
            }
            mems.push(branch_memory(d, &b.id)?);
            d.remove(&b.id)?;
            Ok(running.as_micros() as u64)
        })?;
        let running = out.report.row(&row, ttr);
        out.report.row(
            &format!("QEMU guest fork, {mode}: branch total (daemon)"),
            series.totals.clone(),
        );
        out.report.row(
            &format!("QEMU guest fork, {mode}: branch restore phase"),
            series.phase("restore"),
        );
        let mut cells = vec![
            mode.to_string(),
            series.requests.to_string(),
            fmt_ms(running.p50 as f64),
        ];
        cells.extend(fork_cells(&series));
        cells.pop();
        table.rows.push(cells);
        let mean = |f: &dyn Fn(&GuestMemory) -> Option<f64>| {
            let v: Vec<f64> = mems.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let cg = mean(&|m| m.cgroup_bytes.map(|b| b as f64 / 1024.0));
        let pss = mean(&|m| Some(m.pss_kib as f64));
        let rss = mean(&|m| Some(m.rss_kib as f64));
        let shown = |v: Option<f64>| v.map(fmt_kib).unwrap_or_else(|| "n/a".into());
        mem_items.push((
            format!("{mode} branch, 10 s after its fork: cgroup memory charged (mean)"),
            shown(cg),
        ));
        mem_items.push((
            format!("{mode} branch, 10 s after its fork: PSS of its processes (mean)"),
            shown(pss),
        ));
        mem_items.push((
            format!("{mode} branch, 10 s after its fork: RSS of its processes (mean)"),
            shown(rss),
        ));
        mem_json.push(json!({
            "mode": mode,
            "branch_phases_us": series.phases,
            "cgroup_kib": mems.iter().map(|m| m.cgroup_bytes.map(|b| b / 1024)).collect::<Vec<_>>(),
            "pss_kib": mems.iter().map(|m| m.pss_kib).collect::<Vec<_>>(),
            "rss_kib": mems.iter().map(|m| m.rss_kib).collect::<Vec<_>>(),
        }));
    }
    out.report.tables.push(table);
    mem_items.insert(
        0,
        (
            "CRIU images of the checkpoint".into(),
            fmt_kib(ck.images_bytes as f64 / 1024.0),
        ),
    );
    out.report.sections.push((
        "Part 3: QEMU 256 MiB guest memory per branch".into(),
        mem_items,
    ));
    out.report.extra.insert(
        "qemu".into(),
        json!({ "images_bytes": ck.images_bytes, "counter_at_checkpoint": at_checkpoint, "memory": mem_json }),
    );
    d.remove_checkpoint(&ck.id)?;
    d.remove(&sb.id)?;

    let lazy = out
        .report
        .p50("QEMU guest fork, lazy: time to running (request to next serial line)")
        .map(|us| us as f64 / 1000.0);
    out.report.checks.push(Check {
        name: "QEMU guest lazy fork: time to running p50".into(),
        value: lazy,
        shown: lazy
            .map(|v| format!("{v:.0} ms"))
            .unwrap_or_else(|| "n/a".into()),
        goal: format!("< {LAZY_RUNNING_GOAL_MS} ms"),
        met: lazy.map(|v| v < LAZY_RUNNING_GOAL_MS),
    });
    out.report.notes.push(
        "part 3: the guest prints a counter line about every 100 ms, so time to running \
         includes up to one interval of waiting for the next line; the serial log is read \
         on the host through the branch's root every 2 ms; memory is read 10 s after the \
         fork request (a lazy branch's lazy-pages daemon runs in forkd's cgroup, not the \
         branch's)"
            .into(),
    );
    Ok(())
}
