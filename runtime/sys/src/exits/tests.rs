//! Tests of the exit watcher: callbacks, kept descriptors, bursts, the budget.

use super::*;
use std::sync::mpsc;
use std::time::Duration;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn callbacks_run_when_the_processes_exit() {
    let w = ExitWatcher::start("exit-watcher-test").unwrap();
    let (tx, rx) = mpsc::channel();
    let mut children = Vec::new();
    for (i, secs) in ["0.3", "0"].iter().enumerate() {
        let (child, pidfd) = sleeper(secs);
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

#[test]
fn callbacks_see_the_process_descriptors() {
    let w = ExitWatcher::start("exit-watcher-fds-cb").unwrap();
    // A pipe opened after the watcher's thread made its own table: the callback
    // writes into it, as an async runtime's waker writes into its eventfd.
    let (r, wr) = pipe();
    let mut reader = std::fs::File::from(r);
    let mut writer = std::fs::File::from(wr);
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pidfd = crate::pidfd_open(child.id() as libc::pid_t).unwrap();
    let (tx, rx) = mpsc::channel();
    w.watch(pidfd, move || {
        use std::io::Write;
        tx.send(writer.write_all(b"x").map_err(|e| e.to_string()))
            .unwrap();
    })
    .unwrap();
    let wrote = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(wrote, Ok(()));
    let mut b = [0u8; 1];
    use std::io::Read;
    reader.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"x");
    child.wait().unwrap();
}

/// A `sleep SECS` process and its pidfd.
fn sleeper(secs: &str) -> (std::process::Child, OwnedFd) {
    let child = std::process::Command::new("sleep")
        .arg(secs)
        .spawn()
        .unwrap();
    let pidfd = crate::pidfd_open(child.id() as libc::pid_t).unwrap();
    (child, pidfd)
}

/// A pipe, close-on-exec: (read end, write end).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors the kernel writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: just returned by the kernel, owned here.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// A hand-over that would take the table past its limit is refused, and the room it
/// takes comes back once the process has exited and its kept descriptors are closed.
#[test]
fn hand_overs_stay_within_the_descriptor_limit() {
    let w = ExitWatcher::start_limited("exit-watcher-room", RESERVED + 4).unwrap();
    assert_eq!(w.room(), 4);
    let (mut child, pidfd) = sleeper("30");
    let (_r1, w1) = pipe();
    let (_r2, w2) = pipe();
    let (tx, rx) = mpsc::channel();
    w.watch_keeping(pidfd, vec![w1, w2], move || tx.send(()).unwrap())
        .unwrap();
    assert_eq!(w.room(), 1);
    let (mut other, other_pidfd) = sleeper("30");
    let (_r3, w3) = pipe();
    let e = w
        .watch_keeping(other_pidfd, vec![w3], || ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no room for 2 more"), "{e}");
    assert_eq!((w.room(), w.len()), (1, 1));
    child.kill().unwrap();
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(w.wait_released(Duration::from_secs(10)));
    assert_eq!(w.room(), 4);
    other.kill().unwrap();
    child.wait().unwrap();
    other.wait().unwrap();
}

#[test]
fn kept_descriptors_are_held_until_the_exit_then_closed() {
    let w = ExitWatcher::start("exit-watcher-keep").unwrap();
    let pipes: Vec<(OwnedFd, OwnedFd)> = (0..MAX_KEPT).map(|_| pipe()).collect();
    let (readers, writers): (Vec<_>, Vec<_>) = pipes.into_iter().unzip();
    let (mut child, pidfd) = sleeper("30");
    // More than the watcher keeps for one process is refused, and nothing is kept.
    let too_many: Vec<OwnedFd> = (0..=MAX_KEPT).map(|_| pipe().1).collect();
    let (_other, other_pidfd) = sleeper("0");
    let e = w
        .watch_keeping(other_pidfd, too_many, || ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most 3"), "{e}");
    let (tx, rx) = mpsc::channel();
    w.watch_keeping(pidfd, writers, move || tx.send(()).unwrap())
        .unwrap();
    assert_eq!(w.kept(), 1);
    // The write ends are held by the watcher alone: while the process runs, each pipe
    // has a writer (a read would block), and the process's table has no copy.
    for r in &readers {
        let mut p = libc::pollfd {
            fd: r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        assert_eq!(
            unsafe { libc::poll(&mut p, 1, 100) },
            0,
            "writer closed early"
        );
    }
    assert!(!w.wait_released(Duration::from_millis(50)));
    child.kill().unwrap();
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(w.wait_released(Duration::from_secs(10)));
    assert_eq!(w.kept(), 0);
    // The last writers are gone: each read end sees the end of its pipe.
    use std::io::Read;
    for r in readers {
        let mut b = [0u8; 1];
        assert_eq!(std::fs::File::from(r).read(&mut b).unwrap(), 0);
    }
    child.wait().unwrap();
}

#[test]
fn descriptors_kept_by_exits_close_together_are_all_closed() {
    let w = ExitWatcher::start("exit-watcher-burst").unwrap();
    let (tx, rx) = mpsc::channel();
    let mut ends = Vec::new();
    let mut children = Vec::new();
    for _ in 0..12 {
        let (r, wr) = pipe();
        let (child, pidfd) = sleeper("30");
        let tx = tx.clone();
        w.watch_keeping(pidfd, vec![wr], move || tx.send(()).unwrap())
            .unwrap();
        ends.push(r);
        children.push(child);
    }
    assert_eq!(w.kept(), 12);
    // The first exit is released at once; the others, a moment later, wait for the
    // next burst, and every one is closed in the end.
    for c in &mut children {
        c.kill().unwrap();
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }
    assert!(
        w.wait_released(Duration::from_secs(10)),
        "{} left open",
        w.kept()
    );
    for r in ends {
        let mut b = [0u8; 1];
        use std::io::Read;
        assert_eq!(std::fs::File::from(r).read(&mut b).unwrap(), 0);
    }
    for c in &mut children {
        c.wait().unwrap();
    }
}

#[test]
fn watched_pidfds_stay_out_of_the_process_table() {
    let w = ExitWatcher::start("exit-watcher-fds").unwrap();
    let before = open_fds();
    let mut children = Vec::new();
    let (tx, rx) = mpsc::channel();
    for _ in 0..20 {
        let (child, pidfd) = sleeper("30");
        let tx = tx.clone();
        w.watch(pidfd, move || tx.send(()).unwrap()).unwrap();
        children.push(child);
    }
    // Twenty processes watched, not one more descriptor in the process's table
    // (other tests running beside this one may open a few of their own, never 20).
    assert_eq!(w.len(), 20);
    assert!(open_fds() < before + 20, "{before} -> {}", open_fds());
    for c in &mut children {
        c.kill().unwrap();
    }
    for _ in 0..20 {
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }
    assert!(w.is_empty());
    for mut c in children {
        c.wait().unwrap();
    }
}
