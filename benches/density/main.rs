//! Many branches alive at once: what one more costs as the number alive grows, and the
//! memory branches of one checkpoint share. Not in CI (it takes minutes).
//!
//! Part 1, busybox branches (`FORKD_DENSITY_N`, default `100,1000,2000,5000`): one live
//! checkpoint of a busybox shell loop that ticks every 10 s without forking (`read -t`
//! on a FIFO: a loop that forks `sleep` every second makes thousands of processes a
//! second at this size, and measures the machine's CPU, not forkd). Branches are forked
//! 100 a request until N are alive; at each N, once the host has settled after the last
//! batch (`FORKD_DENSITY_SETTLE_SECS`, default 10: the batch's first ticks and the
//! kernel's work on its branches are not what one more costs): single forks, creates,
//! execs, filesystem checkpoints, stops and removes (`FORKD_DENSITY_SAMPLES`, default 25,
//! p50/p90: with fewer, one busy moment of the host moves a p50; each a pause of
//! `FORKD_DENSITY_SPACING_MS`, default 250, jittered, after the last, see `space`), the list and inspect
//! requests, the whole `forkd ps` process, host memory per branch
//! (MemAvailable drop / N), the daemon's RSS and how busy the host was while it settled
//! (all CPUs, and the share of one its own PID 1 took); a sample of branches must answer
//! an exec.
//! Then, with all of them still alive, `FORKD_DENSITY_DEBIAN` (default 1000; 0 skips)
//! Debian branches of a live checkpoint of a python3 loop (the same 10-s tick) are forked
//! beside them: time a branch, single forks, memory a branch, and a sample of both kinds
//! must answer. At the smallest N, controls (`benches/density/controls.rs`;
//! `FORKD_DENSITY_CONTROLS=0` skips them) sample one more fork and create again beside
//! idle processes and beside network namespaces outside forkd, as many as the largest N
//! brings: what the host itself charges for them. Then every branch is removed, timed.
//! The p50 latencies against the number alive are also drawn, target/bench/density.svg.
//! podman's peer: `podman container restore --import` of an export of the same loop,
//! one container after another, until
//! `FORKD_DENSITY_PODMAN_SECS` (default 300) have passed or `FORKD_DENSITY_PODMAN_MAX`
//! (default 1000) run: restore time at the first and the last 10, memory per container.
//!
//! Part 2, the QEMU guest (TCG, `FORKD_DENSITY_QEMU_MIB` of guest memory, default 1024),
//! forked from its restore template by requests that also share memory
//! (`share_memory`, on the default `FORKD_KSM=ask`), with a memory cgroup for every branch
//! (`FORKD_MEMCG=each`, whatever the environment says): 1, 4 and 16 branches
//! (`FORKD_DENSITY_QEMU`), host memory in total and per branch (MemAvailable drop right
//! after the fork and settled, and the branches' cgroup charge), the time until KSM's
//! sharing settles and the CPU ksmd spent;
//! and the guest checks of tests/guest.rs in every branch: its counter goes on past the
//! checkpoint's, its serial log is one run (one boot, no restart or gap) carrying the
//! secret the guest drew at boot, and branches diverge (QEMU killed in one, its log
//! stops while the others count on).
//!
//! Part 1's daemon takes the environment's `FORKD_MEMCG` (`limited`, the default on cgroup
//! v1: branches without a memory limit share one memory cgroup; `each`) and
//! its `FORKD_KSM` (`ask` unless set, and its forks do not ask, so branches share no
//! memory; `on` makes every fork share); the header records both.
//! Part 3, `benches/density/large.rs`: 1,000 branches of one live state holding 1 GiB,
//! all alive at once, with its peer (branches read page by page) in the same run.
//!
//! `FORKD_DENSITY_PARTS` (default `branches,qemu,large`). Writes target/bench/density.json and .md.

#![forbid(unsafe_code)]

#[path = "../common/mod.rs"]
mod common;
#[path = "../peers/mod.rs"]
mod peers;

mod controls;
mod large;
mod podman_peer;
mod qemu;

use anyhow::{bail, Context, Result};
use common::{DaemonGuard, Report};
use peers::podman::{Podman, PodmanContainer};
use podman_peer::podman_peer;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub(crate) const LOOP: &str = "mkfifo /tmp/tick; exec 3<>/tmp/tick; i=0; while :; do i=$((i+1)); echo $i > /tmp/count; read -t 10 x <&3; done";
/// The Debian branches' program: a python3 loop with the busybox loop's tick.
const PY_LOOP: &str = "exec python3 -c \"
import time
i = 0
while True:
    i += 1
    with open('/tmp/count', 'w') as f:
        f.write(str(i))
    time.sleep(10)
