//! Faults injected into a running daemon: `kill -9` in the middle of creates, of a fork
//! of 20 branches, of a live checkpoint and of an archive import; CRIU killed in the
//! middle of the restores of a fork of 8; `kill -9` of the daemon during an evaluator run,
//! which `forkd eval resume` then completes with the rows a run without the fault gives;
//! the state volume filled to its last MiB during a live checkpoint and an import, and
//! while forks of a live checkpoint's template run. After a restart (or the failed request) the
//! listings are consistent with what is on disk and in the kernel, nothing is left behind
//! (mounts, cgroups, sandbox directories and their subvolumes, checkpoint and layer
//! stages, processes, CRIU, nftables chains), and the next request works.

#![forbid(unsafe_code)]

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
    // Processes: of this build's forkd, only the daemon runs (no set-up helper of a
    // half-made sandbox), and no CRIU outlives the request that started it.
    let daemon = d.pid().map(|p| p as i32);
    let bin = std::fs::canonicalize(BIN).unwrap();
    let root = format!("FORKD_ROOT={}", d.root.display());
    for pid in pids() {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        let ours = std::fs::read(format!("/proc/{pid}/environ"))
            .unwrap_or_default()
            .split(|&b| b == 0)
            .any(|v| v == root.as_bytes());
        if exe.as_deref() == Some(bin.as_path()) && ours && Some(pid) != daemon {
            let text = String::from_utf8_lossy(&cmd).replace('\0', " ");
            panic!("process {pid} ({text}) of this daemon's state root is left");
        }
        if daemon.is_some() && parent_of(pid) == daemon {
            // CRIU itself (`swrk`), or a helper a restore forked (`criu: restore ...`).
            assert!(
                !cmd.split(|&b| b == 0).any(|p| p == b"swrk") && !cmd.starts_with(b"criu"),
                "a CRIU ({pid}, {}) is left",
                String::from_utf8_lossy(&cmd)
            );
        }
    }
    // nftables: the daemon's table holds one chain per listed sandbox with egress, and
    // none when no sandbox has it (the table goes with the last one).
    let egress = listed.iter().filter(|s| s.network.is_some()).count();
    let chains = nft_table(d)
        .map(|t| {
            t.lines()
                .filter(|l| l.trim_start().starts_with("chain sb_"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(
        chains, egress,
        "sandbox chains in the daemon's nftables table"
    );
    listed
}

fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .collect()
}

fn parent_of(pid: i32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The text of the daemon's nftables table (`inet forkd_<tag>`, the tag from its data
/// directory), if it has one.
fn nft_table(d: &TestDaemon) -> Option<String> {
    use sha2::Digest;
    let tag: String = sha2::Sha256::digest(d.data().as_os_str().as_encoded_bytes())
        .iter()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect();
    let nft = common::nft().ok()?;
    let out = std::process::Command::new(nft)
        .args(["list", "table", "inet", &format!("forkd_{tag}")])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The children of `parent`: each pid with its command line's words.
fn children_of(parent: i32) -> Vec<(i32, Vec<String>)> {
    pids()
        .into_iter()
        .filter(|&pid| parent_of(pid) == Some(parent))
        .map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let words = cmd
                .split(|&b| b == 0)
                .filter(|p| !p.is_empty())
                .map(|p| String::from_utf8_lossy(p).to_string())
                .collect();
            (pid, words)
        })
        .collect()
}

/// Pids of the processes whose parent is `parent` and whose command line is `argv`.
fn children_running(parent: u32, argv: &str) -> Vec<i32> {
    children_of(parent as i32)
        .into_iter()
        .filter(|(_, words)| words.join(" ") == argv)
        .map(|(pid, _)| pid)
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
    let daemon_pid = d.pid().unwrap();
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

/// Processes whose parent is `parent` and whose command line has the word `word`.
fn children_with(parent: u32, word: &str) -> Vec<i32> {
    children_of(parent as i32)
        .into_iter()
        .filter(|(_, words)| words.iter().any(|w| w == word))
        .map(|(pid, _)| pid)
        .collect()
}

/// The daemon is killed while eight creates are in flight. After the restart every
/// sandbox that is listed runs, every directory is a listed sandbox, the half-made ones
/// left no cgroup or mount, and a create works.
#[test]
fn kill_9_during_creates() {
    let name = "kill_9_during_creates";
    if !can_run_criu(name) {
        return;
    }
    let mut d = TestDaemon::start("faults-create");
    let body = serde_json::json!({
        "image": "busybox",
        "command": { "shell": "while :; do sleep 1; done" }
    });
    // Half with egress: a veth, a lease and nftables rules each.
    let creators: Vec<_> = (0..8)
        .map(|i| {
            let mut b = body.clone();
            if i % 2 == 0 {
                b["network"] = serde_json::json!({ "mode": "egress" });
            }
            d.call_in_background::<SandboxInfo>("POST", "/v1/sandboxes".into(), b)
        })
        .collect();
    let mut seen = BTreeSet::new();
    assert!(
        wait_until(Duration::from_secs(30), || {
            seen.extend(dirs(&d, "sandboxes"));
            !seen.is_empty()
        }),
        "no create began"
    );
    d.kill9();
    let answered = creators
        .into_iter()
        .map(|c| c.join())
        .filter(|r| matches!(r, Ok(Ok(_))))
        .count();
    seen.extend(dirs(&d, "sandboxes"));
    d.spawn();
    let listed = consistent(&d, &seen);
    assert!(
        listed.len() >= answered,
        "{answered} creates answered, {} listed",
        listed.len()
    );
    let sb = d.create(body);
    assert_eq!(d.sh(&sb.id, "echo ok").1.trim(), "ok");
    // And with egress: its chain is there, and counted.
    let e = d.create(serde_json::json!({ "image": "busybox", "network": { "mode": "egress" } }));
    consistent(&d, &seen);
    assert!(
        nft_table(&d).is_some_and(|t| t.contains(&format!("chain sb_{}", e.network.unwrap().link))),
        "the new sandbox's chain"
    );
    for s in list(&d) {
        d.remove(&s.id);
    }
    for id in &seen {
        assert!(!cgroup_exists(id), "cgroup {id} left after removal");
    }
}

/// An archive of a checkpoint whose sandbox wrote `bytes` random bytes to `/big`, in the
/// test's directory; the sandbox and the checkpoint are gone afterwards. Returns the
/// archive and the SHA-256 of `/big`.
fn big_archive(d: &TestDaemon, bytes: u64) -> (std::path::PathBuf, String) {
    let sb = d.create(serde_json::json!({ "image": "busybox" }));
    let (code, sum, err) = d.sh(
        &sb.id,
        &format!("head -c {bytes} /dev/urandom > /big && sha256sum /big | cut -d' ' -f1"),
    );
    assert_eq!(code, 0, "{err}");
    let ck = d.checkpoint(&sb.id, false);
    let archive = d.root.parent().unwrap().join("big.forkd");
    let _: serde_json::Value = d
        .client
        .call(
            "POST",
            &format!("/v1/checkpoints/{}/export", ck.id),
            Some(&serde_json::json!({ "path": archive })),
        )
        .unwrap();
    d.remove(&sb.id);
    let _: serde_json::Value = d
        .client
        .call("DELETE", &format!("/v1/checkpoints/{}", ck.id), None)
        .unwrap();
    (archive, sum)
}

/// The daemon is killed while it imports an archive (150 MB that does not compress).
/// After the restart no checkpoint is listed, no stage is left in the checkpoints or in
/// the layer store, and the same archive imports whole and forks.
#[test]
fn kill_9_during_an_archive_import() {
    let name = "kill_9_during_an_archive_import";
    if !can_run_criu(name) {
        return;
    }
    let mut d = TestDaemon::start("faults-import");
    let (archive, sum) = big_archive(&d, 150_000_000);
    let importer = d.call_in_background::<CheckpointInfo>(
        "POST",
        "/v1/checkpoints/import".into(),
        serde_json::json!({ "path": archive }),
    );
    assert!(
        wait_until(Duration::from_secs(30), || dirs(&d, "checkpoints")
            .iter()
            .any(|n| n.starts_with(".stage-"))),
        "the import never staged"
    );
    d.kill9();
    assert!(
        importer.join().unwrap().is_err(),
        "the import cannot have answered"
    );
    d.spawn();
    consistent(&d, &BTreeSet::new());
    let none: Vec<CheckpointInfo> = d.client.call("GET", "/v1/checkpoints", None).unwrap();
    assert!(none.is_empty(), "{none:?}");
    let staged: Vec<String> = std::fs::read_dir(d.data().join("layers/tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert!(staged.is_empty(), "layer stages left: {staged:?}");
    let back: CheckpointInfo = d
        .client
        .call(
            "POST",
            "/v1/checkpoints/import",
            Some(&serde_json::json!({ "path": archive })),
        )
        .unwrap();
    let fork = d.fork(&back.id, 1, false);
    let b = &fork.branches[0].id;
    assert_eq!(d.sh(b, "sha256sum /big | cut -d' ' -f1").1, sum);
}

/// CRIU is killed (SIGKILL, every CRIU the daemon starts while the request runs: the
/// checkpoint's restore template and its restoring workers) in the middle of the
/// restores of a fork of 8 branches of a sandbox holding 200 MB. The fork fails as a
/// whole: no branch is listed, none left a directory, a cgroup, a mount or a process;
/// the source runs on and the checkpoint forks again (from a new template).
#[test]
fn criu_killed_during_a_fork_of_8_leaves_nothing() {
    let name = "criu_killed_during_a_fork_of_8_leaves_nothing";
    if !can_run_criu(name) {
        return;
    }
    let d = TestDaemon::start_with_env("faults-restore", &[("FORKD_FORK_PARALLEL", "2")]);
    let sb = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "shell": "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x} > /tmp/ready; while :; do sleep 1; done" }
    }));
    d.wait_for(&sb.id, "cat /tmp/ready", "200000000");
    let ck = d.checkpoint(&sb.id, true);
    let daemon_pid = d.pid().unwrap();
    let forker = d.call_in_background::<forkd::api::ForkResult>(
        "POST",
        format!("/v1/checkpoints/{}/fork", ck.id),
        serde_json::json!({ "count": 8 }),
    );
    let mut seen = BTreeSet::new();
    let mut killed = 0;
    while !forker.is_finished() {
        seen.extend(dirs(&d, "sandboxes"));
        let criu = children_with(daemon_pid, "swrk")
            .into_iter()
            .chain(children_with(daemon_pid, "template"));
        for pid in criu {
            if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL)
                .is_ok()
            {
                killed += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(killed > 0, "no CRIU was seen to kill");
    let err = match forker.join().unwrap() {
        Ok(r) => panic!("the fork succeeded with {} branches", r.branches.len()),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("restore"), "{err}");
    println!("fork of 8 with {killed} CRIU killed: {err}");
    seen.extend(dirs(&d, "sandboxes"));
    seen.remove(&sb.id);
    assert!(!seen.is_empty(), "no branch was begun");
    let listed = consistent(&d, &seen);
    assert_eq!(
        listed.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
        vec![sb.id.clone()],
        "only the source is left"
    );
    let again = d.fork(&ck.id, 1, false);
    let b = &again.branches[0].id;
    assert_eq!(d.sh(b, "cat /tmp/ready").1.trim(), "200000000");
}

/// The volume (a 640 MiB image) fills from the host as fast as it can, while forks of 4
/// branches of a live checkpoint, restored from its template, run one after another.
/// Each fork is all or nothing: 4 branches that hold the checkpoint's memory, or an
/// error that says the volume is full; a failed fork leaves no branch (listing,
/// directory, cgroup, mount, process), the template and the branches made before run
/// on, and once the space is freed the checkpoint forks again from the same template.
#[test]
fn a_volume_filling_during_forks_loses_nothing() {
    let name = "a_volume_filling_during_forks_loses_nothing";
    if !can_run_criu(name) {
        return;
    }
    let d = TestDaemon::start_with_env("faults-fillfork", &[("FORKD_VOLUME_SIZE", "640M")]);
    let sb = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "shell": "x=$(head -c 50000000 /dev/zero | tr '\\0' a); echo ${#x} > /tmp/ready; while :; do sleep 1; done" }
    }));
    d.wait_for(&sb.id, "cat /tmp/ready", "50000000");
    let ck = d.checkpoint(&sb.id, true);
    // Two branches: a request for more than one waits for the template.
    let mut first = d.fork(&ck.id, 2, false).branches;
    let before = first.remove(0).id;
    d.remove(&first[0].id);
    let daemon_pid = d.pid().unwrap();
    let template = children_with(daemon_pid, "template");
    assert_eq!(template.len(), 1, "one restore template: {template:?}");

    let fill = d.data().join("fill-from-the-host");
    let filler = {
        let fill = fill.clone();
        std::thread::spawn(move || -> (u64, String) {
            use std::io::Write;
            let mut f = std::fs::File::create(&fill).unwrap();
            let mib = vec![0u8; 1 << 20];
            let mut written = 0u64;
            loop {
                if let Err(e) = f.write_all(&mib).and_then(|_| {
                    if written % (16 << 20) == 0 {
                        f.sync_data()
                    } else {
                        Ok(())
                    }
                }) {
                    return (written, e.to_string());
                }
                written += 1 << 20;
            }
        })
    };
    let full = |e: &str| e.contains("the volume is full") || e.contains("No space left on device");
    let (mut made, mut refused) = (Vec::new(), Vec::new());
    let mut seen = BTreeSet::new();
    // Forks while it fills, and five once it is full.
    let mut after_full = 0;
    let t = std::time::Instant::now();
    while after_full < 5 {
        if filler.is_finished() {
            after_full += 1;
        }
        let r = d.client.call::<forkd::api::ForkResult>(
            "POST",
            &format!("/v1/checkpoints/{}/fork", ck.id),
            Some(&serde_json::json!({ "count": 4 })),
        );
        seen.extend(dirs(&d, "sandboxes"));
        match r {
            Ok(r) => {
                assert_eq!(r.branches.len(), 4);
                made.extend(r.branches.into_iter().map(|b| b.id));
            }
            Err(e) => {
                let e = e.to_string();
                assert!(full(&e), "a fork into a filling volume: {e}");
                refused.push(e);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the volume never filled"
        );
    }
    let (written, why) = filler.join().unwrap();
    // Refused before anything was made (the volume's watcher saw it full), or failed on
    // the way (the space ran out during the fork).
    let (up_front, on_the_way): (Vec<&String>, Vec<&String>) = refused
        .iter()
        .partition(|e| e.contains("refused: the volume is full"));
    println!(
        "{} forks of 4 made, {} refused up front and {} failed on the way while {} MiB filled the volume ({why}); first refusal: {}; first failure on the way: {}",
        made.len() / 4,
        up_front.len(),
        on_the_way.len(),
        written >> 20,
        up_front.first().map(|s| s.as_str()).unwrap_or("-"),
        on_the_way.first().map(|s| s.as_str()).unwrap_or("-")
    );
    assert!(!refused.is_empty(), "no fork was refused");
    std::fs::remove_file(&fill).unwrap();
    subvolumes_cleaned(&d);
    let listed: BTreeSet<String> = consistent(&d, &seen).into_iter().map(|s| s.id).collect();
    let mut expect: BTreeSet<String> = made.iter().cloned().collect();
    expect.extend([sb.id.clone(), before.clone()]);
    assert_eq!(
        listed, expect,
        "the sandboxes listed are the source and the forks that were made"
    );
    for id in made.iter().chain([&before]) {
        assert_eq!(
            d.sh(id, "cat /tmp/ready").1.trim(),
            "50000000",
            "branch {id}"
        );
    }
    let staged: Vec<String> = std::fs::read_dir(d.data().join("layers/tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert!(staged.is_empty(), "layer stages left: {staged:?}");
    assert_eq!(
        children_with(daemon_pid, "template"),
        template,
        "the restore template runs on"
    );
    let again = fork_once_space_is_back(&d, &ck.id);
    assert_eq!(d.sh(&again, "cat /tmp/ready").1.trim(), "50000000");
    assert_eq!(
        children_with(daemon_pid, "template"),
        template,
        "the fork after the fill is restored from the same template"
    );
}

fn rows_by_trial(
    run: &std::path::Path,
) -> std::collections::BTreeMap<String, forkd_analysis::TrialRow> {
    let rows = results(run);
    let n = rows.len();
    let by: std::collections::BTreeMap<_, _> =
        rows.into_iter().map(|r| (r.trial_id.clone(), r)).collect();
    assert_eq!(by.len(), n, "a trial counted twice in {}", run.display());
    by
}

/// The daemon is killed while an evaluator run is in its trials. The run ends (its
/// trials from then on are infrastructure failures); after a restart, `forkd eval
/// resume` runs those again and the run's rows equal, trial for trial (outcome and
/// per-test results), those of the same run made without the fault; the decision log
/// names the trials it ran again.
#[test]
fn kill_9_during_an_evaluator_run_then_resume() {
    let name = "kill_9_during_an_evaluator_run_then_resume";
    if !can_run_criu(name) {
        return;
    }
    let mut d = TestDaemon::start("faults-eval");
    let work = d.root.parent().unwrap().to_path_buf();
    let suite = work.join("suite");
    copy_dir(
        &std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/suites/mini"),
        &suite,
    );
    let sock = d.socket.to_str().unwrap().to_string();
    let args = |out: &std::path::Path| -> Vec<String> {
        [
            "--socket",
            &sock,
            "eval",
            "run",
            suite.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--agents",
            "oracle,noop",
            "--conditions",
            "clean,residual",
            "--retries",
            "0",
        ]
        .map(String::from)
        .to_vec()
    };
    let reference = work.join("reference");
    let out = std::process::Command::new(BIN)
        .args(args(&reference))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = rows_by_trial(&reference);
    assert!(want.len() >= 6, "{} trials", want.len());

    let run = work.join("faulted");
    let log = std::fs::File::create(work.join("faulted.log")).unwrap();
    let mut evaluator = std::process::Command::new(BIN)
        .args(args(&run))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(120), || std::fs::read_to_string(
            run.join("results.jsonl")
        )
        .map(|t| t.lines().count() >= 1)
        .unwrap_or(false)),
        "the run never reached its trials"
    );
    d.kill9();
    assert!(
        wait_until(Duration::from_secs(120), || evaluator
            .try_wait()
            .unwrap()
            .is_some()),
        "the evaluator did not end without its daemon"
    );
    let cut = results(&run);
    assert!(
        cut.iter()
            .any(|r| r.outcome == forkd_analysis::Outcome::InfraError),
        "the fault shows as infrastructure: {cut:?}"
    );
    d.spawn();
    let out = d.cli(&["--socket", &sock, "eval", "resume", run.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = rows_by_trial(&run);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the same trials"
    );
    for (id, w) in &want {
        let g = &got[id];
        assert_eq!((g.outcome, &g.tests), (w.outcome, &w.tests), "trial {id}");
    }
    let decisions = std::fs::read_to_string(run.join("decisions.jsonl")).unwrap();
    let resumed: serde_json::Value = decisions
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.to_string().contains("retried_infra"))
        .unwrap_or_else(|| panic!("no resume decision: {decisions}"));
    let retried = resumed.to_string();
    for r in cut
        .iter()
        .filter(|r| r.outcome == forkd_analysis::Outcome::InfraError)
    {
        assert!(
            retried.contains(&r.trial_id),
            "{} not named: {retried}",
            r.trial_id
        );
    }
}

