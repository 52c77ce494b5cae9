//! Descriptors passed between the watcher and its thread over a socket pair: a key, a
//! pidfd and the descriptors kept with it, as `SCM_RIGHTS`.

use super::*;

/// A message header over one buffer and a control buffer (room for one `SCM_RIGHTS`
/// header and 1 + [`MAX_KEPT`] descriptors, aligned); the caller sets `msg_controllen`.
/// The pointers are valid while both live.
fn header(iov: &mut libc::iovec, control: &mut Control) -> libc::msghdr {
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg
}

/// The control buffer: CMSG_SPACE of 1 + MAX_KEPT descriptors (16 bytes of header, 16 of
/// descriptors), in u64s for alignment.
type Control = [u64; 4];
const _: () = assert!(16 + (1 + MAX_KEPT) * 4 <= std::mem::size_of::<Control>());

/// One message: the key as 8 bytes, the pidfd and the kept descriptors (if any) as
/// `SCM_RIGHTS`, in that order.
pub(super) fn send_fds(
    sock: &OwnedFd,
    key: u64,
    pidfd: &OwnedFd,
    keep: &[OwnedFd],
) -> io::Result<()> {
    let data = key.to_le_bytes();
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let fds: Vec<RawFd> = std::iter::once(pidfd.as_raw_fd())
        .chain(keep.iter().map(AsRawFd::as_raw_fd))
        .take(1 + MAX_KEPT)
        .collect();
    let payload = std::mem::size_of_val(fds.as_slice()) as u32;
    let mut control: Control = [0; 4];
    let mut msg = header(&mut iov, &mut control);
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(payload) } as usize;
    // SAFETY: the control buffer (32 bytes, aligned) holds one cmsg with up to
    // 1 + MAX_KEPT = 4 descriptors (CMSG_SPACE(16) is 32, checked above); CMSG_FIRSTHDR
    // points into it and CMSG_DATA at its payload.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as usize;
        let data = libc::CMSG_DATA(cmsg) as *mut RawFd;
        for (i, fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(data.add(i), *fd);
        }
    }
    loop {
        // SAFETY: `msg` points at live buffers for the duration of the call.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A received message: the key, the pidfd, the kept descriptors that came with it.
pub(super) type Received = (u64, OwnedFd, Vec<OwnedFd>);

/// The next message, if one is waiting.
pub(super) fn recv_fds(sock: &OwnedFd) -> io::Result<Option<Received>> {
    let mut data = [0u8; 8];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut control: Control = [0; 4];
    let mut msg = header(&mut iov, &mut control);
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: `msg` points at live buffers for the duration of the call.
    let r = unsafe {
        libc::recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    if r == 0 {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    // SAFETY: the kernel filled `msg`; CMSG_FIRSTHDR is null or points at a complete
    // header inside `control`, whose SCM_RIGHTS payload holds the descriptors it
    // installed (their number follows from the header's length).
    let mut fds = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a hand-over without a descriptor",
            ));
        }
        let n = ((*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
        let data = libc::CMSG_DATA(cmsg) as *const RawFd;
        (0..n.min(1 + MAX_KEPT))
            .map(|i| OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))))
            .collect::<Vec<_>>()
            .into_iter()
    };
    let Some(pidfd) = fds.next() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a hand-over without a descriptor",
        ));
    };
    Ok(Some((u64::from_le_bytes(data), pidfd, fds.collect())))
}