\"";
const BATCH: usize = 100;
const PODMAN_IMAGE: &str = "localhost/forkd-bench-busybox";

fn main() {
    common::install_interrupt_handler();
    if let Err(e) = run() {
        eprintln!("bench density: error: {e:#}");
        std::process::exit(1);
    }
}

fn list(name: &str, default: &str) -> Result<Vec<usize>> {
    let v = std::env::var(name).unwrap_or_else(|_| default.to_string());
    v.split(',')
        .map(|s| {
            s.trim()
                .parse::<usize>()
                .with_context(|| format!("{name}={v:?}"))
        })
        .collect()
}

/// Waits between two samples of one row: `FORKD_DENSITY_SPACING_MS` (default 250, `0`
/// for none) times a factor drawn from [0.5, 1.5). Samples taken back to back fall
/// within half a second, inside one burst or one lull of what else the host runs (its
/// PID 1 works in bursts of most of a second once thousands of network namespaces
/// exist), so a row's p50 told which phase it landed on; spread over some 6 s, with no
/// fixed period to fall in step with, it is the typical latency under the host's load.
/// The pause is outside every timing.
pub(crate) fn space() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static SPACING: OnceLock<u64> = OnceLock::new();
    static RNG: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
    let ms = *SPACING.get_or_init(|| {
        std::env::var("FORKD_DENSITY_SPACING_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(250)
    });
    if ms == 0 {
        return;
    }
    // xorshift64, the same sequence in every run.
    let mut x = RNG.load(Ordering::Relaxed);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    RNG.store(x, Ordering::Relaxed);
    let factor = 0.5 + (x % 1000) as f64 / 1000.0;
    std::thread::sleep(Duration::from_secs_f64(ms as f64 * factor / 1000.0));
}

pub(crate) fn us(t: Instant) -> u64 {
    t.elapsed().as_micros() as u64
}

fn run() -> Result<()> {
    let Some(debian) = common::root_and_debian("bench density")? else {
        return Ok(());
    };
    let parts =
        std::env::var("FORKD_DENSITY_PARTS").unwrap_or_else(|_| "branches,qemu,large".into());
    let samples = common::env_usize("FORKD_DENSITY_SAMPLES", 25)?;
    let date = common::utc_now();
    let load_start = common::load_average();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_forkd"));
    let mut report = Report::new("density");
    let podman = if parts.contains("branches") {
        Podman::detect()?
    } else {
        None
    };
    // The busybox and Debian branches' daemon takes `FORKD_KSM` from the environment (`ask`
    // unless set); the header records it.
    let branch_ksm = std::env::var("FORKD_KSM").unwrap_or_else(|_| "ask".into());
    if parts.contains("branches") {
        let d = DaemonGuard::start(&bin)?;
        d.import(&common::fixture_image("busybox.tar"), "busybox")?;
        let debian_n = common::env_count("FORKD_DENSITY_DEBIAN", 1000)?;
        if debian_n > 0 {
            d.import(&debian, "debian")?;
        }
        branches(
            &d,
            &bin,
            samples,
            &list("FORKD_DENSITY_N", "100,1000,2000,5000")?,
            debian_n,
            &mut report,
        )?;
        drop(d.stop());
        if let Some(p) = &podman {
            podman_peer(p, &mut report)?;
        }
    }
    if parts.contains("qemu") {
        // The daemon's default (`ask`): its forks ask to share memory. A memory cgroup for
        // every branch, whose charges are reported.
        let (memcg, ksm) = (
            std::env::var_os("FORKD_MEMCG"),
            std::env::var_os("FORKD_KSM"),
        );
        std::env::set_var("FORKD_KSM", "ask");
        std::env::set_var("FORKD_MEMCG", "each");
        let d = DaemonGuard::start(&bin)?;
        match ksm {
            Some(v) => std::env::set_var("FORKD_KSM", v),
            None => std::env::remove_var("FORKD_KSM"),
        }
        match memcg {
            Some(v) => std::env::set_var("FORKD_MEMCG", v),
            None => std::env::remove_var("FORKD_MEMCG"),
        }
        d.import(&debian, "debian")?;
        qemu::qemu(&d, &list("FORKD_DENSITY_QEMU", "1,4,16")?, &mut report)?;
        drop(d.stop());
    }
    if parts.contains("large") {
        large::large(&bin, &debian, samples, &mut report)?;
    }
    let run = common::RunInfo::at_end(&date, &load_start);
    let header = run.header(
        json!({
            "samples": samples,
            "spacing_ms": std::env::var("FORKD_DENSITY_SPACING_MS").unwrap_or_else(|_| "250".into()),
            "parts": parts,
            // Whether sandboxes without a memory limit share one memory cgroup.
            "memcg": std::env::var("FORKD_MEMCG").unwrap_or_else(|_| "limited".into()),
            "branch_ksm": branch_ksm,
        }),
        ("peers", json!({ "podman": podman.as_ref().map(|p| json!({"version": p.version, "runtime": p.runtime})) })),
    );
    let title = run.title("peer: podman container restore --import (runc, the same CRIU)");
    let (json_path, md_path, md) = report.write(&header, &title).context("write the report")?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}

