//! The mechanisms that keep a sandbox's cost independent of how many are alive
//! (docs/DESIGN.md, "Many sandboxes"), and the semantics of memory shared between
//! branches. The numbers at thousands of branches are in benches/density/.

#![forbid(unsafe_code)]

mod common;

use common::*;
use std::time::Duration;

const LOOP: &str = "mkfifo /tmp/tick; exec 3<>/tmp/tick; i=0; while :; do i=$((i+1)); echo $i > /tmp/count; read -t 10 x <&3; done";

fn mount_lines(d: &TestDaemon, id: &str) -> usize {
    let (code, out, err) = d.sh(id, "wc -l < /proc/self/mountinfo");
    assert_eq!(code, 0, "{err}");
    out.trim().parse().unwrap()
}

/// The host's mounts below the daemon's state root (its volume, CRIU's `/run`).
fn host_mounts(d: &TestDaemon) -> Vec<String> {
    mounts_under(&d.root)
}

#[test]
fn roots_stay_out_of_the_host_mount_table_and_tables_do_not_grow() {
    let name = "roots_stay_out_of_the_host_mount_table_and_tables_do_not_grow";
    if !can_run_criu(name) {
        return;
    }
    let d = TestDaemon::start("density-mounts");
    let host_before = host_mounts(&d);
    let first = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
    let fresh_table = mount_lines(&d, &first.id);
    let ck = d.checkpoint(&first.id, true);
    let b = d.fork(&ck.id, 1, false).branches.remove(0);
    let branch_table = mount_lines(&d, &b.id);
    // Sixteen more, half fresh and half branches.
    for _ in 0..8 {
        d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
    }
    d.fork(&ck.id, 8, false);
    let last = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
    let last_b = d.fork(&ck.id, 1, false).branches.remove(0);
    // What a set-up and a restore see does not depend on how many sandboxes exist.
    assert_eq!(mount_lines(&d, &last.id), fresh_table);
    assert_eq!(mount_lines(&d, &last_b.id), branch_table);
    // No root was ever attached on the host: its table is as it was before the first.
    assert!(d.sandbox_mounts().is_empty(), "{:?}", d.sandbox_mounts());
    assert_eq!(host_mounts(&d), host_before);
    // The daemon reaches every root through the init, and each is the sandbox's own.
    d.sh(&last_b.id, "echo mine > /tmp/who");
    let info: forkd::api::SandboxInfo = d
        .client
        .call("GET", &format!("/v1/sandboxes/{}", last_b.id), None)
        .unwrap();
    assert_eq!(
        info.rootfs,
        format!("/proc/{}/root", info.init_pid.unwrap())
    );
    let who = std::path::Path::new(&info.rootfs).join("tmp/who");
    assert_eq!(std::fs::read_to_string(who).unwrap(), "mine\n");
    let (_, other, _) = d.sh(&b.id, "cat /tmp/who 2>/dev/null || echo absent");
    assert_eq!(other, "absent\n");
    // A list reads no cgroup unless asked; inspect always does.
    let list: Vec<forkd::api::SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    assert_eq!(list.len(), 20);
    assert!(list
        .iter()
        .all(|s| s.memory_bytes.is_none() && s.oom_kills.is_none()));
    let list: Vec<forkd::api::SandboxInfo> = d
        .client
        .call("GET", "/v1/sandboxes?stats=true", None)
        .unwrap();
    // Every one runs and has a figure: its memory cgroup's, or (none of them has a memory
    // limit, so on cgroup v1 they share one by default) its processes'.
    use forkd::api::MemoryCounted;
    let v1 = memcg_dir(&first.id).is_some();
    for s in &list {
        assert!(s.memory_bytes.is_some_and(|m| m > 0), "{s:?}");
        let counted = if v1 {
            MemoryCounted::Processes
        } else {
            MemoryCounted::Cgroup
        };
        assert_eq!(s.memory_counted, Some(counted), "{s:?}");
        let kills = (counted == MemoryCounted::Cgroup).then_some(0);
        assert_eq!(s.oom_kills, kills, "{s:?}");
    }
    let bad = d
        .client
        .call::<serde_json::Value>("GET", "/v1/sandboxes?stats=yes", None);
    let e = format!("{}", bad.unwrap_err());
    assert!(e.contains("stats must be true or false"), "{e}");
}

/// How many mounts the mount namespace of process `pid` holds, hidden ones included.
fn namespace_mounts(pid: i32) -> u32 {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).unwrap();
    forkd_sys::mount::namespace_mounts(std::os::fd::AsFd::as_fd(&ns)).unwrap()
}

/// (id, parent id, mount point) of every line of a mount table.
fn mount_ids(table: &str) -> Vec<(u64, u64, String)> {
    table
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[4].to_string(),
            )
        })
        .collect()
}

