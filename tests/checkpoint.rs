//! Checkpoints and forks against a real daemon: filesystem and live checkpoints, branch
//! isolation, deep chains, lazy restore, failures that must leave nothing behind.

mod common;

use common::*;
use forkd::api::{CheckpointInfo, SandboxInfo, SandboxStatus};
use std::time::Duration;

const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.05; done";

#[test]
fn filesystem_checkpoint_forks_isolated_branches() {
    if !can_run("filesystem_checkpoint_forks_isolated_branches") {
        return;
    }
    let d = TestDaemon::start("fsckpt");
    let src = d.busybox();
    d.sh(&src.id, "echo before > /etc/state; rm /etc/group; mkdir -p /data && head -c 100000 /dev/urandom > /data/blob");
    let c = d.checkpoint(&src.id, false);
    assert!(!c.live);
    assert_eq!(c.layers.len(), 3, "{:?}", c.layers);
    // The source goes on, and its later writes are not in the checkpoint.
    d.sh(&src.id, "echo after > /etc/state");
    let r = d.fork(&c.id, 8, false);
    assert_eq!(r.branches.len(), 8);
    let blob = d.sh(&src.id, "md5sum /data/blob").1;
    for (i, b) in r.branches.iter().enumerate() {
        assert_eq!(b.mode, "fresh");
        assert_eq!(d.sh(&b.id, "cat /etc/state").1, "before\n");
        assert_ne!(
            d.sh(&b.id, "test -e /etc/group").0,
            0,
            "a deletion before the checkpoint came back"
        );
        assert_eq!(d.sh(&b.id, "md5sum /data/blob").1, blob);
        d.sh(
            &b.id,
            &format!("echo branch{i} > /etc/state; echo {i} > /tmp/own"),
        );
    }
    // Every branch sees only its own writes; the source and the checkpoint are untouched.
    for (i, b) in r.branches.iter().enumerate() {
        assert_eq!(d.sh(&b.id, "cat /etc/state").1, format!("branch{i}\n"));
        assert_eq!(d.sh(&b.id, "cat /tmp/own").1, format!("{i}\n"));
    }
    assert_eq!(d.sh(&src.id, "cat /etc/state").1, "after\n");
    assert_ne!(d.sh(&src.id, "test -e /tmp/own").0, 0);
    let again = d.fork(&c.id, 1, false);
    assert_eq!(d.sh(&again.branches[0].id, "cat /etc/state").1, "before\n");
    // The tree hash appears once computed, and is the same for an identical checkpoint.
    let mut info: CheckpointInfo = d
        .client
        .call("GET", &format!("/v1/checkpoints/{}", c.id), None)
        .unwrap();
    for _ in 0..200 {
        if info.tree_hash.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
        info = d
            .client
            .call("GET", &format!("/v1/checkpoints/{}", c.id), None)
            .unwrap();
    }
    assert_eq!(info.tree_hash.as_ref().map(String::len), Some(64));
    assert_eq!(info.branches.len(), 9);
}

