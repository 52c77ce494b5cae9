//! Confined agents: an agent process reaches its own trial and nothing else.
//!
//! External agents and harness drivers (mini-swe-agent) run on the host. Each one gets:
//! - a **grant** on its trial's sandbox (`POST /v1/sandboxes/{id}/grants`, see the
//!   daemon's `grants` module): a socket of its own, owned by the agent's user, that
//!   serves exec, files, logs, trajectory and inspect of that one sandbox; everything
//!   else is refused (403) and kept in the grant. Its step budget is the task's
//!   `max_steps`, counted by the daemon when an exec starts: the exec past it is refused.
//!   `FORKD_SOCKET` points at the grant's socket, so the clients need no change.
//! - a **user of its own** (from `FORKD_AGENT_UID_BASE`, default [`DEFAULT_UID_BASE`],
//!   one of 65,536 numbers a trial), without supplementary groups or a way back to root
//!   (`no_new_privs`);
//! - a **mount namespace** where the suites the run reads and the run directory are
//!   covered by empty tmpfs mounts, except the agent's own directory
//!   (`trials/<trial>/agent`, its home and working directory);
//! - afterwards, the grant's record in `trials/<trial>/grant.json`: steps taken, every
//!   refusal (what was asked, why it was refused, whether it was the budget).
//!
//! The evaluator's own scripted agents (oracle, noop, patch, script, replay) are its own
//! code and act through its session directly.

use super::session::{Infra, InfraResult, Session};
use forkd_api::{GrantInfo, GrantRequest};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// The first uid given to agents when `FORKD_AGENT_UID_BASE` is not set: far above the
/// ranges distributions give to people, services and user namespaces.
pub const DEFAULT_UID_BASE: u32 = 2_000_000_000;
/// How many uids agents take turns on.
const UID_SPAN: u32 = 65_536;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The uid for the next agent: different for every agent that runs at once in this
/// process, and (through the process id) most likely from other evaluators' too.
fn next_uid() -> InfraResult<u32> {
    let base = match std::env::var("FORKD_AGENT_UID_BASE") {
        Ok(v) => v
            .parse::<u32>()
            .ok()
            .filter(|b| *b > 0 && b.checked_add(UID_SPAN).is_some())
            .ok_or_else(|| {
                Infra(format!(
                    "FORKD_AGENT_UID_BASE={v:?}: expected a uid from 1 to {}",
                    u32::MAX - UID_SPAN
                ))
            })?,
        Err(_) => DEFAULT_UID_BASE,
    };
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    Ok(base + (std::process::id().wrapping_mul(4099).wrapping_add(n)) % UID_SPAN)
}

/// One agent's confinement, from its grant to its record.
pub struct Confined {
    pub grant: GrantInfo,
    /// The agent's own directory: its home, its working directory, where its brief goes.
    pub dir: PathBuf,
    hide: Vec<PathBuf>,
}

impl Confined {
    /// Makes the grant on `sandbox` and the agent's directory `dir` (emptied, owned by
    /// the agent's user, mode 0700). `hide`: what the agent must not see.
    pub fn prepare(
        s: &Session,
        sandbox: &str,
        max_steps: u64,
        dir: &Path,
        hide: Vec<PathBuf>,
    ) -> InfraResult<Confined> {
        if !nix::unistd::Uid::effective().is_root() {
            return Err(Infra(
                "confined agents need the evaluator to run as root (it gives each agent a user and a mount namespace of its own)".into(),
            ));
        }
        let uid = next_uid()?;
        let dir = &std::path::absolute(dir)
            .map_err(|e| Infra(format!("agent directory {}: {e}", dir.display())))?;
        let _ = std::fs::remove_dir_all(dir);
        let made = std::fs::create_dir_all(dir)
            .and_then(|_| std::os::unix::fs::chown(dir, Some(uid), Some(uid)))
            .and_then(|_| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)));
        made.map_err(|e| Infra(format!("agent directory {}: {e}", dir.display())))?;
        let req = GrantRequest {
            uid,
            gid: Some(uid),
            max_steps: Some(max_steps.max(1)),
        };
        let grant: GrantInfo = s
            .client
            .call(
                "POST",
                &format!("/v1/sandboxes/{sandbox}/grants"),
                Some(&serde_json::to_value(&req).expect("json")),
            )
            .map_err(|e| Infra(format!("grant on sandbox {sandbox}: {e}")))?;
        Ok(Confined {
            grant,
            dir: dir.to_path_buf(),
            hide,
        })
    }

    /// Makes `cmd` run as the agent: its user, its mount namespace, its grant's socket,
    /// its directory as home and working directory.
    pub fn apply(&self, cmd: &mut std::process::Command) -> InfraResult<()> {
        cmd.env("FORKD_SOCKET", &self.grant.socket)
            .env("HOME", &self.dir)
            .current_dir(&self.dir);
        let c = forkd_sys::confine::Confinement {
            uid: self.grant.uid,
            gid: self.grant.gid,
            hide: self.hide.clone(),
            keep: self.dir.clone(),
        };
        forkd_sys::confine::confine(cmd, &c)
            .map_err(|e| Infra(format!("confine agent in {}: {e}", self.dir.display())))
    }

    /// Writes a file into the agent's directory that the agent may read and change.
    pub fn give(&self, name: &str, data: &[u8]) -> InfraResult<PathBuf> {
        let p = self.dir.join(name);
        std::fs::write(&p, data)
            .and_then(|_| std::os::unix::fs::chown(&p, Some(self.grant.uid), Some(self.grant.gid)))
            .map_err(|e| Infra(format!("write {}: {e}", p.display())))?;
        Ok(p)
    }

    /// Whether the daemon has refused an exec for the step budget by now.
    pub fn budget_spent(&self, s: &Session) -> bool {
        s.client
            .call::<GrantInfo>("GET", &format!("/v1/grants/{}", self.grant.id), None)
            .map(|g| budget_refused(&g))
            .unwrap_or(false)
    }

    /// Revokes the grant and writes its record to `record`; returns it.
    pub fn finish(self, s: &Session, record: &Path) -> InfraResult<GrantInfo> {
        let g: GrantInfo = s
            .client
            .call("DELETE", &format!("/v1/grants/{}", self.grant.id), None)
            .map_err(|e| Infra(format!("revoke grant {}: {e}", self.grant.id)))?;
        std::fs::write(record, serde_json::to_vec_pretty(&g).expect("json"))
            .map_err(|e| Infra(format!("write {}: {e}", record.display())))?;
        Ok(g)
    }
}

/// With every kept refusal used up, a later budget refusal is only counted: the grant's
/// steps then equal its budget.
fn budget_refused_past_kept(g: &GrantInfo) -> bool {
    g.refused as usize > g.refusals.len() && g.max_steps.is_some_and(|m| g.steps >= m)
}

/// Whether a finished grant shows the step budget spent.
pub fn budget_refused(g: &GrantInfo) -> bool {
    g.refusals.iter().any(|r| r.budget) || budget_refused_past_kept(g)
}