/// A set-up does not `pivot_root` (which walks every task on the host): the sandbox's
/// mount namespace is a copy of the daemon's empty one, an empty read-only tmpfs, with
/// the sandbox's root stacked on it. So the namespace holds the sandbox's own mounts and
/// that tmpfs, whatever the host and the other sandboxes have mounted; the sandbox sees
/// its root as `/` and nothing of the tmpfs; and a branch, whose namespace CRIU makes
/// (with a `pivot_root` of its own), has the same table as its source.
#[test]
fn a_sandboxs_mount_namespace_is_its_own_mounts_over_one_empty_tmpfs() {
    let name = "a_sandboxs_mount_namespace_is_its_own_mounts_over_one_empty_tmpfs";
    if !can_run_criu(name) {
        return;
    }
    let d = TestDaemon::start("density-emptyns");
    let a = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
    let b = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
    let host = namespace_mounts(std::process::id() as i32);
    for sb in [&a, &b] {
        let pid = sb.init_pid.unwrap();
        let (_, table, _) = d.sh(&sb.id, "cat /proc/self/mountinfo");
        let ids = mount_ids(&table);
        // The sandbox's root is mounted on something it cannot see...
        let (_, parent, point) = &ids[0];
        assert_eq!(point, "/", "{table}");
        assert!(ids.iter().all(|(id, _, _)| id != parent), "{table}");
        // ...which is the namespace's one other mount: the empty tmpfs. Nothing of the
        // host's, of the daemon's volume or of another sandbox is in the namespace.
        assert_eq!(namespace_mounts(pid) as usize, ids.len() + 1, "{table}");
        assert!(host as usize > ids.len() + 1, "the host has {host} mounts");
    }
    // `..` of the sandbox's root is that root, and its init's root is the same directory.
    let (code, out, err) = d.sh(
        &a.id,
        "cd /; ls -a / > /tmp/l1; cd /../../..; ls -a . > /tmp/l2; cmp /tmp/l1 /tmp/l2 && ls -a /proc/1/root/ | cmp - /tmp/l1 && echo same",
    );
    assert_eq!((code, out.as_str()), (0, "same\n"), "{err}");
    // A checkpoint of such a sandbox restores: the branch's table is its source's.
    let ck = d.checkpoint(&a.id, true);
    let br = d.fork(&ck.id, 1, false).branches.remove(0);
    assert_eq!(mount_lines(&d, &br.id), mount_lines(&d, &a.id));
    // CRIU's root shim (fixtures/criu/root-shim.c) moves the branch's root onto an
    // empty tmpfs rather than CRIU pivoting into it: the branch's namespace is shaped as
    // a created sandbox's, its mounts over one tmpfs it cannot see. With
    // `FORKD_CRIU_ROOT=pivot` CRIU pivots, and nothing is hidden.
    let hidden = usize::from(std::env::var("FORKD_CRIU_ROOT").as_deref() != Ok("pivot"));
    assert_eq!(
        namespace_mounts(br.init_pid.unwrap()) as usize,
        mount_lines(&d, &br.id) + hidden
    );
    // And `..` of the branch's root is that root too.
    let (code, out, err) = d.sh(
        &br.id,
        "cd /; ls -a / > /tmp/l1; cd /../../..; ls -a . > /tmp/l2; cmp /tmp/l1 /tmp/l2 && ls -a /proc/1/root/ | cmp - /tmp/l1 && echo same",
    );
    assert_eq!((code, out.as_str()), (0, "same\n"), "{err}");
    let n = d.read_number(&br.id, "/tmp/count");
    assert!(n >= 1, "{n}");
}

/// The device of the sysfs mounted at `/sys` in a sandbox.
fn sys_device(d: &TestDaemon, id: &str) -> String {
    let (code, out, err) = d.sh(id, "cat /proc/self/mountinfo");
    assert_eq!(code, 0, "{err}");
    forkd_sys::mountinfo::parse(&out)
        .into_iter()
        .rfind(|m| m.mount_point == std::path::Path::new("/sys"))
        .unwrap_or_else(|| panic!("no /sys in sandbox {id}:\n{out}"))
        .device
}

