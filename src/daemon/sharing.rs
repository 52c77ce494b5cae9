//! Memory shared between branches of one checkpoint, through KSM.
//!
//! CRIU restores every page of a checkpoint into every branch: 16 branches of a 256 MiB
//! QEMU guest hold 16 private copies of the same guest memory. With `FORKD_KSM=on` the
//! daemon marks each restored tree mergeable (the CRIU process that forks it runs with
//! `PR_SET_MEMORY_MERGE`, which every process it forks, the restored tree included,
//! inherits, across `exec` too) and runs the kernel's same-page merging: identical pages
//! of the branches become one copy-on-write page again. The semantics of private memory
//! stay the kernel's own (a write copies, a discarded page reads back as zeros): KSM
//! merges only pages whose contents are equal and breaks the share on write.
//!
//! KSM costs CPU while it scans, so the daemon scans fast only while a fork batch settles
//! (`FORKD_KSM_BOOST_PAGES` pages every `FORKD_KSM_SLEEP_MS`, for `FORKD_KSM_BOOST_SECS`
//! after the last fork) and slowly otherwise (`FORKD_KSM_IDLE_PAGES`). The knobs are the
//! machine's (`/sys/kernel/mm/ksm`): the daemon sets them at start and puts back what it
//! found when it stops (merged pages stay merged). See docs/DESIGN.md for the choice.

use super::log;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The kernel's KSM controls.
const KSM: &str = "/sys/kernel/mm/ksm";

/// What the daemon does about memory shared between branches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub boost_pages: u64,
    pub idle_pages: u64,
    pub sleep_ms: u64,
    pub boost: Duration,
}

impl Settings {
    /// From `FORKD_KSM` (`off`, the default, or `on`) and its knobs; `None` when off.
    pub fn from_env() -> anyhow::Result<Option<Settings>> {
        let num =
            |name: &str, default: u64| -> anyhow::Result<u64> {
                match std::env::var(name) {
                    Err(_) => Ok(default),
                    Ok(v) => v.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                        anyhow::anyhow!("{name}={v:?}: expected a positive integer")
                    }),
                }
            };
        match std::env::var("FORKD_KSM").as_deref() {
            Err(_) | Ok("off") | Ok("0") => Ok(None),
            Ok("on") | Ok("1") => Ok(Some(Settings {
                boost_pages: num("FORKD_KSM_BOOST_PAGES", 4000)?,
                idle_pages: num("FORKD_KSM_IDLE_PAGES", 100)?,
                sleep_ms: num("FORKD_KSM_SLEEP_MS", 20)?,
                boost: Duration::from_secs(num("FORKD_KSM_BOOST_SECS", 30)?),
            })),
            Ok(other) => anyhow::bail!("FORKD_KSM={other:?}: expected on or off"),
        }
    }
}

/// The running KSM policy: a thread that raises the scan rate after forks and lowers it
/// when they have settled.
pub struct Sharing {
    settings: Settings,
    /// Until when to scan fast; the thread waits on the condition for changes.
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

impl Sharing {
    /// Switches KSM on with the idle rate. Fails, naming the file, when the kernel has
    /// no KSM or its controls cannot be written.
    pub fn start(settings: Settings) -> anyhow::Result<Arc<Sharing>> {
        let mut found = Vec::new();
        for name in ["run", "pages_to_scan", "sleep_millisecs"] {
            let v = read_knob(name).map_err(|e| {
                anyhow::anyhow!(
                    "FORKD_KSM=on, but {} cannot be read: {e}",
                    knob(name).display()
                )
            })?;
            found.push((name, v));
        }
        write_knob("pages_to_scan", &settings.idle_pages.to_string())?;
        write_knob("sleep_millisecs", &settings.sleep_ms.to_string())?;
        write_knob("run", "1")?;
        let sharing = Arc::new(Sharing {
            settings,
            state: Arc::new((Mutex::new(None), Condvar::new())),
            found,
        });
        let state = sharing.state.clone();
        let s = sharing.settings.clone();
        std::thread::Builder::new()
            .name("ksm".into())
            .spawn(move || pace(&s, &state))?;
        log::info(&format!(
            "KSM on: {} pages every {} ms for {} s after a fork, {} otherwise",
            sharing.settings.boost_pages,
            sharing.settings.sleep_ms,
            sharing.settings.boost.as_secs(),
            sharing.settings.idle_pages
        ));
        Ok(sharing)
    }

    /// A fork batch was restored: scan fast until it has settled.
    pub fn forked(&self) {
        let (lock, cond) = &*self.state;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Instant::now() + self.settings.boost);
        cond.notify_one();
    }

    /// Puts the knobs back as they were found (pages merged so far stay merged).
    pub fn stop(&self) {
        for (name, value) in self.found.iter().rev() {
            if let Err(e) = write_knob(name, value) {
                log::warn(&format!("KSM: {e}"));
            }
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

    #[test]
    fn settings_parse_and_refuse_bad_values() {
        // One test touches the variables, so no other test sees them change.
        std::env::remove_var("FORKD_KSM");
        assert_eq!(Settings::from_env().unwrap(), None);
        std::env::set_var("FORKD_KSM", "on");
        std::env::set_var("FORKD_KSM_BOOST_PAGES", "5000");
        let s = Settings::from_env().unwrap().unwrap();
        assert_eq!((s.boost_pages, s.idle_pages, s.sleep_ms), (5000, 100, 20));
        assert_eq!(s.boost, Duration::from_secs(30));
        std::env::set_var("FORKD_KSM_BOOST_PAGES", "0");
        let e = Settings::from_env().unwrap_err().to_string();
        assert!(e.contains("FORKD_KSM_BOOST_PAGES"), "{e}");
        std::env::remove_var("FORKD_KSM_BOOST_PAGES");
        std::env::set_var("FORKD_KSM", "sometimes");
        let e = Settings::from_env().unwrap_err().to_string();
        assert!(e.contains("FORKD_KSM=\"sometimes\""), "{e}");
        std::env::remove_var("FORKD_KSM");
    }
}