/// Removes every sandbox of `ids`, one request each, with progress; the time it took, µs.
pub(crate) fn remove_all(d: &DaemonGuard, ids: &[String]) -> Result<u64> {
    let t = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        common::check_interrupted()?;
        d.remove(id)?;
        if i % 100 == 99 {
            eprint!("\r  removed {}", i + 1);
        }
    }
    eprintln!();
    Ok(us(t))
}

pub(crate) fn fork(d: &DaemonGuard, ck: &str, n: usize) -> Result<Vec<String>> {
    Ok(d.fork(ck, n, false)?
        .branches
        .into_iter()
        .map(|b| b.id)
        .collect())
}

/// Picks branches at random, the same sequence in every run.
struct Picker(u64);

impl Picker {
    fn one<'a>(&mut self, ids: &'a [String]) -> &'a str {
        // xorshift64
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        &ids[(self.0 % ids.len() as u64) as usize]
    }

    /// How many of 20 branches picked from `ids` still run their loop and answer.
    fn answering(&mut self, d: &DaemonGuard, ids: &[String]) -> usize {
        (0..20)
            .filter(|_| {
                d.sh_ok(self.one(ids), "cat /tmp/count")
                    .is_ok_and(|c| c.trim().parse::<u64>().is_ok())
            })
            .count()
    }
}

