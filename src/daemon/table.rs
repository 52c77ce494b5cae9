//! The daemon's table of sandboxes, with the two indexes that questions about one
//! checkpoint or one image ask: which sandboxes stand on checkpoint C (its branches, and
//! sandboxes of later checkpoints over it), and which were made from image I.
//!
//! Without them each such question read every sandbox's record under its lock: with
//! 5,000 sandboxes alive that was ~3 ms in every filesystem checkpoint (its answer names
//! the checkpoint's branches) and in every removal of a checkpoint. A sandbox's lower
//! layers and image are fixed before it enters the table (the record is complete by
//! then, also for an imported archive) and never change, so the indexes are kept from
//! the record once, at insertion, and dropped at removal.

use super::checkpoints::Lower;
use super::sandboxes::Sandbox;
use forkd_sandbox::{CheckpointId, SandboxId};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

#[derive(Default)]
pub struct SandboxTable {
    by_id: HashMap<SandboxId, Arc<Sandbox>>,
    over_checkpoint: HashMap<CheckpointId, BTreeSet<SandboxId>>,
    of_image: HashMap<String, BTreeSet<SandboxId>>,
}

impl SandboxTable {
    /// Adds (or replaces) a sandbox, indexed by the checkpoints in its stack and its
    /// image.
    pub fn insert(&mut self, sb: Arc<Sandbox>) {
        self.remove(&sb.id);
        let (checkpoints, image) = {
            let rec = sb.record.locked();
            let cks: Vec<CheckpointId> = rec
                .lowers
                .iter()
                .filter_map(|l| match l {
                    Lower::Checkpoint(c) => Some(c.clone()),
                    Lower::Layer(_) => None,
                })
                .collect();
            (cks, rec.image.clone())
        };
        for c in checkpoints {
            self.over_checkpoint
                .entry(c)
                .or_default()
                .insert(sb.id.clone());
        }
        self.of_image
            .entry(image)
            .or_default()
            .insert(sb.id.clone());
        self.by_id.insert(sb.id.clone(), sb);
    }

    /// Takes a sandbox out, with its index entries.
    pub fn remove(&mut self, id: &SandboxId) -> Option<Arc<Sandbox>> {
        let sb = self.by_id.remove(id)?;
        let rec = sb.record.locked();
        for l in &rec.lowers {
            if let Lower::Checkpoint(c) = l {
                unindex(&mut self.over_checkpoint, c, id);
            }
        }
        unindex(&mut self.of_image, &rec.image, id);
        drop(rec);
        Some(sb)
    }

    pub fn by_id(&self) -> &HashMap<SandboxId, Arc<Sandbox>> {
        &self.by_id
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<Sandbox>> {
        self.by_id.values()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The sandboxes whose stack holds checkpoint `id`, in id order.
    pub fn over_checkpoint(&self, id: &CheckpointId) -> Vec<String> {
        names(self.over_checkpoint.get(id))
    }

    /// The sandboxes made from image `name`, in id order.
    pub fn of_image(&self, name: &str) -> Vec<String> {
        names(self.of_image.get(name))
    }
}

fn unindex<K: std::hash::Hash + Eq + std::borrow::Borrow<Q>, Q: std::hash::Hash + Eq + ?Sized>(
    index: &mut HashMap<K, BTreeSet<SandboxId>>,
    key: &Q,
    id: &SandboxId,
) {
    if let Some(set) = index.get_mut(key) {
        set.remove(id);
        if set.is_empty() {
            index.remove(key);
        }
    }
}

fn names(set: Option<&BTreeSet<SandboxId>>) -> Vec<String> {
    set.map(|s| s.iter().map(|id| id.to_string()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str, image: &str, checkpoints: &[&str]) -> Arc<Sandbox> {
        let lowers: Vec<String> = checkpoints
            .iter()
            .map(|c| format!("checkpoint:{c}"))
            .chain(std::iter::once(format!("layer:{}", "ab".repeat(32))))
            .collect();
        let rec = crate::daemon::record::test_record(id, image, &lowers, None);
        Arc::new(Sandbox::new(format!("/nonexistent/{id}").into(), rec))
    }

    const C1: &str = "c111111111111111";
    const C2: &str = "c222222222222222";

    #[test]
    fn the_indexes_follow_insertions_and_removals() {
        let mut t = SandboxTable::default();
        let c1: CheckpointId = C1.parse().unwrap();
        let c2: CheckpointId = C2.parse().unwrap();
        // A branch of C2, which was taken of a branch of C1: it stands on both.
        t.insert(sandbox("b000000000000002", "busybox", &[C2, C1]));
        t.insert(sandbox("a000000000000001", "busybox", &[C1]));
        t.insert(sandbox("d000000000000003", "debian", &[]));
        assert_eq!(t.len(), 3);
        assert_eq!(
            t.over_checkpoint(&c1),
            ["a000000000000001", "b000000000000002"]
        );
        assert_eq!(t.over_checkpoint(&c2), ["b000000000000002"]);
        assert_eq!(
            t.of_image("busybox"),
            ["a000000000000001", "b000000000000002"]
        );
        assert_eq!(t.of_image("debian"), ["d000000000000003"]);
        assert!(t.of_image("alpine").is_empty());

        let b: SandboxId = "b000000000000002".parse().unwrap();
        assert!(t.remove(&b).is_some());
        assert!(t.remove(&b).is_none(), "a second removal finds nothing");
        assert_eq!(t.over_checkpoint(&c1), ["a000000000000001"]);
        assert!(t.over_checkpoint(&c2).is_empty());
        assert!(!t.over_checkpoint.contains_key(&c2), "empty entries go");
        assert_eq!(t.of_image("busybox"), ["a000000000000001"]);

        // Inserting an id again replaces it and its index entries.
        t.insert(sandbox("a000000000000001", "debian", &[C2]));
        assert_eq!(t.len(), 2);
        assert!(t.over_checkpoint(&c1).is_empty());
        assert_eq!(t.over_checkpoint(&c2), ["a000000000000001"]);
        assert!(t.of_image("busybox").is_empty());
        assert_eq!(
            t.of_image("debian"),
            ["a000000000000001", "d000000000000003"]
        );
        assert!(t.by_id().contains_key(&"d000000000000003".parse().unwrap()));
    }
}
