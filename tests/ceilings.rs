//! The host's ceilings on how many sandboxes may run (docs/DESIGN.md, "Ten thousand
//! branches"): a fork that would pass `kernel.pid_max` is refused by name before anything
//! is made, and `GET /v1/health` shows the ceiling for a branch of the checkpoint. Alone
//! in its test binary: it lowers the host's `kernel.pid_max` for a moment (and puts it
//! back, whatever happens).

#![forbid(unsafe_code)]

mod common;

use common::*;
use std::collections::BTreeSet;

const PID_MAX: &str = "/proc/sys/kernel/pid_max";

/// Puts `kernel.pid_max` back when dropped.
struct PidMax(String);

impl Drop for PidMax {
    fn drop(&mut self) {
        let _ = std::fs::write(PID_MAX, &self.0);
    }
}

fn host_tasks() -> u64 {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap();
    l.split_whitespace()
        .nth(3)
        .unwrap()
        .split('/')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_fork_past_pid_max_is_refused_by_name_and_makes_nothing() {
    let name = "a_fork_past_pid_max_is_refused_by_name_and_makes_nothing";
    if !can_run_criu(name) {
        return;
    }
    let d = TestDaemon::start("ceilings");
    let src = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "shell": "while :; do read -t 10 x; done" }
    }));
    let ck = d.checkpoint(&src.id, true);
    let before = d.fork(&ck.id, 1, false).branches[0].id.clone();

    let guard = PidMax(std::fs::read_to_string(PID_MAX).unwrap().trim().to_string());
    // Room for about 100 more tasks past what the daemon keeps for the host (1,024).
    let low = host_tasks() + 1024 + 100;
    std::fs::write(PID_MAX, low.to_string()).unwrap();
    let health: forkd::api::Health = d
        .client
        .call("GET", &format!("/v1/health?checkpoint={}", ck.id), None)
        .unwrap();
    let refused = d.client.call::<forkd::api::ForkResult>(
        "POST",
        &format!("/v1/checkpoints/{}/fork", ck.id),
        Some(&serde_json::json!({ "count": 200 })),
    );
    drop(guard);
    let ceiling = health
        .ceilings
        .iter()
        .find(|c| c.name == "kernel.pid_max")
        .expect("health lists kernel.pid_max");
    assert_eq!(ceiling.value, low);
    assert!(ceiling.per_sandbox >= 2, "{ceiling:?}");
    assert!(ceiling.allows < 200, "{ceiling:?}");
    let e = refused
        .expect_err("a fork of 200 branches past pid_max")
        .to_string();
    println!("{e}");
    assert!(
        e.contains(&format!("kernel.pid_max is {low}")) && e.contains("sysctl -w kernel.pid_max="),
        "{e}"
    );
    assert!(e.contains(&ck.id), "the error names the checkpoint: {e}");

    // Nothing was made, and what ran runs on.
    let listed: Vec<forkd::api::SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    let ids: BTreeSet<String> = listed.iter().map(|s| s.id.clone()).collect();
    assert_eq!(ids, BTreeSet::from([src.id.clone(), before.clone()]));
    let dirs: BTreeSet<String> = std::fs::read_dir(d.data().join("sandboxes"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(dirs, ids, "sandbox directories against the listing");
    assert_eq!(d.sh(&before, "echo up").1.trim(), "up");
    let after = d.fork(&ck.id, 1, false).branches[0].id.clone();
    assert_eq!(d.sh(&after, "echo up").1.trim(), "up");
}
