//! Writable layers made ahead of the creates and forks that take them.
//!
//! A sandbox's writable layer is a snapshot of a base or of a checkpoint's layer (see
//! [`super::bases`]), and a btrfs snapshot commits the volume's transaction: 2-4 ms on a
//! quiet volume, more while other sandboxes write, and it waits out a commit already
//! running. A thread of the daemon keeps snapshots of the sources recently snapshotted
//! ready (`FORKD_SPARE_LAYERS` each, default [`super::config::DEFAULT_SPARE_LAYERS`]; the
//! [`MAX_SOURCES`] most recent sources), so a create or a fork renames one into place
//! instead of committing. A fork of several branches makes the snapshots it lacks at
//! once, side by side, where btrfs puts them in one commit.
//!
//! A source whose last take left it none is refilled at once (once the creates and forks
//! under way have ended); one that still has a spare, or a new checkpoint's that nothing
//! took yet, waits until the daemon is quiet ([`super::quiet`]), so that its commit does
//! not land on the requests that follow a create (its first exec above all).
//!
//! A spare is a snapshot of an immutable subvolume (a base, a checkpoint's read-only
//! snapshot), so one made ahead is the same as one made at the create. Each is handed
//! out once, by rename; a source that goes (a checkpoint removed, a base collected)
//! takes its spares with it, and a daemon that starts removes those an earlier one left.

use super::log;
use super::quiet::Activity;
use super::Lock as _;
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Sources kept ready at most; the least recently used goes first.
pub const MAX_SOURCES: usize = 16;
/// Snapshots a batch makes at once.
const BATCH_AT_ONCE: usize = 16;
/// Snapshots one batch makes ahead at most (the branches past them make their own, or
/// take what the thread made meanwhile): what a failed fork leaves ready stays bounded.
const BATCH_AHEAD: usize = 256;
/// How long, at most, the thread waits after a take for the operations in flight to end
/// before it makes the next.
const REFILL_AFTER: Duration = Duration::from_millis(20);
/// How often a spare not needed yet looks again whether the daemon is quiet.
const QUIET_POLL: Duration = Duration::from_millis(10);

#[derive(Default)]
struct State {
    /// Ready spares of each source.
    ready: HashMap<PathBuf, Vec<PathBuf>>,
    /// The sources kept ready, most recently used last.
    sources: VecDeque<PathBuf>,
    /// Set by [`SpareLayers::stop`].
    stopped: bool,
    /// Creates and forks under way ([`SpareLayers::busy`]).
    in_flight: usize,
    /// The source the thread is making a spare of, if any.
    making: Option<PathBuf>,
    /// Sources whose last take left them no spare: made at once, not when quiet.
    emptied: HashSet<PathBuf>,
}

impl State {
    /// Marks `source` as just used; returns the spares of a source that fell out.
    fn touch(&mut self, source: &Path) -> Vec<PathBuf> {
        self.sources.retain(|s| s != source);
        self.sources.push_back(source.to_path_buf());
        let mut dropped = Vec::new();
        while self.sources.len() > MAX_SOURCES {
            if let Some(old) = self.sources.pop_front() {
                self.emptied.remove(&old);
                dropped.extend(self.ready.remove(&old).unwrap_or_default());
            }
        }
        dropped
    }

    /// The source to make a spare of next, and whether it is needed now (a take left it
    /// none) rather than when the daemon is quiet: the most recently used of those needed
    /// now, else of those short of `target`.
    fn lacking(&self, target: usize) -> Option<(PathBuf, bool)> {
        let have = |s: &PathBuf| self.ready.get(s).map_or(0, Vec::len);
        let recent = || self.sources.iter().rev();
        recent()
            .find(|s| have(s) == 0 && self.emptied.contains(*s))
            .map(|s| (s.clone(), true))
            .or_else(|| {
                recent()
                    .find(|s| have(s) < target)
                    .map(|s| (s.clone(), false))
            })
    }
}