#[test]
fn sandboxes_and_branches_bind_one_sysfs() {
    let name = "sandboxes_and_branches_bind_one_sysfs";
    if !can_run_criu(name) {
        return;
    }
    let d = TestDaemon::start("density-sysfs");
    // The daemon's sysfs, of a network namespace of its own.
    let at = d.root.join("sysfs");
    let host = forkd_sys::mountinfo::mount_at(&at)
        .unwrap()
        .filter(|m| m.fstype == "sysfs")
        .unwrap_or_else(|| panic!("no sysfs at {}", at.display()))
        .device;
    let a = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
    let b = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
    let ck = d.checkpoint(&a.id, true);
    let br = d.fork(&ck.id, 2, false).branches;
    // Fresh sandboxes and branches all bind that one superblock: no new sysfs mount,
    // whose lookup walks every network namespace's superblock, per sandbox or restore.
    for id in [&a.id, &b.id, &br[0].id, &br[1].id] {
        assert_eq!(sys_device(&d, id), host, "sandbox {id}");
        let (code, out, _) = d.sh(
            id,
            "ls /sys/class/net; touch /sys/x 2>/dev/null || echo read-only",
        );
        assert_eq!(code, 0);
        assert_eq!(out, "lo\nread-only\n", "sandbox {id}");
    }
    // A branch of a branch too (its checkpoint marks /sys external again).
    let ck2 = d.checkpoint(&br[0].id, true);
    let again = d.fork(&ck2.id, 1, false).branches.remove(0);
    assert_eq!(sys_device(&d, &again.id), host);
    let (_, count, _) = d.sh(&again.id, "cat /tmp/count");
    assert!(count.trim().parse::<u64>().is_ok(), "{count:?}");
}

#[test]
fn a_filesystem_checkpoint_syncs_the_volume_only_for_much_unwritten_data() {
    let name = "a_filesystem_checkpoint_syncs_the_volume_only_for_much_unwritten_data";
    if !can_run(name) {
        return;
    }
    // A sync of the volume writes what every sandbox on it dirtied; the snapshot writes
    // out the sandbox's own. Either way the checkpoint holds what was written just before.
    let d = TestDaemon::start("density-sync");
    let src = d.busybox();
    // New files each time: btrfs starts writing out a file truncated and written again
    // as soon as it is closed.
    let cases = [
        ("echo small >", false),
        // 8 MiB: past the 4 MiB above which the volume is synced first, and well under
        // the volume's dirty bound (32 MiB), so the kernel does not start writing it
        // out on its own before the checkpoint looks.
        ("head -c 8388608 /dev/urandom >", true),
    ];
    for (i, (write, synced)) in cases.into_iter().enumerate() {
        let file = format!("/tmp/f{i}");
        let (code, sum, err) = d.sh(&src.id, &format!("{write} {file}; md5sum {file}"));
        assert_eq!(code, 0, "{err}");
        let c = d.checkpoint(&src.id, false);
        assert_eq!(
            c.phases_us.contains_key("sync"),
            synced,
            "{write}: {:?}",
            c.phases_us
        );
        let b = d.fork(&c.id, 1, false).branches.remove(0);
        assert_eq!(d.sh(&b.id, &format!("md5sum {file}")).1, sum, "{write}");
    }
}

#[test]
fn a_small_layer_is_copied_into_its_checkpoint_and_a_large_one_snapshotted() {
    let name = "a_small_layer_is_copied_into_its_checkpoint_and_a_large_one_snapshotted";
    if !can_run_criu(name) {
        return;
    }
    // A snapshot commits the whole shared volume; a copy of a small layer commits
    // nothing. The branch of either sees the same files.
    let d = TestDaemon::start("density-copy");
    let a = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
    let (code, _, err) = d.sh(
        &a.id,
        "echo one > /tmp/one && ln /tmp/one /tmp/two && ln -s ../tmp/one /etc/link \
         && chmod 4750 /tmp/one && rm /bin/ed && mkfifo /tmp/pipe && mkdir -p /srv/a/b \
         && echo deep > /srv/a/b/c",
    );
    assert_eq!(code, 0, "{err}");
    let look = "cat /tmp/one; stat -c '%h %a' /tmp/two; readlink /etc/link; \
                test -e /bin/ed || echo ed-gone; test -p /tmp/pipe && echo fifo; \
                cat /srv/a/b/c; test -S /.forkd/run/init.sock && echo socket";
    let want = "one\n2 4750\n../tmp/one\ned-gone\nfifo\ndeep\nsocket\n";
    assert_eq!(d.sh(&a.id, look).1, want);
    for live in [false, true] {
        let c = d.checkpoint(&a.id, live);
        assert!(
            c.phases_us.contains_key("copy") && !c.phases_us.contains_key("snapshot"),
            "live {live}: {:?}",
            c.phases_us
        );
        let b = d.fork(&c.id, 1, false).branches.remove(0);
        assert_eq!(d.sh(&b.id, look).1, want, "live {live}");
        // The branch writes its own layer, not the checkpoint's copy.
        d.sh(&b.id, "echo other > /tmp/one");
        let again = d.fork(&c.id, 1, false).branches.remove(0);
        assert_eq!(d.sh(&again.id, "cat /tmp/one").1, "one\n", "live {live}");
    }
    // Past 4 MiB of files, the layer is snapshotted.
    let (code, sum, err) = d.sh(
        &a.id,
        "head -c 5000000 /dev/urandom > /tmp/big; md5sum /tmp/big",
    );
    assert_eq!(code, 0, "{err}");
    let c = d.checkpoint(&a.id, false);
    assert!(
        c.phases_us.contains_key("snapshot") && !c.phases_us.contains_key("copy"),
        "{:?}",
        c.phases_us
    );
    let b = d.fork(&c.id, 1, false).branches.remove(0);
    assert_eq!(d.sh(&b.id, "md5sum /tmp/big").1, sum);
    assert_eq!(d.sh(&b.id, look).1, want);
}

