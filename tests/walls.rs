//! The walls around a sandbox against a hostile agent: the system-call filter and what
//! the sandbox's capabilities and mounts refuse. An escape battery (`tests/walls/probe.c`,
//! built statically here) runs as root in a busybox and a Debian sandbox, and again in a
//! branch of a live checkpoint of each: every attempt fails with the errno expected, and
//! nothing on the host changes. A sandbox made `unconfined` runs without the filter and
//! says so; archives a sandbox forges write nothing outside `forkd cp`'s destination.
//! Greedy neighbours (disk, memory, tasks) are `tests/disk.rs`.

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
    if !have_program(name, "cc") {
        return;
    }
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
