//! Removing a checkpoint (`DELETE /v1/checkpoints/{id}`): refused while branches or
//! later checkpoints stand on its layer, unless forced, which removes them first.

use super::Checkpoint;
use crate::api::ApiError;
use crate::daemon::{Daemon, Lock};

impl Daemon {
    /// Removes a checkpoint. Refused while branches or later checkpoints use its layer,
    /// unless `force`, which removes those first.
    pub fn remove_checkpoint(&self, c: &Checkpoint, force: bool) -> Result<(), ApiError> {
        c.begin_removal()?;
        let res = self.remove_begun(c, force);
        if res.is_err() {
            c.removing.store(false, std::sync::atomic::Ordering::SeqCst);
        }
        res
    }

    fn remove_begun(&self, c: &Checkpoint, force: bool) -> Result<(), ApiError> {
        let branches = self.branches_of(&c.id);
        let children = self.children_of(&c.id);
        if !force && (!branches.is_empty() || !children.is_empty()) {
            let mut what = Vec::new();
            if !branches.is_empty() {
                what.push(format!("sandboxes {}", branches.join(", ")));
            }
            if !children.is_empty() {
                what.push(format!("checkpoints {}", children.join(", ")));
            }
            return Err(ApiError::conflict(format!(
                "checkpoint {} is still needed by {}; remove them first or force",
                c.id,
                what.join(" and ")
            )));
        }
        for b in branches {
            if let Ok(sb) = self.sandboxes.get(&b) {
                self.remove_sandbox(&sb, true)?;
            }
        }
        for child in children {
            if let Ok(cc) = self.checkpoints.get(&child) {
                self.remove_checkpoint(&cc, true)?;
            }
        }
        self.checkpoints.table.locked().remove(&c.id);
        // Stop a background hash from writing meta.json (see hash_in_background).
        {
            let _rec = c.record.locked();
            c.removed.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        self.delete_checkpoint_dir(&c.dir);
        Ok(())
    }
}