#[test]
fn a_list_shows_every_sandbox_as_it_is_after_each_change() {
    let name = "a_list_shows_every_sandbox_as_it_is_after_each_change";
    if !can_run_criu(name) {
        return;
    }
    // A list answers from descriptions kept since each record last changed: after each
    // step below it must say what an inspect (which describes afresh) says.
    let d = TestDaemon::start("density-list");
    let same = |step: &str| {
        let list: Vec<forkd::api::SandboxInfo> =
            d.client.call("GET", "/v1/sandboxes", None).unwrap();
        for shown in &list {
            let mut fresh: forkd::api::SandboxInfo = d
                .client
                .call("GET", &format!("/v1/sandboxes/{}", shown.id), None)
                .unwrap();
            // The counters are an inspect's alone.
            fresh.memory_bytes = None;
            fresh.memory_counted = None;
            fresh.oom_kills = None;
            fresh.disk_used_bytes = None;
            fresh.cpu_usage_us = None;
            assert_eq!(
                serde_json::to_value(shown).unwrap(),
                serde_json::to_value(&fresh).unwrap(),
                "{step}"
            );
        }
        list.into_iter()
            .map(|s| (s.id, s.status.to_string(), s.init_pid.is_some()))
            .collect::<Vec<_>>()
    };
    let a = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
    let b = d.busybox();
    let listed = same("created");
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|(_, st, pid)| st == "running" && *pid));
    let _: forkd::api::SandboxInfo = d
        .client
        .call(
            "POST",
            &format!("/v1/sandboxes/{}/stop", b.id),
            Some(&serde_json::json!({ "grace_secs": 1 })),
        )
        .unwrap();
    let listed = same("stopped");
    assert!(
        listed.contains(&(b.id.clone(), "stopped".into(), false)),
        "{listed:?}"
    );
    let ck = d.checkpoint(&a.id, true);
    let branch = d.fork(&ck.id, 1, false).branches.remove(0);
    let listed = same("forked");
    assert!(
        listed.iter().any(|(id, _, _)| *id == branch.id),
        "{listed:?}"
    );
    // A sandbox whose init exits on its own is stopped by the daemon, not a request.
    // (The exec itself ends with the init: its answer is not awaited as a success.)
    let _ = d.exec(&branch.id, serde_json::json!({ "shell": "kill -TERM 1" }));
    assert!(wait_until(Duration::from_secs(10), || {
        let l: Vec<forkd::api::SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
        l.iter().any(|s| s.id == branch.id && s.init_pid.is_none())
    }));
    same("exited");
    d.remove(&b.id);
    let listed = same("removed");
    assert!(!listed.iter().any(|(id, _, _)| *id == b.id), "{listed:?}");
}

/// How many times the CRIU of a branch's restore moved a mount namespace's root (its
/// debug log names each `pivot_root`).
fn root_moves(d: &TestDaemon, id: &str) -> usize {
    let log = d.data().join("sandboxes").join(id).join("criu/restore.log");
    let text =
        std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("read {}: {e}", log.display()));
    text.lines()
        .filter(|l| l.contains("mnt: Move the root to"))
        .count()
}

