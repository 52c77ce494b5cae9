use super::*;

fn cloexec(fd: RawFd) -> bool {
    // SAFETY: reads a flag of a descriptor the test holds.
    unsafe { libc::fcntl(fd, libc::F_GETFD) & libc::FD_CLOEXEC != 0 }
}

/// The one-at-a-time way (Linux 5.10, which has no CLOSE_RANGE_CLOEXEC) marks what
/// the ranged call marks, from `first` on only. Checked in a child of its own: the
/// other tests of this binary open and close descriptors on their threads meanwhile.
#[test]
fn descriptors_are_marked_close_on_exec_one_at_a_time() {
    fn check_here() -> bool {
        let mut raw = Vec::new();
        for _ in 0..3 {
            // SAFETY: a NUL-terminated literal; the descriptor stays open until exit.
            let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
            if fd < 0 {
                return false;
            }
            raw.push(fd);
        }
        raw.sort_unstable();
        raw.iter().all(|fd| !cloexec(*fd))
            && cloexec_each_from(raw[1] as libc::c_uint).is_ok()
            && !cloexec(raw[0])
            && cloexec(raw[1])
            && cloexec(raw[2])
    }
    // SAFETY: the child only opens files, reads a directory and sets flags, then
    // leaves with _exit; glibc's allocator is fork-safe.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        let ok = check_here();
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the descriptors from the first on, and only those, are close-on-exec (status {status})"
    );
}
