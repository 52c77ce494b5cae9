//! Process-tree shapes through a live checkpoint and a fork: forkd next to podman
//! (`podman container checkpoint --export` / `restore --import`, with
//! `--tcp-established`, runc and the same CRIU), in the same run.
//!
//! Each shape is started as the main command of a fresh sandbox or container of the
//! Debian fixture (so its processes descend from the container's init, as CRIU needs),
//! then checkpointed live and restored: forkd forks 3 branches from one checkpoint,
//! podman restores one copy from its export. A copy counts only if every process the
//! shape needs runs in it. The shapes are the ones services make: a daemon whose
//! session leader exited (setsid), the classic double fork, job control under tmux,
//! threads in processes of two groups, an orphaned process group whose member is
//! stopped, daemonized redis with a client connected over TCP, and nginx's master and
//! its workers (as www-data).
//!
//! Reports, per shape and tool, whether the copies came up, the checkpoint time and the
//! restore time per copy (p50 over FORKD_BENCH_TREES_SAMPLES rounds, default 3).
//! Writes target/bench/trees.json and .md.

#![forbid(unsafe_code)]

mod common;
mod peers;

use anyhow::{Context, Result};
use common::{DaemonGuard, Report};
use peers::podman::{Podman, PodmanContainer, PODMAN_TCP_FLAGS};
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const PODMAN_IMAGE: &str = "localhost/forkd-bench-debian";
const BRANCHES: usize = 3;
struct Shape {
    name: &'static str,
    /// Bash, run as the main command before `exec sleep infinity`.
    script: &'static str,
    /// Process names every copy must run.
    expect: &'static [&'static str],
}

const COUNTER: &str = "i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.2; done";

fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "setsid daemon, leader exited",
            script: "setsid bash -c 'bash -c \"$COUNTER\" </dev/null >/dev/null 2>&1 &'; sleep 0.3",
            expect: &["bash", "sleep"],
        },
        Shape {
            name: "double fork",
            script: "python3 -c 'import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp(\"bash\", [\"bash\", \"-c\", os.environ[\"COUNTER\"]])\n    os._exit(0)\nos.wait()'",
            expect: &["bash"],
        },
        Shape {
            name: "tmux job control",
            script: "tmux new-session -d -s jobs bash -i && tmux send-keys -t jobs 'sleep 100000 | cat &' Enter; sleep 0.5",
            expect: &["tmux: server", "cat"],
        },
        Shape {
            name: "threads in two groups",
            script: "for g in a b; do setsid python3 -c 'import threading, time\nfor k in range(2): threading.Thread(target=time.sleep, args=(10**6,), daemon=True).start()\ntime.sleep(10**6)' </dev/null >/dev/null 2>&1 & done; sleep 0.5",
            expect: &["python3"],
        },
        Shape {
            name: "redis daemonized + TCP client",
            script: "redis-server --daemonize yes --bind 127.0.0.1 --save '' --appendonly no && until redis-cli ping >/dev/null 2>&1; do sleep 0.1; done && (python3 -c 'import socket, time\ns = socket.create_connection((\"127.0.0.1\", 6379)); f = s.makefile(\"rb\")\nwhile True:\n    s.sendall(b\"INCR n\\r\\n\"); f.readline(); time.sleep(0.1)' </dev/null >/dev/null 2>&1 &); sleep 0.5",
            expect: &["redis-server", "python3"],
        },
        Shape {
            name: "orphaned group, stopped member",
            script: "setsid bash -c \"trap '' HUP; bash -c \\\"$COUNTER\\\" </dev/null >/dev/null 2>&1 & echo \\$! > /tmp/member\"; sleep 0.3; kill -STOP $(cat /tmp/member)",
            expect: &["bash"],
        },
        Shape {
            name: "nginx master + workers",
            script: "nginx && sleep 0.5",
            expect: &["nginx"],
        },
    ]
}

fn main() {
    common::install_interrupt_handler();
    if let Err(e) = run() {
        eprintln!("bench trees: error: {e:#}");
        std::process::exit(1);
    }
}

