//! A failed CRIU request explained: the response's verdict, the errors of its log, the
//! known causes named (a full filesystem, a missing kernel feature, ...).

use crate::*;
use rust_criu::rust_criu_protobuf::rpc;
use std::path::Path;

pub(crate) fn check(
    resp: rpc::Criu_resp,
    action: &'static str,
    log: &Path,
) -> Result<rpc::Criu_resp, CriuError> {
    if resp.success() {
        return Ok(resp);
    }
    // CRIU's own message is its first error, often a harmless one (RLIMIT_NOFILE, which
    // it cannot raise without CAP_SYS_RESOURCE); the log's first real error is the cause.
    let errors = log_errors(log);
    let mut message = errors.first().cloned().unwrap_or_else(|| {
        // With nothing in the log (one it could not write, say), CRIU's own message is
        // all there is, unless it is only the harmless RLIMIT_NOFILE one.
        let own = resp.cr_errmsg();
        if own.contains("RLIMIT_NOFILE") {
            "no reason in the log".to_string()
        } else {
            own.to_string()
        }
    });
    if resp.has_cr_errno() && resp.cr_errno() != 0 {
        message.push_str(&format!(
            " ({})",
            std::io::Error::from_raw_os_error(resp.cr_errno())
        ));
    }
    if message.trim().is_empty() {
        message = "no reason given; see the log".into();
    }
    // The process CRIU stopped at, named while it still runs (a failed dump resumes the
    // tree), so that the caller knows which of its programs cannot be kept.
    if action == "dump" {
        if let Some(who) = culprit_pid(&errors).and_then(describe_process) {
            message = format!("process {who}: {message}");
        }
    }
    if let Some(why) = explain(&errors) {
        message.push_str(": ");
        message.push_str(&why);
    }
    if let Some(full) = log.parent().and_then(full_filesystem) {
        message.push_str(": ");
        message.push_str(&full);
    }
    Err(CriuError::Failed {
        action,
        message: message.trim().to_string(),
        log: log.to_path_buf(),
        tail: log_tail(log),
    })
}

/// When the filesystem holding `dir` (the images, the log) has under 16 MiB left, which
/// is what a dump or restore that ran out of space leaves: what to tell the user.
pub(crate) fn full_filesystem(dir: &Path) -> Option<String> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    (free < 16 << 20).then(|| {
        format!(
            "No space left on device: the filesystem holding {} has {} KiB free",
            dir.display(),
            free / 1024
        )
    })
}

/// What a known CRIU failure means here, in forkd's terms.
pub(crate) fn explain(errors: &[String]) -> Option<String> {
    if errors
        .iter()
        .any(|e| e.starts_with("inet: In-flight connection"))
    {
        return Some(
            "a listening socket has connections its server has not accepted yet; a live \
             checkpoint cannot keep them (they would be lost in every branch): let the \
             server accept them (or the clients give up) and checkpoint again"
                .into(),
        );
    }
    if errors.iter().any(|e| e.starts_with("Can't get rlimit")) {
        // `Dump core (pid: N) failed`: the process CRIU could not read.
        let who = errors
            .iter()
            .find_map(|e| {
                e.split("(pid: ")
                    .nth(1)?
                    .split(')')
                    .next()?
                    .parse::<u32>()
                    .ok()
            })
            .and_then(|pid| {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                Some(format!(
                    " ({}, uid {})",
                    status_field(&status, "Name:")?,
                    status_field(&status, "Uid:")?
                ))
            })
            .unwrap_or_default();
        return Some(format!(
            "a process of the tree{who} runs as a user other than root; CRIU reads every \
             process's resource limits with prlimit(2), which for another user's process \
             needs CAP_SYS_RESOURCE, and this machine does not grant it. forkd's CRIU bundle \
             (fixtures/setup.sh criu) carries a shim that reads them from /proc instead; \
             this CRIU does not: use the bundle (FORKD_CRIU), or checkpoint the files only"
        ));
    }
    None
}

/// The first process an error line names (`Dump files (pid: N) failed`, CRIU's form for
/// every per-process step); a host pid.
pub(crate) fn culprit_pid(errors: &[String]) -> Option<u32> {
    errors.iter().find_map(|e| {
        let rest = e.split("(pid: ").nth(1)?;
        rest.split(')').next()?.trim().parse().ok()
    })
}

/// A process as its owner knows it: its pid in its own namespace (the sandbox's), its
/// name and command line, e.g. `5 (python3: python3 /root/serve.py)`. `None` once it
/// has gone.
pub(crate) fn describe_process(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let name = status_field(&status, "Name:")?;
    // NSpid lists the pid in each namespace, the innermost last.
    let inner = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last().map(String::from))
        .unwrap_or_else(|| pid.to_string());
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut line = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ")
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if line.chars().count() > 160 {
        line = line.chars().take(157).collect::<String>() + "...";
    }
    Some(if line.is_empty() {
        format!("{inner} ({name})")
    } else {
        format!("{inner} ({name}: {line})")
    })
}

fn status_field(status: &str, key: &str) -> Option<String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
}

/// Error lines of a CRIU log without their timestamp and source location, harmless
/// ones left out.
pub(crate) fn log_errors(log: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(log) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| l.contains("Error (") && !l.contains("RLIMIT_NOFILE"))
        .map(|l| l.split_once("): ").map(|(_, m)| m).unwrap_or(l).to_string())
        .collect()
}

/// The last error lines of a CRIU log, for error messages.
pub fn log_tail(log: &Path) -> String {
    let errors = log_errors(log);
    if errors.is_empty() {
        return String::new();
    }
    let start = errors.len().saturating_sub(4);
    format!("\n  {}", errors[start..].join("\n  "))
}
