//! Grants: a capability on one sandbox, served on a socket of its own.
//!
//! The daemon's own socket is root's (it can do anything the daemon can). An agent under
//! evaluation gets a grant instead: `POST /v1/sandboxes/{id}/grants` with an unprivileged
//! uid and a step budget makes `<socket>.grants/<grant id>.sock`, owned by that uid with
//! mode 0600, and serves on it the same API, restricted:
//!
//! - only the operations in [`api::GRANTED_OPERATIONS`] (exec, files in and out, logs,
//!   the trajectory, inspect, version), and only on the grant's own sandbox: any other
//!   operation, and any path naming another sandbox (or an id prefix that does not
//!   resolve to the grant's), is answered 403 `forbidden`;
//! - every exec is a step, counted when it is admitted (before it starts, not when it
//!   ends); the exec past `max_steps` is refused with 403 naming the budget;
//! - every refusal is kept in the grant (the first [`api::GRANT_REFUSALS_KEPT`] in
//!   detail, all of them counted), so the evaluator can put them in the trial's record.
//!
//! The socket is bound under a private staging directory (mode 0700), given to its user,
//! and only then renamed into the grant directory, so nobody else can connect in between
//! (a process-wide umask change would race with the daemon's other threads). The grant
//! directory is the daemon's socket path with `.grants` added (`forkd.sock.grants`), mode
//! 0711: its users can reach their socket by name but cannot list the others. A grant ends when it is revoked
//! (`DELETE /v1/grants/{grant}`), when its sandbox is removed, or with the daemon: grants
//! are not recovered after a restart (the directory is emptied at start).

use super::Lock as _;
use super::{log, Daemon};
use crate::api::{self, ApiError, GrantInfo, GrantRequest, Refusal};
use forkd_sandbox::SandboxId;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One grant.
pub struct Grant {
    pub id: String,
    pub sandbox: SandboxId,
    pub uid: u32,
    pub gid: u32,
    pub max_steps: Option<u64>,
    pub socket: PathBuf,
    steps: AtomicU64,
    refused: AtomicU64,
    refusals: Mutex<Vec<Refusal>>,
    active: AtomicBool,
    /// Tells the accept loop to stop.
    stop: tokio::sync::watch::Sender<bool>,
}

impl Grant {
    pub fn info(&self) -> GrantInfo {
        GrantInfo {
            id: self.id.clone(),
            sandbox: self.sandbox.to_string(),
            socket: self.socket.display().to_string(),
            uid: self.uid,
            gid: self.gid,
            max_steps: self.max_steps,
            steps: self.steps.load(Ordering::SeqCst),
            refused: self.refused.load(Ordering::SeqCst),
            refusals: self.refusals.locked().clone(),
            active: self.active.load(Ordering::SeqCst),
        }
    }

    /// Admits one request, or refuses it (and keeps the refusal). An exec takes a step
    /// here, at admission.
    pub fn admit(
        &self,
        d: &Daemon,
        method: &str,
        path: &str,
        op: api::Operation,
        params: &HashMap<&'static str, String>,
    ) -> Result<(), ApiError> {
        let verdict = self.judge(d, op, params);
        if let Err((reason, budget)) = verdict {
            self.refused.fetch_add(1, Ordering::SeqCst);
            let mut kept = self.refusals.locked();
            if kept.len() < api::GRANT_REFUSALS_KEPT {
                kept.push(Refusal {
                    t_us: now_us(),
                    method: method.to_string(),
                    path: path.to_string(),
                    reason: reason.clone(),
                    budget,
                });
            }
            return Err(ApiError::forbidden(reason));
        }
        Ok(())
    }

