//! The walls around a sandbox against a hostile agent: the system-call filter and what
//! the sandbox's capabilities and mounts refuse. An escape battery (`tests/walls/probe.c`,
//! built statically here) runs as root in a busybox and a Debian sandbox, and again in a
//! branch of a live checkpoint of each: every attempt fails with the errno expected, and
//! nothing on the host changes. A sandbox made `unconfined` runs without the filter and
//! says so.

#![forbid(unsafe_code)]

mod common;

use common::*;
use forkd::api::SandboxInfo;
use std::collections::BTreeMap;
use std::path::PathBuf;

const EPERM: i32 = 1;
const ENOENT: i32 = 2;
const ESRCH: i32 = 3;
const EROFS: i32 = 30;
const ENOSYS: i32 = 38;
const ENETUNREACH: i32 = 101;
const ETIMEDOUT: i32 = 110;

/// What each attempt of the probe must end with.
fn expected() -> BTreeMap<&'static str, Vec<i32>> {
    let mut m: BTreeMap<&'static str, Vec<i32>> = BTreeMap::new();
    for name in [
        "unshare-user",
        "unshare-user-mount-net",
        "unshare-mount",
        "clone-newuser",
        "setns",
        "mount-tmpfs",
        "mount-cgroup-v1",
        "umount-proc",
        "pivot-root",
        "fsopen",
        "open-tree",
        "swapon",
        "reboot",
        "keyctl",
        "add-key",
        "request-key",
        "bpf-prog-load",
        "perf-event-open",
        "userfaultfd",
        "io-uring-setup",
        "init-module",
        "finit-module",
        "delete-module",
        "kexec-load",
        "kexec-file-load",
        "open-by-handle-at",
        "socket-vsock",
        "personality-exec",
        "iopl",
        // A 32-bit system call is refused, not killed; so are x32's.
        "int80-getpid",
        "x32-unshare-user",
        "x32-io-uring-setup",
        // Without CAP_MKNOD.
        "mknod-block",
    ] {
        m.insert(name, vec![EPERM]);
    }
    // glibc falls back to clone on ENOSYS only; a number newer than the filter's table
    // answers as on an older kernel.
    m.insert("clone3-newuser", vec![ENOSYS]);
    m.insert("unknown-syscall", vec![ENOSYS]);
    // Read-only binds over the host's knobs (sysrq is absent from some kernels).
    m.insert("write-proc-sys", vec![EROFS]);
    m.insert("write-sysrq", vec![EROFS, ENOENT]);
    m.insert("write-sys", vec![EROFS]);
    // Outside the pid namespace nothing is visible.
    m.insert("ptrace-host-pid", vec![ESRCH]);
    m.insert("ptrace-init-parent", vec![ESRCH]);
    m.insert("kill-host-pid", vec![ESRCH]);
    // What ordinary programs use still works.
    m.insert("unshare-files", vec![0]);
    m.insert("personality-query", vec![0]);
    m.insert("socket-inet", vec![0]);
    m
}

