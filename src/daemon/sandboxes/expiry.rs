//! Sandboxes that expire (E2B's sandbox timeout): a sandbox may carry a time at which
//! the daemon removes it, set when it is made (`expires_in_secs`) and changed later
//! (`setSandboxExpiry`). A watcher thread looks once a second and removes, as a forced
//! removal does, every sandbox whose time has come. The time is in the sandbox's record,
//! so it survives a restart of the daemon (a sandbox that expired meanwhile goes at the
//! watcher's first look).

use super::Sandbox;
use crate::api::{ApiError, SandboxStatus};
use crate::daemon::{log, now_secs, Daemon, Lock};
use std::sync::Arc;
use std::time::Duration;

/// How often the watcher looks.
const EVERY: Duration = Duration::from_secs(1);

impl Daemon {
    /// Sets when `sb` is removed: `in_secs` from now, or never.
    pub fn set_expiry(&self, sb: &Sandbox, in_secs: Option<u64>) -> Result<(), ApiError> {
        let mut rec = sb.record.locked();
        if rec.status == SandboxStatus::Removing {
            return Err(ApiError::not_found(format!(
                "sandbox {} is being removed",
                sb.id
            )));
        }
        let before = rec.expires_at;
        rec.expires_at = in_secs.map(|s| now_secs().saturating_add(s));
        let written = crate::daemon::write_json_atomic(
            &sb.dir,
            "state.json",
            &*rec,
            crate::daemon::Survive::DaemonCrash,
        );
        if let Err(e) = written {
            // Not written: the sandbox keeps the time it had.
            rec.expires_at = before;
            return Err(e);
        }
        Ok(())
    }

    /// Starts the watcher (a thread that ends with the daemon).
    pub(crate) fn watch_expiry(self: &Arc<Self>) -> std::io::Result<()> {
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("expiry".into())
            .spawn(move || loop {
                std::thread::sleep(EVERY);
                match weak.upgrade() {
                    Some(d) => d.remove_expired(),
                    None => break,
                }
            })
            .map(drop)
    }

    /// Removes every sandbox whose time has come, each on a worker of its own so that
    /// one slow removal does not hold the others back.
    fn remove_expired(self: &Arc<Self>) {
        let now = now_secs();
        // The table's lock is not held while records are looked at.
        let all: Vec<Arc<Sandbox>> = self.sandboxes.table.locked().values().cloned().collect();
        let due: Vec<Arc<Sandbox>> = all
            .into_iter()
            .filter(|sb| {
                let rec = sb.record.locked();
                rec.expires_at.is_some_and(|at| at <= now) && rec.status != SandboxStatus::Removing
            })
            .collect();
        for sb in due {
            let d = self.clone();
            let spawned = std::thread::Builder::new()
                .name("expired".into())
                .spawn(move || match d.remove_sandbox(&sb, true) {
                    Ok(()) => log::info(&format!("sandbox {}: expired, removed", sb.id)),
                    Err(e) => log::warn(&format!(
                        "sandbox {}: expired; removal failed: {}",
                        sb.id, e.message
                    )),
                });
            if let Err(e) = spawned {
                log::warn(&format!("expiry: no thread for a removal: {e}"));
                break;
            }
        }
    }
}