    /// `Ok`, or why not and whether it is the step budget.
    fn judge(
        &self,
        d: &Daemon,
        op: api::Operation,
        params: &HashMap<&'static str, String>,
    ) -> Result<(), (String, bool)> {
        if !self.active.load(Ordering::SeqCst) {
            return Err((format!("grant {} was revoked", self.id), false));
        }
        if !api::GRANTED_OPERATIONS.contains(&op) {
            return Err((
                format!(
                    "grant {} allows exec, files, logs and inspect of sandbox {} only, not {}",
                    self.id,
                    self.sandbox,
                    op.id()
                ),
                false,
            ));
        }
        if let Some(id) = params.get("id") {
            // The id must name this grant's sandbox: in full, or as a prefix that
            // resolves to it (never to another one, whose existence is not confirmed).
            let own = self.sandbox.to_string();
            let resolves_here = own.starts_with(id.as_str())
                && d.sandboxes
                    .get(id)
                    .map(|sb| sb.id == self.sandbox)
                    .unwrap_or(false);
            if !resolves_here {
                return Err((
                    format!(
                        "grant {} covers sandbox {} only, not {id}",
                        self.id, self.sandbox
                    ),
                    false,
                ));
            }
        }
        if op == api::Operation::ExecInSandbox {
            let taken = self.steps.fetch_add(1, Ordering::SeqCst);
            if let Some(max) = self.max_steps {
                if taken >= max {
                    self.steps.fetch_sub(1, Ordering::SeqCst);
                    return Err((
                        format!(
                            "step budget of grant {} is spent: {max} execs allowed",
                            self.id
                        ),
                        true,
                    ));
                }
            }
        }
        Ok(())
    }
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The daemon's grants.
pub struct Grants {
    /// `<the daemon's socket>.grants`.
    dir: PathBuf,
    table: Mutex<HashMap<String, Arc<Grant>>>,
    /// Where a new grant's socket goes to be served (the server takes the other end).
    to_serve: tokio::sync::mpsc::UnboundedSender<GrantSocket>,
    sockets: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<GrantSocket>>>,
}

impl Grants {
    /// Grants served from `dir`, emptied of the sockets an earlier daemon left (only
    /// those: nothing else in it is touched, and a `dir` that is not a directory of
    /// root's is refused).
    pub fn open(dir: PathBuf) -> anyhow::Result<Grants> {
        use anyhow::Context;
        use std::os::unix::fs::MetadataExt;
        let stage = dir.join(".stage");
        for (d, mode) in [(&dir, 0o711), (&stage, 0o700)] {
            match std::fs::symlink_metadata(d) {
                Ok(m) if m.is_dir() && m.uid() == 0 => {}
                Ok(_) => anyhow::bail!(
                    "{} is not a directory of root's: grant sockets go there (move it away, or start the daemon with another socket path)",
                    d.display()
                ),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    std::fs::create_dir(d).with_context(|| format!("create {}", d.display()))?
                }
                Err(e) => return Err(e).with_context(|| format!("stat {}", d.display())),
            }
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode))
                .with_context(|| format!("chmod {}", d.display()))?;
            for entry in std::fs::read_dir(d).with_context(|| format!("read {}", d.display()))? {
                let entry = entry?;
                let name = entry.file_name();
                let name = name.to_string_lossy();
                let is_grant = name
                    .strip_suffix(".sock")
                    .is_some_and(|id| id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()));
                if is_grant {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        let (to_serve, sockets) = tokio::sync::mpsc::unbounded_channel();
        Ok(Grants {
            dir,
            table: Mutex::new(HashMap::new()),
            to_serve,
            sockets: Mutex::new(Some(sockets)),
        })
    }