/// Builds the probe statically (the busybox image has no C library).
fn probe() -> PathBuf {
    let out = std::env::temp_dir().join(format!("forkd-walls-probe-{}", std::process::id()));
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/walls/probe.c");
    let st = std::process::Command::new("cc")
        .args(["-static", "-O2", "-Wall", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc {} failed", src.display());
    out
}

/// Runs the probe in `id` and checks every line against [`expected`]; `sibling` is
/// another sandbox's address and the errno its raw echo must end with.
fn battery(d: &TestDaemon, id: &str, probe: &std::path::Path, what: &str, sibling: (&str, i32)) {
    let bytes = std::fs::read(probe).unwrap();
    d.put_file(id, "/walls-probe", &bytes);
    let daemon_pid = d.pid().expect("the daemon's pid");
    let (code, out, err) = d.sh(
        id,
        &format!(
            "chmod 755 /walls-probe && /walls-probe {daemon_pid} {}",
            sibling.0
        ),
    );
    assert_eq!(code, 0, "{what}: the probe failed: {err}\n{out}");
    let got: BTreeMap<String, i32> = out
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.trim().parse().expect("an errno")))
        .collect();
    let mut want = expected();
    want.insert("raw-socket-sibling", vec![sibling.1]);
    let mut wrong = Vec::new();
    for (name, ok) in &want {
        match got.get(*name) {
            Some(e) if ok.contains(e) => {}
            Some(e) => wrong.push(format!("{name}: errno {e}, expected one of {ok:?}")),
            None => wrong.push(format!("{name}: no result")),
        }
    }
    for name in got.keys() {
        if !want.contains_key(name.as_str()) {
            wrong.push(format!("{name}: not in the expected table"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{what}:\n{}\nprobe output:\n{out}",
        wrong.join("\n")
    );
    // Nothing it tried is left in the sandbox either.
    let (_, ls, _) = d.sh(id, "ls /tmp/walls-sda 2>&1; grep -c walls-m /proc/mounts");
    assert!(ls.contains("No such file"), "{what}: {ls}");
}

/// Python's ctypes in the Debian image: io_uring and bpf(BPF_PROG_LOAD) are refused.
const CTYPES: &str = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(256)
for name, nr, args in [("io_uring_setup", 425, (8, buf)), ("bpf", 321, (5, buf, 128))]:
    r = libc.syscall(nr, *args)
    print(name, r, ctypes.get_errno())
"#;

/// What on the host the probe could have changed, read before and after.
fn host_state() -> Vec<String> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_else(|e| format!("{p}: {e}"));
    vec![
        read("/proc/sys/kernel/domainname"),
        read("/proc/sys/kernel/hostname"),
        read("/proc/swaps"),
        read("/sys/kernel/mm/transparent_hugepage/enabled"),
        format!("{:?}", std::fs::symlink_metadata("/tmp/walls-m").is_ok()),
        format!("{:?}", std::fs::symlink_metadata("/tmp/walls-sda").is_ok()),
    ]
}

#[test]
fn the_escape_battery_fails_in_busybox_and_debian_before_and_after_a_fork() {
    let name = "the_escape_battery_fails_in_busybox_and_debian_before_and_after_a_fork";
    if !can_run_criu(name) {
        return;
    }
    let Some(debian) = fixture(name, "images/debian.tar.zst", "debian") else {
        return;
    };
    let probe = probe();
    let before = host_state();
    let d = TestDaemon::start("walls-battery");
    d.import(&debian, "debian");
    // A sibling with egress, to be reached through raw sockets: from a sandbox without a
    // network there is no route; from one with egress the packets go nowhere.
    let sibling =
        d.create(serde_json::json!({ "image": "busybox", "network": { "mode": "egress" } }));
    let sibling_addr = sibling
        .network
        .as_ref()
        .expect("the sibling's address")
        .address
        .clone();
    let egress = d.create(serde_json::json!({
        "image": "busybox", "network": { "mode": "egress" },
        "command": { "argv": ["sleep", "infinity"] }
    }));
    battery(
        &d,
        &egress.id,
        &probe,
        "busybox sandbox with egress",
        (&sibling_addr, ETIMEDOUT),
    );
    for image in ["busybox", "debian"] {
        let sb = d.create(serde_json::json!({
            "image": image,
            "command": { "argv": ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done"] }
        }));
        assert_eq!(sb.seccomp, forkd::api::Seccomp::Default, "{image}");
        battery(
            &d,
            &sb.id,
            &probe,
            &format!("{image} sandbox"),
            (&sibling_addr, ENETUNREACH),
        );
        if image == "debian" {
            d.put_file(&sb.id, "/walls-ctypes.py", CTYPES.as_bytes());
            let (code, out, err) = d.sh(&sb.id, "python3 /walls-ctypes.py");
            assert_eq!(code, 0, "{err}");
            assert!(
                out.contains("io_uring_setup -1 1") && out.contains("bpf -1 1"),
                "python's ctypes reached io_uring or bpf: {out}"
            );
        }
        let ck = d.checkpoint(&sb.id, true);
        let fork = d.fork(&ck.id, 1, false);
        let branch = &fork.branches[0].id;
        let info: SandboxInfo = d
            .client
            .call("GET", &format!("/v1/sandboxes/{branch}"), None)
            .unwrap();
        assert_eq!(info.seccomp, forkd::api::Seccomp::Default);
        // The restored processes carry the filter: the counter's shell, and what the
        // branch starts.
        let (_, status, _) = d.sh(branch, "grep -h Seccomp: /proc/1/status /proc/self/status");
        assert_eq!(status.matches("Seccomp:\t2").count(), 2, "{status}");
        battery(
            &d,
            branch,
            &probe,
            &format!("{image} branch"),
            (&sibling_addr, ENETUNREACH),
        );
        let n = d.read_number(branch, "/tmp/n");
        assert!(
            wait_until(std::time::Duration::from_secs(10), || d
                .read_number(branch, "/tmp/n")
                > n),
            "the branch's counter stopped"
        );
    }
    assert_eq!(before, host_state(), "the host changed");
    let _ = std::fs::remove_file(&probe);
}

#[test]
fn an_unconfined_sandbox_runs_without_the_filter_and_says_so() {
    let name = "an_unconfined_sandbox_runs_without_the_filter_and_says_so";
    if !can_run(name) {
        return;
    }
    let d = TestDaemon::start("walls-unconfined");
    let sb = d.create(serde_json::json!({ "image": "busybox", "seccomp": "unconfined" }));
    assert_eq!(sb.seccomp, forkd::api::Seccomp::Unconfined);
    let (_, status, _) = d.sh(&sb.id, "grep Seccomp: /proc/self/status");
    assert_eq!(status.trim(), "Seccomp:\t0");
    // What the filter refuses is the kernel's again: a user namespace (the sandbox's
    // capabilities still keep mounts out of reach outside it).
    let (code, _, err) = d.sh(&sb.id, "unshare -U true");
    assert_eq!(code, 0, "{err}");
    // A filesystem checkpoint's branch keeps the choice.
    let ck = d.checkpoint(&sb.id, false);
    let fork = d.fork(&ck.id, 1, false);
    let b = &fork.branches[0].id;
    let (_, status, _) = d.sh(b, "grep Seccomp: /proc/self/status");
    assert_eq!(status.trim(), "Seccomp:\t0");
    // The CLI's spelling, and a bad one refused by name.
    let out = d.cli(&[
        "run",
        "-d",
        "--security-opt",
        "seccomp=unconfined",
        "busybox",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = d.cli(&["inspect", &id]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"seccomp\": \"unconfined\""));
    let out = d.cli(&["run", "-d", "--security-opt", "seccomp=off", "busybox"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("seccomp \"off\" is not known"), "{err}");
    let out = d.cli(&[
        "run",
        "-d",
        "--security-opt",
        "apparmor=unconfined",
        "busybox",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--security-opt \"apparmor=unconfined\" is not supported"),
        "{err}"
    );
    // The API refuses an unknown value by name too.
    let r: Result<SandboxInfo, _> = d.client.call(
        "POST",
        "/v1/sandboxes",
        Some(&serde_json::json!({ "image": "busybox", "seccomp": "off" })),
    );
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("seccomp") || e.contains("unknown variant"),
        "{e}"
    );
}

/// A small filesystem of the test's own, mounted for the daemon's state root; unmounted
/// and removed when dropped.
struct SmallDisk {
    image: PathBuf,
    mount: PathBuf,
}

impl SmallDisk {
    fn new(tag: &str, mib: u64) -> SmallDisk {
        let image = PathBuf::from(format!("/tmp/forkd-test-{tag}-{}.disk", std::process::id()));
        let mount = PathBuf::from(format!("/tmp/forkd-test-{tag}-{}.mnt", std::process::id()));
        std::fs::File::create(&image)
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
        let ok = |c: &mut std::process::Command| assert!(c.status().unwrap().success(), "{c:?}");
        ok(std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&image));
        std::fs::create_dir_all(&mount).unwrap();
        ok(std::process::Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount));
        SmallDisk { image, mount }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        for m in [self.mount.join("root/vol"), self.mount.clone()] {
            let _ = std::process::Command::new("umount")
                .arg(m)
                .stderr(std::process::Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir(&self.mount);
        let _ = std::fs::remove_file(&self.image);
    }
}

fn health(d: &TestDaemon) -> forkd::api::Health {
    d.client
        .call("GET", "/v1/health", None)
        .expect("GET /v1/health")
}

#[test]
fn a_full_disk_gives_the_writer_enospc_and_the_node_goes_on() {
    let name = "a_full_disk_gives_the_writer_enospc_and_the_node_goes_on";
    if !can_run_criu(name) {
        return;
    }
    // A 1.2 GB disk under a volume allowed to grow to 4 GiB.
    let disk = SmallDisk::new("full-disk", 1200);
    let root = disk.mount.join("root");
    let d = TestDaemon::start_at("full-disk", &[("FORKD_VOLUME_SIZE", "4G")], Some(&root));
    assert!(
        d.log().contains("has room for"),
        "no word of the disk's size at start: {}",
        d.log()
    );
    let h = health(&d);
    assert!(h.ok, "{:?}", h.degraded);
    assert!(h.volume.size_bytes < h.volume.max_bytes);
    let counter = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "argv": ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done"] }
    }));
    let before = d.checkpoint(&counter.id, true);
    let writer = d.busybox();
    // Health is sampled while the writer fills the disk.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (stop, client) = (stop.clone(), d.client.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(h) = client.call::<forkd::api::Health>("GET", "/v1/health", None) {
                    seen.extend(h.volume.pressure);
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            seen
        })
    };
    let (code, out, err) = d.sh(
        &writer.id,
        "dd if=/dev/urandom of=/root/big bs=1M count=1500 2>&1; echo rc=$?",
    );
    assert_eq!(code, 0, "{err}");
    // The writer is told: by btrfs when the volume filled, or (where the volume has
    // quotas) by the disk limit the daemon gave it, the largest writer, once the volume
    // was down to its reserve.
    assert!(
        (out.contains("No space left on device") || out.contains("Disk quota exceeded"))
            && out.contains("rc=1"),
        "the writer was not told: {out}"
    );
    // Still full: the health endpoint says so, and a create is refused with the reason.
    let h = health(&d);
    let pressure = h
        .volume
        .pressure
        .clone()
        .expect("pressure while the disk is full");
    assert!(
        pressure.contains("the volume is") && pressure.contains("cannot grow"),
        "{pressure}"
    );
    assert!(!h.ok && h.volume.problems.is_empty(), "{h:?}");
    let r: Result<SandboxInfo, _> = d.client.call(
        "POST",
        "/v1/sandboxes",
        Some(&serde_json::json!({ "image": "busybox" })),
    );
    let e = r.unwrap_err().to_string();
    assert!(e.contains("create refused: the volume is"), "{e}");
    if h.disk_limits.ok {
        // The writer was the one stopped, and the other sandbox's counter goes on while
        // the writer's file is still there.
        assert!(
            pressure.contains(&format!("sandbox {}, its largest writer", writer.id)),
            "{pressure}"
        );
        let n = d.read_number(&counter.id, "/tmp/n");
        assert!(
            wait_until(std::time::Duration::from_secs(10), || d
                .read_number(&counter.id, "/tmp/n")
                > n),
            "the other sandbox's counter stopped while the volume was full"
        );
        // And the stopped writer cannot take the reserve.
        let (_, out, _) = d.sh(
            &writer.id,
            "dd if=/dev/zero of=/root/more bs=1M count=64 2>&1",
        );
        assert!(out.contains("Disk quota exceeded"), "{out}");
    }
    // The volume stayed writable: no read-only remount, no device error.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let vol = root.join("vol");
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(vol.to_str().unwrap()))
        .expect("the volume's mount");
    assert!(line.split(' ').nth(5).unwrap().starts_with("rw"), "{line}");
    // Space comes back: the same daemon creates and forks again.
    let (code, _, err) = d.sh(&writer.id, "rm /root/big && sync");
    assert_eq!(code, 0, "{err}");
    assert!(
        wait_until(std::time::Duration::from_secs(15), || health(&d)
            .volume
            .pressure
            .is_none()),
        "the pressure did not clear"
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = sampler.join().unwrap();
    assert!(
        !seen.is_empty(),
        "GET /v1/health never reported the pressure while it lasted"
    );
    let n = d.read_number(&counter.id, "/tmp/n");
    assert!(
        wait_until(std::time::Duration::from_secs(10), || d
            .read_number(&counter.id, "/tmp/n")
            > n),
        "the other sandbox's counter stopped"
    );
    let fork = d.fork(&before.id, 1, false);
    let b = &fork.branches[0].id;
    let n = d.read_number(b, "/tmp/n");
    assert!(n > 0);
    assert!(
        wait_until(std::time::Duration::from_secs(10), || d
            .read_number(b, "/tmp/n")
            > n),
        "the branch of the checkpoint taken before does not count"
    );
    let again = d.busybox();
    assert_eq!(d.sh(&again.id, "echo ok").1.trim(), "ok");
    assert!(health(&d).ok);
    drop(d);
    drop(disk);
}

