//! The exits of many processes learned from one descriptor: the kernel's process events
//! connector (`NETLINK_CONNECTOR`, `CN_IDX_PROC`), which announces the exit of every
//! process on the host. A watcher of ten thousand sandboxes' inits then holds one socket,
//! not a pidfd for each (docs/DESIGN.md, "Ten thousand branches").
//!
//! What it relies on, and what covers each gap:
//! - The events come from the host's pid namespace, in the initial network namespace,
//!   to a socket whose owner has `CAP_NET_ADMIN`: [`ProcEvents::open`] fails elsewhere,
//!   and the caller keeps pidfds.
//! - A pid is only reused once its process has been reaped. A watched process is the
//!   caller's child (an init, the daemon being a subreaper) until the caller reaps it
//!   after the callback; one that is not (an init of an earlier daemon) is told apart
//!   from a later process with its pid by its start time.
//! - Events can be lost when the socket's buffer overflows (`ENOBUFS`), and a process can
//!   exit before it is watched: both are covered by looking at the process itself
//!   (`/proc/PID/stat`: gone, a zombie, or another start time) on every overflow, when it
//!   is watched, and every [`SWEEP`] while anything is watched.
//! - Linux 6.6 and later filter the events in the kernel (exits only); older kernels send
//!   every fork, exec and exit, filtered here.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The first kernel that filters process events for a listener.
pub const KERNEL_FILTER: (u32, u32) = (6, 6);

/// How long an exit announced of a pid not watched is remembered.
const RECENT: Duration = Duration::from_secs(2);

/// How often the watched processes are looked at even without a lost event.
pub const SWEEP: Duration = Duration::from_secs(10);

const NETLINK_CONNECTOR: libc::c_int = 11;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
const NLMSG_HDR: usize = 16;
const CN_MSG: usize = 20;

type Callback = Box<dyn FnOnce() + Send>;

struct Watched {
    /// The process's start time (`/proc/PID/stat`, field 22), when known.
    start: Option<u64>,
    on_exit: Callback,
}

#[derive(Default)]
struct Table {
    /// Per pid, what to run when it exits (more than one watch of a pid runs each).
    watched: HashMap<i32, Vec<Watched>>,
    /// Exits announced of pids not watched then, the last [`RECENT`]: a process is
    /// announced before it is a zombie, so one watched just after its announcement may
    /// not look gone yet.
    recent: HashMap<i32, Instant>,
    /// Watched pids announced recently that did not look gone: looked at again soon.
    suspects: Vec<(i32, Instant)>,
}

impl Table {
    /// Removes the watches of `pid` that `ended` says are over; returns their callbacks.
    fn take(&mut self, pid: i32, ended: impl Fn(&Watched) -> bool) -> Vec<Callback> {
        let Some(list) = self.watched.get_mut(&pid) else {
            return Vec::new();
        };
        let (done, keep): (Vec<Watched>, Vec<Watched>) = list.drain(..).partition(|w| ended(w));
        if keep.is_empty() {
            self.watched.remove(&pid);
        } else {
            *list = keep;
        }
        done.into_iter().map(|w| w.on_exit).collect()
    }
}

/// A watcher of process exits through the process events connector. Cloning shares it.
#[derive(Clone)]
pub struct ProcEvents {
    table: Arc<Mutex<Table>>,
    /// Exited pids go to the thread that runs their callbacks.
    fired: std::sync::mpsc::Sender<Callback>,
}