/// Waits until btrfs has cleaned the volume's deleted subvolumes (it gives their space
/// back in the background, once their last user lets go).
fn subvolumes_cleaned(d: &TestDaemon) {
    let cleaned = std::process::Command::new("btrfs")
        .args(["subvolume", "sync"])
        .arg(d.data())
        .status()
        .expect("run btrfs subvolume sync");
    assert!(cleaned.success());
}

/// A fork of one branch of `ck` once freed space is back. btrfs gives back what was
/// removed in the background: until the volume's watcher sees the space (within a fifth
/// of a second of the filesystem), a fork is refused as the volume is full, by name;
/// then it goes. Returns the branch.
fn fork_once_space_is_back(d: &TestDaemon, ck: &str) -> String {
    let mut refused = Vec::new();
    loop {
        match d.client.call::<forkd::api::ForkResult>(
            "POST",
            &format!("/v1/checkpoints/{ck}/fork"),
            Some(&serde_json::json!({ "count": 1 })),
        ) {
            Ok(r) => return r.branches[0].id.clone(),
            Err(e) if e.to_string().contains("the volume is full") && refused.len() < 100 => {
                refused.push(e.to_string());
                std::thread::sleep(Duration::from_millis(300));
            }
            Err(e) => panic!("fork once space came back: {e} (refused before: {refused:?})"),
        }
    }
}

