//! Resuming a stopped sandbox from a live checkpoint of it (`POST
//! /v1/sandboxes/{id}/resume`): the checkpoint's process tree restored as a branch that
//! takes the sandbox's place, under the same id, with its labels, owner and limits. A
//! pause is a live checkpoint that stops the sandbox; a resume is this.
//!
//! All or nothing: the stopped sandbox's directory is set aside (`<id>.resuming`) while
//! the branch starts under its id, removed once the branch runs, and put back if the
//! branch fails, so the sandbox is stopped as before. A daemon that dies in between
//! finds the aside directory at its next start ([`Daemon::recover_resumes`]): put back
//! where no sandbox took its place, removed where one did.

use super::Checkpoint;
use crate::api::{ApiError, ForkRequest, SandboxStatus};
use crate::daemon::lifecycle::{Begun, Verb};
use crate::daemon::sandboxes::Sandbox;
use crate::daemon::{log, Daemon, Lock};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a stopped sandbox's directory is renamed to while a resume runs.
const ASIDE: &str = ".resuming";

fn aside_of(dir: &Path) -> PathBuf {
    let mut p = dir.as_os_str().to_owned();
    p.push(ASIDE);
    PathBuf::from(p)
}

impl Daemon {
    /// The newest live checkpoint taken of `sb`, for a resume that names none.
    pub fn latest_live_checkpoint(&self, sb: &Sandbox) -> Result<Arc<Checkpoint>, ApiError> {
        let table = self.checkpoints.table.locked();
        table
            .values()
            .filter(|c| {
                let r = c.record.locked();
                r.live && r.sandbox == sb.id
            })
            .max_by_key(|c| {
                let r = c.record.locked();
                (r.created, r.id.to_string())
            })
            .cloned()
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "sandbox {} has no live checkpoint to resume from",
                    sb.id
                ))
            })
    }

    /// Resumes the stopped sandbox `sb` from `c`, a live checkpoint taken of it.
    pub fn resume_sandbox(
        self: &Arc<Self>,
        sb: &Arc<Sandbox>,
        c: &Arc<Checkpoint>,
        expires_in_secs: Option<u64>,
    ) -> Result<(), ApiError> {
        {
            let r = c.record.locked();
            if r.sandbox != sb.id || !r.live {
                return Err(ApiError::bad_request(format!(
                    "checkpoint {} is not a live checkpoint of sandbox {}",
                    c.id, sb.id
                )));
            }
        }
        let (labels, owner, mut limits) = {
            let rec = sb.record.locked();
            if rec.status != SandboxStatus::Stopped {
                return Err(ApiError::conflict(format!(
                    "sandbox {} is {}: only a stopped sandbox is resumed",
                    sb.id, rec.status
                )));
            }
            (rec.labels.clone(), rec.owner.clone(), rec.limits.clone())
        };
        self.admit(
            crate::daemon::admission::Ask {
                what: &format!("resume of sandbox {}", sb.id),
                sandboxes: 1,
                tasks_each: c.tasks(),
                defaults: false,
            },
            &mut limits,
        )?;
        let _in_use = c.use_for("resume")?;
        let held = match sb.begin(Verb::Remove { force: false })? {
            Begun::Held(h) => h,
            Begun::Nothing => {
                return Err(ApiError::not_found(format!(
                    "sandbox {} is being removed",
                    sb.id
                )))
            }
        };
        let req = ForkRequest {
            count: Some(1),
            expires_in_secs,
            ..Default::default()
        };
        let mut plan = self.plan_fork(c, &req, limits, owner)?;
        // The sandbox's own labels, not the checkpoint's.
        plan.labels = labels;
        let aside = aside_of(&sb.dir);
        std::fs::rename(&sb.dir, &aside).map_err(|e| {
            ApiError::internal(format!(
                "resume of sandbox {}: set {} aside: {e}",
                sb.id,
                sb.dir.display()
            ))
        })?;
        self.sandboxes.table.locked().remove(&sb.id);
        match self.fork_branch(&plan, Some(sb.id.clone())) {
            Ok(_) => {
                self.delete_sandbox_dir(&aside);
                held.settle(SandboxStatus::Removing, |_| Ok(()))?;
                log::info(&format!(
                    "sandbox {}: resumed from checkpoint {}",
                    sb.id, c.id
                ));
                Ok(())
            }
            Err(e) => {
                // Back as it was: stopped (the hold's end restores the state).
                if let Err(re) = std::fs::rename(&aside, &sb.dir) {
                    log::warn(&format!(
                        "sandbox {}: put {} back: {re}",
                        sb.id,
                        aside.display()
                    ));
                }
                self.sandboxes.table.locked().insert(sb.clone());
                drop(held);
                Err(e)
            }
        }
    }

    /// Settles what a daemon that died during a resume left: each `<id>.resuming`
    /// directory is put back where no sandbox `<id>` runs, and removed where one does.
    pub(crate) fn recover_resumes(&self) {
        let dir = self.node.data.join("sandboxes");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let Some(id) = name.strip_suffix(ASIDE) else {
                continue;
            };
            let aside = entry.path();
            let home = dir.join(id);
            let taken = home.join("state.json").exists();
            if taken {
                log::info(&format!(
                    "sandbox {id}: a resume finished; removing what it set aside"
                ));
                self.delete_sandbox_dir(&aside);
            } else {
                log::info(&format!(
                    "sandbox {id}: a resume did not finish; putting the sandbox back"
                ));
                if home.exists() {
                    self.delete_sandbox_dir(&home);
                }
                if let Err(e) = std::fs::rename(&aside, &home) {
                    log::warn(&format!("sandbox {id}: put {} back: {e}", aside.display()));
                }
            }
        }
    }
}
