//! When the daemon is answering nobody: the moment for work made ahead.
//!
//! The threads that keep things ready (spare layers, spare network namespaces) make what
//! a request took. Made at once, their work lands beside the caller's next request: a
//! spare layer is a btrfs snapshot, which commits the volume's transaction, and with
//! thousands of sandboxes writing that commit takes tens of milliseconds, during which
//! every other writer on the volume (the next request's own files, a sandbox's first
//! command opening its log) waits for it. So what is not needed yet waits until no
//! request has been under way for [`QUIET`]; what is needed (a pool that a take left
//! empty) is made as before, at once. docs/DESIGN.md ("Ten thousand branches") has the
//! measurements.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long no request must have been under way for the daemon to count as quiet.
pub const QUIET: Duration = Duration::from_millis(25);

/// The requests under way that may change something (the API's reads are not counted:
/// `routes::answer`), and when the last one ended.
pub struct Activity {
    under_way: AtomicUsize,
    /// When the last request ended, in microseconds since `epoch`.
    last_end_us: AtomicU64,
    epoch: Instant,
}

/// A request under way, until dropped.
pub struct Answering<'a>(&'a Activity);

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        self.0.last_end_us.store(self.0.now_us(), Ordering::Release);
        self.0.under_way.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            under_way: AtomicUsize::new(0),
            last_end_us: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl Activity {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Marks a request under way until the guard is dropped.
    pub fn answering(&self) -> Answering<'_> {
        self.under_way.fetch_add(1, Ordering::AcqRel);
        Answering(self)
    }

    /// How long the daemon has answered nobody (zero while a request is under way).
    pub fn quiet_for(&self) -> Duration {
        if self.under_way.load(Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        let last = self.last_end_us.load(Ordering::Acquire);
        Duration::from_micros(self.now_us().saturating_sub(last))
    }

    /// Whether no request has been under way for [`QUIET`].
    pub fn is_quiet(&self) -> bool {
        self.quiet_for() >= QUIET
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_only_once_the_last_request_has_been_over_for_a_while() {
        let a = Activity::default();
        std::thread::sleep(QUIET + Duration::from_millis(5));
        assert!(a.is_quiet(), "nothing was ever asked");
        let g = a.answering();
        assert!(!a.is_quiet(), "a request is under way");
        std::thread::sleep(QUIET + Duration::from_millis(5));
        assert!(!a.is_quiet(), "still under way, however long");
        drop(g);
        assert!(!a.is_quiet(), "it has only just ended");
        std::thread::sleep(QUIET + Duration::from_millis(5));
        assert!(a.is_quiet());
    }
}