/// The state volume (a 640 MiB image here) filled to its last MiB, by a sandbox and, past
/// the reserve at which the daemon stops that sandbox from writing more (where the volume
/// has quotas), by a file on the volume: a live checkpoint of a sandbox holding 100 MB
/// and the import of a 120 MB archive each fail with an error that says the volume is
/// full, leave no checkpoint, stage or layer stage, and the sandbox runs on; once the
/// space is freed both work.
#[test]
fn a_full_volume_fails_checkpoints_and_imports_cleanly() {
    let name = "a_full_volume_fails_checkpoints_and_imports_cleanly";
    if !can_run_criu(name) {
        return;
    }
    let d = TestDaemon::start_with_env("faults-full", &[("FORKD_VOLUME_SIZE", "640M")]);
    // The archive to import, made first (its checkpoint then goes).
    let (archive, _) = big_archive(&d, 120_000_000);
    let _: serde_json::Value = d.client.call("POST", "/v1/gc", None).unwrap();
    // The space of what was removed comes back in the background (btrfs cleans a
    // deleted subvolume once its last user lets go of it): waited for here, so that the
    // fill below leaves the volume full, not nearly full.
    subvolumes_cleaned(&d);

    let sb = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "shell": "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo ${#x} > /tmp/ready; while :; do sleep 1; done" }
    }));
    d.wait_for(&sb.id, "cat /tmp/ready", "100000000");
    let (_, out, _) = d.sh(
        &sb.id,
        "dd if=/dev/zero of=/fill bs=1M 2>&1 | tail -2; sync",
    );
    let free_kib = || -> u64 {
        let st = nix::sys::statvfs::statvfs(&d.data()).unwrap();
        st.blocks_available() as u64 * st.fragment_size() as u64 / 1024
    };
    // The rest, written from outside (no quota holds it back).
    let rest = d.data().join("fill-from-the-host");
    let topped = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "dd if=/dev/zero of={} bs=1M 2>&1 | tail -1; sync",
            rest.display()
        ))
        .output()
        .expect("fill the volume from the host");
    let topped = String::from_utf8_lossy(&topped.stdout);
    assert!(
        free_kib() < 64 * 1024,
        "the volume is not full ({} KiB free): {out} {topped}",
        free_kib()
    );
    let nothing_left = |what: &str| {
        let listed: Vec<CheckpointInfo> = d.client.call("GET", "/v1/checkpoints", None).unwrap();
        assert!(listed.is_empty(), "{what}: {listed:?}");
        let stages: Vec<String> = dirs(&d, "checkpoints")
            .into_iter()
            .filter(|n| n.starts_with(".stage-"))
            .collect();
        assert!(stages.is_empty(), "{what}: stages left: {stages:?}");
        let staged: Vec<String> = std::fs::read_dir(d.data().join("layers/tmp"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        assert!(staged.is_empty(), "{what}: layer stages left: {staged:?}");
        assert_eq!(
            d.sh(&sb.id, "echo up").1.trim(),
            "up",
            "{what}: the sandbox runs on"
        );
    };
    let full = |e: &str| e.contains("No space left on device");
    let dump: Result<CheckpointInfo, _> = d.client.call(
        "POST",
        &format!("/v1/sandboxes/{}/checkpoint", sb.id),
        Some(&serde_json::json!({ "live": true })),
    );
    let e = dump
        .expect_err("a live checkpoint into a full volume")
        .to_string();
    println!("live checkpoint into a full volume: {e}");
    assert!(full(&e) && e.contains(&sb.id), "{e}");
    nothing_left("after the checkpoint");
    let import: Result<CheckpointInfo, _> = d.client.call(
        "POST",
        "/v1/checkpoints/import",
        Some(&serde_json::json!({ "path": archive })),
    );
    let e = import
        .expect_err("an import into a full volume")
        .to_string();
    println!("import into a full volume: {e}");
    assert!(full(&e) && e.contains("big.forkd"), "{e}");
    nothing_left("after the import");

    let (code, _, err) = d.sh(&sb.id, "rm /fill && sync");
    assert_eq!(code, 0, "{err}");
    std::fs::remove_file(&rest).unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || free_kib() > 300 * 1024),
        "the space never came back: {} KiB",
        free_kib()
    );
    let live = d.checkpoint(&sb.id, true);
    let b = fork_once_space_is_back(&d, &live.id);
    assert_eq!(d.sh(&b, "cat /tmp/ready").1.trim(), "100000000");
    let back: CheckpointInfo = d
        .client
        .call(
            "POST",
            "/v1/checkpoints/import",
            Some(&serde_json::json!({ "path": archive })),
        )
        .unwrap();
    let b2 = d.fork(&back.id, 1, false).branches[0].id.clone();
    assert_eq!(d.sh(&b2, "wc -c < /big").1.trim(), "120000000");
}