fn full_script(s: &Shape) -> String {
    format!(
        "export COUNTER='{COUNTER}'; {}; exec sleep infinity",
        s.script
    )
}

/// forkd: one sandbox, one live checkpoint, one fork of BRANCHES; (checkpoint us,
/// per-branch restore us, copies running).
fn forkd_round(d: &DaemonGuard, s: &Shape) -> Result<(u64, Vec<u64>, usize)> {
    let sb = d.create_with(
        &json!({ "image": "debian", "command": { "argv": ["bash", "-c", full_script(s)] } }),
    )?;
    let up = common::wait_until(Duration::from_secs(20), || {
        has_all(
            &d.sh_ok(&sb.id, "ps -eo comm").unwrap_or_default(),
            s.expect,
        )
    });
    if !up {
        let _ = d.remove(&sb.id);
        anyhow::bail!("the shape never came up in the sandbox");
    }
    let t = Instant::now();
    let ck = d.checkpoint(&sb.id, true, false);
    let ck_us = t.elapsed().as_micros() as u64;
    let _ = d.remove(&sb.id);
    let ck = ck?;
    let fork = d.fork(&ck.id, BRANCHES, false);
    let result = fork.map(|f| {
        let per: Vec<u64> = f
            .branches
            .iter()
            .filter_map(|b| b.phases_us.get("total").copied())
            .collect();
        let ok = f
            .branches
            .iter()
            .filter(|b| has_all(&d.sh_ok(&b.id, "ps -eo comm").unwrap_or_default(), s.expect))
            .count();
        for b in &f.branches {
            let _ = d.remove(&b.id);
        }
        (ck_us, per, ok)
    });
    let _ = d.remove_checkpoint(&ck.id);
    result
}

