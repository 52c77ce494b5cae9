//! Waiting for many processes to exit on one thread: each process is watched through its
//! pidfd (readable once it exits) in one epoll set, and its callback runs when it does.
//!
//! A daemon with thousands of sandboxes watches thousands of inits. Their pidfds are not
//! kept in the daemon's descriptor table: every program the daemon starts copies that
//! table when it forks and closes each close-on-exec entry when it execs, so a pidfd per
//! sandbox made every set-up and every CRIU pay for the number of sandboxes alive. The
//! watcher's thread has a descriptor table of its own (`unshare(CLONE_FILES)`) and holds
//! them there: [`ExitWatcher::watch`] hands a pidfd over on a socket (`SCM_RIGHTS`) and
//! closes the caller's copy.
//!
//! The callbacks do not run on that thread: a descriptor number there names something
//! else than in the rest of the process (an async runtime's wake-up eventfd, say, is not
//! open there at all). The watcher's thread passes the number of each exited process on
//! a channel to a second thread, in the process's table, which runs its callback.
//!
//! A watched process may come with descriptors to keep past its exit
//! ([`ExitWatcher::watch_keeping`], at most [`MAX_KEPT`]): a sandbox's namespaces, whose
//! last close tears them down (a mount namespace unmounts its tree, an overlay among it,
//! which syncs the filesystem under it; a network namespace is dismantled by a kernel
//! worker). A third thread, sharing the watcher's table, closes them after the callback
//! of their process has been queued, so that what the close costs is never on the path
//! of the exit or of its callback. Those that come close together are closed together,
//! at most one burst a second, so that the syncs their closes cause are one, not one
//! each; [`ExitWatcher::wait_released`] waits until they are all closed.
//!
//! The watcher's table is bounded like any other by the process's `RLIMIT_NOFILE`, and a
//! hand-over whose descriptors the table cannot take is lost. So the watcher counts
//! what its table holds and refuses a hand-over that would not fit
//! ([`ExitWatcher::room`]): a caller learns how many descriptors it may still hand over
//! and keeps fewer, or refuses new work, rather than losing the watcher.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

type Callback = Box<dyn FnOnce() + Send>;

/// The most descriptors one watched process may keep past its exit.
pub const MAX_KEPT: usize = 3;

/// How often, at most, kept descriptors are closed. A sandbox's root is one: its last
/// close unmounts an overlay, which syncs the whole filesystem under it, every other
/// sandbox's dirty data and a commit included. Closed one at a time, a stop a few
/// milliseconds after another forced a commit each; closed in a burst, the first close
/// syncs and the others find little left to write.
const RELEASE_SPACING: Duration = Duration::from_secs(1);

/// The epoll key of the hand-over socket; pidfds are keyed by their hand-over number.
const HANDOVER: u64 = u64::MAX;

struct Shared {
    /// Our end of the hand-over socket, in the process's table.
    tx: OwnedFd,
    next: AtomicU64,
    /// What to run when the process handed over under that number exits.
    callbacks: Mutex<HashMap<u64, Callback>>,
    /// What the watcher's table holds.
    kept: Arc<Kept>,
    /// The process's limit on open descriptors (`RLIMIT_NOFILE`, soft), at start.
    limit: usize,
    /// Cleared when either of the watcher's threads ends (a panic included).
    alive: Arc<std::sync::atomic::AtomicBool>,
}

/// Clears the flag it holds when dropped: a thread's way of saying it ended.
struct Alive(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Descriptors of the watcher's table kept free of hand-overs: stdio, the epoll set, the
/// hand-over socket, and what a receive installs before it is counted.
const RESERVED: usize = 64;

/// What the watcher's table holds: how many processes' kept descriptors are still open,
/// with a signal for each set closed, and how many descriptors were handed over and are
/// not closed yet (pidfds and kept ones).
#[derive(Default)]
struct Kept {
    open: Mutex<usize>,
    closed: Condvar,
    held: AtomicUsize,
}

impl Kept {
    fn add(&self, n: isize) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        *open = open.saturating_add_signed(n);
        if n < 0 {
            self.closed.notify_all();
        }
    }
}

