//! Memory shared between branches of one checkpoint, through KSM.
//!
//! CRIU restores every page of a checkpoint into every branch: 16 branches of a 256 MiB
//! QEMU guest hold 16 private copies of the same guest memory. A fork that shares memory
//! marks its restored trees mergeable (the CRIU process that forks each runs with
//! `PR_SET_MEMORY_MERGE`, which every process it forks, the restored tree included,
//! inherits, across `exec` too), and the daemon runs the kernel's same-page merging:
//! identical pages of the branches become one copy-on-write page again. The semantics
//! of private memory stay the kernel's own (a write copies, a discarded page reads back
//! as zeros): KSM merges only pages whose contents are equal and breaks the share on
//! write.
//!
//! Which forks share (`FORKD_KSM`): `ask`, the default, only those whose request asks
//! (`share_memory: true`, `forkd fork --share-memory`); `on`, every live fork unless its
//! request says `share_memory: false`; `off`, none (a request that asks is refused).
//! Merging is between every tree opened to it, so sharing is a choice per fork: a
//! branch that shares can tell, by how long a write takes, whether another sharing
//! branch holds a page equal to one of its own (docs/DESIGN.md).
//!
//! KSM costs CPU while it scans, so the daemon scans fast only while a fork batch settles
//! (`FORKD_KSM_BOOST_PAGES` pages every `FORKD_KSM_SLEEP_MS`, for `FORKD_KSM_BOOST_SECS`
//! after the last fork) and slowly otherwise (`FORKD_KSM_IDLE_PAGES`). The knobs are the
//! machine's (`/sys/kernel/mm/ksm`): the daemon sets them when it starts (`on`) or at the
//! first fork that shares (`ask`), and puts back what it found when it stops (merged
//! pages stay merged). See docs/DESIGN.md for the choice of KSM.

use super::log;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The kernel's KSM controls.
const KSM: &str = "/sys/kernel/mm/ksm";

/// Which forks share their branches' memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// None; a request that asks is refused.
    Off,
    /// Those whose request asks (the default).
    Ask,
    /// Every live fork, unless its request declines.
    On,
}

/// What the daemon does about memory shared between branches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub mode: Mode,
    pub boost_pages: u64,
    pub idle_pages: u64,
    pub sleep_ms: u64,
    pub boost: Duration,
}

/// The daemon's sharing policy, and KSM's pacing once it runs.
pub struct Sharing {
    settings: Settings,
    /// Whether the kernel can open a branch's memory to KSM, or why not.
    supported: Result<(), String>,
    /// KSM as the daemon runs it: none until the first fork that shares (`ask`).
    running: Mutex<Option<Running>>,
}

/// KSM switched on by the daemon.
struct Running {
    /// Until when to scan fast; the pacing thread waits on the condition for changes.
    state: Arc<(Mutex<Option<Instant>>, Condvar)>,
    /// What the knobs were before the daemon set them.
    found: Vec<(&'static str, String)>,
}

fn knob(name: &str) -> PathBuf {
    PathBuf::from(KSM).join(name)
}

fn read_knob(name: &str) -> std::io::Result<String> {
    std::fs::read_to_string(knob(name)).map(|s| s.trim().to_string())
}

fn write_knob(name: &str, value: &str) -> std::io::Result<()> {
    std::fs::write(knob(name), value).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("write {value} to {}: {e}", knob(name).display()),
        )
    })
}

/// The first kernel with `PR_SET_MEMORY_MERGE`, which opens a whole process tree to KSM.
pub const MEMORY_MERGE_KERNEL: (u32, u32) = (6, 4);

/// Whether the kernel of `release`, which has `PR_SET_MEMORY_MERGE` or not, can share a
/// branch's memory; the error says why not. The kernel is asked, not its version read:
/// distribution kernels carry features back (RHEL's 5.14).
pub fn memory_merge_verdict(release: &str, available: bool) -> Result<(), String> {
    if available {
        return Ok(());
    }
    Err(format!(
        "memory sharing needs Linux {}.{} (PR_SET_MEMORY_MERGE); this kernel is {release}",
        MEMORY_MERGE_KERNEL.0, MEMORY_MERGE_KERNEL.1
    ))
}

impl Sharing {
    /// The policy; with `on`, switches KSM on at once with the idle rate and fails,
    /// naming the file, when the kernel has no KSM or its controls cannot be written, or
    /// naming the version, when it is older than Linux 6.4.
    /// `supported` is the kernel's verdict ([`super::features::Features::memory_merge`]).
    pub fn new(settings: Settings, supported: Result<(), String>) -> anyhow::Result<Sharing> {
        let sharing = Sharing {
            settings,
            supported,
            running: Mutex::new(None),
        };
        if sharing.settings.mode == Mode::On {
            sharing
                .supported
                .clone()
                .map_err(|e| anyhow::anyhow!("FORKD_KSM=on: {e}"))?;
            sharing.start()?;
        }
        Ok(sharing)
    }