impl ProcEvents {
    /// Opens the connector, subscribes to exits, and starts the thread (named `name`) that
    /// reads them and the one (`name-cb`) that runs callbacks. `kernel_filter`: the kernel
    /// filters events ([`KERNEL_FILTER`] and later).
    pub fn open(name: &str, kernel_filter: bool) -> io::Result<ProcEvents> {
        // The kernel takes subscriptions only from the host's pid and user namespaces,
        // and ignores others without a word (a filtering kernel does not even
        // acknowledge one it took): asked here.
        let status = std::fs::read_to_string("/proc/self/status")?;
        let nspid = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .map(|v| v.split_whitespace().count());
        if nspid != Some(1) {
            return Err(io::Error::other(
                "this process is not in the host's pid namespace",
            ));
        }
        let uid_map = std::fs::read_to_string("/proc/self/uid_map")?;
        if uid_map.split_whitespace().collect::<Vec<_>>() != ["0", "0", "4294967295"] {
            return Err(io::Error::other(
                "this process is not in the host's user namespace",
            ));
        }
        let sock = subscribe(kernel_filter)?;
        let table = Arc::new(Mutex::new(Table::default()));
        let (fired, run) = std::sync::mpsc::channel::<Callback>();
        std::thread::Builder::new()
            .name(format!("{name}-cb"))
            .spawn(move || {
                while let Ok(cb) = run.recv() {
                    cb();
                }
            })?;
        let events = ProcEvents { table, fired };
        let reader = events.clone();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || reader.read(sock))?;
        Ok(events)
    }

    /// Runs `on_exit` (on the callback thread) once process `pid`, started at `start`
    /// (`/proc/PID/stat`'s start time; `None` to trust the pid), has exited; at once if
    /// it already has. Holds no descriptor.
    pub fn watch(&self, pid: i32, start: Option<u64>, on_exit: impl FnOnce() + Send + 'static) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.watched.entry(pid).or_default().push(Watched {
            start,
            on_exit: Box::new(on_exit),
        });
        // It may have exited before it was in the table.
        let ended = t.take(pid, |w| gone(pid, w.start));
        if ended.is_empty() && t.recent.contains_key(&pid) {
            t.suspects.push((pid, Instant::now()));
        }
        for cb in ended {
            let _ = self.fired.send(cb);
        }
    }

    /// Stops watching `pid` (its callback never runs).
    pub fn forget(&self, pid: i32) {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .watched
            .remove(&pid);
    }

    /// How many processes are watched.
    pub fn len(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .watched
            .values()
            .map(Vec::len)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `pid` exited (an event): every watch of it whose process is gone. The kernel
    /// announces an exit once the process is a zombie (or reaped), so the look at `/proc`
    /// confirms it; an event read late, after its pid was reaped and taken by a process
    /// watched since, or a thread's `execve` (announced as its old leader's exit), leaves
    /// the watch in place.
    fn fire(&self, pid: i32) {
        let ended = {
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            let ended = t.take(pid, |w| gone(pid, w.start));
            if ended.is_empty() {
                if t.recent.len() >= 4096 {
                    t.recent.retain(|_, at| at.elapsed() < RECENT);
                }
                t.recent.insert(pid, Instant::now());
            }
            ended
        };
        for cb in ended {
            let _ = self.fired.send(cb);
        }
    }

    fn has_suspects(&self) -> bool {
        !self
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .suspects
            .is_empty()
    }

    /// Looks again at watched pids announced just before they were watched; returns
    /// whether any are left to look at.
    fn recheck(&self) -> bool {
        let (ended, left) = {
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            let suspects = std::mem::take(&mut t.suspects);
            let mut ended = Vec::new();
            for (pid, at) in suspects {
                let now = t.take(pid, |w| gone(pid, w.start));
                if now.is_empty() && at.elapsed() < RECENT && t.watched.contains_key(&pid) {
                    t.suspects.push((pid, at));
                }
                ended.extend(now);
            }
            t.recent.retain(|_, at| at.elapsed() < RECENT);
            (ended, !t.suspects.is_empty())
        };
        for cb in ended {
            let _ = self.fired.send(cb);
        }
        left
    }

    /// Fires every watched process that is gone.
    fn sweep(&self) {
        let ended: Vec<Callback> = {
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            let pids: Vec<i32> = t.watched.keys().copied().collect();
            pids.into_iter()
                .flat_map(|pid| t.take(pid, |w| gone(pid, w.start)))
                .collect()
        };
        for cb in ended {
            let _ = self.fired.send(cb);
        }
    }

    fn read(&self, sock: OwnedFd) {
        let mut buf = vec![0u8; 64 << 10];
        let mut swept = Instant::now();
        let mut suspects = false;
        loop {
            let mut pfd = libc::pollfd {
                fd: sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let ready = unsafe { libc::poll(&mut pfd, 1, if suspects { 10 } else { 1000 }) };
            if suspects || self.has_suspects() {
                suspects = self.recheck();
            }
            if swept.elapsed() >= SWEEP {
                swept = Instant::now();
                self.sweep();
            }
            if ready <= 0 {
                continue;
            }
            // SAFETY: the buffer is ours and `buf.len()` bytes long.
            let n = unsafe {
                libc::recv(
                    sock.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    // Events were lost: look at every watched process.
                    Some(libc::ENOBUFS) => self.sweep(),
                    Some(libc::EAGAIN) | Some(libc::EINTR) => {}
                    _ => std::thread::sleep(Duration::from_millis(100)),
                }
                continue;
            }
            for pid in exits(&buf[..n as usize]) {
                self.fire(pid);
            }
        }
    }
}

/// Whether process `pid` (started at `start`, if known) has exited: no such process, a
/// zombie, or a later process with its pid.
fn gone(pid: i32, start: Option<u64>) -> bool {
    match crate::process_stat(pid) {
        Ok((state, now)) => {
            matches!(state.as_deref(), None | Some("Z") | Some("X"))
                || matches!((start, now), (Some(want), Some(now)) if want != now)
        }
        // No such process. Any other failure (no descriptor to spare, no memory) says
        // nothing of it: looked at again later.
        Err(e) => e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH),
    }
}

