//! A table of long operations in progress (pulls, builds): each one's status, listed
//! while it runs and gone from the table when it ends, however it ends.

use super::Lock as _;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Jobs in progress by key, each with a status its worker updates.
pub struct Jobs<K, S> {
    table: Mutex<BTreeMap<K, Arc<Mutex<S>>>>,
}

impl<K: Ord + Clone, S: Clone> Default for Jobs<K, S> {
    fn default() -> Self {
        Jobs {
            table: Mutex::new(BTreeMap::new()),
        }
    }
}

impl<K: Ord + Clone, S: Clone> Jobs<K, S> {
    /// The statuses of every job in progress, in key order.
    pub fn list(&self) -> Vec<S> {
        self.table
            .locked()
            .values()
            .map(|j| j.locked().clone())
            .collect()
    }

    /// Enters a job with its first `status`; `None` if one with `key` is in progress.
    /// The job leaves the table when the returned guard drops.
    pub fn register(&self, key: K, status: S) -> Option<Registered<'_, K, S>> {
        let mut table = self.table.locked();
        if table.contains_key(&key) {
            return None;
        }
        let status = Arc::new(Mutex::new(status));
        table.insert(key.clone(), status.clone());
        Some(Registered {
            jobs: self,
            key,
            status,
        })
    }
}

/// A job in the table: its status, and its removal when it ends.
pub struct Registered<'a, K: Ord, S> {
    jobs: &'a Jobs<K, S>,
    key: K,
    pub status: Arc<Mutex<S>>,
}

impl<K: Ord, S> Drop for Registered<'_, K, S> {
    fn drop(&mut self) {
        self.jobs
            .table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_listed_while_it_runs_and_one_key_runs_once() {
        let jobs: Jobs<String, u32> = Jobs::default();
        let a = jobs.register("a".into(), 1).unwrap();
        assert!(jobs.register("a".into(), 2).is_none());
        *a.status.lock().unwrap() = 3;
        let b = jobs.register("b".into(), 4).unwrap();
        assert_eq!(jobs.list(), vec![3, 4]);
        drop(a);
        assert_eq!(jobs.list(), vec![4]);
        drop(b);
        assert!(jobs.list().is_empty());
        assert!(jobs.register("a".into(), 5).is_some());
    }
}
