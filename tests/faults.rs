//! Faults injected into a running daemon: `kill -9` in the middle of a fork of 20
//! branches and in the middle of a live checkpoint. After a restart the listings are
//! consistent with what is on disk and in the kernel, nothing is left behind (mounts,
//! cgroups, sandbox directories and their subvolumes, checkpoint stages, processes,
//! CRIU), and the next request works.

mod common;

use common::*;
use forkd::api::{CheckpointInfo, SandboxInfo, SandboxStatus};
use std::collections::BTreeSet;
use std::time::Duration;

fn list(d: &TestDaemon) -> Vec<SandboxInfo> {
    d.client.call("GET", "/v1/sandboxes", None).unwrap()
}

fn dirs(d: &TestDaemon, sub: &str) -> BTreeSet<String> {
    std::fs::read_dir(d.data().join(sub))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect()
}

/// What a restarted daemon must show: every sandbox directory is a listed sandbox and
/// the other way round; every listed running sandbox answers; every sandbox id in
/// `seen` that is no longer listed has no cgroup left; no sandbox root is mounted on
/// the host; no checkpoint stage is left.
fn consistent(d: &TestDaemon, seen: &BTreeSet<String>) -> Vec<SandboxInfo> {
    let listed = list(d);
    let ids: BTreeSet<String> = listed.iter().map(|s| s.id.clone()).collect();
    assert_eq!(
        dirs(d, "sandboxes"),
        ids,
        "sandbox directories against the listing"
    );
    for s in &listed {
        if s.status == SandboxStatus::Running {
            let (code, out, err) = d.sh(&s.id, "echo up");
            assert_eq!((code, out.trim()), (0, "up"), "sandbox {}: {err}", s.id);
        } else {
            assert_eq!(s.status, SandboxStatus::Stopped, "{}: settled", s.id);
        }
    }
    for id in seen.difference(&ids) {
        assert!(
            !cgroup_exists(id),
            "cgroup of the gone sandbox {id} is left"
        );
    }
    assert!(
        d.sandbox_mounts().is_empty(),
        "mounts: {:?}",
        d.sandbox_mounts()
    );
    let stages: Vec<String> = dirs(d, "checkpoints")
        .into_iter()
        .filter(|n| n.starts_with(".stage-"))
        .collect();
    assert!(stages.is_empty(), "stages left: {stages:?}");
    listed
}

/// Pids of the processes whose parent is `parent` and whose command line is `argv`.
fn children_running(parent: u32, argv: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let ppid = status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:"))
                .and_then(|v| v.trim().parse::<u32>().ok());
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            ppid == Some(parent)
                && cmd
                    .split(|&b| b == 0)
                    .filter(|p| !p.is_empty())
                    .map(|p| String::from_utf8_lossy(p).to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
                    == argv
        })
        .collect()
}