#[test]
fn a_restore_moves_the_root_once() {
    let name = "a_restore_moves_the_root_once";
    if !can_run_criu(name) {
        return;
    }
    // Every pivot_root walks every task on the host: CRIU's newer mount engine did two
    // a restore (an empty namespace, then the root), the one forkd asks for does one.
    let d = TestDaemon::start_with_env("density-pivots", &[("FORKD_CRIU_LOG_LEVEL", "4")]);
    let a = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
    d.sh(&a.id, "echo kept > /tmp/mark");
    let ck = d.checkpoint(&a.id, true);
    let b = d.fork(&ck.id, 1, false).branches.remove(0);
    assert_eq!(root_moves(&d, &b.id), 1);
    // The branch is whole: its file, its loop, its mounts (the same table as the source).
    assert_eq!(d.sh(&b.id, "cat /tmp/mark").1, "kept\n");
    let n = d.read_number(&b.id, "/tmp/count");
    d.sh(&b.id, "echo > /tmp/tick");
    assert!(
        wait_until(Duration::from_secs(10), || d
            .read_number(&b.id, "/tmp/count")
            > n),
        "the branch's loop stopped"
    );
    assert_eq!(mount_lines(&d, &b.id), mount_lines(&d, &a.id));
    // And a branch of that branch, restored the same way.
    let ck2 = d.checkpoint(&b.id, true);
    let c = d.fork(&ck2.id, 1, false).branches.remove(0);
    assert_eq!(root_moves(&d, &c.id), 1);
    assert_eq!(d.sh(&c.id, "cat /tmp/mark").1, "kept\n");
}

fn ksm(name: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/kernel/mm/ksm/{name}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// A Python process holding 4,096 identical anonymous pages waits for a word in
/// /tmp/go: `drop` discards the first half (`MADV_DONTNEED`), then it reports what both
/// halves read.
const PAGES: &str = r#"
import mmap, os, time
n = 4096
m = mmap.mmap(-1, n * 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
page = b"\x5a" * 4096
for i in range(n):
    m[i * 4096:(i + 1) * 4096] = page
open("/tmp/ready", "w").write("ready")
while not os.path.exists("/tmp/go"):
    time.sleep(0.02)
if open("/tmp/go").read().strip() == "drop":
    m.madvise(mmap.MADV_DONTNEED, 0, n // 2 * 4096)
half = n // 2 * 4096
zeros = m[:half] == b"\0" * half
kept = m[half:] == page * (n // 2)
first = m[:half] == page * (n // 2)
open("/tmp/result", "w").write(f"zeros={zeros} kept={kept} first={first}")
time.sleep(10**6)
"#;

#[test]
fn a_discarded_page_reads_zeros_in_a_branch_whose_pages_are_merged() {
    let name = "a_discarded_page_reads_zeros_in_a_branch_whose_pages_are_merged";
    if !can_run_criu(name) {
        return;
    }
    if !require(
        name,
        std::path::Path::new("/sys/kernel/mm/ksm/run").exists(),
        "the kernel has no KSM",
    ) {
        return;
    }
    let Some(debian) = fixture(name, "images/debian.tar.zst", "debian") else {
        return;
    };
    let run_knob = || {
        std::fs::read_to_string("/sys/kernel/mm/ksm/run")
            .unwrap()
            .trim()
            .to_string()
    };
    let found = run_knob();
    // The default: KSM is left alone until a fork asks to share.
    let d = TestDaemon::start_with_env("density-ksm", &[("FORKD_KSM", "ask")]);
    assert_eq!(run_knob(), found);
    d.import(&debian, "debian");
    let sb = d.create(
        serde_json::json!({ "image": "debian", "command": { "argv": ["python3", "-c", PAGES] } }),
    );
    let ready = wait_until(Duration::from_secs(30), || {
        d.sh(&sb.id, "cat /tmp/ready 2>/dev/null").1 == "ready"
    });
    assert!(ready, "the page holder never got ready");
    let ck = d.checkpoint(&sb.id, true);
    let merge_any = |pid: Option<i32>| {
        let stat = std::fs::read_to_string(format!("/proc/{}/ksm_stat", pid.unwrap())).unwrap();
        stat.lines()
            .find_map(|l| l.strip_prefix("ksm_merge_any: "))
            .unwrap_or_default()
            .to_string()
    };
    // A fork that does not ask keeps its branches' memory their own.
    let own = d.fork(&ck.id, 1, false).branches;
    assert_eq!(merge_any(own[0].init_pid), "no");
    assert_eq!(run_knob(), found);
    // Asking for a fresh branch is refused: it restores no memory.
    let fork = |body: serde_json::Value| {
        d.client.call::<forkd::api::ForkResult>(
            "POST",
            &format!("/v1/checkpoints/{}/fork", ck.id),
            Some(&body),
        )
    };
    let err = fork(serde_json::json!({ "fresh": true, "share_memory": true }))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("share_memory") && err.contains(&ck.id),
        "{err}"
    );
    let sharing_before = ksm("pages_sharing");
    let branches = fork(serde_json::json!({ "count": 2, "share_memory": true }))
        .expect("a fork that shares memory")
        .branches;
    assert_eq!(run_knob(), "1");
    for b in &branches {
        assert_eq!(merge_any(b.init_pid), "yes", "branch {}", b.id);
    }
    // The branches' identical pages are merged (with each other and within each).
    let merged = wait_until(Duration::from_secs(60), || {
        ksm("pages_sharing") >= sharing_before + 4096
    });
    assert!(
        merged,
        "KSM merged {} pages",
        ksm("pages_sharing") - sharing_before
    );
    d.sh(&branches[0].id, "echo drop > /tmp/go");
    d.sh(&branches[1].id, "echo keep > /tmp/go");
    let result = |id: &str| {
        let mut out = String::new();
        wait_until(Duration::from_secs(30), || {
            out = d.sh(id, "cat /tmp/result 2>/dev/null").1;
            !out.is_empty()
        });
        out
    };
    // Discarded merged pages read back as zeros; the rest and the sibling are untouched.
    assert_eq!(result(&branches[0].id), "zeros=True kept=True first=False");
    assert_eq!(result(&branches[1].id), "zeros=False kept=True first=True");
    drop(d);
    // The daemon put the machine's KSM setting back when it stopped.
    assert_eq!(run_knob(), found);
}

/// A stop passes SIGTERM to every process of its sandbox, each in a session and process
/// group of its own, and to none of another sandbox: the init finds them in the
/// sandbox's own `/proc` rather than by `kill(-1)`, whose walk covers every process on
/// the host.
#[test]
fn a_stop_terminates_every_process_of_its_sandbox_and_no_other() {
    let name = "a_stop_terminates_every_process_of_its_sandbox_and_no_other";
    if !can_run(name) {
        return;
    }
    let d = TestDaemon::start("density-stop");
    let loop_ = serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } });
    let (a, b) = (d.create(loop_.clone()), d.create(loop_));
    // Marks its start; on SIGTERM marks that and exits.
    let worker = b"trap 'echo term > /tmp/term-$1; exit 0' TERM\n\
echo $$ > /tmp/up-$1\n\
while :; do sleep 0.2; done\n";
    let start = |id: &str, tag: &str| {
        d.put_file(id, "/worker.sh", worker);
        let (code, _, err) = d.sh(
            id,
            &format!("setsid sh /worker.sh {tag} </dev/null >/dev/null 2>&1 &"),
        );
        assert_eq!(code, 0, "{err}");
        d.wait_for(id, &format!("cat /tmp/up-{tag}"), "")
            .trim()
            .to_string()
    };
    let tags = ["a0", "a1", "a2"];
    for tag in tags {
        start(&a.id, tag);
    }
    let b_pid = start(&b.id, "b");

    let info: forkd::api::SandboxInfo = d
        .client
        .call(
            "POST",
            &format!("/v1/sandboxes/{}/stop", a.id),
            Some(&serde_json::json!({ "grace_secs": 20 })),
        )
        .expect("stop");
    assert_eq!(info.status, forkd::api::SandboxStatus::Stopped);
    for tag in tags {
        let mark = std::path::Path::new(&info.upper).join(format!("tmp/term-{tag}"));
        assert_eq!(
            std::fs::read_to_string(&mark).unwrap_or_default().trim(),
            "term",
            "{} got no SIGTERM",
            mark.display()
        );
    }
    // The other sandbox's process runs on, untouched.
    let (code, out, err) = d.sh(&b.id, &format!("kill -0 {b_pid} && ls /tmp"));
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("term-b"), "{out}");
}