pub struct SpareLayers {
    dir: PathBuf,
    state: Mutex<State>,
    /// Signalled when a source wants one more.
    wanted: Condvar,
    target: usize,
    next: AtomicU64,
    /// Held by the thread while it makes a snapshot.
    making: Mutex<()>,
    /// The daemon's requests, for the spares not needed yet.
    activity: Arc<Activity>,
    /// Signalled when the last operation in flight ends, and when the thread has made a
    /// spare.
    settled: Condvar,
}

/// An operation under way that may take a spare (see [`SpareLayers::busy`]).
pub struct Busy<'a>(&'a SpareLayers);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state.locked();
        st.in_flight = st.in_flight.saturating_sub(1);
        if st.in_flight == 0 {
            self.0.settled.notify_all();
        }
    }
}

impl SpareLayers {
    /// Opens `dir` (emptied of what an earlier daemon left) and starts the thread that
    /// keeps `target` spares of each recent source (none with 0).
    pub fn start(
        dir: PathBuf,
        target: usize,
        activity: Arc<Activity>,
    ) -> anyhow::Result<Arc<Self>> {
        std::fs::create_dir_all(&dir)
            .map_err(|e| anyhow::anyhow!("create {}: {e}", dir.display()))?;
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                remove(&e.path());
            }
        }
        let spares = Arc::new(SpareLayers {
            dir,
            state: Mutex::new(State::default()),
            wanted: Condvar::new(),
            target,
            next: AtomicU64::new(0),
            making: Mutex::new(()),
            activity,
            settled: Condvar::new(),
        });
        if target > 0 {
            let s = spares.clone();
            std::thread::Builder::new()
                .name("spare-layers".into())
                .spawn(move || s.fill())
                .map_err(|e| anyhow::anyhow!("start the spare layer thread: {e}"))?;
        }
        Ok(spares)
    }

    /// Puts a writable snapshot of `source` at `dst` (which must not exist): one made
    /// ahead, renamed into place, or one made now. The source is kept ready from now on.
    pub fn snapshot_to(&self, source: &Path, dst: &Path) -> std::io::Result<()> {
        if let Some(spare) = self.take(source).or_else(|| self.being_made(source)) {
            match std::fs::rename(&spare, dst) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    log::warn(&format!(
                        "spare layers: rename {} to {}: {e}; snapshotting instead",
                        spare.display(),
                        dst.display()
                    ));
                    remove(&spare);
                }
            }
        }
        snapshot(source, dst)
    }

    /// The spare of `source` the thread is making now, once made: waiting for it is
    /// quicker than a snapshot of one's own, which would commit beside it.
    fn being_made(&self, source: &Path) -> Option<PathBuf> {
        let deadline = std::time::Instant::now() + Duration::from_millis(100);
        let mut st = self.state.locked();
        while st.making.as_deref() == Some(source) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            st = self
                .settled
                .wait_timeout(st, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        st.ready.get_mut(source).and_then(Vec::pop)
    }

    /// Marks a create or a fork under way until the guard is dropped: the thread makes
    /// the spare that operation took once no operation is under way (at most
    /// [`REFILL_AFTER`] after the take), so that its snapshot does not slow it down.
    pub fn busy(&self) -> Busy<'_> {
        self.state.locked().in_flight += 1;
        Busy(self)
    }

    /// A ready snapshot of `source`, if there is one; the source is kept ready from now on.
    fn take(&self, source: &Path) -> Option<PathBuf> {
        let (spare, dropped) = {
            let mut st = self.state.locked();
            let spare = st.ready.get_mut(source).and_then(Vec::pop);
            if st.ready.get(source).is_none_or(Vec::is_empty) {
                st.emptied.insert(source.to_path_buf());
            }
            (spare, st.touch(source))
        };
        self.wanted.notify_one();
        dropped.iter().for_each(|p| remove(p));
        spare
    }

    /// Keeps `source` ready from now on (a checkpoint just made, which is forked next).
    pub fn want(&self, source: &Path) {
        let dropped = self.state.locked().touch(source);
        self.wanted.notify_one();
        dropped.iter().for_each(|p| remove(p));
    }

    /// Makes the snapshots of `source` that `count` takes will need beyond those ready,
    /// side by side, so that btrfs commits them together.
    pub fn prepare(&self, source: &Path, count: usize) {
        let (have, dropped) = {
            let mut st = self.state.locked();
            (st.ready.get(source).map_or(0, Vec::len), st.touch(source))
        };
        dropped.iter().for_each(|p| remove(p));
        let lacking = count.min(BATCH_AHEAD).saturating_sub(have);
        for chunk in (0..lacking).collect::<Vec<_>>().chunks(BATCH_AT_ONCE) {
            let made: Vec<PathBuf> = std::thread::scope(|scope| {
                let handles: Vec<_> = chunk
                    .iter()
                    .map(|_| scope.spawn(|| self.make(source)))
                    .collect();
                handles
                    .into_iter()
                    .filter_map(|h| h.join().ok().and_then(Result::ok))
                    .collect()
            });
            let mut st = self.state.locked();
            if st.sources.iter().any(|s| s == source) {
                st.ready
                    .entry(source.to_path_buf())
                    .or_default()
                    .extend(made);
            } else {
                // Forgotten meanwhile (its checkpoint removed, its base collected).
                drop(st);
                made.iter().for_each(|p| remove(p));
            }
        }
    }

    /// Stops the thread (a daemon about to release its volume): once this returns it
    /// holds nothing open there and makes nothing more.
    pub fn stop(&self) {
        self.state.locked().stopped = true;
        self.wanted.notify_all();
        // Waits out a snapshot being made.
        drop(self.making.locked());
    }

    /// Removes `source`'s spares and stops keeping it ready (it is being removed).
    pub fn forget(&self, source: &Path) {
        let dropped = {
            let mut st = self.state.locked();
            st.sources.retain(|s| s != source);
            st.emptied.remove(source);
            st.ready.remove(source).unwrap_or_default()
        };
        dropped.iter().for_each(|p| remove(p));
    }

    /// A new writable snapshot of `source` in the spare directory.
    fn make(&self, source: &Path) -> std::io::Result<PathBuf> {
        let spare = self
            .dir
            .join(self.next.fetch_add(1, Ordering::Relaxed).to_string());
        snapshot(source, &spare)?;
        Ok(spare)
    }

    /// Waits until the daemon is quiet and no create or fork is under way; false if
    /// the thread was stopped or `source` is no longer the next to make (another became
    /// needed at once, or it was forgotten or filled) meanwhile.
    fn quiet_unless_needed(&self, source: &Path) -> bool {
        let mut st = self.state.locked();
        loop {
            if st.stopped
                || st
                    .lacking(self.target)
                    .is_none_or(|(s, now)| now || s != source)
            {
                return false;
            }
            if st.in_flight == 0 && self.activity.is_quiet() {
                return true;
            }
            st = self
                .wanted
                .wait_timeout(st, QUIET_POLL)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    fn fill(&self) {
        loop {
            let (source, now) = {
                let mut st = self.state.locked();
                loop {
                    if st.stopped {
                        return;
                    }
                    if let Some(s) = st.lacking(self.target) {
                        break s;
                    }
                    st = self
                        .wanted
                        .wait(st)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
            };
            if !now && !self.quiet_unless_needed(&source) {
                // Stopped, or something else comes first now: choose again.
                continue;
            }
            // After the operations that took one are done: on a machine of few CPUs, a
            // snapshot beside one would slow it down.
            {
                let deadline = std::time::Instant::now() + REFILL_AFTER;
                let mut st = self.state.locked();
                while st.in_flight > 0 && !st.stopped {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    st = self
                        .settled
                        .wait_timeout(st, left)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0;
                }
            }
            let making = self.making.locked();
            {
                let mut st = self.state.locked();
                if st.stopped {
                    return;
                }
                st.making = Some(source.clone());
            }
            let made = self.make(&source);
            drop(making);
            let mut st = self.state.locked();
            st.making = None;
            self.settled.notify_all();
            match made {
                Ok(spare) => {
                    st.emptied.remove(&source);
                    if st.sources.contains(&source) {
                        st.ready.entry(source).or_default().push(spare);
                    } else {
                        // Forgotten meanwhile.
                        drop(st);
                        remove(&spare);
                    }
                }
                Err(e) => {
                    // The source went, or the volume refuses: stop keeping it; takes make
                    // their own snapshot (and report the error if it is theirs too).
                    log::warn(&format!(
                        "spare layers: snapshot {}: {e}; no longer kept ready",
                        source.display()
                    ));
                    st.sources.retain(|s| *s != source);
                    st.emptied.remove(&source);
                    let dropped = st.ready.remove(&source).unwrap_or_default();
                    drop(st);
                    dropped.iter().for_each(|p| remove(p));
                }
            }
        }
    }
}

/// A writable snapshot of the subvolume `source` at `dst`.
fn snapshot(source: &Path, dst: &Path) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (dst.parent(), dst.file_name()) else {
        return Err(std::io::Error::other("no parent directory"));
    };
    let src = File::open(source)?;
    let parent = File::open(parent)?;
    let name = CString::new(name.as_encoded_bytes()).map_err(std::io::Error::other)?;
    forkd_sys::btrfs::snapshot(src.as_fd(), parent.as_fd(), &name, false)
}

/// Deletes a spare (a subvolume) or whatever else is at `path`.
fn remove(path: &Path) {
    let res = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => File::open(parent).and_then(|p| {
            let name = CString::new(name.as_encoded_bytes()).map_err(std::io::Error::other)?;
            forkd_sys::btrfs::delete_subvolume(p.as_fd(), &name)
        }),
        _ => Ok(()),
    };
    if res.is_err() {
        let _ = std::fs::remove_dir_all(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recent_source_falls_out() {
        let mut st = State::default();
        for i in 0..MAX_SOURCES {
            st.touch(Path::new(&format!("/s{i}")));
        }
        st.ready
            .insert(PathBuf::from("/s0"), vec![PathBuf::from("/spare0")]);
        // s0 used again: s1 is now the oldest.
        assert!(st.touch(Path::new("/s0")).is_empty());
        assert!(st.touch(Path::new("/new")).is_empty());
        assert!(!st.sources.contains(&PathBuf::from("/s1")));
        assert_eq!(st.lacking(1), Some((PathBuf::from("/new"), false)));
        for i in 2..MAX_SOURCES {
            st.touch(Path::new(&format!("/t{i}")));
        }
        assert_eq!(st.touch(Path::new("/last")), vec![PathBuf::from("/spare0")]);
    }

    #[test]
    fn a_source_a_take_left_empty_comes_first_and_at_once() {
        let mut st = State::default();
        let (a, b) = (PathBuf::from("/a"), PathBuf::from("/b"));
        st.touch(&a);
        st.touch(&b);
        st.ready.insert(a.clone(), vec![PathBuf::from("/spare-a")]);
        st.ready.insert(b.clone(), vec![PathBuf::from("/spare-b")]);
        // Both short of two: the most recent, when quiet.
        assert_eq!(st.lacking(2), Some((b.clone(), false)));
        // A take emptied the older one: it is made first, at once.
        st.ready.get_mut(&a).unwrap().clear();
        st.emptied.insert(a.clone());
        assert_eq!(st.lacking(2), Some((a.clone(), true)));
        // A new source nothing took from waits for a quiet moment.
        st.touch(Path::new("/c"));
        assert_eq!(st.lacking(2), Some((a.clone(), true)));
        st.emptied.clear();
        assert_eq!(st.lacking(2), Some((PathBuf::from("/c"), false)));
        // Falling out forgets that it was emptied.
        st.emptied.insert(a.clone());
        for i in 0..MAX_SOURCES {
            st.touch(Path::new(&format!("/s{i}")));
        }
        assert!(!st.emptied.contains(&a));
    }
}