/// A watcher of process exits (see the module). Cloning shares the watcher.
#[derive(Clone)]
pub struct ExitWatcher {
    shared: Arc<Shared>,
}

impl ExitWatcher {
    /// Starts the thread (named `name`) that holds the pidfds, and the one that runs the
    /// callbacks (`name` and `-cb`).
    pub fn start(name: &str) -> io::Result<ExitWatcher> {
        Self::start_limited(name, open_files_limit())
    }

    /// [`ExitWatcher::start`] with `limit` in place of the process's descriptor limit.
    fn start_limited(name: &str, limit: usize) -> io::Result<ExitWatcher> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` has room for the two descriptors the kernel writes.
        super::check(unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        } as libc::c_long)?;
        // SAFETY: the kernel just returned these descriptors; nobody else owns them.
        let (tx, rx) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let kept = Arc::new(Kept::default());
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (alive_watch, alive_cb) = (Alive(alive.clone()), Alive(alive.clone()));
        let shared = Arc::new(Shared {
            alive,
            tx,
            next: AtomicU64::new(0),
            callbacks: Mutex::new(HashMap::new()),
            kept: kept.clone(),
            limit,
        });
        let (exited_tx, exited_rx) = std::sync::mpsc::channel::<u64>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let rx_raw = rx.as_raw_fd();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || match Thread::start(rx_raw, kept) {
                Ok(t) => {
                    let _alive = alive_watch;
                    let _ = ready_tx.send(Ok(()));
                    t.run(&exited_tx)
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })?;
        // Ends when the watcher's thread does (its sender dropped); holds the callbacks
        // only while it runs one, so dropping every watcher still ends both threads.
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name(format!("{name}-cb"))
            .spawn(move || {
                let _alive = alive_cb;
                while let Ok(key) = exited_rx.recv() {
                    let Some(s) = weak.upgrade() else { return };
                    let on_exit = s
                        .callbacks
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&key);
                    drop(s);
                    if let Some(on_exit) = on_exit {
                        on_exit();
                    }
                }
            })?;
        let started = ready_rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the exit watcher's thread died")));
        // The thread holds its own copy of `rx` now (or failed); the process's copy goes.
        drop(rx);
        started?;
        Ok(ExitWatcher { shared })
    }

    /// Whether both of the watcher's threads still run.
    pub fn is_running(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    /// Runs `on_exit` (on the watcher's callback thread) once the process behind `pidfd` has
    /// exited; at once if it already has. The pidfd is handed to the watcher's thread and
    /// the caller's descriptor closed.
    pub fn watch(&self, pidfd: OwnedFd, on_exit: impl FnOnce() + Send + 'static) -> io::Result<()> {
        self.watch_keeping(pidfd, Vec::new(), on_exit)
    }

    /// [`ExitWatcher::watch`], and `keep` (at most [`MAX_KEPT`] descriptors) is held, out
    /// of the process's table, until the process has exited and its callback has been
    /// queued; it is then closed on a thread of its own.
    pub fn watch_keeping(
        &self,
        pidfd: OwnedFd,
        keep: Vec<OwnedFd>,
        on_exit: impl FnOnce() + Send + 'static,
    ) -> io::Result<()> {
        if keep.len() > MAX_KEPT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} descriptors to keep, at most {MAX_KEPT}", keep.len()),
            ));
        }
        let n = 1 + keep.len();
        let held = &self.shared.kept.held;
        if held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                (h + n + RESERVED <= self.shared.limit).then_some(h + n)
            })
            .is_err()
        {
            return Err(io::Error::other(format!(
                "the exit watcher holds {} descriptors and may open {} (RLIMIT_NOFILE): no room for {n} more",
                held.load(Ordering::Acquire),
                self.shared.limit
            )));
        }
        let key = self.shared.next.fetch_add(1, Ordering::Relaxed);
        self.shared
            .callbacks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, Box::new(on_exit));
        if !keep.is_empty() {
            self.shared.kept.add(1);
        }
        if let Err(e) = send_fds(&self.shared.tx, key, &pidfd, &keep) {
            held.fetch_sub(n, Ordering::AcqRel);
            self.shared
                .callbacks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
            if !keep.is_empty() {
                self.shared.kept.add(-1);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Waits up to `timeout` until every descriptor kept past an exit is closed, counting
    /// those of processes still running; true if none is left open.
    pub fn wait_released(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let kept = &self.shared.kept;
        let mut open = kept.open.lock().unwrap_or_else(|e| e.into_inner());
        while *open > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            open = kept
                .closed
                .wait_timeout(open, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// How many more descriptors a hand-over may bring (a pidfd and what it keeps) before
    /// the watcher's table is full.
    pub fn room(&self) -> usize {
        self.shared
            .limit
            .saturating_sub(RESERVED + self.shared.kept.held.load(Ordering::Acquire))
    }

    /// How many processes' kept descriptors are open (processes running or just exited).
    pub fn kept(&self) -> usize {
        *self
            .shared
            .kept
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// How many processes are watched.
    pub fn len(&self) -> usize {
        self.shared
            .callbacks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The watcher's thread: its own descriptor table holds the epoll set, the receiving end
/// of the hand-over socket, the pidfds and what is kept with them.
struct Thread {
    epoll: OwnedFd,
    rx: OwnedFd,
    pidfds: HashMap<u64, (OwnedFd, Vec<OwnedFd>)>,
    /// To the thread that closes kept descriptors (it shares this thread's table).
    release: std::sync::mpsc::Sender<Vec<OwnedFd>>,
    kept: Arc<Kept>,
}

impl Thread {
    /// Gives this thread a table of its own holding only stdio and `rx`, then makes the
    /// epoll set there and starts the releasing thread, which shares that table.
    fn start(rx: RawFd, kept: Arc<Kept>) -> io::Result<Thread> {
        // SAFETY: unshare takes flags only; it affects this thread alone.
        super::check(unsafe { libc::unshare(libc::CLONE_FILES) } as libc::c_long)?;
        // Close this table's copies of everything else the process had open when it was
        // copied (the process's own copies are untouched).
        let keep = rx as libc::c_uint;
        if keep > 3 {
            close_range(3, keep - 1)?;
        }
        close_range((keep + 1).max(3), libc::c_uint::MAX)?;
        // SAFETY: `rx` is open in this thread's table, which only this thread uses.
        let rx = unsafe { OwnedFd::from_raw_fd(rx) };
        // SAFETY: no memory is passed; the result is a new descriptor or -1.
        let fd = super::check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) } as libc::c_long)?;
        // SAFETY: the kernel just returned this descriptor; nobody else owns it.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let (release, released) = std::sync::mpsc::channel::<Vec<OwnedFd>>();
        let name = std::thread::current()
            .name()
            .map_or_else(|| "exits-release".to_string(), |n| format!("{n}-rel"));
        // Made from this thread, so it shares this thread's table (a thread shares the
        // table of the thread that makes it). Ends when `release` is dropped.
        let counted = kept.clone();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || release_in_bursts(&released, &counted))?;
        let t = Thread {
            epoll,
            rx,
            pidfds: HashMap::new(),
            release,
            kept,
        };
        t.add(t.rx.as_raw_fd(), HANDOVER, libc::EPOLLIN as u32)?;
        Ok(t)
    }

    fn add(&self, fd: RawFd, key: u64, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: key };
        // SAFETY: both descriptors are open in this thread's table; `ev` is a valid
        // epoll_event the kernel only reads.
        super::check(unsafe {
            libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev)
        } as libc::c_long)
        .map(drop)
    }

    /// Waits for exits and hand-overs; sends the key of each process that exited.
    fn run(mut self, exited: &std::sync::mpsc::Sender<u64>) {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            // SAFETY: `events` is a valid buffer of `events.len()` entries the kernel fills.
            let n = unsafe {
                libc::epoll_wait(
                    self.epoll.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as libc::c_int,
                    -1,
                )
            };
            if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // The epoll descriptor itself failed: nothing more can be watched.
                return;
            }
            for ev in &events[..n as usize] {
                let key = ev.u64;
                if key == HANDOVER {
                    if !self.receive(exited) {
                        return;
                    }
                    continue;
                }
                // One-shot: the registration is spent; closing the pidfd removes it.
                let kept = self.pidfds.remove(&key).map(|(pidfd, keep)| {
                    drop(pidfd);
                    self.kept.held.fetch_sub(1, Ordering::AcqRel);
                    keep
                });
                if exited.send(key).is_err() {
                    return;
                }
                if let Some(fds) = kept {
                    self.release_later(fds);
                }
            }
        }
    }

    /// Hands a process's kept descriptors to the releasing thread; closes them here if
    /// that is gone.
    fn release_later(&self, fds: Vec<OwnedFd>) {
        if fds.is_empty() {
            return;
        }
        if let Err(unsent) = self.release.send(fds) {
            self.kept.held.fetch_sub(unsent.0.len(), Ordering::AcqRel);
            drop(unsent.0);
            self.kept.add(-1);
        }
    }

    /// Takes every pidfd waiting on the socket into the epoll set. False once every
    /// sender is gone (the watcher was dropped).
    fn receive(&mut self, exited: &std::sync::mpsc::Sender<u64>) -> bool {
        loop {
            match recv_fds(&self.rx) {
                Ok(Some((key, pidfd, keep))) => {
                    let events = (libc::EPOLLIN | libc::EPOLLONESHOT) as u32;
                    if self.add(pidfd.as_raw_fd(), key, events).is_ok() {
                        self.pidfds.insert(key, (pidfd, keep));
                        continue;
                    }
                    // Cannot be watched: reported as gone, which the callback checks.
                    drop(pidfd);
                    self.kept.held.fetch_sub(1, Ordering::AcqRel);
                    if exited.send(key).is_err() {
                        return false;
                    }
                    self.release_later(keep);
                }
                Ok(None) => return true,
                // A message whose descriptors the table could not take (the budget
                // keeps that from happening): that process goes unwatched, the rest
                // does not.
                Err(e) if e.kind() == io::ErrorKind::InvalidData => continue,
                // Every sender is gone, or the socket failed.
                Err(_) => return false,
            }
        }
    }
}

/// The releasing thread's loop: closes kept descriptors in bursts, at most one burst a
/// [`RELEASE_SPACING`]. A descriptor that comes after a quiet spell is closed at once;
/// one that comes sooner waits for the next burst, with every other that comes meanwhile.
/// Ends when every sender is gone, after closing what it holds.
fn release_in_bursts(released: &std::sync::mpsc::Receiver<Vec<OwnedFd>>, counted: &Kept) {
    use std::sync::mpsc::RecvTimeoutError;
    let mut last: Option<Instant> = None;
    while let Ok(fd) = released.recv() {
        let mut burst = vec![fd];
        if let Some(due) = last.map(|t| t + RELEASE_SPACING) {
            loop {
                let left = due.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match released.recv_timeout(left) {
                    Ok(fd) => burst.push(fd),
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                }
            }
        }
        burst.extend(released.try_iter());
        let (n, fds) = (burst.len(), burst.iter().map(Vec::len).sum::<usize>());
        drop(burst);
        counted.held.fetch_sub(fds, Ordering::AcqRel);
        last = Some(Instant::now());
        counted.add(-(n as isize));
    }
}

/// The process's soft limit on open descriptors.
fn open_files_limit() -> usize {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `r`, which lives across the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    usize::try_from(r.rlim_cur).unwrap_or(usize::MAX)
}

fn close_range(first: libc::c_uint, last: libc::c_uint) -> io::Result<()> {
    // SAFETY: closes descriptors of this thread's own table that nothing here owns.
    super::check(unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) }).map(drop)
}

mod passing;
use passing::{recv_fds, send_fds};

#[cfg(test)]
mod tests;
