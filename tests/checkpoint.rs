//! Checkpoints and forks against a real daemon: filesystem and live checkpoints, branch
//! isolation, deep chains, lazy restore, failures that must leave nothing behind.

#![forbid(unsafe_code)]

mod common;

use common::*;
use forkd::api::{CheckpointInfo, SandboxInfo, SandboxStatus};
use std::time::Duration;

const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.05; done";

/// Waits until the counter of sandbox `id` is above `n`; false if it never gets there
/// (within 30 s).
fn counter_passes(d: &TestDaemon, id: &str, n: u64) -> bool {
    wait_until(Duration::from_secs(30), || {
        d.sh(id, "cat /tmp/counter 2>/dev/null")
            .1
            .trim()
            .parse::<u64>()
            .is_ok_and(|v| v > n)
    })
}

/// Waits until the counter of sandbox `id` has reached `n`: far above what a counter
/// started over would show a fraction of a second after a fork, so that a branch's value
/// tells a resumed counter from a restarted one.
fn counter_reaches(d: &TestDaemon, id: &str, n: u64) {
    assert!(
        wait_until(Duration::from_secs(60), || {
            d.sh(id, "cat /tmp/counter 2>/dev/null")
                .1
                .trim()
                .parse::<u64>()
                .is_ok_and(|v| v >= n)
        }),
        "the counter of {id} never reached {n}"
    );
}

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
        assert_eq!(b.mode, forkd::api::ForkMode::Fresh);
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
    counter_reaches(&d, &src.id, 60);
    d.sh(&src.id, "echo secret-$RANDOM > /tmp/secret");
    let secret = d.sh(&src.id, "cat /tmp/secret").1;
    // A lower bound of the checkpointed count: read before, it cannot be above it.
    let at_checkpoint = d.read_number(&src.id, "/tmp/counter");
    let c = d.checkpoint(&src.id, true);
    assert!(c.live && c.images_bytes > 0);
    // The source keeps running.
    assert!(counter_passes(&d, &src.id, at_checkpoint));
    let counter_pid = d
        .sh(&src.id, "pidof sh | tr ' ' '\\n' | sort -n | head -1")
        .1;

    let r = d.fork(&c.id, 8, false);
    assert_eq!(r.branches.len(), 8);
    let mut pids = std::collections::HashSet::new();
    for b in &r.branches {
        assert_eq!(b.mode, forkd::api::ForkMode::Eager);
        assert!(b.phases_us.contains_key("restore"), "{:?}", b.phases_us);
        // The counter resumed from (about) the checkpointed value: it started over if it
        // is far below it.
        let n = d.read_number(&b.id, "/tmp/counter");
        assert!(
            n >= at_checkpoint,
            "branch {} counter {n} < checkpoint {at_checkpoint}",
            b.id
        );
        // ... and goes on from there.
        assert!(
            counter_passes(&d, &b.id, n),
            "branch {} stopped counting",
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
    // The others' progress is the clock: once each has counted on by a few steps, the
    // stopped one would have too, had it not stopped.
    for (b, before) in r.branches[1..].iter().zip(others) {
        assert!(
            counter_passes(&d, &b.id, before + 3),
            "branch {} stopped counting",
            b.id
        );
    }
    assert_eq!(d.read_number(first, "/tmp/counter"), frozen);
    // A branch can be checkpointed and forked again.
    let c2 = d.checkpoint(&r.branches[1].id, true);
    assert_eq!(c2.parent.as_deref(), Some(c.id.as_str()));
    let r2 = d.fork(&c2.id, 1, false);
    // It resumes from the branch's count (not from zero) and goes on counting.
    let n2 = d.read_number(&r2.branches[0].id, "/tmp/counter");
    assert!(n2 >= at_checkpoint, "{n2} < {at_checkpoint}");
    assert!(counter_passes(&d, &r2.branches[0].id, n2));
    // A fresh fork of a live checkpoint: its files, a new init, none of its processes.
    let fresh: forkd::api::ForkResult = d
        .client
        .call(
            "POST",
            &format!("/v1/checkpoints/{}/fork", c.id),
            Some(&serde_json::json!({ "fresh": true })),
        )
        .unwrap();
    let f = &fresh.branches[0];
    assert_eq!(f.mode, forkd::api::ForkMode::Fresh);
    assert_eq!(d.sh(&f.id, "cat /tmp/secret").1, secret);
    // The file as the checkpoint holds it: it may be empty, if the checkpoint caught the
    // counter between truncating and writing it (nothing rewrites it here).
    let n = d.sh(&f.id, "cat /tmp/counter").1;
    // The source's progress is the clock (see above).
    let now = d.read_number(&src.id, "/tmp/counter");
    assert!(counter_passes(&d, &src.id, now + 3));
    assert_eq!(
        d.sh(&f.id, "cat /tmp/counter").1,
        n,
        "a fresh branch runs the checkpointed counter"
    );
}

#[test]
fn lazy_fork_runs_before_its_memory_is_loaded() {
    if !can_run_criu("lazy_fork_runs_before_its_memory_is_loaded") {
        return;
    }
    let d = TestDaemon::start("lazy");
    let src = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": COUNTER } }));
    counter_reaches(&d, &src.id, 60);
    let at_checkpoint = d.read_number(&src.id, "/tmp/counter");
    let c = d.checkpoint(&src.id, true);
    let r = d.fork(&c.id, 2, true);
    for b in &r.branches {
        assert_eq!(b.mode, forkd::api::ForkMode::Lazy);
        let n = d.read_number(&b.id, "/tmp/counter");
        assert!(
            n >= at_checkpoint,
            "lazy branch counter {n} < {at_checkpoint}"
        );
        assert!(
            counter_passes(&d, &b.id, n),
            "lazy branch {} stopped counting",
            b.id
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
    // Each branch's layer holds its checkpoint's files over the image's base, so a
    // checkpoint of the fiftieth generation stands on its own layer and the image's
    // (runtime and busybox): the stack does not grow with the chain.
    let c = last.unwrap();
    assert_eq!(c.layers.len(), 3, "{:?}", c.layers);
    let (_, count, _) = d.sh(&sb, "ls / | grep -c '^gen-'");
    assert_eq!(count.trim(), "50");
    assert_eq!(d.sh(&sb, "cat /latest").1, "49\n");
    assert_eq!(d.sh(&sb, "cat /gen-0").1, "0\n");
}

#[test]
fn deep_stacks_are_squashed() {
    if !can_run_criu("deep_stacks_are_squashed") {
        return;
    }
    let d = TestDaemon::start_with_env("squash", &[("FORKD_MAX_LAYERS", "5")]);
    let first =
        d.create(serde_json::json!({ "image": "busybox", "command": { "shell": COUNTER } }));
    let mut sb = first.id.clone();
    d.sh(&sb, "rm /etc/group");
    for generation in 0..8 {
        d.sh(&sb, &format!("echo {generation} > /gen-{generation}"));
        // Every other generation live, so restored processes meet squashed layers too.
        let c = d.checkpoint(&sb, generation % 2 == 1);
        assert!(
            c.layers.len() <= 5,
            "generation {generation}: {} layers",
            c.layers.len()
        );
        sb = d.fork(&c.id, 1, false).branches[0].id.clone();
    }
    assert_eq!(d.sh(&sb, "ls / | grep -c '^gen-'").1.trim(), "8");
    assert_ne!(
        d.sh(&sb, "test -e /etc/group").0,
        0,
        "a deletion was lost by squashing"
    );
    assert!(d.read_number(&sb, "/tmp/counter") > 0);
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
    assert!(
        counter_passes(&d, &src.id, n),
        "the sandbox stopped counting"
    );
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

/// Rewrites an archive entry by entry: `edit` may change a (name, data) pair, drop it
/// (None) or the caller may append extra entries.
fn rewrite_archive(
    src: &std::path::Path,
    dest: &std::path::Path,
    mut edit: impl FnMut(&str, Vec<u8>) -> Option<(String, Vec<u8>)>,
    extra: Vec<(String, Vec<u8>)>,
) {
    use std::io::Read;
    let mut a = tar::Archive::new(zstd::Decoder::new(std::fs::File::open(src).unwrap()).unwrap());
    let mut b = tar::Builder::new(Vec::new());
    let put = |b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o600);
        h.set_entry_type(tar::EntryType::Regular);
        // Set the name raw, so that names like "../x" go through unchanged.
        let bytes = name.as_bytes();
        h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
        h.set_cksum();
        b.append(&h, data).unwrap();
    };
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().display().to_string();
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        if let Some((n, d)) = edit(&name, data) {
            put(&mut b, &n, &d);
        }
    }
    for (n, d) in extra {
        put(&mut b, &n, &d);
    }
    let tar = b.into_inner().unwrap();
    std::fs::write(dest, zstd::encode_all(&tar[..], 3).unwrap()).unwrap();
}

#[test]
fn archives_round_trip_and_tampering_is_rejected() {
    if !can_run_criu("archives_round_trip_and_tampering_is_rejected") {
        return;
    }
    let d = TestDaemon::start("archive");
    let import = |path: &std::path::Path| {
        d.client.call::<CheckpointInfo>(
            "POST",
            "/v1/checkpoints/import",
            Some(&serde_json::json!({ "path": path })),
        )
    };
    let checkpoints = || {
        d.client
            .call::<Vec<CheckpointInfo>>("GET", "/v1/checkpoints", None)
            .unwrap()
            .len()
    };
    let src = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": COUNTER } }));
    counter_reaches(&d, &src.id, 60);
    d.sh(&src.id, "echo kept > /etc/state; rm /etc/group");
    let at_checkpoint = d.read_number(&src.id, "/tmp/counter");
    let c = d.checkpoint(&src.id, true);
    let work = d.root.parent().unwrap().join("archives");
    std::fs::create_dir_all(&work).unwrap();
    let file = work.join("ck.forkd");
    let out = d.cli(&["checkpoint", "export", &c.id, file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let original: CheckpointInfo = d
        .client
        .call("GET", &format!("/v1/checkpoints/{}", c.id), None)
        .unwrap();
    // Import: the same tree hash, and branches resume the processes.
    let out = d.cli(&["checkpoint", "import", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let imported_id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let imported: CheckpointInfo = d
        .client
        .call("GET", &format!("/v1/checkpoints/{imported_id}"), None)
        .unwrap();
    assert_eq!(imported.tree_hash, original.tree_hash);
    assert!(imported.tree_hash.is_some());
    let r = d.fork(&imported_id, 2, false);
    for b in &r.branches {
        assert_eq!(d.sh(&b.id, "cat /etc/state").1, "kept\n");
        assert_ne!(d.sh(&b.id, "test -e /etc/group").0, 0);
        let n = d.read_number(&b.id, "/tmp/counter");
        assert!(
            n >= at_checkpoint,
            "imported branch counter {n} < {at_checkpoint}"
        );
        assert!(
            counter_passes(&d, &b.id, n),
            "imported branch {} stopped counting",
            b.id
        );
    }

    // Tampered archives are rejected, naming the problem, and leave nothing behind.
    let checkpoints_before = checkpoints();
    let layers_before = std::fs::read_dir(d.data().join("layers")).unwrap().count();
    let bad = work.join("bad.forkd");
    let cases: Vec<(
        &str,
        Box<dyn Fn(&str, Vec<u8>) -> Option<(String, Vec<u8>)>>,
        Vec<(String, Vec<u8>)>,
    )> = vec![
        (
            "does not match its SHA-256",
            Box::new(|n: &str, mut data: Vec<u8>| {
                if n == "criu/pstree.img" {
                    data[0] ^= 1;
                }
                Some((n.to_string(), data))
            }),
            vec![],
        ),
        (
            "is missing",
            Box::new(|n: &str, data| (n != "criu/pstree.img").then(|| (n.to_string(), data))),
            vec![],
        ),
        (
            "is not in the manifest",
            Box::new(|n: &str, data| Some((n.to_string(), data))),
            vec![("criu/extra.img".into(), b"x".to_vec())],
        ),
        (
            "unexpected entry",
            Box::new(|n: &str, data| Some((n.to_string(), data))),
            vec![("../escape".into(), b"x".to_vec())],
        ),
        (
            "tree hash",
            // A layer changed consistently (manifest updated too) still fails its tree hash.
            Box::new(|n: &str, data: Vec<u8>| Some((n.to_string(), data))),
            vec![],
        ),
    ];
    for (i, (expect, edit, extra)) in cases.into_iter().enumerate() {
        if expect == "tree hash" {
            // Replace layer 0 by layer 1 and fix the manifest's SHA-256 accordingly.
            let mut layer1 = Vec::new();
            rewrite_archive(
                &file,
                &work.join("scratch"),
                |n, d| {
                    if n == "layers/1.tar" {
                        layer1 = d.clone();
                    }
                    Some((n.into(), d))
                },
                vec![],
            );
            let sum: String = {
                use sha2::Digest;
                sha2::Sha256::digest(&layer1)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect()
            };
            rewrite_archive(
                &file,
                &bad,
                |n, d| {
                    if n == "layers/0.tar" {
                        return Some((n.into(), layer1.clone()));
                    }
                    if n == "manifest.json" {
                        let mut m: serde_json::Value = serde_json::from_slice(&d).unwrap();
                        m["files"]["layers/0.tar"]["sha256"] = sum.clone().into();
                        m["files"]["layers/0.tar"]["size"] = layer1.len().into();
                        return Some((n.into(), serde_json::to_vec(&m).unwrap()));
                    }
                    Some((n.into(), d))
                },
                vec![],
            );
        } else {
            rewrite_archive(&file, &bad, edit, extra);
        }
        let err = import(&bad).unwrap_err().to_string();
        assert!(
            err.contains(expect),
            "case {i}: expected {expect:?} in {err}"
        );
        assert!(!work.parent().unwrap().join("escape").exists());
        assert_eq!(checkpoints(), checkpoints_before);
        assert_eq!(
            std::fs::read_dir(d.data().join("layers")).unwrap().count(),
            layers_before,
            "case {i} left a layer"
        );
        let stages = std::fs::read_dir(d.data().join("checkpoints"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .count();
        assert_eq!(stages, 0, "case {i} left a stage");
    }
    // A corrupted compressed stream is refused too.
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&bad, &bytes).unwrap();
    assert!(import(&bad).is_err());
    // gc removes nothing that is still used, and the checkpoints still fork.
    let _: serde_json::Value = d
        .client
        .call("POST", "/v1/gc", Some(&serde_json::json!({})))
        .unwrap();
    let r = d.fork(&c.id, 1, false);
    assert_eq!(d.sh(&r.branches[0].id, "cat /etc/state").1, "kept\n");

    // A thin archive names the store's layers (the image's, the runtime's) instead of
    // writing them: smaller, and whole again on a daemon that holds them.
    let thin = work.join("thin.forkd");
    let out = d.cli(&[
        "checkpoint",
        "export",
        "--thin",
        &c.id,
        thin.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (full_len, thin_len) = (
        std::fs::metadata(&file).unwrap().len(),
        std::fs::metadata(&thin).unwrap().len(),
    );
    assert!(
        thin_len < full_len,
        "thin {thin_len} bytes, whole {full_len}"
    );
    let (mut named, mut layers_total, mut layer_files) = (Vec::new(), 0, 0);
    rewrite_archive(
        &thin,
        &work.join("scratch"),
        |n, data| {
            if n == "manifest.json" {
                let m: serde_json::Value = serde_json::from_slice(&data).unwrap();
                for l in m["layers"].as_array().unwrap() {
                    layers_total += 1;
                    if l.get("file").is_none() {
                        named.push(l["tree_hash"].as_str().unwrap().to_string());
                    }
                }
            } else if n.starts_with("layers/") {
                layer_files += 1;
            }
            Some((n.into(), data))
        },
        vec![],
    );
    assert!(
        !named.is_empty(),
        "the image's layers are named, not written"
    );
    assert_eq!(
        layer_files + named.len(),
        layers_total,
        "the others are written"
    );
    let imported = import(&thin).unwrap();
    assert_eq!(imported.tree_hash, original.tree_hash);
    let r = d.fork(&imported.id, 1, false);
    assert_eq!(d.sh(&r.branches[0].id, "cat /etc/state").1, "kept\n");
    let n = d.read_number(&r.branches[0].id, "/tmp/counter");
    assert!(
        n >= at_checkpoint,
        "thin import's branch counter {n} < {at_checkpoint}"
    );
    // Naming a layer this daemon lacks: refused (409) and named, nothing added.
    let checkpoints_before = checkpoints();
    let missing = "ab".repeat(32);
    rewrite_archive(
        &thin,
        &bad,
        |n, data| {
            if n != "manifest.json" {
                return Some((n.into(), data));
            }
            let mut m: serde_json::Value = serde_json::from_slice(&data).unwrap();
            for l in m["layers"].as_array_mut().unwrap() {
                if l.get("file").is_none() {
                    l["tree_hash"] = missing.clone().into();
                }
            }
            Some((n.into(), serde_json::to_vec(&m).unwrap()))
        },
        vec![],
    );
    let err = import(&bad).unwrap_err();
    match err {
        forkd::client::ClientError::Api(e) => {
            assert_eq!(e.kind, forkd::api::ErrorKind::Conflict, "{}", e.message);
            assert!(e.message.contains(&missing), "{}", e.message);
        }
        e => panic!("expected a conflict, got {e}"),
    }
    assert_eq!(checkpoints(), checkpoints_before);
}

/// An exec is complete only once its relay inside the sandbox is gone: a live checkpoint
/// sent the moment an exec (or a detached exec) returns must not meet the relay still
/// holding its connection to the host, which CRIU cannot dump.
#[test]
fn live_checkpoint_right_after_an_exec() {
    if !can_run_criu("live_checkpoint_right_after_an_exec") {
        return;
    }
    let d = TestDaemon::start("afterexec");
    let src = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": COUNTER } }));
    for round in 0..30 {
        if round % 2 == 0 {
            assert_eq!(d.sh(&src.id, "echo x > /tmp/x").0, 0);
        } else {
            d.exec(
                &src.id,
                serde_json::json!({ "argv": ["sleep", "1000"], "detach": true }),
            )
            .expect("detached exec");
        }
        let c = d.checkpoint(&src.id, true);
        d.cli(&["checkpoint", "rm", &c.id]);
    }
    // Right after a sandbox is made, and right after a branch is forked: the daemon's
    // own connections to the new init (the readiness check, the command's start) must
    // be gone too.
    for _ in 0..10 {
        let sb =
            d.create(serde_json::json!({ "image": "busybox", "command": { "shell": COUNTER } }));
        let c = d.checkpoint(&sb.id, true);
        let branch = d.fork(&c.id, 1, false).branches[0].id.clone();
        let c2 = d.checkpoint(&branch, true);
        d.remove(&branch);
        d.remove(&sb.id);
        d.cli(&["checkpoint", "rm", &c2.id]);
        d.cli(&["checkpoint", "rm", &c.id]);
    }
}

/// The daemon has CRIU probe the kernel at start-up, into its private `/run`, so that the
/// first live checkpoint or fork does not pay for the probe.
#[test]
fn criu_kernel_facts_are_cached_at_start() {
    if !can_run_criu("criu_kernel_facts_are_cached_at_start") {
        return;
    }
    let d = TestDaemon::start("kdat");
    let kdat = d.root.join("criu-run/criu.kdat");
    let t = std::time::Instant::now();
    while !kdat.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{} not written within 10 s of start, with no CRIU request made",
            kdat.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads frames until a `Started` one; its pid.
fn started_pid(s: &mut std::os::unix::net::UnixStream) -> i32 {
    use forkd_sandbox::proto::{read_frame, ExecStarted, Kind};
    loop {
        match read_frame(s).unwrap() {
            Some((Kind::Started, body)) => {
                return serde_json::from_slice::<ExecStarted>(&body).unwrap().pid
            }
            Some((Kind::Error, body)) => panic!("error frame: {}", String::from_utf8_lossy(&body)),
            Some(_) => {}
            None => panic!("the stream ended before Started"),
        }
    }
}

/// The next stdout frame's text.
fn next_output(s: &mut std::os::unix::net::UnixStream) -> String {
    use forkd_sandbox::proto::{read_frame, Kind};
    loop {
        match read_frame(s).unwrap() {
            Some((Kind::Stdout, body)) => return String::from_utf8(body).unwrap(),
            Some((Kind::Exit | Kind::Error, body)) => {
                panic!("ended: {}", String::from_utf8_lossy(&body))
            }
            Some(_) => {}
            None => panic!("the stream ended"),
        }
    }
}

/// A kept command outlives its client, takes the next one that attaches by its pid, and
/// (with no client attached) goes with its sandbox into a live checkpoint: in a branch
/// it runs on with its state, and a client attaches to it there.
#[test]
fn kept_commands_outlive_their_clients_and_their_checkpoints() {
    use forkd_sandbox::proto::{write_frame, ExecRequest, Kind};
    if !can_run_criu("kept_commands_outlive_their_clients_and_their_checkpoints") {
        return;
    }
    let d = TestDaemon::start("kept");
    let sb = d.busybox();
    let kept = ExecRequest {
        shell: Some("i=0; while read line; do i=$((i+1)); echo $i:$line; done".into()),
        stdin: true,
        keep: true,
        ..Default::default()
    };
    let mut s = d.client.exec_stream(&sb.id, &kept).unwrap();
    let pid = started_pid(&mut s);
    write_frame(&mut s, Kind::Stdin, b"a\n").unwrap();
    assert_eq!(next_output(&mut s), "1:a\n");
    drop(s);
    // Gone client, live command; a second client takes it over, state and all.
    let attach = ExecRequest {
        attach: Some(pid),
        ..Default::default()
    };
    let mut s = d.client.exec_stream(&sb.id, &attach).unwrap();
    assert_eq!(started_pid(&mut s), pid);
    write_frame(&mut s, Kind::Stdin, b"b\n").unwrap();
    assert_eq!(next_output(&mut s), "2:b\n");
    // A third client replaces the second, which sees its stream end.
    let mut third = d.client.exec_stream(&sb.id, &attach).unwrap();
    assert_eq!(started_pid(&mut third), pid);
    assert!(
        forkd_sandbox::proto::read_frame(&mut s)
            .map(|f| f.is_none())
            .unwrap_or(true),
        "the replaced client's stream ends"
    );
    drop(s);
    drop(third);
    // With no client, the sandbox checkpoints live; its branch runs the command on.
    let mut ck = None;
    for _ in 0..50 {
        match d.client.call::<CheckpointInfo>(
            "POST",
            &format!("/v1/sandboxes/{}/checkpoint", sb.id),
            Some(&serde_json::json!({ "live": true })),
        ) {
            Ok(c) => {
                ck = Some(c);
                break;
            }
            // The daemon counts a session until the relay's side closes.
            Err(e) if e.to_string().contains("exec session") => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("checkpoint: {e}"),
        }
    }
    let ck = ck.expect("the checkpoint waited for the sessions to close");
    let fork = d.fork(&ck.id, 1, false);
    let branch = &fork.branches[0].id;
    let mut s = d.client.exec_stream(branch, &attach).unwrap();
    assert_eq!(started_pid(&mut s), pid, "the same pid in the branch");
    write_frame(&mut s, Kind::Stdin, b"c\n").unwrap();
    assert_eq!(
        next_output(&mut s),
        "3:c\n",
        "the branch's command kept its count"
    );
    write_frame(&mut s, Kind::StdinEof, b"").unwrap();
    // A pid that is not a kept command's is refused by name.
    let mut s = d
        .client
        .exec_stream(
            branch,
            &ExecRequest {
                attach: Some(1),
                ..Default::default()
            },
        )
        .unwrap();
    match forkd_sandbox::proto::read_frame(&mut s).unwrap() {
        Some((Kind::Error, body)) => {
            let m = String::from_utf8_lossy(&body).into_owned();
            assert!(m.contains("no kept command with pid 1"), "{m}");
        }
        other => panic!("expected an error frame, got {other:?}"),
    }
    // The source sandbox's command runs on too, for a client that attaches there.
    let mut s = d.client.exec_stream(&sb.id, &attach).unwrap();
    assert_eq!(started_pid(&mut s), pid);
    write_frame(&mut s, Kind::Stdin, b"d\n").unwrap();
    assert_eq!(next_output(&mut s), "3:d\n");
}

/// A pause: a live checkpoint that stops the sandbox.
fn pause(d: &TestDaemon, id: &str) -> CheckpointInfo {
    d.client
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/checkpoint"),
            Some(&serde_json::json!({ "live": true, "stop": true })),
        )
        .unwrap()
}

/// A pause (a live checkpoint that stops the sandbox) and a resume: the same sandbox,
/// under its id, labels and all, running its processes on from their state; refused,
/// leaving it as it was, when the sandbox runs or the checkpoint is another's.
#[test]
fn a_paused_sandbox_resumes_under_its_id() {
    if !can_run_criu("a_paused_sandbox_resumes_under_its_id") {
        return;
    }
    let d = TestDaemon::start("resume");
    let src = d.create(serde_json::json!({
        "image": "busybox",
        "labels": { "who": "resume" },
        "command": { "shell": COUNTER },
    }));
    counter_reaches(&d, &src.id, 40);
    let other = d.create(serde_json::json!({ "image": "busybox" }));
    let foreign = d.checkpoint(&other.id, true);
    // Resuming a running sandbox is refused.
    let running = d
        .client
        .call::<SandboxInfo>(
            "POST",
            &format!("/v1/sandboxes/{}/resume", src.id),
            Some(&serde_json::json!({})),
        )
        .unwrap_err()
        .to_string();
    assert!(
        running.contains("no live checkpoint") || running.contains("only a stopped"),
        "{running}"
    );
    let paused = pause(&d, &src.id);
    let stopped: SandboxInfo = d
        .client
        .call("GET", &format!("/v1/sandboxes/{}", src.id), None)
        .unwrap();
    assert_eq!(stopped.status, SandboxStatus::Stopped);
    let at_pause = {
        let dir = std::path::Path::new(&stopped.upper).join("tmp/counter");
        std::fs::read_to_string(&dir)
            .unwrap_or_default()
            .trim()
            .parse::<u64>()
            .unwrap_or(40)
    };
    // Another sandbox's checkpoint is not this one's to resume from.
    let wrong = d
        .client
        .call::<SandboxInfo>(
            "POST",
            &format!("/v1/sandboxes/{}/resume", src.id),
            Some(&serde_json::json!({ "checkpoint": foreign.id })),
        )
        .unwrap_err()
        .to_string();
    assert!(
        wrong.contains("not a live checkpoint of sandbox"),
        "{wrong}"
    );
    let still: SandboxInfo = d
        .client
        .call("GET", &format!("/v1/sandboxes/{}", src.id), None)
        .unwrap();
    assert_eq!(
        still.status,
        SandboxStatus::Stopped,
        "a refused resume leaves it stopped"
    );
    let resumed: SandboxInfo = d
        .client
        .call(
            "POST",
            &format!("/v1/sandboxes/{}/resume", src.id),
            Some(&serde_json::json!({ "expires_in_secs": 3600 })),
        )
        .unwrap();
    assert_eq!(resumed.id, src.id);
    assert_eq!(resumed.status, SandboxStatus::Running);
    assert_eq!(
        resumed.labels.get("who").map(String::as_str),
        Some("resume")
    );
    assert!(resumed.expires_at.is_some());
    let n = d.read_number(&src.id, "/tmp/counter");
    assert!(
        n >= at_pause,
        "the counter went on from {at_pause}, not from 0: {n}"
    );
    assert!(counter_passes(&d, &src.id, n), "it counts on");
    // Paused and resumed again, from the newest pause.
    pause(&d, &src.id);
    let again: SandboxInfo = d
        .client
        .call(
            "POST",
            &format!("/v1/sandboxes/{}/resume", src.id),
            Some(&serde_json::json!({})),
        )
        .unwrap();
    assert_eq!(again.status, SandboxStatus::Running);
    assert!(d.read_number(&src.id, "/tmp/counter") >= n);
    let _ = paused;
    let listed: Vec<SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    assert_eq!(listed.iter().filter(|s| s.id == src.id).count(), 1);
    assert!(!std::path::Path::new(&format!(
        "{}.resuming",
        d.data().join("sandboxes").join(&src.id).display()
    ))
    .exists());
}
