//! Where a shard runs: the node and attempt it runs as (from the scheduler's
//! environment), its index, and the daemon it uses on that node.

use super::*;

/// This node's name: the scheduler's (`SLURMD_NODENAME`, or `NODE_NAME` as the
/// Kubernetes manifest sets it), else the host name.
pub fn node_name() -> String {
    for v in ["SLURMD_NODENAME", "NODE_NAME"] {
        if let Ok(n) = std::env::var(v) {
            if !n.is_empty() {
                return n;
            }
        }
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// The attempt running now, as the scheduler names it: `slurm:<job>_<index>.<restart>`,
/// `kube:<pod>`, else `local:<pid>`.
pub fn attempt_name() -> String {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if let (Some(job), Some(task)) = (var("SLURM_ARRAY_JOB_ID"), var("SLURM_ARRAY_TASK_ID")) {
        let restart = var("SLURM_RESTART_COUNT").unwrap_or_else(|| "0".into());
        return format!("slurm:{job}_{task}.{restart}");
    }
    if let Some(pod) = var("POD_NAME")
        .or_else(|| var("HOSTNAME").filter(|_| var("JOB_COMPLETION_INDEX").is_some()))
    {
        return format!("kube:{pod}");
    }
    format!("local:{}@{}", std::process::id(), node_name())
}

/// The shard index of this attempt: `--index`, else the scheduler's.
pub fn index_from_env() -> Option<usize> {
    ["SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse().ok())
}

/// The socket of this node's daemon, started (detached, on its own state root) when
/// none answers. Returns the socket and whether this call started the daemon.
pub fn node_daemon(plan: &Plan, node: &str) -> anyhow::Result<(PathBuf, bool)> {
    let (root, socket) = match &plan.node_root {
        Some(t) => {
            anyhow::ensure!(
                !node.is_empty() && !node.contains('/') && node != "." && node != "..",
                "node name {node:?} cannot name a state root"
            );
            let root = PathBuf::from(t.replace("%n", node));
            // Beside the root, not in it: the root is the daemon's own (mode 0700), and
            // confined agents must reach the grant sockets next to the daemon's.
            let socket = PathBuf::from(format!("{}.sock", root.display()));
            (root, socket)
        }
        None => (
            std::env::var_os("FORKD_ROOT")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/var/lib/forkd")),
            forkd_api::client::Client::default_socket(),
        ),
    };
    let answers = |s: &Path| {
        forkd_api::client::Client::new(s)
            .call::<serde_json::Value>("GET", "/v1/version", None)
            .is_ok()
    };
    if answers(&socket) {
        return Ok((socket, false));
    }
    std::fs::create_dir_all(&root)
        .map_err(|e| anyhow::anyhow!("node {node}: state root {}: {e}", root.display()))?;
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let log_path = PathBuf::from(format!("{}.log", root.display()));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| anyhow::anyhow!("node {node}: {}: {e}", log_path.display()))?;
    eprintln!(
        "[eval] node {node}: no daemon on {}; starting one on {} (log {})",
        socket.display(),
        root.display(),
        log_path.display()
    );
    // `setsid --fork`: the daemon outlives this job (a scheduler's job ends; the node's
    // daemon and its cached states stay for the next shard).
    let status = std::process::Command::new("setsid")
        .arg("--fork")
        .arg(std::env::current_exe()?)
        .arg("daemon")
        .env("FORKD_ROOT", &root)
        .env("FORKD_SOCKET", &socket)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .map_err(|e| anyhow::anyhow!("node {node}: start the daemon (setsid): {e}"))?;
    anyhow::ensure!(status.success(), "node {node}: setsid exited {status}");
    match forkd_api::client::Client::new(&socket)
        .wait_ready(std::time::Duration::from_secs(60), || Ok(()))
    {
        Ok(()) => Ok((socket, true)),
        Err(e) => {
            let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            anyhow::bail!(
                "node {node}: {e} (log {}: {})",
                log_path.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            )
        }
    }
}
