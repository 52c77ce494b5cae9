//! Live checkpoints and forks of sandboxes whose processes are in hostile states: a
//! traced process, a zombie, a tight fork loop, a process blocked opening a FIFO, and a
//! CRIU that never answers. Each either checkpoints and forks correctly or fails with a
//! clear error in bounded time; the sandbox keeps running either way, and other
//! requests are served meanwhile.

#![forbid(unsafe_code)]

mod common;

use common::*;
use forkd::api::{CheckpointInfo, SandboxInfo, SandboxStatus};
use forkd::client::ClientError;
use std::time::Duration;

fn debian(name: &str, tag: &str, env: &[(&str, &str)]) -> Option<(TestDaemon, SandboxInfo)> {
    if !can_run_criu(name) {
        return None;
    }
    let image = fixture(name, "images/debian.tar.zst", "debian")?;
    let d = TestDaemon::start_with_env(tag, env);
    d.import(&image, "debian");
    let sb = d.create(
        serde_json::json!({ "image": "debian", "command": { "argv": ["sleep", "infinity"] } }),
    );
    Some((d, sb))
}

fn live_checkpoint(d: &TestDaemon, id: &str) -> Result<CheckpointInfo, ClientError> {
    d.client.call(
        "POST",
        &format!("/v1/sandboxes/{id}/checkpoint"),
        Some(&serde_json::json!({ "live": true })),
    )
}

/// The sandbox is running and answers an exec.
fn still_runs(d: &TestDaemon, id: &str) {
    let info: SandboxInfo = d
        .client
        .call("GET", &format!("/v1/sandboxes/{id}"), None)
        .unwrap();
    assert_eq!(info.status, SandboxStatus::Running, "sandbox {id}");
    let (code, out, err) = d.sh(id, "echo alive");
    assert_eq!((code, out.trim()), (0, "alive"), "sandbox {id}: {err}");
}

/// Nothing half-made: no checkpoint stage left on disk.
fn no_stage(d: &TestDaemon) {
    let stages: Vec<_> = std::fs::read_dir(d.data().join("checkpoints"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".stage-"))
        .map(|e| e.path())
        .collect();
    assert!(stages.is_empty(), "stages left: {stages:?}");
}

const TRACER: &str = r#"
import ctypes, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
pid = os.fork()
if pid == 0:
    libc.ptrace(0, 0, None, None)          # PTRACE_TRACEME
    os.kill(os.getpid(), signal.SIGSTOP)
    i = 0
    while True:
        i += 1
        with open("/tmp/traced", "w") as f:
            f.write(str(i))
        time.sleep(0.05)
os.waitpid(pid, 0)                         # the tracee stopped at its SIGSTOP
libc.ptrace(7, pid, None, None)            # PTRACE_CONT
with open("/tmp/tracee", "w") as f:
    f.write(str(pid))
while True:
    time.sleep(1)
"#;

/// A process traced by another (a debugger, `strace`) cannot be seized by CRIU: the live
/// checkpoint is refused at once, naming the traced process and its tracer, and the
/// sandbox goes on (the tracee still counts). A filesystem checkpoint still works.
#[test]
fn a_traced_process_is_refused_by_name_and_keeps_running() {
    let name = "a_traced_process_is_refused_by_name_and_keeps_running";
    let Some((d, sb)) = debian(name, "hostile-traced", &[]) else {
        return;
    };
    d.put_file(&sb.id, "/tracer.py", TRACER.as_bytes());
    let r = d.exec(
        &sb.id,
        serde_json::json!({ "argv": ["python3", "/tracer.py"], "detach": true }),
    );
    r.expect("start the tracer");
    let tracee = d.wait_for(&sb.id, "cat /tmp/tracee", "");
    d.wait_for(&sb.id, "cat /tmp/traced", "");
    let before = d.read_number(&sb.id, "/tmp/traced");
    match live_checkpoint(&d, &sb.id) {
        Err(ClientError::Api(e)) => {
            assert_eq!(e.status(), 409, "{}", e.message);
            assert!(
                e.message
                    .contains(&format!("process {} (python3) is traced", tracee.trim())),
                "{}",
                e.message
            );
        }
        other => panic!("a traced process was checkpointed: {other:?}"),
    }
    no_stage(&d);
    still_runs(&d, &sb.id);
    assert!(
        wait_until(Duration::from_secs(10), || d
            .read_number(&sb.id, "/tmp/traced")
            > before),
        "the tracee stopped counting"
    );
    let fs = d.checkpoint(&sb.id, false);
    assert!(!fs.live);
}

