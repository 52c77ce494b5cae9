//! Sandboxes against a real daemon: lifecycle, exec, isolation, limits, recovery.

#![forbid(unsafe_code)]

mod common;

use common::*;
use forkd::api::{SandboxInfo, SandboxStatus};
use std::time::Duration;

#[test]
fn lifecycle_run_exec_stop_rm() {
    if !can_run("lifecycle_run_exec_stop_rm") {
        return;
    }
    let d = TestDaemon::start("lifecycle");
    let sb = d.create(serde_json::json!({
        "image": "busybox",
        "hostname": "box1",
        "command": { "shell": "echo started; while true; do sleep 1; done" }
    }));
    assert_eq!(sb.status, SandboxStatus::Running);
    let (code, out, _) = d.sh(&sb.id, "hostname; echo $HOME; pwd");
    assert_eq!((code, out.as_str()), (0, "box1\n/root\n/\n"));
    // Exit codes, env, cwd and user come through.
    let r = d.exec(&sb.id, serde_json::json!({ "argv": ["sh", "-c", "echo $FOO; pwd; id -u; exit 3"], "env": ["FOO=bar"], "cwd": "/tmp", "user": "nobody" })).unwrap();
    assert_eq!(r.exit.exit_code, 3);
    assert_eq!(
        String::from_utf8(decode(&r.stdout_b64)).unwrap(),
        "bar\n/tmp\n65534\n"
    );
    // A missing program is a clear error, not a hang.
    let err = d
        .exec(&sb.id, serde_json::json!({ "argv": ["no-such-program"] }))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no-such-program: command not found"), "{err}");
    // The main command's output is in its log.
    let mut log = Vec::new();
    for _ in 0..100 {
        log = d
            .client
            .raw("GET", &format!("/v1/sandboxes/{}/logs", sb.id), &[])
            .unwrap()
            .body;
        if !log.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(log, b"started\n");
    // rm without force is refused while running.
    let err = d
        .client
        .call::<serde_json::Value>("DELETE", &format!("/v1/sandboxes/{}", sb.id), None)
        .unwrap_err();
    assert!(err.to_string().contains("is running"), "{err}");
    // stop is idempotent and cleans up mounts and cgroups.
    for _ in 0..2 {
        let info: SandboxInfo = d
            .client
            .call(
                "POST",
                &format!("/v1/sandboxes/{}/stop", sb.id),
                Some(&serde_json::json!({"grace_secs": 2})),
            )
            .unwrap();
        assert_eq!(info.status, SandboxStatus::Stopped);
    }
    assert!(d.sandbox_mounts().is_empty(), "{:?}", d.sandbox_mounts());
    assert!(!cgroup_exists(&sb.id));
    let err = d
        .exec(&sb.id, serde_json::json!({ "argv": ["true"] }))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not running"), "{err}");
    d.remove(&sb.id);
    let err = d
        .client
        .call::<serde_json::Value>("DELETE", &format!("/v1/sandboxes/{}", sb.id), None)
        .unwrap_err();
    assert!(err.to_string().contains("no such sandbox"), "{err}");
    assert!(!d.data().join("sandboxes").join(&sb.id).exists());
}

#[test]
fn exec_output_is_binary_safe_and_large() {
    if !can_run("exec_output_is_binary_safe_and_large") {
        return;
    }
    let d = TestDaemon::start("binary");
    let sb = d.busybox();
    let r = d.exec(&sb.id, serde_json::json!({ "shell": "head -c 6000000 /dev/zero | tr '\\0' '\\377'; printf 'e\\0rr' >&2" })).unwrap();
    let out = decode(&r.stdout_b64);
    assert_eq!(out.len(), 6_000_000);
    assert!(out.iter().all(|&b| b == 0xff));
    assert_eq!(decode(&r.stderr_b64), b"e\0rr");
    // Binary stdin round trip, of many pipes' worth: `cat` writes back while it is
    // still being fed, and neither side may wait on the other.
    let input: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let r = d
        .exec(
            &sb.id,
            serde_json::json!({ "argv": ["cat"], "stdin_b64": forkd::api::b64::encode(&input) }),
        )
        .unwrap();
    assert_eq!(decode(&r.stdout_b64), input);
}

#[test]
fn exec_merges_output_in_order_and_caps_it() {
    if !can_run("exec_merges_output_in_order_and_caps_it") {
        return;
    }
    let d = TestDaemon::start("merged");
    let sb = d.busybox();
    // One process alternating streams: merged, the order is exactly the order written.
    let line = "for i in 1 2 3 4 5 6 7 8; do echo out$i; echo err$i >&2; done";
    let r = d
        .exec(
            &sb.id,
            serde_json::json!({ "shell": line, "merge_stderr": true }),
        )
        .unwrap();
    let want: String = (1..=8).map(|i| format!("out{i}\nerr{i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&decode(&r.output_b64)), want);
    assert_eq!(decode(&r.stdout_b64), decode(&r.output_b64));
    assert!(r.stderr_b64.is_empty());
    assert_eq!(r.output_bytes, want.len() as u64);
    assert!(!r.truncated);
    // Apart: each stream on its own, and the merged form holds both.
    let r = d
        .exec(&sb.id, serde_json::json!({ "shell": line }))
        .unwrap();
    let (out, err) = (decode(&r.stdout_b64), decode(&r.stderr_b64));
    assert_eq!(
        String::from_utf8_lossy(&out),
        (1..=8).map(|i| format!("out{i}\n")).collect::<String>()
    );
    assert_eq!(
        String::from_utf8_lossy(&err),
        (1..=8).map(|i| format!("err{i}\n")).collect::<String>()
    );
    assert_eq!(decode(&r.output_b64).len(), out.len() + err.len());
    // A command that prints far more than the cap runs to its end; the answer keeps the
    // first bytes and says how many were written.
    let r = d
        .exec(
            &sb.id,
            serde_json::json!({ "shell": "head -c 50000000 /dev/zero; echo done >&2; exit 7", "output_limit": 4096, "merge_stderr": true }),
        )
        .unwrap();
    assert_eq!(r.exit.exit_code, 7);
    assert!(r.truncated);
    assert_eq!(r.output_bytes, 50_000_005);
    assert_eq!(decode(&r.output_b64).len(), 4096);
    // The default cap holds without a limit in the request.
    let r = d
        .exec(
            &sb.id,
            serde_json::json!({ "shell": "head -c 20000000 /dev/zero" }),
        )
        .unwrap();
    assert!(r.truncated);
    assert_eq!(
        decode(&r.stdout_b64).len() as u64,
        forkd::api::DEFAULT_OUTPUT_LIMIT
    );
    // Bad combinations and limits are refused by name.
    for (body, word) in [
        (
            serde_json::json!({ "shell": "true", "output_limit": 1u64 << 40 }),
            "output_limit",
        ),
        (
            serde_json::json!({ "shell": "true", "merge_stderr": true, "tty": true }),
            "merge_stderr",
        ),
    ] {
        let e = d.exec(&sb.id, body).unwrap_err().to_string();
        assert!(e.contains(word), "{e}");
    }
    d.remove(&sb.id);
}

#[test]
fn exec_timeout_kills_the_whole_tree() {
    if !can_run("exec_timeout_kills_the_whole_tree") {
        return;
    }
    let d = TestDaemon::start("timeout");
    let sb = d.busybox();
    let r = d
        .exec(&sb.id, serde_json::json!({ "shell": "sleep 1000 & setsid sh -c 'sleep 1001 & sleep 1002' & echo started; sleep 1003", "timeout_ms": 700 }))
        .unwrap();
    assert!(r.exit.timed_out);
    assert_eq!(r.exit.exit_code, 137);
    assert_eq!(decode(&r.stdout_b64), b"started\n");
    let (_, ps, _) = d.sh(&sb.id, "ps -o pid,args");
    assert!(
        !ps.contains("sleep 10"),
        "grandchildren survived the timeout:\n{ps}"
    );
    // A command that ends on time is not reported as timed out.
    let r = d
        .exec(
            &sb.id,
            serde_json::json!({ "argv": ["true"], "timeout_ms": 5000 }),
        )
        .unwrap();
    assert!(!r.exit.timed_out);
    // The CLI reports a timeout distinctly, with exit code 124.
    let out = d.cli(&["exec", "--timeout", "0.3", &sb.id, "--", "sleep", "100"]);
    assert_eq!(out.status.code(), Some(124));
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out"));
}

#[test]
fn sandbox_is_isolated_from_the_host() {
    if !can_run("sandbox_is_isolated_from_the_host") {
        return;
    }
    let d = TestDaemon::start("isolation");
    let sb = d.busybox();
    // Processes: only the sandbox's own, with the init as PID 1.
    let (_, ps, _) = d.sh(&sb.id, "ps -o pid,args");
    assert!(
        ps.lines()
            .any(|l| l.trim_start().starts_with("1 ") && l.contains("forkd-init")),
        "{ps}"
    );
    assert!(
        !ps.contains("forkd daemon") && !ps.contains("cargo"),
        "host processes visible:\n{ps}"
    );
    // Files: a marker on the host is not visible; the old root is gone.
    let marker = std::env::temp_dir().join(format!("forkd-host-marker-{}", std::process::id()));
    std::fs::write(&marker, "host").unwrap();
    let (code, _, _) = d.sh(&sb.id, &format!("test -e {}", marker.display()));
    assert_ne!(code, 0, "host file visible in the sandbox");
    let (_, mounts, _) = d.sh(&sb.id, "cat /proc/self/mountinfo");
    let mut points: Vec<&str> = mounts.lines().filter_map(|l| l.split(' ').nth(4)).collect();
    points.sort();
    // /proc's host-wide knobs are read-only binds (those this kernel has).
    let host_wide: Vec<String> = ["sys", "sysrq-trigger", "irq", "bus", "fs"]
        .iter()
        .filter(|p| std::path::Path::new("/proc").join(p).exists())
        .map(|p| format!("/proc/{p}"))
        .collect();
    // /dev is a directory of the root filesystem, not a mount (only its devpts is).
    let mut expected: Vec<&str> = vec!["/", "/dev/pts", "/proc", "/sys"];
    expected.extend(host_wide.iter().map(String::as_str));
    expected.sort();
    assert_eq!(points, expected, "unexpected mounts:\n{mounts}");
    // A global sysctl cannot be written (it would act on the host).
    let (code, _, err) = d.sh(&sb.id, "echo 1 > /proc/sys/vm/drop_caches");
    assert_ne!(code, 0, "wrote a host-wide sysctl from the sandbox");
    assert!(err.contains("Read-only"), "{err}");
    std::fs::remove_file(&marker).unwrap();
    // Mounting is not allowed (no CAP_SYS_ADMIN in the bounding set).
    let (code, _, err) = d.sh(&sb.id, "mkdir -p /mnt/x && mount -t tmpfs none /mnt/x");
    assert_ne!(code, 0, "mount succeeded inside the sandbox");
    assert!(
        err.contains("denied") || err.contains("not permitted"),
        "{err}"
    );
    // No device nodes: one made inside would reach the host's device (here the loop
    // control device).
    let (code, _, err) = d.sh(&sb.id, "mknod /tmp/lc c 10 237");
    assert_ne!(
        code, 0,
        "mknod of a character device succeeded inside the sandbox"
    );
    assert!(err.contains("not permitted"), "{err}");
    let (_, status, _) = d.sh(&sb.id, "grep -E 'CapBnd|NoNewPrivs' /proc/self/status");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    // Network: a server on the host's loopback is unreachable.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (code, _, _) = d.sh(&sb.id, &format!("echo hi | nc -w 1 127.0.0.1 {port}"));
    assert_ne!(code, 0, "connected to the host's loopback");
    assert!(
        listener.accept().is_err(),
        "the host's server saw a connection from the sandbox"
    );
    let (_, ifaces, _) = d.sh(&sb.id, "cat /proc/net/dev");
    assert!(
        ifaces.contains("lo:") && ifaces.lines().count() == 3,
        "unexpected interfaces:\n{ifaces}"
    );
    // No host descriptor leaks into the sandbox's processes.
    let (_, fds, _) = d.sh(&sb.id, "ls -l /proc/1/fd");
    assert!(
        !fds.contains("socket:") || fds.matches("socket:").count() <= 2,
        "{fds}"
    );
    // The one pipe it holds is its own: both ends of the hand-over pipe its relays
    // write detached commands to (crate forkd_sandbox::init).
    let pipes: std::collections::BTreeSet<&str> = fds
        .split_whitespace()
        .filter(|w| w.starts_with("pipe:"))
        .collect();
    assert!(
        !fds.contains("/tmp/forkd-test") && pipes.len() <= 1 && fds.matches("pipe:").count() <= 2,
        "init holds host descriptors:\n{fds}"
    );
}

/// The classic way out of a `chroot`: a process that may chroot (root in the sandbox
/// keeps CAP_SYS_CHROOT) chroots into a subdirectory while holding a descriptor of the
/// old root, walks `..` from there and chroots at the top. A sandbox's root is stacked on
/// an empty tmpfs rather than pivoted into (docs/DESIGN.md, "Many sandboxes"): the walk
/// up crosses from the root to that tmpfs and straight back up onto the root, so the
/// top it reaches is the sandbox's own root. From a branch too, whose root CRIU
/// restored.
#[test]
fn a_chroot_escape_ends_at_the_sandboxs_own_root() {
    let name = "a_chroot_escape_ends_at_the_sandboxs_own_root";
    if !can_run_criu(name) {
        return;
    }
    let Some(image) = fixture(name, "images/debian.tar.zst", "debian") else {
        return;
    };
    let d = TestDaemon::start("chroot-escape");
    d.import(&image, "debian");
    let sb = d.create(
        serde_json::json!({ "image": "debian", "command": { "argv": ["sleep", "infinity"] } }),
    );
    const ESCAPE: &str = r#"
import os, sys
before = sorted(os.listdir("/"))
os.makedirs("/tmp/jail", exist_ok=True)
old = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
os.chroot("/tmp/jail")
os.fchdir(old)
for _ in range(64):
    os.chdir("..")
os.chroot(".")
after = sorted(os.listdir("/"))
print("same" if after == before else "escaped: %r" % after)
print("host file visible" if os.path.exists(sys.argv[1]) else "no host file")
"#;
    d.put_file(&sb.id, "/tmp/escape.py", ESCAPE.as_bytes());
    let marker = std::env::temp_dir().join(format!("forkd-escape-marker-{}", std::process::id()));
    std::fs::write(&marker, "host").unwrap();
    let ck = d.checkpoint(&sb.id, true);
    let br = d.fork(&ck.id, 1, false).branches.remove(0);
    for id in [&sb.id, &br.id] {
        let (code, out, err) = d.sh(id, &format!("python3 /tmp/escape.py {}", marker.display()));
        assert_eq!(code, 0, "sandbox {id}: {err}");
        assert_eq!(out, "same\nno host file\n", "sandbox {id}");
    }
    std::fs::remove_file(&marker).unwrap();
}

#[test]
fn limits_stop_fork_bombs_and_memory_hogs() {
    if !can_run("limits_stop_fork_bombs_and_memory_hogs") {
        return;
    }
    let d = TestDaemon::start("limits");
    let other = d.busybox();
    let sb = d.create(serde_json::json!({ "image": "busybox", "limits": { "pids": 64, "memory_bytes": 67108864 } }));
    // A fork bomb hits pids.max; the timeout then kills the whole tree.
    let r = d.exec(&sb.id, serde_json::json!({ "shell": "bomb() { bomb | bomb & }; bomb; sleep 5", "timeout_ms": 3000 })).unwrap();
    assert!(r.exit.timed_out || r.exit.exit_code != 0);
    // A memory hog is killed inside its cgroup.
    let r = d.exec(&sb.id, serde_json::json!({ "argv": ["dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"] })).unwrap();
    assert_eq!(
        r.exit.exit_code, 137,
        "memory hog was not killed: {:?}",
        r.exit
    );
    let info: SandboxInfo = d
        .client
        .call("GET", &format!("/v1/sandboxes/{}", sb.id), None)
        .unwrap();
    assert!(info.oom_kills.unwrap_or(0) >= 1, "{info:?}");
    // The sandbox, the other sandbox and the daemon all live on.
    assert_eq!(d.sh(&sb.id, "echo alive").1, "alive\n");
    assert_eq!(d.sh(&other.id, "echo alive").1, "alive\n");
    // A CPU quota the kernel refuses (under 1 ms of a 100 ms period, or one whose
    // microseconds overflow) is a 400 naming the field, not a 500 from the cgroup (found by
    // tests/fuzz.rs); a quota in range runs.
    for bad in [5u64, u64::MAX] {
        let e = d
            .client
            .call::<SandboxInfo>(
                "POST",
                "/v1/sandboxes",
                Some(&serde_json::json!({ "image": "busybox", "limits": { "cpu_millis": bad } })),
            )
            .unwrap_err();
        match e {
            forkd::client::ClientError::Api(a) => {
                assert_eq!(a.kind, forkd::api::ErrorKind::BadRequest, "{a:?}");
                assert!(a.message.contains("cpu_millis"), "{a:?}");
            }
            other => panic!("{other:?}"),
        }
    }
    let slow = d.create(serde_json::json!({ "image": "busybox", "limits": { "cpu_millis": 10 } }));
    assert_eq!(d.sh(&slow.id, "echo alive").1, "alive\n");
    // Limits too small for the sandbox to start (its set-up is OOM-killed, or cannot fork
    // its init): a 400 naming the field, not a 500 (found by tests/fuzz.rs), and nothing
    // of the sandbox left: not listed, no cgroup, no directory.
    let listed = || {
        d.client
            .call::<Vec<SandboxInfo>>("GET", "/v1/sandboxes", None)
            .unwrap()
            .len()
    };
    let before = listed();
    for (limits, field) in [
        (serde_json::json!({ "memory_bytes": 65536 }), "memory_bytes"),
        (serde_json::json!({ "pids": 1 }), "pids"),
    ] {
        let e = d
            .client
            .call::<SandboxInfo>(
                "POST",
                "/v1/sandboxes",
                Some(&serde_json::json!({ "image": "busybox", "limits": limits })),
            )
            .unwrap_err();
        let a = match e {
            forkd::client::ClientError::Api(a) => a,
            other => panic!("{other:?}"),
        };
        assert_eq!(a.kind, forkd::api::ErrorKind::BadRequest, "{a:?}");
        assert!(a.message.contains(&format!("limits.{field}")), "{a:?}");
        // The message names the sandbox that was being made; none of it is left.
        let id = a
            .message
            .split("sandbox ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no sandbox named: {a:?}"));
        assert_eq!(listed(), before, "{limits}");
        assert!(!d.data().join("sandboxes").join(id).exists(), "{id}");
        assert!(!cgroup_exists(id), "{id}");
    }
}

#[test]
fn long_exec_does_not_block_other_requests() {
    if !can_run("long_exec_does_not_block_other_requests") {
        return;
    }
    let d = TestDaemon::start("concurrency");
    let sb = d.busybox();
    let socket = d.socket.clone();
    let id = sb.id.clone();
    let long = std::thread::spawn(move || {
        let c = forkd::client::Client::new(&socket);
        c.call::<forkd::api::ExecResult>(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&serde_json::json!({"argv": ["sleep", "3"]})),
        )
        .unwrap()
    });
    // The long exec runs (its sleep is there) before the quick ones start.
    assert!(wait_until(Duration::from_secs(10), || d
        .sh(&sb.id, "ps -o args | grep -qx 'sleep 3'")
        .0
        == 0));
    for _ in 0..20 {
        assert_eq!(d.sh(&sb.id, "echo quick").1, "quick\n");
    }
    let _: Vec<SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    assert!(
        !long.is_finished(),
        "the short requests waited for the long exec"
    );
    assert_eq!(long.join().unwrap().exit.exit_code, 0);
}

#[test]
fn daemon_recovers_after_kill_9() {
    if !can_run("daemon_recovers_after_kill_9") {
        return;
    }
    let mut d = TestDaemon::start("recovery");
    let live = d.create(serde_json::json!({ "image": "busybox", "command": { "shell": "while true; do sleep 1; done" } }));
    let doomed = d.busybox();
    d.sh(&live.id, "echo kept > /tmp/state");
    d.kill9();
    // While the daemon is down, one sandbox's init dies.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(doomed.init_pid.unwrap()),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    let pid = doomed.init_pid.unwrap();
    assert!(wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|st| {
                st.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('Z'))
            })
            .unwrap_or(true)
    }));
    d.spawn();
    let list: Vec<SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    let find = |id: &str| list.iter().find(|s| s.id == id).unwrap().clone();
    assert_eq!(find(&live.id).status, SandboxStatus::Running);
    assert_eq!(find(&doomed.id).status, SandboxStatus::Stopped);
    assert_eq!(d.sh(&live.id, "cat /tmp/state").1, "kept\n");
    // Roots live in the sandboxes' own mount namespaces: none is in the host's table,
    // and the live one's is reached through its init after the restart.
    let mounts = d.sandbox_mounts();
    assert!(mounts.is_empty(), "{mounts:?}");
    let live_now = find(&live.id);
    let state = format!("/proc/{}/root/tmp/state", live_now.init_pid.unwrap());
    assert_eq!(std::fs::read_to_string(&state).unwrap(), "kept\n");
    assert_eq!(
        live_now.rootfs,
        format!("/proc/{}/root", live_now.init_pid.unwrap())
    );
    assert!(!cgroup_exists(&doomed.id));
    // The CLI lists both.
    let out = d.cli(&["ps", "-a", "-q"]);
    let ids = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(ids.contains(&live.id) && ids.contains(&doomed.id), "{ids}");
}