    /// The grants' sockets, each as it is made, for the server to serve (once).
    pub fn sockets(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<GrantSocket>> {
        self.sockets.locked().take()
    }

    pub fn get(&self, id: &str) -> Result<Arc<Grant>, ApiError> {
        self.table
            .locked()
            .get(id)
            .cloned()
            .ok_or_else(|| ApiError::not_found(format!("no such grant: {id}")))
    }

    /// The grants on one sandbox.
    fn of(&self, sandbox: &SandboxId) -> Vec<Arc<Grant>> {
        self.table
            .locked()
            .values()
            .filter(|g| &g.sandbox == sandbox)
            .cloned()
            .collect()
    }
}

/// The first directory from `dir` up to `/` that others cannot traverse, if any.
fn untraversable(dir: &Path) -> Option<(PathBuf, u32)> {
    dir.ancestors().find_map(|a| {
        let mode = std::fs::metadata(a).ok()?.permissions().mode();
        (mode & 0o001 == 0).then(|| (a.to_path_buf(), mode & 0o7777))
    })
}

/// A grant's listening socket, to be served until the grant ends (`stopped`).
pub struct GrantSocket {
    pub listener: std::os::unix::net::UnixListener,
    pub grant: Arc<Grant>,
    pub stopped: tokio::sync::watch::Receiver<bool>,
}

impl Grants {
    /// Makes a grant on `sandbox`: its socket listens, and goes to the server to serve.
    pub fn grant(&self, sb: &super::Sandbox, req: &GrantRequest) -> Result<GrantInfo, ApiError> {
        if req.uid == 0 {
            return Err(ApiError::bad_request(
                "grant: uid 0 is root, which needs no grant (give an unprivileged uid)",
            ));
        }
        if req.uid == u32::MAX || req.gid == Some(u32::MAX) {
            return Err(ApiError::bad_request(
                "grant: 4294967295 is no user or group (it means \"unchanged\" to chown)",
            ));
        }
        if req.max_steps == Some(0) {
            return Err(ApiError::bad_request(
                "grant: max_steps must be at least 1 (leave it out for no limit)",
            ));
        }
        let status = sb.record.locked().status;
        if status != api::SandboxStatus::Running {
            return Err(ApiError::conflict(format!(
                "sandbox {} is {status:?}, not running: no grant on it",
                sb.id
            )));
        }
        let g = self;
        if let Some((dir, mode)) = untraversable(&g.dir) {
            return Err(ApiError::conflict(format!(
                "grant sockets live in {}, which uid {} cannot reach: {} has mode {mode:04o} (give it o+x, or put the daemon's socket elsewhere)",
                g.dir.display(),
                req.uid,
                dir.display()
            )));
        }
        let gid = req.gid.unwrap_or(req.uid);
        let id = forkd_sandbox::id::random_hex(8);
        let staged = g.dir.join(".stage").join(format!("{id}.sock"));
        let socket = g.dir.join(format!("{id}.sock"));
        let fail = |step: &str, e: std::io::Error| {
            let _ = std::fs::remove_file(&staged);
            ApiError::internal(format!("grant {id} on sandbox {}: {step}: {e}", sb.id))
        };
        let listener = std::os::unix::net::UnixListener::bind(&staged)
            .map_err(|e| fail(&format!("bind {}", staged.display()), e))?;
        std::os::unix::fs::chown(&staged, Some(req.uid), Some(gid))
            .map_err(|e| fail("chown", e))?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| fail("chmod", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| fail("set non-blocking", e))?;
        std::fs::rename(&staged, &socket)
            .map_err(|e| fail(&format!("rename to {}", socket.display()), e))?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let grant = Arc::new(Grant {
            id: id.clone(),
            sandbox: sb.id.clone(),
            uid: req.uid,
            gid,
            max_steps: req.max_steps,
            socket: socket.clone(),
            steps: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            refusals: Mutex::new(Vec::new()),
            active: AtomicBool::new(true),
            stop,
        });
        g.table.locked().insert(id.clone(), grant.clone());
        log::info(&format!(
            "grant {id}: sandbox {} to uid {} (steps {})",
            sb.id,
            req.uid,
            req.max_steps
                .map(|m| m.to_string())
                .unwrap_or_else(|| "unlimited".into())
        ));
        let info = grant.info();
        if self
            .to_serve
            .send(GrantSocket {
                listener,
                grant,
                stopped,
            })
            .is_err()
        {
            let _ = self.revoke(&id);
            return Err(ApiError::internal(format!(
                "grant {id}: the daemon is stopping and serves no new socket"
            )));
        }
        Ok(info)
    }

    /// Ends a grant: its socket goes, requests already admitted finish.
    pub fn revoke(&self, id: &str) -> Result<GrantInfo, ApiError> {
        let grant = self.get(id)?;
        self.table.locked().remove(id);
        grant.active.store(false, Ordering::SeqCst);
        let _ = grant.stop.send(true);
        if let Err(e) = std::fs::remove_file(&grant.socket) {
            if e.kind() != std::io::ErrorKind::NotFound {
                log::warn(&format!(
                    "grant {id}: remove {}: {e}",
                    grant.socket.display()
                ));
            }
        }
        Ok(grant.info())
    }

    /// Revokes every grant on a sandbox that is going away.
    pub(super) fn revoke_of(&self, sandbox: &SandboxId) {
        for g in self.of(sandbox) {
            let _ = self.revoke(&g.id);
        }
    }
}