/// A zombie (a child its parent never reaps) is checkpointed and comes back as a zombie
/// in every branch, whose parent is still there.
#[test]
fn a_zombie_comes_back_a_zombie_in_every_branch() {
    let name = "a_zombie_comes_back_a_zombie_in_every_branch";
    let Some((d, sb)) = debian(name, "hostile-zombie", &[]) else {
        return;
    };
    // The shell becomes `sleep`, which never waits for a child; the shell's child exits
    // a second later, by then a child of that `sleep` (a child that exited before the
    // `exec` could be reaped by the shell, and no zombie would be left).
    let r = d.exec(
        &sb.id,
        serde_json::json!({ "shell": "sh -c 'sleep 1 & echo $! > /tmp/zpid; exec sleep infinity'", "detach": true }),
    );
    r.expect("start");
    let zpid = d.wait_for(&sb.id, "cat /tmp/zpid", "");
    let zpid = zpid.trim().to_string();
    let state = format!("cut -d' ' -f3 /proc/{zpid}/stat");
    d.wait_for(&sb.id, &state, "Z");
    let ck = live_checkpoint(&d, &sb.id).expect("live checkpoint with a zombie");
    let fork = d.fork(&ck.id, 2, false);
    for b in &fork.branches {
        let (code, out, err) = d.sh(&b.id, &state);
        assert_eq!((code, out.trim()), (0, "Z"), "branch {}: {err}", b.id);
        still_runs(&d, &b.id);
    }
    still_runs(&d, &sb.id);
}

/// A process forking as fast as it can: the tree is frozen for the dump, so it
/// checkpoints like any other, and the loop goes on in the sandbox and in each branch.
#[test]
fn a_tight_fork_loop_checkpoints_and_goes_on() {
    let name = "a_tight_fork_loop_checkpoints_and_goes_on";
    let Some((d, sb)) = debian(name, "hostile-forkloop", &[]) else {
        return;
    };
    let r = d.exec(
        &sb.id,
        serde_json::json!({
            "shell": "i=0; while :; do i=$((i+1)); /bin/true; echo $i > /tmp/n; done",
            "detach": true
        }),
    );
    r.expect("start the loop");
    d.wait_for(&sb.id, "cat /tmp/n", "");
    let ck = live_checkpoint(&d, &sb.id).expect("live checkpoint of a fork loop");
    let fork = d.fork(&ck.id, 2, false);
    for id in fork
        .branches
        .iter()
        .map(|b| b.id.as_str())
        .chain([sb.id.as_str()])
    {
        let at = d.read_number(id, "/tmp/n");
        assert!(
            wait_until(Duration::from_secs(10), || d.read_number(id, "/tmp/n")
                > at + 10),
            "{id}: the loop stopped"
        );
        still_runs(&d, id);
    }
}

/// The system call the sandbox's `cat` is in and its state: "257 S" while it sleeps in
/// `openat` (wchan would name the FIFO's wait, but Linux before 5.16 reads it as 0 with
/// the ORC unwinder Debian's kernels use).
const READER_WAIT: &str = "for p in /proc/[0-9]*; do [ \"$(cat $p/comm)\" = cat ] && echo \"$(cut -d' ' -f1 $p/syscall) $(cut -d' ' -f3 $p/stat)\"; done; true";

/// What [`READER_WAIT`] prints for a reader asleep in `openat`.
const IN_OPEN: &str = "257 S";

