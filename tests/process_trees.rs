//! The process trees real machines have, through live checkpoints and forks: daemons
//! whose session leader exited, the classic double fork, job control under an
//! interactive shell in a pty, multi-threaded processes in several process groups. In
//! every branch the `pid ppid pgid sid` table (and each process's thread count) equals
//! the one taken before the checkpoint, and every process goes on running.

#![forbid(unsafe_code)]

mod common;

use common::*;
use std::time::{Duration, Instant};

/// Prints `pid ppid pgid sid comm threads` of every process but itself and its parent
/// (the exec's relay), sorted. Relays of execs that have just finished (an `init` with
/// no child left) are the sandbox's plumbing, on their way out: left out too.
const TABLE: &str = r#"
import os
skip = {os.getpid(), os.getppid()}
rows = []
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) in skip:
        continue
    try:
        s = open(f"/proc/{p}/stat").read()
        threads = len(os.listdir(f"/proc/{p}/task"))
    except OSError:
        continue
    comm = s[s.index("(") + 1:s.rindex(")")]
    f = s[s.rindex(")") + 2:].split()
    rows.append((int(p), int(f[1]), int(f[2]), int(f[3]), comm, threads))
parents = {r[1] for r in rows}
for r in sorted(rows):
    if r[4] == "init" and r[0] != 1 and r[0] not in parents:
        continue
    print(*r)
"#;

/// Starts the shapes. Each keeps a counter in /tmp/c-NAME; the counters sleep with
/// `read -t` on a FIFO nobody writes, so no process comes and goes between two tables.
const TREES: &str = r#"
set -e
counter='mkfifo /tmp/f-$0; exec 9<>/tmp/f-$0; i=0; while :; do i=$((i+1)); echo $i > /tmp/c-$0; read -t 0.1 -u 9 || :; done'
# setsid, and the new session's leader exits.
setsid bash -c "bash -c '$counter' setsid </dev/null >/dev/null 2>&1 &"
# The classic daemon: fork, setsid, fork, and both parents exit.
python3 - "$counter" <<'PY'
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("bash", ["bash", "-c", sys.argv[1], "double"])
    os._exit(0)
os.wait()
PY
# Job control: an interactive bash in tmux's pty, with background pipelines (each its
# own process group in the shell's session); tmux's server daemonizes itself.
tmux new-session -d -s jobs bash -i
tmux send-keys -t jobs "bash -c '$counter' jobs | cat > /dev/null &" Enter
tmux send-keys -t jobs "sleep 100000 | cat &" Enter
# Threads, in processes of two process groups (and sessions).
for g in a b; do
    setsid python3 -c "
import os, threading, time
def tick(k):
    n = 0
    while True:
        n += 1
        with open('/tmp/c-thr$g' + k, 'w') as f:
            f.write(str(n))
        time.sleep(0.1)
for k in 'xy':
    threading.Thread(target=tick, args=(k,), daemon=True).start()
time.sleep(10**6)
" </dev/null >/dev/null 2>&1 &
done
"#;

const COUNTERS: &[&str] = &[
    "/tmp/c-setsid",
    "/tmp/c-double",
    "/tmp/c-jobs",
    "/tmp/c-thrax",
    "/tmp/c-thray",
    "/tmp/c-thrbx",
    "/tmp/c-thrby",
];

/// A daemon with the Debian image and a sandbox of it (running `sleep infinity`) that
/// holds the table script; `None` after a SKIP.
fn debian_sandbox(name: &str, tag: &str) -> Option<(TestDaemon, forkd::api::SandboxInfo)> {
    if !can_run_criu(name) {
        return None;
    }
    let debian = fixture(name, "images/debian.tar.zst", "debian")?;
    let d = TestDaemon::start(tag);
    d.import(&debian, "debian");
    let sb = d.create(
        serde_json::json!({ "image": "debian", "command": { "argv": ["sleep", "infinity"] } }),
    );
    d.put_file(&sb.id, "/table.py", TABLE.as_bytes());
    Some((d, sb))
}

fn table(d: &TestDaemon, id: &str) -> String {
    let (code, out, err) = d.sh(id, "python3 /table.py");
    assert_eq!(code, 0, "{err}");
    out
}

