//! What a process tree must not be doing when CRIU dumps it, read from `/proc` through
//! the sandbox's cgroup: exec relays on their way out, threads inside `vfork`, stopped
//! tasks, tasks traced by another process.

use crate::api::ApiError;
use forkd_cgroups::Cgroup;
use forkd_sandbox::SandboxId;
use std::time::{Duration, Instant};

/// Waits, up to `limit`, until no exec relay of the sandbox is left whose command has
/// ended: a process running the init's binary (`comm` "init"), other than the init
/// itself, with no child. Relays of commands still running have their command as a
/// child and stay.
pub(super) fn wait_for_exiting_relays(cg: &Cgroup, init_pid: i32, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let pids = cg.pids().unwrap_or_default();
        let stat = |pid: i32| -> Option<(String, i32)> {
            let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let comm = s.get(s.find('(')? + 1..s.rfind(')')?)?.to_string();
            let ppid = s
                .get(s.rfind(')')? + 2..)?
                .split(' ')
                .nth(1)?
                .parse()
                .ok()?;
            Some((comm, ppid))
        };
        let procs: Vec<(i32, String, i32)> = pids
            .iter()
            .filter_map(|&p| stat(p).map(|(c, pp)| (p, c, pp)))
            .collect();
        let exiting = procs.iter().any(|(pid, comm, _)| {
            *pid != init_pid && comm == "init" && !procs.iter().any(|(_, _, pp)| pp == pid)
        });
        if !exiting || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A thread of the cgroup caught inside `vfork` (or a `clone`/`clone3` that may carry
/// `CLONE_VFORK`, as `posix_spawn` does), read from `/proc/PID/task/TID/syscall` of the
/// frozen tree. Such a parent cannot be seized until its child has called `exec`, and a
/// frozen or seized child never does, so a dump taken then waits out CRIU's timeout and
/// fails ("Unseizable non-zombie ... state D").
pub(super) fn vfork_parent(cg: &Cgroup) -> Option<i32> {
    const VFORK: &str = "58";
    const CLONE: &str = "56";
    const CLONE3: &str = "435";
    const CLONE_VFORK: u64 = 0x4000;
    cg.pids().unwrap_or_default().into_iter().find_map(|pid| {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
        tasks.flatten().find_map(|t| {
            let text = std::fs::read_to_string(t.path().join("syscall")).ok()?;
            let mut fields = text.split_whitespace();
            let in_vfork = match fields.next()? {
                VFORK | CLONE3 => true,
                CLONE => fields
                    .next()
                    .and_then(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).ok())
                    .is_some_and(|flags| flags & CLONE_VFORK != 0),
                _ => false,
            };
            in_vfork.then_some(pid)
        })
    })
}

/// Freezes the cgroup at a moment when no thread is inside `vfork` (see
/// [`vfork_parent`]): a caught one is thawed, given a moment to `exec`, and frozen again,
/// for up to about two seconds; then the freeze stands as it is (the dump may fail, and
/// says why).
pub(super) fn freeze_outside_vfork(cg: &Cgroup, sandbox: &SandboxId) -> Result<u32, ApiError> {
    let freeze = |on: bool| {
        cg.set_frozen(on, Duration::from_secs(10)).map_err(|e| {
            let _ = cg.set_frozen(false, Duration::from_secs(10));
            ApiError::from_chain(
                &format!("{} sandbox {sandbox}", if on { "freeze" } else { "thaw" }),
                &e,
            )
        })
    };
    freeze(true)?;
    let mut retries = 0;
    while retries < 200 && vfork_parent(cg).is_some() {
        retries += 1;
        freeze(false)?;
        std::thread::sleep(Duration::from_micros(500 * u64::from(retries.min(20))));
        freeze(true)?;
    }
    Ok(retries)
}

/// The processes of the cgroup in a stopped state (`T`, `t` in `/proc/PID/stat`).
pub(super) fn stopped_tasks(cg: &Cgroup) -> Vec<i32> {
    cg.pids()
        .unwrap_or_default()
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(") ")
                        .map(|(_, rest)| rest.starts_with(['T', 't']))
                })
                .unwrap_or(false)
        })
        .collect()
}

/// The processes of the cgroup that another process traces (`TracerPid` in
/// `/proc/PID/status`), each with its tracer: (pid, comm, tracer pid, tracer comm),
/// pids as the sandbox sees them.
pub(super) fn traced_tasks(cg: &Cgroup) -> Vec<(i32, String, i32, String)> {
    let comm = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_default()
    };
    // The innermost of `NSpid`'s pids: the one in the sandbox's own pid namespace.
    let inner = |pid: i32| -> i32 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .and_then(|v| v.split_whitespace().last()?.parse().ok())
            })
            .unwrap_or(pid)
    };
    cg.pids()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let tracer: i32 = status
                .lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))?
                .trim()
                .parse()
                .ok()?;
            (tracer != 0).then(|| (inner(pid), comm(pid), inner(tracer), comm(tracer)))
        })
        .collect()
}