/// Part 1.
fn branches(
    d: &DaemonGuard,
    bin: &Path,
    samples: usize,
    ns: &[usize],
    debian_n: usize,
    report: &mut Report,
) -> Result<()> {
    let settle = Duration::from_secs(common::env_usize("FORKD_DENSITY_SETTLE_SECS", 10)? as u64);
    eprintln!(
        "[1] busybox branches alive at N = {ns:?}, sampled {} s after each batch",
        settle.as_secs()
    );
    let source = d.create_with(&json!({ "image": "busybox", "command": { "shell": LOOP } }))?;
    let ck = d.checkpoint(&source.id, true, false)?;
    let base_avail = common::mem_available_kib()?;
    let mut alive: Vec<String> = Vec::new();
    let mut table = Vec::new();
    // p50s in ms against the number alive, for the plot.
    let mut plot: Vec<common::plot::Series> = [
        "fork of one",
        "create",
        "exec",
        "filesystem checkpoint",
        "stop",
        "remove",
        "list",
    ]
    .iter()
    .map(|n| common::plot::Series {
        name: n.to_string(),
        points: vec![],
    })
    .collect();
    let mut pick = Picker(0x2545f4914f6cdd1d);
    let controls_on = common::env_count("FORKD_DENSITY_CONTROLS", 1)? > 0;
    let mut control_table = None;
    for &n in ns {
        let grow = Instant::now();
        let before = alive.len();
        while alive.len() < n {
            common::check_interrupted()?;
            let k = (n - alive.len()).min(BATCH);
            alive.extend(fork(d, &ck.id, k)?);
            eprint!("\r  {} alive", alive.len());
        }
        eprintln!();
        let per_branch_batch = if alive.len() > before {
            us(grow) / (alive.len() - before) as u64
        } else {
            0
        };
        // How busy the host is with nothing asked of forkd: the branches' own loops, and
        // whatever the machine itself runs over its processes (its PID 1 here).
        let (busy, init_cpu) = common::host_cpu_over(settle)?;
        let mut row = |what: &str, v: Vec<u64>| report.row(&format!("N={n}: {what}"), v);
        let mut forks = Vec::new();
        for _ in 0..samples {
            space();
            let t = Instant::now();
            alive.extend(fork(d, &ck.id, 1)?);
            forks.push(us(t));
        }
        let fork_s = row("fork of one branch", forks);
        let (mut creates, mut execs, mut cks, mut stops, mut rms) =
            (vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..samples {
            space();
            let t = Instant::now();
            let sb = d.create_with(&json!({ "image": "busybox", "command": { "shell": LOOP } }))?;
            creates.push(us(t));
            let t = Instant::now();
            d.exec_ok(&sb.id, &["true"])?;
            execs.push(us(t));
            let t = Instant::now();
            let c = d.checkpoint(&sb.id, false, false)?;
            cks.push(us(t));
            d.remove_checkpoint(&c.id)?;
            let t = Instant::now();
            d.client().call::<serde_json::Value>(
                "POST",
                &format!("/v1/sandboxes/{}/stop", sb.id),
                Some(&json!({ "grace_secs": 1 })),
            )?;
            stops.push(us(t));
            let t = Instant::now();
            d.remove(&sb.id)?;
            rms.push(us(t));
        }
        let create_s = row("create", creates);
        let exec_s = row("exec (true)", execs);
        let ck_s = row("filesystem checkpoint", cks);
        let stop_s = row("stop", stops);
        let rm_s = row("remove", rms);
        let (mut lists, mut bodies, mut inspects, mut ps) = (vec![], vec![], vec![], vec![]);
        for _ in 0..samples {
            space();
            // The daemon's answer alone (received, not decoded), then as a typed client
            // sees it (decoded into descriptions).
            let t = Instant::now();
            let body = d.client().raw("GET", "/v1/sandboxes", &[])?;
            bodies.push(us(t));
            if body.status != 200 {
                bail!("list: HTTP {}", body.status);
            }
            let t = Instant::now();
            let l: Vec<forkd::api::SandboxInfo> = d.client().call("GET", "/v1/sandboxes", None)?;
            lists.push(us(t));
            if l.len() < alive.len() {
                bail!(
                    "the list has {} sandboxes, {} are alive",
                    l.len(),
                    alive.len()
                );
            }
            let t = Instant::now();
            d.inspect(pick.one(&alive))?;
            inspects.push(us(t));
            let t = Instant::now();
            let out = std::process::Command::new(bin)
                .arg("ps")
                .env("FORKD_SOCKET", &d.socket)
                .output()?;
            if !out.status.success() {
                bail!("forkd ps failed: {}", String::from_utf8_lossy(&out.stderr));
            }
            ps.push(us(t));
        }
        let list_s = row("list request", lists);
        let x = alive.len() as f64;
        for (series, s) in plot
            .iter_mut()
            .zip([&fork_s, &create_s, &exec_s, &ck_s, &stop_s, &rm_s, &list_s])
        {
            series.points.push((x, s.p50 as f64 / 1000.0));
        }
        row("list request, answer only (not decoded)", bodies);
        row("inspect request", inspects);
        row("forkd ps (whole process)", ps);
        // Every sampled branch still runs its loop and answers.
        let answered = pick.answering(d, &alive);
        let avail = common::mem_available_kib()?;
        let per_branch_kib = base_avail.saturating_sub(avail) as f64 / alive.len() as f64;
        let rss = d.rss_kib()?;
        let fds = std::fs::read_dir(format!("/proc/{}/fd", d.pid()?))?.count();
        eprintln!(
            "  N={n}: fork p50 {} create p50 {} exec p50 {} list p50 {}; {:.0} KiB a branch; daemon {rss} KiB, {fds} descriptors; {answered}/20 answered",
            common::fmt_us(fork_s.p50), common::fmt_us(create_s.p50), common::fmt_us(exec_s.p50), common::fmt_us(list_s.p50), per_branch_kib
        );
        table.push(vec![
            alive.len().to_string(),
            common::fmt_us(per_branch_batch),
            common::fmt_us(fork_s.p50),
            common::fmt_us(create_s.p50),
            common::fmt_us(exec_s.p50),
            common::fmt_us(list_s.p50),
            format!("{per_branch_kib:.0} KiB"),
            format!("{rss} KiB"),
            fds.to_string(),
            format!("{busy:.0}% ({init_cpu:.0}%)"),
            format!("{answered}/20"),
        ]);
        if n == ns[0] && controls_on && ns.len() > 1 {
            let extra = ns[ns.len() - 1].saturating_sub(alive.len());
            control_table = Some(controls::controls(
                d, &ck.id, samples, settle, extra, &mut alive, report,
            )?);
        }
    }
    let svg = common::plot::svg(
        "forkd: one more operation with N busybox branches alive (p50)",
        "branches alive (log scale)",
        "ms",
        &plot,
    );
    let svg_path = common::bench_output_dir().join("density.svg");
    std::fs::create_dir_all(common::bench_output_dir())?;
    std::fs::write(&svg_path, svg).with_context(|| format!("write {}", svg_path.display()))?;
    let (debian_ids, debian_ck, debian_table) = if debian_n > 0 {
        debian_branches(d, samples, debian_n, &mut pick, report)?
    } else {
        (Vec::new(), None, None)
    };
    // With the Debian branches beside them, the busybox ones still run.
    let answered = pick.answering(d, &alive);
    let removed = remove_all(d, &alive)?;
    d.remove(&source.id)?;
    d.remove_checkpoint(&ck.id)?;
    let t = Instant::now();
    for id in &debian_ids {
        common::check_interrupted()?;
        d.remove(id)?;
    }
    let debian_removed = us(t);
    if let Some(c) = debian_ck {
        d.remove_checkpoint(&c)?;
    }
    report.tables.push(common::Table::new(
        &format!(
            "Busybox branches alive (p50, sampled {} s after each batch; memory = MemAvailable drop / alive)",
            settle.as_secs()
        ),
        &[
            "alive",
            "fork, per branch in batches of 100",
            "fork of one",
            "create",
            "exec",
            "list",
            "host memory a branch",
            "daemon RSS",
            "daemon descriptors",
            "host CPU busy while settling (its PID 1, % of a CPU)",
            "sampled branches answering",
        ],
        table,
    ));
    report.tables.extend(control_table);
    report.sections.push((
        "Removal".into(),
        vec![
            (
                format!(
                    "busybox branches answering with {} Debian branches beside them",
                    debian_ids.len()
                ),
                format!("{answered}/20 sampled"),
            ),
            (
                format!(
                    "remove all {} busybox branches, one request each",
                    alive.len()
                ),
                format!(
                    "{} ({} a branch)",
                    common::fmt_us(removed),
                    common::fmt_us(removed / alive.len().max(1) as u64)
                ),
            ),
            (
                format!("then all {} Debian branches", debian_ids.len()),
                format!(
                    "{} ({} a branch)",
                    common::fmt_us(debian_removed),
                    common::fmt_us(debian_removed / debian_ids.len().max(1) as u64)
                ),
            ),
            ("plot of the p50s".into(), "density.svg".into()),
        ],
    ));
    report.tables.extend(debian_table);
    Ok(())
}

/// Part 1, second half: `n` Debian branches of a live python3 loop, forked beside the
/// busybox ones. Returns their ids, still alive, their checkpoint's and their table.
fn debian_branches(
    d: &DaemonGuard,
    samples: usize,
    n: usize,
    pick: &mut Picker,
    report: &mut Report,
) -> Result<(Vec<String>, Option<String>, Option<common::Table>)> {
    eprintln!("[1d] {n} Debian python3 branches beside them");
    let source = d.create_with(&json!({ "image": "debian", "command": { "shell": PY_LOOP } }))?;
    if !common::wait_until(Duration::from_secs(30), || {
        d.sh_ok(&source.id, "cat /tmp/count").is_ok()
    }) {
        bail!("the python3 loop wrote no /tmp/count within 30 s");
    }
    let ck = d.checkpoint(&source.id, true, false)?;
    d.remove(&source.id)?;
    let avail0 = common::mem_available_kib()?;
    let t = Instant::now();
    let mut ids = Vec::new();
    while ids.len() < n {
        common::check_interrupted()?;
        ids.extend(fork(d, &ck.id, (n - ids.len()).min(BATCH))?);
        eprint!("\r  {} Debian branches alive", ids.len());
    }
    eprintln!();
    let per_branch = us(t) / n.max(1) as u64;
    let per_kib = avail0.saturating_sub(common::mem_available_kib()?) as f64 / n.max(1) as f64;
    let mut forks = Vec::new();
    for _ in 0..samples {
        space();
        let t = Instant::now();
        ids.extend(fork(d, &ck.id, 1)?);
        forks.push(us(t));
    }
    let fork_s = report.row(&format!("Debian, {n} alive: fork of one branch"), forks);
    let answered = pick.answering(d, &ids);
    let rss = d.rss_kib()?;
    eprintln!(
        "  Debian: {} a branch in batches, fork of one p50 {}; {per_kib:.0} KiB a branch; {answered}/20 answered",
        common::fmt_us(per_branch),
        common::fmt_us(fork_s.p50)
    );
    let table = common::Table::new(
        "Debian python3 branches, beside the busybox ones (memory = MemAvailable drop / n)",
        &[
            "Debian branches",
            "fork, per branch in batches of 100",
            "fork of one",
            "host memory a branch",
            "daemon RSS",
            "sampled branches answering",
        ],
        vec![vec![
            ids.len().to_string(),
            common::fmt_us(per_branch),
            common::fmt_us(fork_s.p50),
            format!("{per_kib:.0} KiB"),
            format!("{rss} KiB"),
            format!("{answered}/20"),
        ]],
    );
    Ok((ids, Some(ck.id), Some(table)))
}