/// A process blocked opening a FIFO no one writes: checkpointed mid-`open`, it is still
/// waiting in every branch, and a writer in one branch wakes only that branch's reader.
#[test]
fn a_process_blocked_opening_a_fifo_waits_on_in_every_branch() {
    let name = "a_process_blocked_opening_a_fifo_waits_on_in_every_branch";
    let Some((d, sb)) = debian(name, "hostile-fifo", &[]) else {
        return;
    };
    let (code, _, err) = d.sh(&sb.id, "mkfifo /tmp/fifo");
    assert_eq!(code, 0, "{err}");
    let r = d.exec(
        &sb.id,
        serde_json::json!({ "shell": "cat /tmp/fifo > /tmp/got", "detach": true }),
    );
    r.expect("start the reader");
    // Blocked in the open: asleep in `openat`, in the kernel's wait for a FIFO's other
    // end, with no descriptor of it yet.
    d.wait_for(&sb.id, READER_WAIT, IN_OPEN);
    let ck = live_checkpoint(&d, &sb.id).expect("live checkpoint with a reader in open");
    let fork = d.fork(&ck.id, 2, false);
    let (a, b) = (&fork.branches[0].id, &fork.branches[1].id);
    let (code, _, err) = d.sh(a, "echo only-a > /tmp/fifo");
    assert_eq!(code, 0, "{err}");
    d.wait_for(a, "cat /tmp/got", "only-a");
    let (code, out, _) = d.sh(b, "cat /tmp/got");
    assert_eq!(
        (code, out.as_str()),
        (0, ""),
        "branch b's reader still waits"
    );
    d.wait_for(b, READER_WAIT, IN_OPEN);
    still_runs(&d, &sb.id);
}

/// A CRIU that never answers: the checkpoint fails once `FORKD_CRIU_TIMEOUT_SECS`
/// passes, saying so; meanwhile the sandbox shows as checkpointing and other requests
/// are answered; after it the sandbox is thawed and running, nothing is left on disk,
/// and the next checkpoint (with a CRIU that answers) works.
#[test]
fn a_criu_that_never_answers_is_killed_at_the_timeout() {
    let name = "a_criu_that_never_answers_is_killed_at_the_timeout";
    if !can_run_criu(name) {
        return;
    }
    let criu = HangingCriu::new("timeout");
    let (hang, wrapper_s) = (criu.hang.clone(), criu.wrapper.clone());
    let d = TestDaemon::start_with_env(
        "hostile-timeout",
        &[("FORKD_CRIU", &wrapper_s), ("FORKD_CRIU_TIMEOUT_SECS", "3")],
    );
    let sb = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "shell": "i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done" }
    }));
    d.wait_for(&sb.id, "cat /tmp/n", "");
    std::fs::write(&hang, b"").unwrap();
    let dumper = d.call_in_background::<CheckpointInfo>(
        "POST",
        format!("/v1/sandboxes/{}/checkpoint", sb.id),
        serde_json::json!({ "live": true }),
    );
    assert!(
        wait_until(Duration::from_secs(10), || {
            let list: Vec<SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
            list.iter()
                .any(|s| s.id == sb.id && s.status == SandboxStatus::Checkpointing)
        }),
        "the sandbox never showed as checkpointing"
    );
    let other = d.busybox();
    let (code, out, _) = d.sh(&other.id, "echo served");
    assert_eq!((code, out.trim()), (0, "served"));
    match dumper.join().unwrap() {
        Err(ClientError::Api(e)) => {
            assert!(
                e.message.contains("did not answer within 3 s"),
                "{}",
                e.message
            );
            // A CRIU that hung is the host's problem, not the sandbox's.
            assert_eq!(e.kind, forkd::api::ErrorKind::Internal, "{}", e.message);
        }
        other => panic!("expected the timeout, got {other:?}"),
    }
    no_stage(&d);
    still_runs(&d, &sb.id);
    let at = d.read_number(&sb.id, "/tmp/n");
    assert!(
        wait_until(Duration::from_secs(10), || d.read_number(&sb.id, "/tmp/n")
            > at),
        "the sandbox was left frozen"
    );
    std::fs::remove_file(&hang).unwrap();
    let ck = live_checkpoint(&d, &sb.id).expect("checkpoint once CRIU answers");
    assert!(ck.live);
}