#[test]
fn live_checkpoint_resumes_processes_in_every_branch() {
    if !can_run_criu("live_checkpoint_resumes_processes_in_every_branch") {
        return;
    }
    let d = TestDaemon::start("liveckpt");
    let src = d.create(serde_json::json!({ "image": "busybox", "hostname": "origin", "command": { "shell": COUNTER } }));
    std::thread::sleep(Duration::from_millis(300));
    d.sh(&src.id, "echo secret-$RANDOM > /tmp/secret");
    let secret = d.sh(&src.id, "cat /tmp/secret").1;
    let c = d.checkpoint(&src.id, true);
    assert!(c.live && c.images_bytes > 0);
    let at_checkpoint = d.read_number(&src.id, "/tmp/counter");
    // The source keeps running.
    std::thread::sleep(Duration::from_millis(200));
    assert!(d.read_number(&src.id, "/tmp/counter") > at_checkpoint);
    let counter_pid = d
        .sh(&src.id, "pidof sh | tr ' ' '\\n' | sort -n | head -1")
        .1;

    let r = d.fork(&c.id, 8, false);
    assert_eq!(r.branches.len(), 8);
    std::thread::sleep(Duration::from_millis(300));
    let mut pids = std::collections::HashSet::new();
    for b in &r.branches {
        assert_eq!(b.mode, "eager");
        assert!(b.phases_us.contains_key("restore"), "{:?}", b.phases_us);
        // The counter resumed from (about) the checkpointed value: it started over if it
        // is far below it.
        let n = d.read_number(&b.id, "/tmp/counter");
        assert!(
            n + 2 >= at_checkpoint,
            "branch {} counter {n} < checkpoint {at_checkpoint}",
            b.id
        );
        assert_eq!(d.sh(&b.id, "cat /tmp/secret").1, secret);
        // Same pids inside (own pid namespace), its own host pid for the init.
        assert_eq!(
            d.sh(&b.id, "pidof sh | tr ' ' '\\n' | sort -n | head -1").1,
            counter_pid
        );
        assert_eq!(
            d.sh(&b.id, "cat /proc/1/cmdline | tr '\\0' ' '").1.trim(),
            "forkd-init __init"
        );
        assert!(pids.insert(b.init_pid.unwrap()));
        let info: SandboxInfo = d
            .client
            .call("GET", &format!("/v1/sandboxes/{}", b.id), None)
            .unwrap();
        assert_eq!(info.hostname, "origin");
        assert!(cgroup_exists(&b.id));
    }
    // Branches diverge: stopping the counter in one leaves the others counting.
    let first = &r.branches[0].id;
    d.sh(first, "kill $(pidof sh | tr ' ' '\\n' | sort -n | head -1)");
    let frozen = d.read_number(first, "/tmp/counter");
    let others: Vec<u64> = r.branches[1..]
        .iter()
        .map(|b| d.read_number(&b.id, "/tmp/counter"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(d.read_number(first, "/tmp/counter"), frozen);
    for (b, before) in r.branches[1..].iter().zip(others) {
        assert!(
            d.read_number(&b.id, "/tmp/counter") > before,
            "branch {} stopped counting",
            b.id
        );
    }
    // A branch can be checkpointed and forked again.
    let c2 = d.checkpoint(&r.branches[1].id, true);
    assert_eq!(c2.parent.as_deref(), Some(c.id.as_str()));
    let r2 = d.fork(&c2.id, 1, false);
    std::thread::sleep(Duration::from_millis(200));
    assert!(d.read_number(&r2.branches[0].id, "/tmp/counter") > 0);
}

#[test]
fn lazy_fork_runs_before_its_memory_is_loaded() {
    if !can_run_criu("lazy_fork_runs_before_its_memory_is_loaded") {
        return;
    }
    let d = TestDaemon::start("lazy");
    let src = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": COUNTER } }));
    std::thread::sleep(Duration::from_millis(300));
    let c = d.checkpoint(&src.id, true);
    let at_checkpoint = d.read_number(&src.id, "/tmp/counter");
    let r = d.fork(&c.id, 2, true);
    std::thread::sleep(Duration::from_millis(300));
    for b in &r.branches {
        assert_eq!(b.mode, "lazy");
        let n = d.read_number(&b.id, "/tmp/counter");
        assert!(
            n + 2 >= at_checkpoint,
            "lazy branch counter {n} < {at_checkpoint}"
        );
    }
}

#[test]
fn chains_of_fifty_generations() {
    if !can_run("chains_of_fifty_generations") {
        return;
    }
    let d = TestDaemon::start("chain");
    let mut sb = d.busybox().id;
    let mut last = None;
    for generation in 0..50 {
        d.sh(
            &sb,
            &format!("echo {generation} > /gen-{generation}; echo {generation} > /latest"),
        );
        let c = d.checkpoint(&sb, false);
        let r = d.fork(&c.id, 1, false);
        sb = r.branches[0].id.clone();
        last = Some(c);
    }
    let c = last.unwrap();
    assert!(c.layers.len() >= 50, "{} layers", c.layers.len());
    let (_, count, _) = d.sh(&sb, "ls / | grep -c '^gen-'");
    assert_eq!(count.trim(), "50");
    assert_eq!(d.sh(&sb, "cat /latest").1, "49\n");
    assert_eq!(d.sh(&sb, "cat /gen-0").1, "0\n");
}

#[test]
fn failed_live_checkpoint_leaves_the_sandbox_running_and_nothing_behind() {
    if !can_run_criu("failed_live_checkpoint_leaves_the_sandbox_running_and_nothing_behind") {
        return;
    }
    let d = TestDaemon::start("ckptfail");
    let src = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": COUNTER } }));
    // A process whose socket's peer is outside the sandbox: CRIU cannot dump it. (Here,
    // an exec session opened straight on the init's socket, bypassing the daemon.)
    let rootfs = std::path::PathBuf::from(&src.rootfs);
    let req = forkd_sandbox::proto::ExecRequest {
        argv: vec!["sleep".into(), "30".into()],
        ..Default::default()
    };
    let (conn, _) = forkd_sandbox::host::start_exec(&rootfs, &req).unwrap();
    let err = d
        .client
        .call::<CheckpointInfo>(
            "POST",
            &format!("/v1/sandboxes/{}/checkpoint", src.id),
            Some(&serde_json::json!({"live": true})),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("criu dump failed"), "{err}");
    assert!(err.contains("log kept at"), "{err}");
    let log = err
        .split("log kept at ")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap();
    assert!(std::path::Path::new(log).exists(), "{log}");
    drop(conn);
    // Nothing half-made, and the sandbox goes on.
    let list: Vec<CheckpointInfo> = d.client.call("GET", "/v1/checkpoints", None).unwrap();
    assert!(list.is_empty());
    let stages: Vec<_> = std::fs::read_dir(d.data().join("checkpoints"))
        .unwrap()
        .flatten()
        .collect();
    assert!(
        stages.is_empty(),
        "{:?}",
        stages.iter().map(|e| e.path()).collect::<Vec<_>>()
    );
    let n = d.read_number(&src.id, "/tmp/counter");
    std::thread::sleep(Duration::from_millis(200));
    assert!(d.read_number(&src.id, "/tmp/counter") > n);
    // A live checkpoint of a stopped sandbox is refused clearly.
    let _: SandboxInfo = d
        .client
        .call(
            "POST",
            &format!("/v1/sandboxes/{}/stop", src.id),
            Some(&serde_json::json!({})),
        )
        .unwrap();
    let err = d
        .client
        .call::<CheckpointInfo>(
            "POST",
            &format!("/v1/sandboxes/{}/checkpoint", src.id),
            Some(&serde_json::json!({"live": true})),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("stopped"), "{err}");
}

#[test]
fn checkpoint_removal_is_refused_while_branches_need_it() {
    if !can_run("checkpoint_removal_is_refused_while_branches_need_it") {
        return;
    }
    let mut d = TestDaemon::start("ckptrm");
    let src = d.busybox();
    let c = d.checkpoint(&src.id, false);
    let r = d.fork(&c.id, 2, false);
    let err = d
        .client
        .call::<serde_json::Value>("DELETE", &format!("/v1/checkpoints/{}", c.id), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("still needed") && err.contains(&r.branches[0].id),
        "{err}"
    );
    // Checkpoints and branches survive a daemon restart.
    d.kill9();
    d.spawn();
    let list: Vec<CheckpointInfo> = d.client.call("GET", "/v1/checkpoints", None).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].branches.len(), 2);
    let _: serde_json::Value = d
        .client
        .call(
            "DELETE",
            &format!("/v1/checkpoints/{}?force=true", c.id),
            None,
        )
        .unwrap();
    let sbs: Vec<SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    assert_eq!(sbs.len(), 1);
    assert_eq!(sbs[0].status, SandboxStatus::Running);
    assert!(!d.data().join("checkpoints").join(&c.id).exists());
}