/// podman: one container, `checkpoint --export`, one `restore --import`.
fn podman_round(
    p: &Podman,
    s: &Shape,
    n: usize,
    dir: &std::path::Path,
) -> Result<(u64, Vec<u64>, usize)> {
    let name = format!("forkd-bench-trees-{n}");
    let c = PodmanContainer::start_with(
        p,
        &name,
        PODMAN_IMAGE,
        PODMAN_TCP_FLAGS,
        &["bash", "-c", &full_script(s)],
    )?;
    let top = |n: &str| -> String {
        Command::new("podman")
            .args(["exec", n, "ps", "-eo", "comm"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
    };
    if !common::wait_until(Duration::from_secs(20), || has_all(&top(&c.name), s.expect)) {
        anyhow::bail!("the shape never came up in the container");
    }
    let export = dir.join(format!("{name}.tar"));
    let _ = std::fs::remove_file(&export);
    let ck_us = checkpoint_with_watchdog(p, &c.name, &export)?;
    // podman refuses `--name` with `--tcp-established`: the copy takes the original's
    // name, which is free once the original is removed.
    drop(c);
    let copy = PodmanContainer { name: name.clone() };
    let r_us = common::time_command(&mut p.restore_import(&["--tcp-established"], &export))?;
    let ok = usize::from(has_all(&top(&copy.name), s.expect));
    drop(copy);
    let _ = std::fs::remove_file(&export);
    Ok((ck_us, vec![r_us], ok))
}

/// `podman container checkpoint --tcp-established --export`, timed. runc freezes the
/// container's cgroup before CRIU seizes the tree, and ptrace cannot seize a stopped task
/// that is frozen: with a stopped process in the tree the dump waits in the kernel
/// forever. After 60 s the container's freezer cgroup is thawed (which lets the dump go
/// on, or fail) and the round counts as hung.
fn checkpoint_with_watchdog(p: &Podman, name: &str, export: &std::path::Path) -> Result<u64> {
    // The container's id, asked now: podman holds the container's lock during a
    // checkpoint, so asking then would wait with it.
    let id = Command::new("podman")
        .args(["inspect", "--format", "{{.Id}}", name])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let t = Instant::now();
    let mut child = p
        .checkpoint_export(&["--tcp-established"], export, name)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("run podman container checkpoint")?;
    let mut hung = false;
    loop {
        if let Some(status) = child.try_wait()? {
            let us = t.elapsed().as_micros() as u64;
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            if hung {
                anyhow::bail!("podman container checkpoint hung (a stopped task in a frozen cgroup) until the benchmark thawed it after 60 s");
            }
            if !status.success() {
                anyhow::bail!(
                    "podman container checkpoint failed ({status}): {}",
                    err.trim()
                );
            }
            return Ok(us);
        }
        if !hung && t.elapsed() > Duration::from_secs(60) {
            hung = true;
            thaw_container(&id);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Thaws every cgroup v1 freezer cgroup whose name holds the container's id.
fn thaw_container(id: &str) {
    fn walk(dir: &std::path::Path, id: &str) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            if !p.is_dir() {
                continue;
            }
            if !id.is_empty() && e.file_name().to_string_lossy().contains(id) {
                if let Err(err) = std::fs::write(p.join("freezer.state"), "THAWED") {
                    eprintln!("  thaw {}: {err}", p.display());
                }
            }
            walk(&p, id);
        }
    }
    walk(std::path::Path::new("/sys/fs/cgroup/freezer"), id);
}

fn has_all(ps: &str, expect: &[&str]) -> bool {
    expect.iter().all(|e| ps.lines().any(|l| l.trim() == *e))
}

fn run() -> Result<()> {
    let Some(debian) = common::root_and_debian("bench trees")? else {
        return Ok(());
    };
    let samples = common::env_usize("FORKD_BENCH_TREES_SAMPLES", 3)?;
    let podman = Podman::detect()?;
    let date = common::utc_now();
    let load_start = common::load_average();
    let d = DaemonGuard::start(&PathBuf::from(env!("CARGO_BIN_EXE_forkd")))?;
    d.import(&debian, "debian")?;
    if let Some(p) = &podman {
        p.import(&debian, PODMAN_IMAGE)?;
    }
    let scratch = common::unique_temp_dir("forkd-bench-trees")?;
    let mut report = Report::new("trees");
    let mut outcome = Vec::new();
    for s in shapes() {
        for tool in ["forkd", "podman"] {
            if tool == "podman" && podman.is_none() {
                continue;
            }
            let mut ck = Vec::new();
            let mut restore = Vec::new();
            let (mut up, mut copies, mut error) = (0, 0, None::<String>);
            for n in 0..samples {
                common::check_interrupted()?;
                let r = match tool {
                    "forkd" => forkd_round(&d, &s),
                    _ => podman_round(podman.as_ref().unwrap(), &s, n, &scratch),
                };
                match r {
                    Ok((c, per, ok)) => {
                        ck.push(c);
                        copies += per.len();
                        restore.extend(per);
                        up += ok;
                    }
                    Err(e) => {
                        error = Some(
                            format!("{e:#}")
                                .lines()
                                .next()
                                .unwrap_or("")
                                .chars()
                                .take(160)
                                .collect(),
                        );
                    }
                }
            }
            eprintln!(
                "  {tool}: {}: {up} copies running, {}",
                s.name,
                error.as_deref().unwrap_or("no error")
            );
            if !ck.is_empty() {
                report.row(&format!("{}: {tool} live checkpoint", s.name), ck);
                report.row(&format!("{}: {tool} restore per copy", s.name), restore);
            }
            outcome.push((
                format!("{}: {tool}", s.name),
                match &error {
                    None => format!("{up} of {copies} copies ran the whole tree"),
                    Some(e) => format!("{up} of {copies} copies ran; failed: {e}"),
                },
            ));
        }
    }
    report
        .sections
        .push(("Restored with the whole tree".into(), outcome));
    let cleanup = d.stop();
    let _ = std::fs::remove_dir_all(&scratch);
    let run = common::RunInfo::at_end(&date, &load_start);
    let header = run.header(
        json!({ "samples": samples, "branches": BRANCHES }),
        ("peers", json!({ "podman": podman.as_ref().map(|p| json!({"version": p.version, "runtime": p.runtime})) })),
    );
    let title = run.title("peer: podman checkpoint/restore (runc, the same CRIU)");
    let (json_path, md_path, md) = report.write(&header, &title).context("write the report")?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    drop(cleanup);
    Ok(())
}
