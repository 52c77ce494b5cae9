//! Waiting for many processes to exit on one thread: each process is watched through its
//! pidfd (readable once it exits) in one epoll set, and its callback runs on the watcher's
//! thread when it does. A daemon with thousands of sandboxes watches all their inits
//! with one thread and one descriptor per init.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

type Callback = Box<dyn FnOnce() + Send>;

struct Shared {
    epoll: OwnedFd,
    /// By pidfd number: the pidfd (kept open while watched) and what to run on exit.
    watched: Mutex<HashMap<RawFd, (OwnedFd, Callback)>>,
}

/// A watcher of process exits (see the module). Cloning shares the watcher.
#[derive(Clone)]
pub struct ExitWatcher {
    shared: Arc<Shared>,
}

impl ExitWatcher {
    /// Creates the epoll set and starts the thread (named `name`) that runs callbacks.
    pub fn start(name: &str) -> io::Result<ExitWatcher> {
        // SAFETY: no memory is passed; the result is a new descriptor or -1.
        let fd = super::check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) } as libc::c_long)?;
        // SAFETY: the kernel just returned this descriptor; nobody else owns it.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let shared = Arc::new(Shared {
            epoll,
            watched: Mutex::new(HashMap::new()),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || run(&s))?;
        Ok(ExitWatcher { shared })
    }

    /// Runs `on_exit` (on the watcher's thread) once the process behind `pidfd` has
    /// exited; at once if it already has. The watcher owns `pidfd` until then.
    pub fn watch(&self, pidfd: OwnedFd, on_exit: impl FnOnce() + Send + 'static) -> io::Result<()> {
        let raw = pidfd.as_raw_fd();
        self.shared
            .watched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(raw, (pidfd, Box::new(on_exit)));
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
            u64: raw as u64,
        };
        // SAFETY: both descriptors are open (the pidfd is owned by the map); `ev` is a
        // valid epoll_event the kernel only reads.
        let r = super::check(unsafe {
            libc::epoll_ctl(
                self.shared.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                raw,
                &mut ev,
            )
        } as libc::c_long);
        if let Err(e) = r {
            self.shared
                .watched
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&raw);
            return Err(e);
        }
        Ok(())
    }

    /// How many processes are watched.
    pub fn len(&self) -> usize {
        self.shared
            .watched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn run(s: &Shared) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        // SAFETY: `events` is a valid buffer of `events.len()` entries the kernel fills.
        let n = unsafe {
            libc::epoll_wait(
                s.epoll.as_raw_fd(),
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
            let raw = ev.u64 as RawFd;
            let entry = s
                .watched
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&raw);
            if let Some((pidfd, on_exit)) = entry {
                // One-shot: the registration is spent; dropping the pidfd closes it and
                // removes it from the set.
                drop(pidfd);
                on_exit();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn callbacks_run_when_the_processes_exit() {
        let w = ExitWatcher::start("exit-watcher-test").unwrap();
        let (tx, rx) = mpsc::channel();
        let mut children = Vec::new();
        for (i, secs) in ["0.3", "0"].iter().enumerate() {
            let child = std::process::Command::new("sleep")
                .arg(secs)
                .spawn()
                .unwrap();
            let pidfd = crate::pidfd_open(child.id() as libc::pid_t).unwrap();
            let tx = tx.clone();
            w.watch(pidfd, move || tx.send(i).unwrap()).unwrap();
            children.push(child);
        }
        // The short one first, then the other; each exactly once.
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 1);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 0);
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        assert!(w.is_empty());
        for mut c in children {
            c.wait().unwrap();
        }
    }
}