#[test]
fn cp_in_and_out_is_binary_safe_and_stays_inside() {
    if !can_run("cp_in_and_out_is_binary_safe_and_stays_inside") {
        return;
    }
    let d = TestDaemon::start("cp");
    let sb = d.busybox();
    let work = d.root.parent().unwrap().join("cp");
    std::fs::create_dir_all(work.join("tree/sub")).unwrap();
    let blob: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(work.join("tree/sub/blob"), &blob).unwrap();
    std::fs::write(work.join("tree/top"), b"top\n").unwrap();
    let target = format!("{}:/root/", sb.id);
    let out = d.cli(&["cp", work.join("tree").to_str().unwrap(), &target]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        d.sh(&sb.id, "md5sum /root/tree/sub/blob | cut -d' ' -f1").0,
        0
    );
    let (_, size, _) = d.sh(&sb.id, "wc -c < /root/tree/sub/blob");
    assert_eq!(size.trim(), "1000000");
    let back = work.join("back");
    let out = d.cli(&[
        "cp",
        &format!("{}:/root/tree", sb.id),
        back.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(back.join("sub/blob")).unwrap(), blob);
    // A symlink inside the sandbox pointing at "/etc" resolves inside the sandbox.
    d.sh(&sb.id, "ln -s /etc /tmp/hostetc");
    let probe = format!("forkd-cp-probe-{}", std::process::id());
    std::fs::write(work.join(&probe), b"x").unwrap();
    let out = d.cli(&[
        "cp",
        work.join(&probe).to_str().unwrap(),
        &format!("{}:/tmp/hostetc/", sb.id),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !std::path::Path::new("/etc").join(&probe).exists(),
        "cp wrote to the host's /etc"
    );
    assert_eq!(d.sh(&sb.id, &format!("cat /etc/{probe}")).1, "x");
    // A missing source inside the sandbox is a clear error.
    let out = d.cli(&[
        "cp",
        &format!("{}:/nonexistent", sb.id),
        back.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nonexistent"));
}

#[test]
fn cli_reports_errors_and_exit_codes() {
    if !can_run("cli_reports_errors_and_exit_codes") {
        return;
    }
    let d = TestDaemon::start("cli");
    let out = d.cli(&[
        "run",
        "--rm",
        "busybox",
        "--",
        "sh",
        "-c",
        "echo out; exit 42",
    ]);
    assert_eq!(out.status.code(), Some(42));
    assert_eq!(out.stdout, b"out\n");
    let out = d.cli(&["run", "-d", "busybox"]);
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert_eq!(id.len(), 16);
    let out = d.cli(&["exec", &id, "--", "sh", "-c", "exit 5"]);
    assert_eq!(out.status.code(), Some(5));
    let out = d.cli(&["exec", "ffffffffffffffff", "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such sandbox: ffffffffffffffff"));
    let out = d.cli(&["image", "rm", "busybox"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));
    let out = d.cli(&["ps", "-q"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), id);
    // Memory use only when asked for (two cgroup reads a sandbox).
    let plain = String::from_utf8_lossy(&d.cli(&["ps"]).stdout).to_string();
    assert!(plain.contains(&id) && !plain.contains("MEMORY"), "{plain}");
    let row: Vec<&str> = plain.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[..3], [id.as_str(), "busybox", "running"], "{plain}");
    assert!(row[3].parse::<i32>().is_ok_and(|p| p > 1), "{plain}");
    let with = String::from_utf8_lossy(&d.cli(&["ps", "--stats"]).stdout).to_string();
    assert!(with.lines().next().unwrap().contains("MEMORY"), "{with}");
    assert!(with.lines().nth(1).unwrap().contains('M'), "{with}");
    // A reader that is gone (`forkd ps | head -0`) ends the listing quietly.
    let (r, w) = nix::unistd::pipe().unwrap();
    drop(r);
    let out = std::process::Command::new(BIN)
        .args(["ps"])
        .env("FORKD_SOCKET", &d.socket)
        .stdout(std::process::Stdio::from(w))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("panicked"),
        "{:?}: {err}",
        out.status
    );
    // Without a daemon the CLI says how to start one.
    let out = std::process::Command::new(BIN)
        .args(["ps"])
        .env("FORKD_SOCKET", "/nonexistent/forkd.sock")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("forkd daemon"));
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn malicious_image_archive_is_rejected_and_leaves_nothing() {
    if !can_run("malicious_image_archive_is_rejected_and_leaves_nothing") {
        return;
    }
    let d = TestDaemon::start("malicious");
    let dir = d.root.parent().unwrap().join("evil");
    std::fs::create_dir_all(&dir).unwrap();
    let victim = dir.join("victim");
    // A tar whose entry climbs out of the extraction directory.
    let mut header = tar::Header::new_gnu();
    let name = format!("../../../../../../..{}", victim.display());
    let bytes = name.as_bytes();
    header.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
    header.set_size(4);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&header, &b"evil"[..]).unwrap();
    let tar_path = dir.join("evil.tar");
    std::fs::write(&tar_path, b.into_inner().unwrap()).unwrap();
    let layers_before = std::fs::read_dir(d.data().join("layers")).unwrap().count();
    let err = d
        .client
        .call::<serde_json::Value>(
            "POST",
            "/v1/images",
            Some(&serde_json::json!({ "source": tar_path, "name": "evil" })),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains(".."), "{err}");
    assert!(!victim.exists());
    assert_eq!(
        std::fs::read_dir(d.data().join("layers")).unwrap().count(),
        layers_before
    );
    assert!(std::fs::read_dir(d.data().join("layers/tmp"))
        .unwrap()
        .next()
        .is_none());
    let out = d.cli(&["image", "ls", "-q"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "busybox");
}

/// `/dev` is a directory of the root filesystem (the runtime layer's, checked and mended by
/// the sandbox's set-up), so an image's own `dev` entries must not be able to redirect it: a `dev` symlink to a host directory, a
/// regular file at `dev/null`, a `dev/shm` symlink. Each sandbox gets the real nodes and
/// nothing is written on the host.
#[test]
fn hostile_dev_entries_in_an_image_stay_inside() {
    if !can_run("hostile_dev_entries_in_an_image_stay_inside") {
        return;
    }
    let d = TestDaemon::start("hostiledev");
    let work = d.root.parent().unwrap().join("hostile-dev");
    let host_dir = work.join("host-dir");
    std::fs::create_dir_all(&host_dir).unwrap();
    let rootfs = |name: &str| {
        let dir = work.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let ok = std::process::Command::new("tar")
            .arg("-xf")
            .arg(busybox_tar())
            .arg("-C")
            .arg(&dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "extract {}", busybox_tar().display());
        dir
    };
    let linked = rootfs("dev-symlink");
    let _ = std::fs::remove_dir_all(linked.join("dev"));
    std::os::unix::fs::symlink(&host_dir, linked.join("dev")).unwrap();
    let files = rootfs("dev-files");
    std::fs::create_dir_all(files.join("dev")).unwrap();
    std::fs::write(files.join("dev/null"), "not a device").unwrap();
    let _ = std::fs::remove_dir_all(files.join("dev/shm"));
    std::os::unix::fs::symlink(&host_dir, files.join("dev/shm")).unwrap();

    for (name, dir) in [("dev-symlink", &linked), ("dev-files", &files)] {
        let out = d.cli(&["image", "import", dir.to_str().unwrap(), "--name", name]);
        assert!(out.status.success(), "import {name}: {out:?}");
        let sb = d.create(serde_json::json!({ "image": name }));
        let (code, out, err) = d.sh(
            &sb.id,
            "stat -c '%n %F %t:%T' /dev/null /dev/zero /dev/urandom; \
             stat -c '%n %F' /dev /dev/shm; echo data > /dev/shm/f && cat /dev/shm/f",
        );
        assert_eq!(code, 0, "{name}: {err}");
        let expected = "/dev/null character special file 1:3\n\
                        /dev/zero character special file 1:5\n\
                        /dev/urandom character special file 1:9\n\
                        /dev directory\n\
                        /dev/shm directory\n\
                        data\n";
        assert_eq!(out, expected, "{name}");
        d.remove(&sb.id);
    }
    let left: Vec<_> = std::fs::read_dir(&host_dir).unwrap().collect();
    assert!(
        left.is_empty(),
        "the sandbox set-up wrote on the host: {left:?}"
    );
}

#[test]
fn detached_commands_are_the_inits_and_their_exits_are_recorded() {
    if !can_run("detached_commands_are_the_inits_and_their_exits_are_recorded") {
        return;
    }
    let d = TestDaemon::start("detached");
    let sb = d.busybox();
    let started: forkd::api::DetachedExec = d
        .client
        .call(
            "POST",
            &format!("/v1/sandboxes/{}/exec", sb.id),
            Some(&serde_json::json!({
                "shell": "echo started; sleep 1; exit 3", "detach": true, "log": "job"
            })),
        )
        .unwrap();
    // Once its relay has handed it over, its parent is the init (PID 1): no relay waits
    // beside it.
    d.wait_for(
        &sb.id,
        &format!(
            "test \"$(awk '/^PPid/{{print $2}}' /proc/{}/status)\" = 1 && echo parent-is-init",
            started.pid
        ),
        "parent-is-init",
    );
    // The init records its exit once it has reaped it.
    let exit = d.wait_for(&sb.id, "cat /.forkd/logs/job.exit 2>/dev/null", "exit_code");
    let exit: serde_json::Value = serde_json::from_str(exit.trim()).unwrap();
    assert_eq!(exit["exit_code"], 3, "{exit}");
    assert!(exit["duration_us"].as_u64().unwrap() >= 1_000_000, "{exit}");
    assert_eq!(d.sh(&sb.id, "cat /.forkd/logs/job.log").1, "started\n");
}

/// The overlay fallback of kernels without `lowerdir+` (layers as one-byte links, see
/// `forkd_sys::lowerdir`), forced on this kernel: sandboxes, a stack of filesystem
/// checkpoints deep enough to be squashed at the fallback's bound, and branches.
#[test]
fn sandboxes_checkpoints_and_forks_with_layers_as_links() {
    let name = "sandboxes_checkpoints_and_forks_with_layers_as_links";
    if !can_run(name) {
        return;
    }
    let d = TestDaemon::start_with_env(
        "links",
        &[("FORKD_OVERLAY_LOWERS", "links"), ("FORKD_MAX_LAYERS", "8")],
    );
    let sb = d.busybox();
    let mut last = String::new();
    for i in 0..12 {
        let (code, _, err) = d.sh(
            &sb.id,
            &format!("echo {i} > /root/gen; echo {i} > /root/only-{i}"),
        );
        assert_eq!(code, 0, "{err}");
        last = d.checkpoint(&sb.id, false).id;
    }
    let branches = d.fork(&last, 2, false);
    assert_eq!(branches.branches.len(), 2);
    for b in &branches.branches {
        let (code, out, _) = d.sh(
            &b.id,
            "cat /root/gen; ls /root | wc -l; echo x > /root/branch",
        );
        assert_eq!(code, 0);
        assert_eq!(
            out, "11\n13\n",
            "every generation's file, the last one's value"
        );
    }
    assert!(
        d.log().contains("overlay lower layers: as links"),
        "{}",
        d.log()
    );
    for b in &branches.branches {
        d.remove(&b.id);
    }
    d.remove(&sb.id);
}

#[test]
fn file_operations_run_as_the_user_inside_the_sandbox() {
    if !can_run("file_operations_run_as_the_user_inside_the_sandbox") {
        return;
    }
    use forkd::api::{FsAnswer, FsKind};
    let d = TestDaemon::start("fileops");
    let sb = d.busybox();
    let c = &d.client;
    let fs = |body: serde_json::Value| -> Result<FsAnswer, String> {
        c.send("POST", &format!("/v1/sandboxes/{}/fs", sb.id), &body)
            .map_err(|e| e.to_string())
    };
    d.sh(
        &sb.id,
        "mkdir -p /srv/u && chown nobody /srv/u && ln -s /etc/passwd /srv/link",
    );
    // A write as a user makes the file theirs, parents included; its bytes come back.
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let put = c
        .raw(
            "PUT",
            &format!(
                "/v1/sandboxes/{}/file?path=/srv/u/d/f.bin&user=nobody",
                sb.id
            ),
            &data,
        )
        .unwrap();
    assert_eq!(put.status, 200, "{}", String::from_utf8_lossy(&put.body));
    let wrote: FsAnswer = serde_json::from_slice(&put.body).unwrap();
    assert_eq!(wrote.entries[0].owner, "nobody");
    assert_eq!(wrote.entries[0].size, data.len() as u64);
    let got = c
        .raw(
            "GET",
            &format!("/v1/sandboxes/{}/file?path=/srv/u/d/f.bin", sb.id),
            &[],
        )
        .unwrap();
    assert_eq!((got.status, got.body == data), (200, true));
    // The sandbox's permissions apply: nobody cannot write under /etc.
    let denied = c
        .raw(
            "PUT",
            &format!("/v1/sandboxes/{}/file?path=/etc/x&user=nobody", sb.id),
            b"x",
        )
        .unwrap();
    assert_eq!(
        denied.status,
        403,
        "{}",
        String::from_utf8_lossy(&denied.body)
    );
    assert!(String::from_utf8_lossy(&denied.body).contains("/etc/x"));
    // Written as root for a user: the file and the directories made for it are theirs.
    let given = c
        .raw(
            "PUT",
            &format!("/v1/sandboxes/{}/file?path=/srv/g/h/f&owner=nobody", sb.id),
            b"x",
        )
        .unwrap();
    assert_eq!(
        given.status,
        200,
        "{}",
        String::from_utf8_lossy(&given.body)
    );
    let (_, owners, _) = d.sh(&sb.id, "stat -c %U /srv/g /srv/g/h /srv/g/h/f /srv");
    assert_eq!(owners, "nobody\nnobody\nnobody\nroot\n");
    fs(serde_json::json!({"op": "remove", "path": "/srv/g"})).unwrap();
    // Stat describes a symlink without following it; list goes depth first.
    let st = fs(serde_json::json!({"op": "stat", "path": "/srv/link"})).unwrap();
    assert_eq!(st.entries[0].kind, FsKind::Symlink);
    assert_eq!(st.entries[0].symlink_target.as_deref(), Some("/etc/passwd"));
    let ls = fs(serde_json::json!({"op": "list", "path": "/srv", "depth": 3})).unwrap();
    let paths: Vec<&str> = ls.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["/srv/link", "/srv/u", "/srv/u/d", "/srv/u/d/f.bin"]);
    let made = fs(serde_json::json!({"op": "make_dir", "path": "/srv/u/d"})).unwrap();
    assert_eq!(made.created, Some(false));
    let made =
        fs(serde_json::json!({"op": "make_dir", "path": "/srv/n/m", "user": "root"})).unwrap();
    assert_eq!(
        (made.created, made.entries[0].kind),
        (Some(true), FsKind::Dir)
    );
    let moved =
        fs(serde_json::json!({"op": "move", "from": "/srv/u/d/f.bin", "to": "/srv/n/g"})).unwrap();
    assert_eq!(moved.entries[0].path, "/srv/n/g");
    fs(serde_json::json!({"op": "remove", "path": "/srv/n"})).unwrap();
    // Errors name the path and keep their kind.
    let missing = fs(serde_json::json!({"op": "stat", "path": "/srv/n"})).unwrap_err();
    assert!(
        missing.contains("/srv/n") && missing.contains("No such file"),
        "{missing}"
    );
    let relative = fs(serde_json::json!({"op": "stat", "path": "srv"})).unwrap_err();
    assert!(relative.contains("must be absolute"), "{relative}");
    let read = fs(serde_json::json!({"op": "read", "path": "/etc/passwd"})).unwrap_err();
    assert!(read.contains("GET or PUT"), "{read}");
}

#[test]
fn a_signal_frame_reaches_the_command() {
    if !can_run("a_signal_frame_reaches_the_command") {
        return;
    }
    use forkd_sandbox::proto::{read_frame, write_frame, ExecExit, ExecRequest, Kind};
    let d = TestDaemon::start("signal");
    let sb = d.busybox();
    let run = |signal: u8, secs: u32| -> ExecExit {
        let req = ExecRequest {
            shell: Some(format!(
                "trap 'echo term; exit 7' TERM; sleep {secs} & wait"
            )),
            ..Default::default()
        };
        let mut s = d.client.exec_stream(&sb.id, &req).unwrap();
        loop {
            match read_frame(&mut s).unwrap() {
                Some((Kind::Started, _)) => break,
                Some(_) => {}
                None => panic!("no Started frame"),
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        write_frame(&mut s, Kind::Signal, &[signal]).unwrap();
        loop {
            match read_frame(&mut s).unwrap() {
                Some((Kind::Exit, body)) => return serde_json::from_slice(&body).unwrap(),
                Some(_) => {}
                None => panic!("no Exit frame"),
            }
        }
    };
    // SIGTERM is the command's to handle; SIGKILL ends the tree.
    assert_eq!(run(15, 100).exit_code, 7);
    let killed = run(9, 101);
    assert_eq!(killed.signal, Some(9), "{killed:?}");
    let (_, ps, _) = d.sh(&sb.id, "ps -o args | grep -c '[s]leep 101' || true");
    assert_eq!(ps.trim(), "0", "the killed command's sleep is gone");
}

#[test]
fn setuid_sandboxes_keep_their_filter_and_capability_bound() {
    if !can_run("setuid_sandboxes_keep_their_filter_and_capability_bound") {
        return;
    }
    let d = TestDaemon::start("setuid");
    let status = |setuid: bool| {
        let sb = d.create(serde_json::json!({ "image": "busybox", "setuid": setuid }));
        assert_eq!(sb.setuid, setuid);
        let (code, out, err) = d.sh(
            &sb.id,
            "grep -E '^(NoNewPrivs|Seccomp|CapBnd):' /proc/1/status /proc/self/status",
        );
        assert_eq!(code, 0, "{err}");
        d.remove(&sb.id);
        out
    };
    let plain = status(false);
    let setuid = status(true);
    assert!(plain.contains("/proc/1/status:NoNewPrivs:\t1"), "{plain}");
    assert!(setuid.contains("/proc/1/status:NoNewPrivs:\t0"), "{setuid}");
    assert!(
        setuid.contains("/proc/self/status:NoNewPrivs:\t0"),
        "{setuid}"
    );
    // Both run under the filter, with the same capability bound.
    for out in [&plain, &setuid] {
        assert!(out.contains("/proc/self/status:Seccomp:\t2"), "{out}");
    }
    let bound = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("/proc/self/status:CapBnd"))
            .map(str::to_string)
    };
    assert_eq!(bound(&plain), bound(&setuid));
}

#[test]
fn sandboxes_are_removed_when_they_expire_and_the_time_can_change() {
    if !can_run("sandboxes_are_removed_when_they_expire_and_the_time_can_change") {
        return;
    }
    let mut d = TestDaemon::start("expiry");
    let gone = |d: &TestDaemon, id: &str| {
        d.client
            .call::<serde_json::Value>("GET", &format!("/v1/sandboxes/{id}"), None)
            .is_err()
    };
    let soon = d.create(serde_json::json!({ "image": "busybox", "expires_in_secs": 1 }));
    let at = soon.expires_at.expect("an expiry");
    assert!(
        at >= soon.created + 1 && at <= soon.created + 3,
        "{at} vs {}",
        soon.created
    );
    let kept = d.create(serde_json::json!({ "image": "busybox", "expires_in_secs": 1 }));
    // Pushed back, then cleared: it stays.
    let pushed: SandboxInfo = d
        .client
        .send(
            "PUT",
            &format!("/v1/sandboxes/{}/expiry", kept.id),
            &serde_json::json!({ "expires_in_secs": 3600 }),
        )
        .unwrap();
    assert!(pushed.expires_at.unwrap() >= at + 3000);
    let cleared: SandboxInfo = d
        .client
        .send(
            "PUT",
            &format!("/v1/sandboxes/{}/expiry", kept.id),
            &serde_json::json!({}),
        )
        .unwrap();
    assert_eq!(cleared.expires_at, None);
    assert!(
        wait_until(Duration::from_secs(10), || gone(&d, &soon.id)),
        "the expired sandbox was not removed"
    );
    assert!(d
        .log()
        .contains(&format!("sandbox {}: expired, removed", soon.id)));
    assert!(!cgroup_exists(&soon.id), "its cgroup went with it");
    // A stopped sandbox expires too; the time survives a restart of the daemon.
    let stopped = d.create(serde_json::json!({ "image": "busybox" }));
    let _: SandboxInfo = d
        .client
        .send(
            "POST",
            &format!("/v1/sandboxes/{}/stop", stopped.id),
            &serde_json::json!({ "grace_secs": 0 }),
        )
        .unwrap();
    let _: SandboxInfo = d
        .client
        .send(
            "PUT",
            &format!("/v1/sandboxes/{}/expiry", stopped.id),
            &serde_json::json!({ "expires_in_secs": 2 }),
        )
        .unwrap();
    d.kill9();
    d.spawn();
    assert!(
        wait_until(Duration::from_secs(15), || gone(&d, &stopped.id)),
        "the stopped sandbox did not expire after the restart"
    );
    assert!(!gone(&d, &kept.id), "the sandbox without an expiry stays");
    let bad = d
        .client
        .send::<_, serde_json::Value>(
            "PUT",
            &format!("/v1/sandboxes/{}/expiry", kept.id),
            &serde_json::json!({ "expires_in": 5 }),
        )
        .unwrap_err()
        .to_string();
    assert!(bad.contains("expires_in"), "{bad}");
}