    /// Whether a fork whose request said `asked` shares its branches' memory; starts KSM
    /// at the first that does. The error says why a request that asks cannot.
    pub fn for_fork(&self, asked: Option<bool>) -> Result<bool, String> {
        let share = match (self.settings.mode, asked) {
            (_, Some(false)) | (Mode::Ask | Mode::Off, None) => false,
            (Mode::Off, Some(true)) => {
                return Err("memory sharing between branches is off on this daemon \
                     (FORKD_KSM=off)"
                    .into())
            }
            (Mode::On, _) | (Mode::Ask, Some(true)) => true,
        };
        if share {
            self.supported.clone()?;
            self.start().map_err(|e| format!("{e:#}"))?;
        }
        Ok(share)
    }

    /// Switches KSM on with the idle rate, once.
    fn start(&self) -> anyhow::Result<()> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if running.is_some() {
            return Ok(());
        }
        let mut found = Vec::new();
        for name in ["run", "pages_to_scan", "sleep_millisecs"] {
            let v = read_knob(name).map_err(|e| {
                anyhow::anyhow!(
                    "memory sharing needs the kernel's KSM, but {} cannot be read: {e}",
                    knob(name).display()
                )
            })?;
            found.push((name, v));
        }
        let set = || -> std::io::Result<()> {
            write_knob("pages_to_scan", &self.settings.idle_pages.to_string())?;
            write_knob("sleep_millisecs", &self.settings.sleep_ms.to_string())?;
            write_knob("run", "1")
        };
        if let Err(e) = set() {
            put_back(&found);
            return Err(e.into());
        }
        let state = Arc::new((Mutex::new(None), Condvar::new()));
        let (s, st) = (self.settings.clone(), state.clone());
        if let Err(e) = std::thread::Builder::new()
            .name("ksm".into())
            .spawn(move || pace(&s, &st))
        {
            put_back(&found);
            return Err(e.into());
        }
        log::info(&format!(
            "KSM on: {} pages every {} ms for {} s after a fork that shares memory, {} otherwise",
            self.settings.boost_pages,
            self.settings.sleep_ms,
            self.settings.boost.as_secs(),
            self.settings.idle_pages
        ));
        *running = Some(Running { state, found });
        Ok(())
    }

    /// A fork batch that shares memory was restored: scan fast until it has settled.
    pub fn forked(&self) {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let Some(r) = running.as_ref() else {
            return;
        };
        let (lock, cond) = &*r.state;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Instant::now() + self.settings.boost);
        cond.notify_one();
    }

    /// Puts the knobs back as they were found, if the daemon set them (pages merged so
    /// far stay merged).
    pub fn stop(&self) {
        if let Some(r) = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            put_back(&r.found);
        }
    }
}

fn put_back(found: &[(&'static str, String)]) {
    for (name, value) in found.iter().rev() {
        if let Err(e) = write_knob(name, value) {
            log::warn(&format!("KSM: {e}"));
        }
    }
}

/// The pacing thread: boost rate until the deadline, idle rate after.
fn pace(s: &Settings, state: &(Mutex<Option<Instant>>, Condvar)) {
    let (lock, cond) = state;
    let mut boosted = false;
    let mut until = lock.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let now = Instant::now();
        let want = until.is_some_and(|t| t > now);
        if want != boosted {
            let pages = if want { s.boost_pages } else { s.idle_pages };
            if let Err(e) = write_knob("pages_to_scan", &pages.to_string()) {
                log::warn(&format!("KSM: {e}"));
            }
            boosted = want;
        }
        until = match *until {
            Some(t) if t > now => {
                cond.wait_timeout(until, t - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            _ => cond.wait(until).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a request gets under each mode, where KSM never has to start.
    #[test]
    fn kernels_without_memory_merge_are_refused_by_name() {
        assert_eq!(
            memory_merge_verdict("5.10.0-33-amd64", false).unwrap_err(),
            "memory sharing needs Linux 6.4 (PR_SET_MEMORY_MERGE); this kernel is 5.10.0-33-amd64"
        );
        assert!(memory_merge_verdict("6.1.0-27-cloud-amd64", false).is_err());
        assert!(memory_merge_verdict("6.18.2", true).is_ok());
        // A distribution kernel that carries the call back is used, whatever its number.
        assert!(memory_merge_verdict("5.14.0-427.el9.x86_64", true).is_ok());
        // Every kernel from 6.4 answers the probe.
        let release = forkd_sys::mount::kernel_release();
        if forkd_sys::mount::kernel_version(&release).is_some_and(|v| v >= MEMORY_MERGE_KERNEL) {
            assert!(forkd_sys::probe::memory_merge(), "{release}");
        }
    }

    #[test]
    fn a_fork_shares_as_its_request_and_the_mode_say() {
        let with = |mode| Sharing {
            settings: Settings {
                mode,
                boost_pages: 1,
                idle_pages: 1,
                sleep_ms: 1,
                boost: Duration::from_secs(1),
            },
            supported: Ok(()),
            running: Mutex::new(None),
        };
        for mode in [Mode::Off, Mode::Ask, Mode::On] {
            assert_eq!(with(mode).for_fork(Some(false)), Ok(false), "{mode:?}");
        }
        assert_eq!(with(Mode::Ask).for_fork(None), Ok(false));
        assert_eq!(with(Mode::Off).for_fork(None), Ok(false));
        let e = with(Mode::Off).for_fork(Some(true)).unwrap_err();
        assert!(e.contains("FORKD_KSM=off"), "{e}");
    }
}