/// The daemon is killed while a fork of 20 branches is restoring them. After the
/// restart the branches that were recorded run, the half-made ones are gone without a
/// trace, and the checkpoint forks again.
#[test]
fn kill_9_during_a_fork_of_20_branches() {
    let name = "kill_9_during_a_fork_of_20_branches";
    if !can_run_criu(name) {
        return;
    }
    let mut d = TestDaemon::start("faults-fork");
    let sb = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "shell": "i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done" }
    }));
    d.wait_for(&sb.id, "cat /tmp/n", "");
    let ck: CheckpointInfo = d.checkpoint(&sb.id, true);
    let forker = d.call_in_background::<forkd::api::ForkResult>(
        "POST",
        format!("/v1/checkpoints/{}/fork", ck.id),
        serde_json::json!({ "count": 20 }),
    );
    let mut seen = BTreeSet::new();
    assert!(
        wait_until(Duration::from_secs(60), || {
            seen.extend(dirs(&d, "sandboxes"));
            list(&d).len() >= 4
        }),
        "the fork made no branches"
    );
    seen.extend(dirs(&d, "sandboxes"));
    d.kill9();
    assert!(
        forker.join().unwrap().is_err(),
        "the fork cannot have answered"
    );
    seen.extend(dirs(&d, "sandboxes"));
    d.spawn();
    let listed = consistent(&d, &seen);
    assert!(listed.iter().any(|s| s.id == sb.id), "the source survives");
    assert!(
        listed.len() < 21,
        "the fork was cut short: {}",
        listed.len()
    );
    for s in listed.iter().filter(|s| s.id != sb.id) {
        let n = d.read_number(&s.id, "/tmp/n");
        assert!(
            wait_until(Duration::from_secs(10), || d.read_number(&s.id, "/tmp/n")
                > n),
            "branch {} does not count on",
            s.id
        );
    }
    let again = d.fork(&ck.id, 2, false);
    assert_eq!(again.branches.len(), 2);
    for s in list(&d) {
        d.remove(&s.id);
    }
    let _: serde_json::Value = d
        .client
        .call("DELETE", &format!("/v1/checkpoints/{}", ck.id), None)
        .unwrap();
    for id in seen.iter().chain(again.branches.iter().map(|b| &b.id)) {
        assert!(!cgroup_exists(id), "cgroup {id} left after removal");
    }
    assert!(dirs(&d, "sandboxes").is_empty());
}

/// The daemon is killed while CRIU dumps a sandbox (a CRIU that does not answer holds
/// it there, the sandbox frozen by the daemon). CRIU dies with the daemon; after the
/// restart the sandbox is thawed and running, the checkpoint never appears, its stage
/// is gone, and the next live checkpoint works.
#[test]
fn kill_9_during_a_live_checkpoint() {
    let name = "kill_9_during_a_live_checkpoint";
    if !can_run_criu(name) {
        return;
    }
    let criu = HangingCriu::new("faults");
    let mut d = TestDaemon::start_with_env("faults-dump", &[("FORKD_CRIU", &criu.wrapper)]);
    let sb = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "shell": "i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done" }
    }));
    d.wait_for(&sb.id, "cat /tmp/n", "");
    std::fs::write(&criu.hang, b"").unwrap();
    let dumper = d.call_in_background::<CheckpointInfo>(
        "POST",
        format!("/v1/sandboxes/{}/checkpoint", sb.id),
        serde_json::json!({ "live": true }),
    );
    let daemon_pid = d.child.as_ref().unwrap().id();
    let mut hung = Vec::new();
    assert!(
        wait_until(Duration::from_secs(20), || {
            hung = children_running(daemon_pid, "sleep 600");
            !hung.is_empty()
        }),
        "CRIU never started"
    );
    assert!(
        dirs(&d, "checkpoints")
            .iter()
            .any(|n| n.starts_with(".stage-")),
        "the checkpoint is staged"
    );
    d.kill9();
    assert!(dumper.join().unwrap().is_err());
    assert!(
        wait_until(Duration::from_secs(10), || hung
            .iter()
            .all(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())),
        "CRIU outlived the daemon: {hung:?}"
    );
    std::fs::remove_file(&criu.hang).unwrap();
    d.spawn();
    let seen: BTreeSet<String> = [sb.id.clone()].into();
    let listed = consistent(&d, &seen);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].status, SandboxStatus::Running);
    let n = d.read_number(&sb.id, "/tmp/n");
    assert!(
        wait_until(Duration::from_secs(10), || d.read_number(&sb.id, "/tmp/n")
            > n),
        "the sandbox stayed frozen after the restart"
    );
    let none: Vec<CheckpointInfo> = d.client.call("GET", "/v1/checkpoints", None).unwrap();
    assert!(none.is_empty(), "{none:?}");
    let ck = d.checkpoint(&sb.id, true);
    let fork = d.fork(&ck.id, 1, false);
    let b = &fork.branches[0].id;
    assert!(d.read_number(b, "/tmp/n") >= n);
}
