//! The goals of part 2: forkd's fork latency as a ratio of its peers' restores (podman
//! one at a time and at the daemon's concurrency, the raw CRIU command line), and the
//! notes that say how the peers were run.

use crate::common::{Check, Report};
use crate::config::{
    Config, Tree, BUSYBOX_TREE, DEBIAN_TREE, PODMAN_RATIO_GOAL, RAW_CRIU_RATIO_GOAL,
};
use crate::forks::{row_fork, row_podman_restore, row_podman_restore_concurrent, row_raw};

/// The goals of part 2.
pub fn fork_checks(report: &mut Report, cfg: &Config, debian: bool) {
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
        let parallel = forkd::daemon::config::Config::from_env().map_or(1, |c| c.fork_parallel);
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
