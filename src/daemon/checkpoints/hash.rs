//! A checkpoint's tree hash, computed after it is made: the hash of its own layer, then
//! of its whole stack (each lower's hash in order), written into `meta.json`.

use super::{Checkpoint, Lower};
use crate::daemon::{log, Daemon, Lock};
use forkd_sandbox::CheckpointId;
use std::sync::Arc;
use std::time::Duration;

impl Daemon {
    /// Computes the tree hash of a checkpoint's own layer, then of its whole stack.
    pub(super) fn hash_in_background(self: &Arc<Self>, c: Arc<Checkpoint>) {
        let d = self.clone();
        std::thread::spawn(move || {
            let fs_hash = match forkd_layers::tree_hash(&c.fs()) {
                Ok(h) => h.to_string(),
                // Removed while being hashed: its files went away under the walk.
                Err(e) if c.removed.load(std::sync::atomic::Ordering::SeqCst) => {
                    log::info(&format!(
                        "checkpoint {}: tree hash abandoned, the checkpoint was removed ({e})",
                        c.id
                    ));
                    return;
                }
                Err(e) => {
                    log::warn(&format!("checkpoint {}: tree hash: {e}", c.id));
                    return;
                }
            };
            let lowers = c.record.locked().lowers.clone();
            let mut stack = sha2::Sha256::default();
            use sha2::Digest;
            stack.update(b"forkd-stack-v1\0");
            for l in &lowers {
                let h = match l {
                    Lower::Layer(id) => id.to_string(),
                    Lower::Checkpoint(cid) if *cid == c.id => fs_hash.clone(),
                    Lower::Checkpoint(cid) => match d.wait_fs_hash(cid) {
                        Some(h) => h,
                        None => return,
                    },
                };
                stack.update(h.as_bytes());
                stack.update(b"\n");
            }
            let tree: String = stack
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let mut rec = c.record.locked();
            // Removed meanwhile: its directory is going or gone, write nothing there.
            // The flag is set under this record's lock, so a write in progress finishes
            // before the directory is deleted. (Only the record lock is taken here: the
            // table is locked before records elsewhere.)
            if c.removed.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            rec.fs_hash = Some(fs_hash);
            rec.tree_hash = Some(tree);
            if let Err(e) = crate::daemon::write_json_atomic(
                &c.dir,
                "meta.json",
                &*rec,
                crate::daemon::Survive::HostCrash,
            ) {
                log::warn(&format!("checkpoint {}: {e}", c.id));
            }
        });
    }

    fn wait_fs_hash(&self, id: &CheckpointId) -> Option<String> {
        for _ in 0..6000 {
            let c = self.checkpoints.table.locked().get(id).cloned()?;
            if let Some(h) = c.record.locked().fs_hash.clone() {
                return Some(h);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}