/// A sandbox's memory cgroup directory on cgroup v1, if the machine has v1.
fn memcg_dir(id: &str) -> Option<std::path::PathBuf> {
    let v1 = std::path::Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists();
    v1.then(|| format!("/sys/fs/cgroup/memory/forkd/{id}").into())
}

#[test]
fn a_removed_sandboxs_cgroup_serves_the_next_sandbox() {
    let name = "a_removed_sandboxs_cgroup_serves_the_next_sandbox";
    if !can_run(name) {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    // A memory cgroup for every sandbox, so that the limited sandbox's serves the next.
    let d = TestDaemon::start_with_env("density-cgroup-pool", &[("FORKD_MEMCG", "each")]);
    let a = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "shell": LOOP },
        "limits": { "memory_bytes": 67108864, "pids": 64 }
    }));
    let first = memcg_dir(&a.id).map(|dir| std::fs::metadata(dir).unwrap().ino());
    d.remove(&a.id);
    assert!(!cgroup_exists(&a.id), "the removed sandbox's name stays");
    let b = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
    let Some(dir) = memcg_dir(&b.id) else {
        // cgroup v2 cannot rename a cgroup: the pool keeps none there.
        let left: Vec<_> = std::fs::read_dir("/sys/fs/cgroup/forkd")
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("free-"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        return;
    };
    // The same kernel cgroup, renamed: nothing was made and nothing removed.
    assert_eq!(std::fs::metadata(&dir).unwrap().ino(), first.unwrap());
    // With the limits of its new sandbox (the defaults), not those of the old one.
    let limit: u64 = std::fs::read_to_string(dir.join("memory.limit_in_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        limit > 1 << 50,
        "memory limit {limit} kept from the first sandbox"
    );
    let pids =
        std::fs::read_to_string(format!("/sys/fs/cgroup/pids/forkd/{}/pids.max", b.id)).unwrap();
    // The daemon's default task limit, not the old sandbox's 64.
    assert_eq!(pids.trim(), "2048");
    // The new sandbox's processes are in it, and it works.
    let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", b.init_pid.unwrap())).unwrap();
    assert!(
        cgroups
            .lines()
            .any(|l| l.ends_with(&format!(":memory:/forkd/{}", b.id))),
        "{cgroups}"
    );
    // Its loop writes its first count a moment after the create answers.
    let counting = wait_until(Duration::from_secs(10), || {
        d.sh(&b.id, "cat /tmp/count > /dev/null && echo counting").1 == "counting\n"
    });
    assert!(counting, "the new sandbox's loop never wrote /tmp/count");
    let (code, out, _) = d.sh(
        &b.id,
        "echo ok; cat /tmp/count > /dev/null && echo counting",
    );
    assert_eq!((code, out.as_str()), (0, "ok\ncounting\n"));
    let info: forkd::api::SandboxInfo = d
        .client
        .call("GET", &format!("/v1/sandboxes/{}", b.id), None)
        .unwrap();
    assert_eq!(info.oom_kills, Some(0));
    // Removed in turn, its cgroup is kept again, under a name of the pool's (once its
    // last process is gone, which the exit watcher's release thread sees a moment later).
    let ino = std::fs::metadata(&dir).unwrap().ino();
    d.remove(&b.id);
    let kept_now = || -> Vec<String> {
        std::fs::read_dir("/sys/fs/cgroup/memory/forkd")
            .unwrap()
            .flatten()
            .filter(|e| e.metadata().is_ok_and(|m| m.ino() == ino))
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect()
    };
    wait_until(Duration::from_secs(10), || {
        kept_now().iter().any(|k| k.starts_with("free-"))
    });
    let kept = kept_now();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].starts_with("free-"), "{kept:?}");
}

