//! The pulls in progress, the daemon's bound on concurrent blob fetches (a counting
//! semaphore), and single flight: a blob one pull fetches, others wait for.

use super::super::Lock as _;
use crate::api::PullStatus;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

/// Pulls in progress, the daemon's bound on concurrent blob fetches, and the blobs
/// being fetched now.
pub struct Pulls {
    pub(super) jobs: super::super::jobs::Jobs<u64, PullStatus>,
    pub(super) next: std::sync::atomic::AtomicU64,
    pub(super) slots: Slots,
    pub(super) flights: Mutex<HashMap<String, Arc<Flight>>>,
}

/// A counting semaphore.
pub(super) struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

pub(super) struct SlotGuard<'a>(&'a Slots);

impl Slots {
    pub(super) fn acquire(&self) -> SlotGuard<'_> {
        let mut free = self.free.locked();
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= 1;
        SlotGuard(self)
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        *self.0.free.locked() += 1;
        self.0.freed.notify_one();
    }
}

/// One blob being fetched: waiters block until it is done, then look in the index.
pub(super) struct Flight {
    pub(super) done: Mutex<bool>,
    pub(super) cv: Condvar,
}

impl Pulls {
    /// A table whose jobs run `n` at once (`FORKD_PULL_PARALLEL`).
    pub fn new(n: usize) -> Self {
        Pulls {
            jobs: Default::default(),
            next: std::sync::atomic::AtomicU64::new(1),
            slots: Slots {
                free: Mutex::new(n),
                freed: Condvar::new(),
            },
            flights: Mutex::new(HashMap::new()),
        }
    }
}

impl Pulls {
    pub fn list(&self) -> Vec<PullStatus> {
        self.jobs.list()
    }
}

/// Ends a flight however its leader ends.
pub(super) struct Leading<'a> {
    pub(super) pulls: &'a Pulls,
    pub(super) key: String,
    pub(super) flight: Arc<Flight>,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        self.pulls.flights.locked().remove(&self.key);
        *self.flight.done.locked() = true;
        self.flight.cv.notify_all();
    }
}
