//! Network namespaces made ahead of the creates and forks that take them.
//!
//! Every sandbox and every branch gets a network namespace of its own with only loopback
//! up (or, with egress, that plus a veth: `network.rs`). Making one is `unshare` and
//! bringing `lo` up, about 0.65 ms of a ~5 ms create, and taking `lo` up waits for the
//! kernel's network lock, which the host's own work over thousands of namespaces holds at
//! times (see docs/DESIGN.md, "Many sandboxes"). A thread of the daemon keeps a few made
//! ahead, so a create or a fork takes one instead of making it. Each namespace is handed
//! out once, by value, and nothing else holds it: once taken, it is the sandbox's alone,
//! as a namespace made in place would be. When none is ready (a batch of forks drains
//! them faster than the thread makes them), the caller makes its own as before. While
//! some are left, the next is made once the daemon is quiet ([`super::quiet`]); the last
//! one taken is replaced at once.

use super::log;
use super::quiet::Activity;
use super::Lock as _;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How long the thread waits after a take before it makes the next namespace.
const REFILL_AFTER: Duration = Duration::from_millis(20);
/// How often a namespace not needed yet looks again whether the daemon is quiet.
const QUIET_POLL: Duration = Duration::from_millis(10);

pub struct SpareNetns {
    ready: Mutex<Vec<OwnedFd>>,
    /// Signalled when one is taken.
    taken: Condvar,
    target: usize,
    /// The daemon's requests, for the namespaces not needed yet.
    activity: Arc<Activity>,
}

impl SpareNetns {
    /// Starts the thread that keeps `target` namespaces ready (none with 0).
    pub fn start(target: usize, activity: Arc<Activity>) -> anyhow::Result<Arc<Self>> {
        let spare = Arc::new(SpareNetns {
            ready: Mutex::new(Vec::with_capacity(target)),
            taken: Condvar::new(),
            target,
            activity,
        });
        if target > 0 {
            let s = spare.clone();
            std::thread::Builder::new()
                .name("spare-netns".into())
                .spawn(move || s.fill())
                .map_err(|e| anyhow::anyhow!("start the spare network namespace thread: {e}"))?;
        }
        Ok(spare)
    }

    /// A new network namespace with loopback up and nothing else: a ready one, or one
    /// made now.
    pub fn take(&self) -> std::io::Result<OwnedFd> {
        let ready = self.ready.locked().pop();
        match ready {
            Some(ns) => {
                self.taken.notify_one();
                Ok(ns)
            }
            None => forkd_net::netlink::new_netns(),
        }
    }

    fn fill(&self) {
        let mut failing = false;
        loop {
            {
                let mut ready = self.ready.locked();
                while ready.len() >= self.target {
                    ready = self
                        .taken
                        .wait(ready)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                // While some are left, the next waits for a quiet moment.
                while !ready.is_empty() && !self.activity.is_quiet() {
                    ready = self
                        .taken
                        .wait_timeout(ready, QUIET_POLL)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0;
                }
            }
            // After the operation that took one has had time to finish: on a machine of
            // few CPUs, making the next one beside it would slow it down.
            std::thread::sleep(REFILL_AFTER);
            // Made without the lock held: a take never waits for a namespace being made.
            match forkd_net::netlink::new_netns() {
                Ok(ns) => {
                    failing = false;
                    self.ready.locked().push(ns);
                }
                Err(e) => {
                    // Creates and forks make their own meanwhile (and report the error
                    // if it is theirs too).
                    if !failing {
                        log::warn(&format!("spare network namespaces: {e}; retrying"));
                    }
                    failing = true;
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    }
}