/// The cgroup path of process `pid` in `controller`'s hierarchy.
fn cgroup_of(pid: i32, controller: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    text.lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            let named = ctrls.split(',').any(|c| c == controller);
            // cgroup v2: one line, `0::<path>`.
            (named || ctrls.is_empty()).then(|| path.to_string())
        })
        .unwrap_or_else(|| panic!("no {controller} line in {text}"))
}

#[test]
fn sandboxes_without_a_memory_limit_share_a_memory_cgroup() {
    let name = "sandboxes_without_a_memory_limit_share_a_memory_cgroup";
    if !can_run_criu(name) {
        return;
    }
    let d = TestDaemon::start_with_env("density-memcg", &[("FORKD_MEMCG", "limited")]);
    let a = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
    let b = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "shell": LOOP },
        "limits": { "memory_bytes": 67108864 }
    }));
    let a_pid = a.init_pid.unwrap();
    if memcg_dir(&a.id).is_none() {
        // cgroup v2 has no per-controller directories: every sandbox keeps its own.
        assert_eq!(cgroup_of(a_pid, "memory"), format!("/forkd/{}", a.id));
        assert!(d.log().contains("FORKD_MEMCG=limited needs cgroup v1"));
        return;
    }
    // The unlimited sandbox's memory is the shared cgroup; its other controllers its own.
    let shared = cgroup_of(a_pid, "memory");
    assert!(shared.starts_with("/forkd/shared-"), "{shared}");
    assert!(!memcg_dir(&a.id).unwrap().exists());
    assert_eq!(cgroup_of(a_pid, "pids"), format!("/forkd/{}", a.id));
    assert_eq!(cgroup_of(a_pid, "freezer"), format!("/forkd/{}", a.id));
    // The limited one has its own, with its limit.
    let b_pid = b.init_pid.unwrap();
    assert_eq!(cgroup_of(b_pid, "memory"), format!("/forkd/{}", b.id));
    let limit =
        std::fs::read_to_string(memcg_dir(&b.id).unwrap().join("memory.limit_in_bytes")).unwrap();
    assert_eq!(limit.trim(), "67108864");
    // A description counts a sharing sandbox's memory from its processes (the shared
    // cgroup's charge and OOM kills are every sharing sandbox's), the other's from its
    // own cgroup.
    use forkd::api::MemoryCounted;
    let info = |id: &str| -> forkd::api::SandboxInfo {
        d.client
            .call("GET", &format!("/v1/sandboxes/{id}"), None)
            .unwrap()
    };
    let ia = info(&a.id);
    assert_eq!(ia.memory_counted, Some(MemoryCounted::Processes), "{ia:?}");
    assert_eq!(ia.oom_kills, None);
    // At least the shell's and the init's own pages, and far less than the shared
    // cgroup's charge once a branch or two are in it.
    let pss = ia.memory_bytes.unwrap();
    assert!(pss > 64 << 10 && pss < 64 << 20, "{pss}");
    let ib = info(&b.id);
    assert_eq!(ib.memory_counted, Some(MemoryCounted::Cgroup), "{ib:?}");
    assert!(ib.memory_bytes.is_some_and(|m| m > 0));
    assert_eq!(ib.oom_kills, Some(0));

    // Branches of a live checkpoint of the unlimited sandbox land in the shared cgroup,
    // keep counting, and are frozen and restored like any other.
    let ck = d.checkpoint(&a.id, true);
    let br = d.fork(&ck.id, 2, false).branches;
    for s in &br {
        let pid = s.init_pid.unwrap();
        assert_eq!(cgroup_of(pid, "memory"), shared, "branch {}", s.id);
        assert_eq!(cgroup_of(pid, "pids"), format!("/forkd/{}", s.id));
        let before = d.read_number(&s.id, "/tmp/count");
        d.sh(&s.id, "echo > /tmp/tick");
        assert!(
            wait_until(Duration::from_secs(5), || d
                .read_number(&s.id, "/tmp/count")
                > before),
            "branch {} does not count",
            s.id
        );
    }
    // A branch's checkpoint and its own branch too.
    let ck2 = d.checkpoint(&br[0].id, true);
    let again = d.fork(&ck2.id, 1, false).branches.remove(0);
    assert_eq!(cgroup_of(again.init_pid.unwrap(), "memory"), shared);

    // Removing them leaves the shared cgroup to the sandboxes still in it.
    for id in [&a.id, &br[0].id, &br[1].id, &again.id] {
        d.remove(id);
        assert!(!cgroup_exists(id), "sandbox {id}'s cgroup stays");
    }
    let shared_dir = format!("/sys/fs/cgroup/memory{shared}");
    assert!(std::path::Path::new(&shared_dir).exists());
    d.remove(&b.id);
}

