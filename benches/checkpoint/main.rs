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
//!
//! Where things are: this file runs the parts in order and checks what the run left
//! behind; `config.rs` holds the trees, goals and configuration, `fs.rs` part 1,
//! `forks.rs` part 2, `guest.rs` part 3, `density.rs` part 4 and `checks.rs` the goals
//! of part 2. The peers are in `benches/peers/`: `tar_zstd.rs` (part 1), `raw_criu.rs`
//! and `podman.rs` (part 2); the shared pieces (daemon, sampling, report) in
//! `benches/common/`.

#![forbid(unsafe_code)]

#[path = "../common/mod.rs"]
mod common;
#[path = "../peers/mod.rs"]
mod peers;

mod checks;
mod config;
mod density;
mod forks;
mod fs;
mod guest;

use anyhow::{anyhow, bail, Result};
use common::{fmt_us, DaemonGuard, Report};
use config::{size_label, Config, Tree, BUSYBOX, BUSYBOX_TREE, DEBIAN, DEBIAN_TREE};
use peers::podman::{podman_containers, Podman, PodmanPeer, PODMAN_RUN_FLAGS};
use peers::raw_criu::is_zombie;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// What every part needs.
pub struct Ctx<'a> {
    pub d: &'a DaemonGuard,
    pub cfg: &'a Config,
    /// A host directory of this run for archives and exports; removed at the end.
    pub scratch: PathBuf,
    /// The daemon's data volume (`<state root>/vol`, or the state root on btrfs).
    pub data: PathBuf,
    pub podman_prefix: String,
}

/// What the run produced and what it must clean up or check for leaks.
pub struct Out {
    pub report: Report,
    /// Every sandbox created (branches included), for the cgroup leak check.
    pub created: Vec<String>,
    /// Host pids of trees restored with the raw CRIU command line.
    pub raw_pids: Vec<i32>,
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
    let criu =
        match forkd_criu::Criu::locate(None, &forkd::daemon::config::Config::from_env()?.criu) {
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

    fs::fs_checkpoints(&ctx, out)?;

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
            Some(p) => Some(podman_peer(&ctx, out, p, tree)?),
            None => None,
        };
        forks::live_forks(&ctx, out, tree, criu, podman_peer.as_mut())?;
    }
    checks::fork_checks(&mut out.report, cfg, debian);

    if !cfg.qemu {
        println!("SKIP QEMU guest (part 3): FORKD_BENCH_QEMU=0");
        out.report
            .notes
            .push("part 3 (QEMU guest) skipped: FORKD_BENCH_QEMU=0".into());
    } else if debian {
        guest::qemu_guest(&ctx, out)?;
    }
    Ok(())
}

/// podman's peer for a tree: its container started, its checkpoints measured (the last
/// export kept for the restores of part 2).
fn podman_peer(ctx: &Ctx, out: &mut Out, p: &Podman, tree: &Tree) -> Result<PodmanPeer> {
    eprintln!(
        "[2/4] podman peer: import {}, checkpoint --export of {}",
        tree.fixture, tree.name
    );
    let peer = PodmanPeer::new(
        p,
        &tree.podman(),
        format!("{}-{}", ctx.podman_prefix, tree.image),
        ctx.scratch
            .join(format!("podman-checkpoint-{}.tar", tree.image)),
    )?;
    let row = forks::row_podman_checkpoint(tree);
    let checkpoints = peer.checkpoints(&row, ctx.cfg.samples)?;
    out.report.row(&row, checkpoints);
    Ok(peer)
}