/// The pids of the processes (not threads) whose exit the datagram `buf` announces.
fn exits(mut buf: &[u8]) -> Vec<i32> {
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDR {
        let Some(len) = u32_at(buf, 0).map(|l| l as usize) else {
            break;
        };
        if len < NLMSG_HDR || len > buf.len() {
            break;
        }
        let msg = &buf[NLMSG_HDR..len];
        // cn_msg: id (idx, val), seq, ack, len (u16), flags (u16); then the proc_event:
        // what, cpu, timestamp (u64), then for an exit: pid, tgid, code, signal, ...
        let ev = CN_MSG;
        if let (Some(CN_IDX_PROC), Some(PROC_EVENT_EXIT)) = (u32_at(msg, 0), u32_at(msg, ev)) {
            let data = ev + 16;
            if let (Some(pid), Some(tgid)) = (u32_at(msg, data), u32_at(msg, data + 4)) {
                if pid == tgid {
                    out.push(pid as i32);
                }
            }
        }
        // Messages are aligned to 4 bytes.
        let next = (len + 3) & !3;
        if next >= buf.len() {
            break;
        }
        buf = &buf[next..];
    }
    out
}

/// A connector socket subscribed to process events (exits only, where the kernel can
/// filter), with a receive buffer for bursts.
fn subscribe(filtered: bool) -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the descriptor is owned below.
    let fd = super::check(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_CONNECTOR,
        )
    } as libc::c_long)?;
    // SAFETY: the kernel just returned it; nobody else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let size: libc::c_int = 8 << 20;
    // SAFETY: an int option of the right size; a failure only leaves the default size.
    unsafe {
        if libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) != 0
        {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    // SAFETY: a zeroed sockaddr_nl is valid; the fields are set below.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    addr.nl_pid = 0;
    addr.nl_groups = CN_IDX_PROC;
    // SAFETY: `addr` is a sockaddr_nl of the size given.
    super::check(unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    } as libc::c_long)?;
    // Linux 6.6 takes a filter (the operation and the one event wanted); older kernels
    // only the operation, and ignore a message of any other length.
    let payload: Vec<u8> = if filtered {
        [PROC_CN_MCAST_LISTEN, PROC_EVENT_EXIT]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect()
    } else {
        PROC_CN_MCAST_LISTEN.to_ne_bytes().to_vec()
    };
    let total = NLMSG_HDR + CN_MSG + payload.len();
    let mut msg = Vec::with_capacity(total);
    msg.extend((total as u32).to_ne_bytes()); // nlmsg_len
    msg.extend((libc::NLMSG_DONE as u16).to_ne_bytes()); // nlmsg_type
    msg.extend(0u16.to_ne_bytes()); // nlmsg_flags
    msg.extend(0u32.to_ne_bytes()); // nlmsg_seq
    msg.extend(std::process::id().to_ne_bytes()); // nlmsg_pid
    msg.extend(CN_IDX_PROC.to_ne_bytes());
    msg.extend(CN_VAL_PROC.to_ne_bytes());
    msg.extend(0u32.to_ne_bytes()); // seq
    msg.extend(0u32.to_ne_bytes()); // ack
    msg.extend((payload.len() as u16).to_ne_bytes());
    msg.extend(0u16.to_ne_bytes()); // flags
    msg.extend(payload);
    // SAFETY: the message buffer is `msg.len()` bytes long.
    let sent = unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if sent != msg.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn datagram(events: &[(u32, u32, u32)]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(what, pid, tgid) in events {
            let mut m = Vec::new();
            m.extend(CN_IDX_PROC.to_ne_bytes());
            m.extend(CN_VAL_PROC.to_ne_bytes());
            m.extend([0u8; 12]);
            m.extend(what.to_ne_bytes());
            m.extend(0u32.to_ne_bytes());
            m.extend(0u64.to_ne_bytes());
            m.extend(pid.to_ne_bytes());
            m.extend(tgid.to_ne_bytes());
            m.extend([0u8; 16]);
            let len = (NLMSG_HDR + m.len()) as u32;
            out.extend(len.to_ne_bytes());
            out.extend([0u8; 12]);
            out.extend(m);
        }
        out
    }

    #[test]
    fn exits_are_read_and_threads_and_other_events_are_not() {
        let buf = datagram(&[
            (PROC_EVENT_EXIT, 10, 10),
            (PROC_EVENT_EXIT, 11, 10),
            (0x0000_0001, 12, 12),
            (PROC_EVENT_EXIT, 13, 13),
        ]);
        assert_eq!(exits(&buf), vec![10, 13]);
        assert_eq!(exits(&buf[..7]), Vec::<i32>::new());
    }

    /// Needs CAP_NET_ADMIN in the initial namespaces (root on the host).
    #[test]
    fn a_watched_process_is_told_of_when_it_exits_or_has_exited() {
        let filter = crate::mount::kernel_version(&crate::mount::kernel_release())
            .is_some_and(|v| v >= KERNEL_FILTER);
        let Ok(events) = ProcEvents::open("test-proc-events", filter) else {
            eprintln!("SKIP a_watched_process_is_told_of_when_it_exits_or_has_exited: no process events here");
            assert!(
                !forkd_testing::in_ci(),
                "process events unavailable under CI"
            );
            return;
        };
        let (tx, rx) = mpsc::channel();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let start = crate::process_start_time(pid);
        let t = tx.clone();
        events.watch(pid, start, move || t.send(pid).unwrap());
        assert_eq!(events.len(), 1);
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "fired while alive"
        );
        child.kill().unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(pid));
        child.wait().unwrap();
        // Already exited (and reaped) before it was watched: told at once.
        let t = tx.clone();
        events.watch(pid, start, move || t.send(-1).unwrap());
        assert_eq!(rx.recv_timeout(Duration::from_secs(1)), Ok(-1));
        assert!(events.is_empty());
        // Forgotten: never told.
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let opid = other.id() as i32;
        events.watch(opid, crate::process_start_time(opid), move || {
            tx.send(-2).unwrap()
        });
        events.forget(opid);
        other.kill().unwrap();
        other.wait().unwrap();
        assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
    }
}