/// A daemon whose descriptor limit (RLIMIT_NOFILE) is lowered to 1,024 keeps 2,000
/// busybox branches alive and watched: it learns every init's exit from the kernel's
/// process events (one descriptor), not from a pidfd each. Killed from outside, every
/// branch's exit is recorded; the daemon's descriptors stay far below the limit.
#[test]
fn two_thousand_branches_are_watched_under_a_limit_of_1024_descriptors() {
    let name = "two_thousand_branches_are_watched_under_a_limit_of_1024_descriptors";
    if !can_run_criu(name) || !have_program(name, "prlimit") {
        return;
    }
    let d = TestDaemon::start("nofile");
    let pid = d.pid().unwrap();
    let set = std::process::Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg("--nofile=1024:1024")
        .status()
        .unwrap();
    assert!(set.success(), "prlimit --nofile=1024:1024 on the daemon");
    let health: forkd::api::Health = d.client.call("GET", "/v1/health", None).unwrap();
    assert!(
        health.exit_watcher.detail.contains("process events"),
        "{:?}",
        health.exit_watcher
    );
    let src = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
    let ck = d.checkpoint(&src.id, true);
    let mut ids = Vec::new();
    while ids.len() < 2000 {
        ids.extend(
            d.fork(&ck.id, 100, false)
                .branches
                .into_iter()
                .map(|b| b.id),
        );
    }
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    println!(
        "2,000 branches alive: the daemon holds {} descriptors",
        fds()
    );
    assert!(fds() < 512, "the daemon holds {} descriptors", fds());
    let listed: Vec<forkd::api::SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    let running: Vec<&forkd::api::SandboxInfo> = listed
        .iter()
        .filter(|s| s.status == forkd::api::SandboxStatus::Running && s.id != src.id)
        .collect();
    assert_eq!(running.len(), 2000, "every branch runs");
    for s in &running {
        let p = s.init_pid.expect("a running branch has an init");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::SIGKILL).unwrap();
    }
    let stopped = || {
        let l: Vec<forkd::api::SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
        l.iter()
            .filter(|s| ids.contains(&s.id) && s.status == forkd::api::SandboxStatus::Stopped)
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(180), || stopped() == 2000),
        "{} of 2,000 killed branches recorded as stopped",
        stopped()
    );
    assert_eq!(
        d.sh(&src.id, "echo up").1.trim(),
        "up",
        "the source runs on"
    );
    let after = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
    assert_eq!(d.sh(&after.id, "echo up").1.trim(), "up");
}
