//! Facts about the run for a report's header and title: the git revision, the date,
//! the machine and its load.

use super::host::proc_kib;
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::SystemTime;

/// `git rev-parse HEAD` of the source tree, and whether tracked files differ from it.
pub fn git_revision() -> (Option<String>, Option<bool>) {
    let dir = env!("CARGO_MANIFEST_DIR");
    let rev = Command::new("git")
        .args(["-C", dir, "rev-parse", "HEAD"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let dirty = Command::new("git")
        .args(["-C", dir, "status", "--porcelain", "--untracked-files=no"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| !o.stdout.is_empty());
    (rev, dirty)
}

/// What a report's header and title say about the run: the revision, the machine and
/// its load at the start and the end.
pub struct RunInfo {
    rev: Option<String>,
    dirty: Option<bool>,
    date: String,
    machine: Value,
    load_start: String,
    load_end: String,
}

impl RunInfo {
    /// Taken at the end of a run that started at `date` with load `load_start`.
    pub fn at_end(date: &str, load_start: &str) -> RunInfo {
        let (rev, dirty) = git_revision();
        RunInfo {
            rev,
            dirty,
            date: date.to_string(),
            machine: machine(),
            load_start: load_start.to_string(),
            load_end: load_average(),
        }
    }

    /// The JSON header: run facts, the benchmark's `config`, and its peers under `peers.0`.
    pub fn header(&self, config: Value, peers: (&str, Value)) -> Value {
        let mut header = json!({
            "git_revision": self.rev,
            "git_dirty": self.dirty,
            "date": self.date,
            "machine": self.machine,
            "load_average": { "start": self.load_start, "end": self.load_end },
            "config": config,
        });
        header[peers.0] = peers.1;
        header
    }

    /// The one-line title under the report's heading; `peers` names the peers measured.
    pub fn title(&self, peers: &str) -> String {
        let m = &self.machine;
        format!(
            "revision `{}`{}, {}; {} CPUs ({}), kernel {}, load average {} at start, {} at \
             end; {peers}",
            self.rev
                .as_deref()
                .map(|r| &r[..r.len().min(12)])
                .unwrap_or("unknown"),
            if self.dirty == Some(true) {
                " (with uncommitted changes)"
            } else {
                ""
            },
            self.date,
            m["nproc"],
            m["cpu"].as_str().unwrap_or("unknown cpu"),
            m["kernel"].as_str().unwrap_or("?"),
            self.load_start,
            self.load_end,
        )
    }
}

/// Now as an RFC 3339 UTC timestamp.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    forkd::api::time::rfc3339(secs, 0)
}

/// The 1, 5 and 15 minute load averages: a busy machine makes every row slower.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        });
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        "cpu": cpu,
        "mem_total_kib": proc_kib("/proc/meminfo", "MemTotal").ok(),
    })
}