/// Writes `mib` MiB to `path` in `id`: Ok, or the error `dd` printed.
fn write_mib(d: &TestDaemon, id: &str, path: &str, mib: u64) -> Result<(), String> {
    let (code, out, err) = d.sh(
        id,
        &format!("dd if=/dev/urandom of={path} bs=1M count={mib} 2>&1 && sync"),
    );
    if code == 0 {
        Ok(())
    } else {
        Err(format!("{out}{err}"))
    }
}

fn disk_used(d: &TestDaemon, id: &str) -> u64 {
    let info: SandboxInfo = d
        .client
        .call("GET", &format!("/v1/sandboxes/{id}"), None)
        .unwrap();
    info.disk_used_bytes.expect("disk_used_bytes in inspect")
}

const MIB: u64 = 1 << 20;

#[test]
fn disk_limits_charge_each_sandbox_and_branch_its_own_writes() {
    let name = "disk_limits_charge_each_sandbox_and_branch_its_own_writes";
    if !can_run_criu(name) {
        return;
    }
    let d = TestDaemon::start("walls-disk");
    let h = health(&d);
    if !h.disk_limits.ok {
        // A kernel without btrfs simple quotas refuses a disk limit by name.
        let r: Result<SandboxInfo, _> = d.client.call(
            "POST",
            "/v1/sandboxes",
            Some(&serde_json::json!({ "image": "busybox", "limits": { "disk_bytes": 64 * MIB } })),
        );
        let e = r.unwrap_err().to_string();
        assert!(e.contains("disk limits need Linux 6.7"), "{e}");
        return;
    }
    let limited = d.create(serde_json::json!({
        "image": "busybox",
        "limits": { "disk_bytes": 64 * MIB },
        "command": { "argv": ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done"] }
    }));
    assert_eq!(limited.limits.disk_bytes, Some(64 * MIB));
    let neighbour = d.busybox();
    write_mib(&d, &limited.id, "/root/a", 40).unwrap();
    let e = write_mib(&d, &limited.id, "/root/b", 40).unwrap_err();
    assert!(e.contains("Disk quota exceeded"), "past the limit: {e}");
    let used = disk_used(&d, &limited.id);
    assert!(used > 60 * MIB && used <= 64 * MIB, "charged {used}");
    // The neighbour, without a limit, writes on.
    write_mib(&d, &neighbour.id, "/root/big", 100).unwrap();
    assert!(disk_used(&d, &neighbour.id) >= 100 * MIB);
    // The image's layers cost nothing: a large file of the image rewritten in place is
    // a copy-up, charged; reading it is not.
    let (code, _, _) = d.sh(&limited.id, "cat /bin/busybox > /dev/null");
    assert_eq!(code, 0);
    // Room again once the file is gone (no checkpoint holds it yet).
    let (code, _, err) = d.sh(&limited.id, "rm -f /root/b && sync");
    assert_eq!(code, 0, "{err}");
    assert!(
        wait_until(std::time::Duration::from_secs(10), || disk_used(
            &d,
            &limited.id
        ) < 48 * MIB),
        "the removed file is still charged: {}",
        disk_used(&d, &limited.id)
    );
    // Branches of a live checkpoint: each is charged only what it writes itself, under
    // the checkpoint's limit, or the one the fork asks for.
    let ck = d.checkpoint(&limited.id, true);
    let fork = d.fork(&ck.id, 2, false);
    for b in &fork.branches {
        assert!(
            disk_used(&d, &b.id) < 4 * MIB,
            "a fresh branch is charged its parent's data"
        );
        write_mib(&d, &b.id, "/root/own", 50).unwrap();
        let e = write_mib(&d, &b.id, "/root/more", 30).unwrap_err();
        assert!(e.contains("Disk quota exceeded"), "{e}");
        // It still reads what it inherited; once it frees what went past its limit, its
        // counter (whose writes the full quota refused meanwhile) goes on.
        let (code, _, _) = d.sh(&b.id, "test -s /root/a && rm -f /root/more && sync");
        assert_eq!(code, 0);
        let n = d.read_number(&b.id, "/tmp/n");
        assert!(wait_until(std::time::Duration::from_secs(10), || d
            .read_number(&b.id, "/tmp/n")
            > n));
    }
    let small: forkd::api::ForkResult = d
        .client
        .call(
            "POST",
            &format!("/v1/checkpoints/{}/fork", ck.id),
            Some(&serde_json::json!({ "count": 1, "disk_bytes": 8 * MIB })),
        )
        .unwrap();
    let b = &small.branches[0].id;
    let e = write_mib(&d, b, "/root/x", 16).unwrap_err();
    assert!(e.contains("Disk quota exceeded"), "{e}");
    // The CLI's spelling, and a limit too small refused by name.
    let out = d.cli(&["run", "-d", "--disk", "32m", "busybox"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(write_mib(&d, &id, "/root/x", 40).is_err());
    let r: Result<SandboxInfo, _> = d.client.call(
        "POST",
        "/v1/sandboxes",
        Some(&serde_json::json!({ "image": "busybox", "limits": { "disk_bytes": 1000 } })),
    );
    let e = r.unwrap_err().to_string();
    assert!(e.contains("disk_bytes 1000 is too small"), "{e}");
}

#[test]
fn a_memory_bomb_a_fork_bomb_and_a_disk_filler_leave_the_node_and_its_neighbours_running() {
    let name =
        "a_memory_bomb_a_fork_bomb_and_a_disk_filler_leave_the_node_and_its_neighbours_running";
    if !can_run_criu(name) {
        return;
    }
    // The operator's defaults bound what a request leaves unset: tasks (2048 without
    // being told), memory and disk. The disk is small, so a filler without its limit
    // would fill it.
    let disk = SmallDisk::new("greedy", 1500);
    let root = disk.mount.join("root");
    let d = TestDaemon::start_at(
        "greedy",
        &[
            ("FORKD_DEFAULT_MEMORY", "256m"),
            ("FORKD_DEFAULT_DISK", "256m"),
        ],
        Some(&root),
    );
    let quotas = health(&d).disk_limits.ok;
    // All sandboxes together are bounded below the machine's memory.
    let total_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    let bound = [
        "/sys/fs/cgroup/memory/forkd/memory.limit_in_bytes",
        "/sys/fs/cgroup/forkd/memory.max",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .expect("the forkd cgroup's memory bound");
    let bound: u64 = bound.trim().parse().expect("a bound, not max");
    assert!(
        bound < total_kib << 10,
        "sandboxes may use {bound} of {} bytes",
        total_kib << 10
    );
    assert!(
        d.log().contains("all sandboxes together may use"),
        "{}",
        d.log()
    );
    const COUNT: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done";
    let counters: Vec<SandboxInfo> = (0..20)
        .map(|_| d.create(serde_json::json!({ "image": "busybox", "command": { "shell": COUNT } })))
        .collect();
    assert_eq!(counters[0].limits.pids, Some(2048));
    assert_eq!(counters[0].limits.memory_bytes, Some(256 << 20));
    let ck = d.checkpoint(&counters[0].id, true);
    let before: Vec<u64> = counters
        .iter()
        .map(|c| d.read_number(&c.id, "/tmp/n"))
        .collect();
    // The three at once.
    let bombs = [
        ("memory", "x=0123456789abcdef; while true; do x=$x$x; done"),
        ("fork", "b() { b | b & }; b"),
        (
            "disk",
            "while true; do dd if=/dev/zero of=/root/fill.$$ bs=1M count=4096; sleep 0.2; done",
        ),
    ];
    let bomb_ids: Vec<(String, &str)> = bombs
        .iter()
        .map(|(what, line)| {
            let sb =
                d.create(serde_json::json!({ "image": "busybox", "command": { "shell": line } }));
            (sb.id, *what)
        })
        .collect();
    // The daemon answers throughout.
    let start = std::time::Instant::now();
    let mut answered = 0;
    while start.elapsed() < std::time::Duration::from_secs(15) {
        let r: Result<serde_json::Value, _> = d.client.call("GET", "/v1/sandboxes", None);
        r.expect("the daemon stopped answering");
        answered += 1;
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(answered > 10);
    // Each bomb met its bound: the memory bomb its limit (killed in its own cgroup),
    // the fork bomb its task limit, the filler its disk limit.
    let info = |id: &str| -> SandboxInfo {
        d.client
            .call("GET", &format!("/v1/sandboxes/{id}"), None)
            .unwrap()
    };
    let (mem, fork, fill) = (&bomb_ids[0].0, &bomb_ids[1].0, &bomb_ids[2].0);
    let m = info(mem);
    assert!(
        m.oom_kills.unwrap_or(0) > 0 || m.memory_bytes.unwrap_or(0) <= 256 << 20,
        "{m:?}"
    );
    let f = info(fork);
    assert_eq!(f.limits.pids, Some(2048));
    if quotas {
        let used = info(fill).disk_used_bytes.unwrap();
        assert!(used <= 256 << 20, "the filler holds {used} bytes");
    }
    // Every counter went on, the volume is writable, health is good.
    let after: Vec<u64> = counters
        .iter()
        .map(|c| d.read_number(&c.id, "/tmp/n"))
        .collect();
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert!(a > b, "counter {i} stopped: {b} then {a}");
    }
    for (id, _) in &bomb_ids {
        let _: serde_json::Value = d
            .client
            .call("DELETE", &format!("/v1/sandboxes/{id}?force=true"), None)
            .expect("remove a bomb");
    }
    let h = health(&d);
    assert!(h.ok, "{:?}", h.degraded);
    // The checkpoint taken before still forks, and its branch counts on.
    let fork = d.fork(&ck.id, 1, false);
    let b = &fork.branches[0].id;
    let n = d.read_number(b, "/tmp/n");
    assert!(wait_until(std::time::Duration::from_secs(10), || d
        .read_number(b, "/tmp/n")
        > n));
    drop(d);
    drop(disk);
}

/// One entry of a forged archive: kind, path, link target, mode, data.
type Forged<'a> = (tar::EntryType, &'a str, Option<&'a str>, u32, &'a [u8]);

/// A tar of `entries`.
fn crafted_tar(entries: &[Forged]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (kind, path, link, mode, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        if let Some(l) = link {
            h.set_link_name(l).unwrap();
        }
        // The name as given, unchecked (the tar crate refuses `..` when it sets one).
        let name = path.as_bytes();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap()
}

#[test]
fn cp_out_of_a_sandbox_that_forges_its_archives_writes_nothing_outside_the_destination() {
    let name =
        "cp_out_of_a_sandbox_that_forges_its_archives_writes_nothing_outside_the_destination";
    if !can_run(name) {
        return;
    }
    let d = TestDaemon::start("walls-cp");
    let sb = d.busybox();
    let work = d.root.parent().unwrap().join("walls-cp");
    let target = work.join("host-target");
    std::fs::create_dir_all(&target).unwrap();
    let t = target.to_str().unwrap();
    let tars = [
        // A symlink to a host directory, then a file through it.
        crafted_tar(&[
            (tar::EntryType::Directory, "x", None, 0o755, b""),
            (tar::EntryType::Symlink, "x/link", Some(t), 0o777, b""),
            (
                tar::EntryType::Regular,
                "x/link/pwned",
                None,
                0o644,
                b"owned",
            ),
        ]),
        // A hard link to a host file, then new contents for it.
        crafted_tar(&[
            (tar::EntryType::Directory, "y", None, 0o755, b""),
            (
                tar::EntryType::Link,
                "y/h",
                Some("/etc/hostname"),
                0o644,
                b"",
            ),
            (tar::EntryType::Regular, "y/h", None, 0o644, b"owned"),
        ]),
        // A path that leaves the destination; a device node.
        crafted_tar(&[(tar::EntryType::Regular, "../escaped", None, 0o644, b"")]),
        crafted_tar(&[(tar::EntryType::Char, "null", None, 0o644, b"")]),
        // A setuid program.
        crafted_tar(&[(
            tar::EntryType::Regular,
            "tool",
            None,
            0o4755,
            b"#!/bin/sh\n",
        )]),
        // Beside what was asked for, a file for the destination directory.
        crafted_tar(&[
            (tar::EntryType::Regular, "anything", None, 0o644, b"asked"),
            (tar::EntryType::Regular, ".bashrc", None, 0o644, b"owned"),
        ]),
    ];
    for (i, tar) in tars.iter().enumerate() {
        d.put_file(&sb.id, &format!("/forged{i}.tar"), tar);
    }
    // The sandbox's root replaces the program `forkd cp` runs in it with one that
    // answers with an archive of its own making (removed first: it is running as PID 1).
    let (code, _, err) = d.sh(
        &sb.id,
        "rm -f /.forkd/init && printf '#!/bin/sh\\ncat /forged$(cat /which).tar\\n' > /.forkd/init && chmod 755 /.forkd/init",
    );
    assert_eq!(code, 0, "{err}");
    let forge = |i: usize| {
        let (code, _, err) = d.sh(&sb.id, &format!("echo {i} > /which"));
        assert_eq!(code, 0, "{err}");
    };
    let cp_out = |dest: &std::path::Path| {
        d.cli(&[
            "cp",
            &format!("{}:/anything", sb.id),
            dest.to_str().unwrap(),
        ])
    };
    forge(0);
    let dest = work.join("out1");
    let out = cp_out(&dest);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("symlink; refusing to write through it"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !target.join("pwned").exists(),
        "cp wrote through the sandbox's symlink"
    );
    forge(1);
    let before = std::fs::read("/etc/hostname").ok();
    let out = cp_out(&work.join("out2"));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is a hard link"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read("/etc/hostname").ok(), before);
    // Paths that leave the destination, and a device node.
    for i in [2, 3] {
        forge(i);
        let out = cp_out(&work.join("out3"));
        assert!(!out.status.success(), "forged archive {i} was unpacked");
    }
    assert!(!work.join("escaped").exists());
    // A setuid program arrives without its setuid bit.
    forge(4);
    let out = cp_out(&work.join("tool"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    forge(5);
    let out = d.cli(&[
        "cp",
        &format!("{}:/anything", sb.id),
        work.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not below anything"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !work.join(".bashrc").exists(),
        "cp wrote beside what was asked for"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(work.join("tool"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755);
    // Into the sandbox: a host symlink arrives as a symlink, resolved inside the sandbox.
    let other = d.busybox();
    std::os::unix::fs::symlink("/etc/hostname", work.join("hostlink")).unwrap();
    let out = d.cli(&[
        "cp",
        work.join("hostlink").to_str().unwrap(),
        &format!("{}:/root/", other.id),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, link, _) = d.sh(&other.id, "readlink /root/hostlink; cat /root/hostlink");
    let host_name = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    assert!(link.starts_with("/etc/hostname\n"), "{link}");
    assert!(
        !link.contains(host_name.trim()) || host_name.trim().is_empty(),
        "the host's file came in: {link}"
    );
    let _ = std::fs::remove_dir_all(&work);
}