/// Waits until the table stops changing (the shapes have settled).
fn settled_table(d: &TestDaemon, id: &str) -> String {
    let t = Instant::now();
    let mut last = table(d, id);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = table(d, id);
        if now == last
            && COUNTERS
                .iter()
                .all(|c| d.sh(id, &format!("test -s {c}")).0 == 0)
        {
            return now;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the trees never settled:\n{now}"
        );
        last = now;
    }
}

fn assert_running(d: &TestDaemon, id: &str) {
    for c in COUNTERS {
        let n = d.read_number(id, c);
        let t = Instant::now();
        while d.read_number(id, c) <= n + 2 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{id}: {c} stopped at {n}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn daemons_job_control_and_threads_keep_their_tree_in_every_branch() {
    let name = "daemons_job_control_and_threads_keep_their_tree_in_every_branch";
    let Some((d, sb)) = debian_sandbox(name, "trees") else {
        return;
    };
    d.put_file(&sb.id, "/trees.sh", TREES.as_bytes());
    let (code, _, err) = d.sh(&sb.id, "bash /trees.sh");
    assert_eq!(code, 0, "{err}");
    let before = settled_table(&d, &sb.id);
    // The shapes are what they claim: sessions whose leader is gone, a job's own group.
    let rows: Vec<Vec<&str>> = before.lines().map(|l| l.split(' ').collect()).collect();
    let pids: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    let leaderless = rows.iter().filter(|r| !pids.contains(&r[3])).count();
    assert!(leaderless >= 2, "sessions without their leader:\n{before}");
    assert!(
        rows.iter().any(|r| r[4] == "python3" && r[5] == "3"),
        "{before}"
    );
    let ck = d.checkpoint(&sb.id, true);
    d.remove(&sb.id);
    let fork = d.fork(&ck.id, 3, false);
    assert_eq!(fork.branches.len(), 3);
    for b in &fork.branches {
        assert_eq!(
            table(&d, &b.id),
            before,
            "branch {}: pid ppid pgid sid comm threads",
            b.id
        );
        assert_running(&d, &b.id);
    }
    // The shell still does job control in a branch: its jobs are listed.
    let b = &fork.branches[0].id;
    let (code, _, err) = d.sh(b, "tmux send-keys -t jobs 'jobs > /tmp/jobs.txt' Enter");
    assert_eq!(code, 0, "{err}");
    let out = d.wait_for(b, "cat /tmp/jobs.txt", "sleep 100000");
    assert!(out.contains("Running"), "{out}");
}

/// The case as a user first meets it, on busybox: `setsid` a background sleep from a
/// shell that then exits.
#[test]
fn setsid_daemon_with_an_exited_leader_forks() {
    if !can_run_criu("setsid_daemon_with_an_exited_leader_forks") {
        return;
    }
    let d = TestDaemon::start("trees-bb");
    let sb = d.create(
        serde_json::json!({ "image": "busybox", "command": { "argv": ["sleep", "100000"] } }),
    );
    let (code, _, err) = d.sh(
        &sb.id,
        "setsid sh -c 'sleep 100000 </dev/null >/dev/null 2>&1 &'; sleep 0.3",
    );
    assert_eq!(code, 0, "{err}");
    // The main command and the setsid'ed one, whose session's leader (the `sh`) exited;
    // only once both run `sleep 100000` (ps shows interim names while they start).
    let line = "ps -o pid,ppid,pgid,sid,args | awk '$5 == \"sleep\" && $6 == \"100000\"'";
    let before = settled_lines(&d, &sb.id, line, 2);
    let ck = d.checkpoint(&sb.id, true);
    let fork = d.fork(&ck.id, 3, false);
    for b in &fork.branches {
        let (_, after, _) = d.sh(&b.id, line);
        assert_eq!(after, before, "branch {}", b.id);
    }
}

/// The output of `line` once it has `n` lines.
fn settled_lines(d: &TestDaemon, id: &str, line: &str, n: usize) -> String {
    let t = Instant::now();
    loop {
        let (_, out, _) = d.sh(id, line);
        if out.lines().count() == n {
            return out;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{line}: {out}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The same daemon started by the sandbox's main command (a detached exec), whose relay
/// stays: the daemon is adopted by the init, where CRIU can recreate its dead leader.
#[test]
fn daemon_of_the_main_command_forks() {
    if !can_run_criu("daemon_of_the_main_command_forks") {
        return;
    }
    let d = TestDaemon::start("trees-main");
    let sb = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "shell": "setsid sh -c 'sleep 100000 </dev/null >/dev/null 2>&1 &'; exec sleep 200000" }
    }));
    // Only the processes whose command line is final (`sleep N`): while the shell starts
    // them, ps shows them under their interim names.
    let line = "ps -o pid,ppid,pgid,sid,args | awk '$5 == \"sleep\" && ($6 == \"100000\" || $6 == \"200000\")'";
    let before = settled_lines(&d, &sb.id, line, 2);
    // The daemon's parent is the init (pid 1), not the main command's relay.
    assert!(
        before
            .lines()
            .any(|l| l.contains("sleep 100000") && l.split_whitespace().nth(1) == Some("1")),
        "{before}"
    );
    let ck = d.checkpoint(&sb.id, true);
    let fork = d.fork(&ck.id, 3, false);
    for b in &fork.branches {
        let (_, after, _) = d.sh(&b.id, line);
        assert_eq!(after, before, "branch {}", b.id);
    }
}

/// An orphaned process group with a stopped member: its session's leader exited, the
/// member (which ignores SIGHUP, as the kernel hangs up a group orphaned while stopped)
/// was stopped after that. In every branch the tree is the same, the member is still
/// stopped, and continued it counts on. (A stopped process cannot be seized inside a
/// frozen cgroup, so this checkpoint goes without the freezer.)
#[test]
fn orphaned_group_with_a_stopped_member_is_continued_in_every_branch() {
    let name = "orphaned_group_with_a_stopped_member_is_continued_in_every_branch";
    let Some((d, sb)) = debian_sandbox(name, "trees-orphan") else {
        return;
    };
    let script = r#"
counter='mkfifo /tmp/f-$0; exec 9<>/tmp/f-$0; i=0; while :; do i=$((i+1)); echo $i > /tmp/c-$0; read -t 0.1 -u 9 || :; done'
setsid bash -c "trap '' HUP; bash -c '$counter' orphan </dev/null >/dev/null 2>&1 & echo \$! > /tmp/member"
"#;
    d.put_file(&sb.id, "/orphan.sh", script.as_bytes());
    let (code, _, err) = d.sh(&sb.id, "bash /orphan.sh");
    assert_eq!(code, 0, "{err}");
    d.wait_for(&sb.id, "cat /tmp/c-orphan", "");
    let member = d.wait_for(&sb.id, "cat /tmp/member", "");
    let member = member.trim().to_string();
    // Orphaned: the group's leader (the setsid'ed bash) is gone, the member's parent is
    // the init, outside its session.
    let stat = |id: &str| d.sh(id, &format!("cut -d' ' -f3-6 /proc/{member}/stat")).1;
    d.wait_for(&sb.id, &format!("cut -d' ' -f4 /proc/{member}/stat"), "1");
    let (code, _, err) = d.sh(&sb.id, &format!("kill -STOP {member}"));
    assert_eq!(code, 0, "{err}");
    d.wait_for(&sb.id, &format!("cut -d' ' -f3 /proc/{member}/stat"), "T");
    let before = table(&d, &sb.id);
    let stopped_at = d.read_number(&sb.id, "/tmp/c-orphan");
    let ck = d.checkpoint(&sb.id, true);
    d.remove(&sb.id);
    let fork = d.fork(&ck.id, 3, false);
    assert_eq!(fork.branches.len(), 3);
    for b in &fork.branches {
        assert_eq!(
            table(&d, &b.id),
            before,
            "branch {}: pid ppid pgid sid comm threads",
            b.id
        );
        assert!(
            stat(&b.id).starts_with("T 1 "),
            "still stopped, parent init: {}",
            stat(&b.id)
        );
        assert_eq!(
            d.read_number(&b.id, "/tmp/c-orphan"),
            stopped_at,
            "a stopped member does not count"
        );
        let (code, _, err) = d.sh(&b.id, &format!("kill -CONT {member}"));
        assert_eq!(code, 0, "{err}");
        let t = Instant::now();
        while d.read_number(&b.id, "/tmp/c-orphan") <= stopped_at + 2 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "branch {}: the member did not go on",
                b.id
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
