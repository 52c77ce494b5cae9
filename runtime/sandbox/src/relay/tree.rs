//! The command's process tree: its exited members reaped, the main command's status
//! kept, and the whole tree found and killed when a timeout fires.

use super::*;

/// Reaps every exited descendant; records the main command's status.
pub(super) fn reap(main: i32, status: &mut Option<WaitStatus>) {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(ws) => {
                if ws.pid() == Some(Pid::from_raw(main)) {
                    *status = Some(ws);
                }
            }
        }
    }
}

/// Microseconds since the epoch: a start time the relay and the init both read.
pub(crate) fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

pub(crate) fn exit_of(status: Option<WaitStatus>, timed_out: bool, elapsed: Duration) -> ExecExit {
    let (exit_code, signal) = match status {
        Some(WaitStatus::Exited(_, code)) => (code, None),
        Some(WaitStatus::Signaled(_, sig, _)) => (128 + sig as i32, Some(sig as i32)),
        _ => (128 + libc::SIGKILL, Some(libc::SIGKILL)),
    };
    ExecExit {
        exit_code,
        signal,
        timed_out,
        duration_us: elapsed.as_micros() as u64,
    }
}

/// Every process below this relay (the relay is a subreaper, so orphans stay below it).
fn descendants() -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // The command name may contain spaces and parentheses; fields follow the last ')'.
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            let mut fields = rest.split_whitespace();
            let _state = fields.next();
            if let Some(ppid) = fields.next().and_then(|p| p.parse::<i32>().ok()) {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut tree: HashSet<i32> = HashSet::from([me]);
    loop {
        let before = tree.len();
        for (pid, ppid) in &parent_of {
            if tree.contains(ppid) {
                tree.insert(*pid);
            }
        }
        if tree.len() == before {
            break;
        }
    }
    tree.remove(&me);
    tree.into_iter().collect()
}

/// Kills the command's whole tree: stop everything first so nothing can fork while we
/// look, then kill, and repeat until the tree is empty.
pub(super) fn kill_tree(main: i32, status: &mut Option<WaitStatus>) {
    for _ in 0..100 {
        let pids = descendants();
        if pids.is_empty() {
            return;
        }
        for &p in &pids {
            let _ = kill(Pid::from_raw(p), Signal::SIGSTOP);
        }
        for &p in &pids {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        reap(main, status);
        std::thread::sleep(Duration::from_millis(2));
    }
}
