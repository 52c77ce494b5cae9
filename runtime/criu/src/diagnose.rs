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
                let field = |k: &str| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix(k))
                        .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
                };
                Some(format!(" ({}, uid {})", field("Name:")?, field("Uid:")?))
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
