//! Tests of the set-up: the spec's hand-over, `/dev` in a root.

use super::*;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

fn root_or_skip(name: &str) -> bool {
    forkd_testing::require(name, forkd_testing::is_root(), "needs root (mknod)")
}

fn assert_dev(root: &Path) {
    let dev = std::fs::symlink_metadata(root.join("dev")).unwrap();
    assert!(dev.is_dir());
    for d in forkd_layers::devices::DEVICES {
        let m = std::fs::symlink_metadata(root.join("dev").join(d.name)).unwrap();
        assert!(m.file_type().is_char_device(), "dev/{}", d.name);
        assert_eq!(
            m.rdev(),
            makedev(d.major.into(), d.minor.into()),
            "dev/{}",
            d.name
        );
        assert_eq!(m.mode() & 0o7777, d.mode, "dev/{}", d.name);
    }
    let shm = std::fs::symlink_metadata(root.join("dev/shm")).unwrap();
    assert!(shm.is_dir());
    assert_eq!(shm.mode() & 0o7777, 0o1777);
    assert_eq!(
        std::fs::read_link(root.join("dev/ptmx")).unwrap(),
        Path::new("pts/ptmx")
    );
}

/// Sends `body` with `fds` as the daemon does, closes its end, and returns what the
/// set-up makes of it.
fn hand(body: &[u8], fds: &[RawFd]) -> StepResult<(SetupSpec, Handed)> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let cmsg = [ControlMessage::ScmRights(fds)];
    let n = sendmsg::<()>(
        ours.as_raw_fd(),
        &[std::io::IoSlice::new(body)],
        if fds.is_empty() { &[] } else { &cmsg },
        MsgFlags::empty(),
        None,
    )
    .unwrap();
    assert_eq!(n, body.len());
    drop(ours);
    receive(&theirs)
}

#[test]
fn the_spec_comes_with_its_descriptors_and_nothing_else_is_taken() {
    let spec = SetupSpec {
        id: SandboxId::random(),
        rootfs: "/r".into(),
        hostname: "h".into(),
        cgroup: None,
        name_files: false,
        sysfs: None,
        seccomp: crate::Seccomp::Default,
        setuid: true,
    };
    let body = serde_json::to_vec(&spec).unwrap();
    let files: Vec<std::fs::File> = (0..4)
        .map(|_| std::fs::File::open("/dev/null").unwrap())
        .collect();
    let fds: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
    let (got, handed) = hand(&body, &fds[..3]).unwrap();
    assert_eq!(got.id, spec.id);
    assert!(got.setuid, "the setuid setting travels with the spec");
    assert!(handed.netns.is_some());
    // Received as descriptors of its own, closed on exec.
    for fd in [&handed.root, &handed.mntns] {
        assert!(!fds.contains(&fd.as_raw_fd()));
        let flags = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
    }
    let (_, handed) = hand(&body, &fds[..2]).unwrap();
    assert!(
        handed.netns.is_none(),
        "two descriptors: the set-up makes the namespace"
    );
    for (fds, why) in [(&fds[..1], "one"), (&fds[..0], "none")] {
        let e = hand(&body, fds)
            .err()
            .unwrap_or_else(|| panic!("{why} accepted"));
        assert_eq!(e.0, "read spec", "{why}: {e:?}");
        assert!(e.1.contains("expected 2 or 3 descriptors"), "{why}: {e:?}");
    }
    // Four: refused whether the fourth fits the control buffer or is cut off.
    let e = hand(&body, &fds).err().expect("four accepted");
    assert_eq!(e.0, "read spec", "{e:?}");
    assert!(e.1.contains("descriptors"), "{e:?}");
    let e = hand(b"{not json", &fds[..2])
        .err()
        .expect("bad json accepted");
    assert_eq!(e.0, "parse spec", "{e:?}");
    let long = vec![b' '; SPEC_LIMIT];
    let e = hand_long(&long);
    assert!(e.1.contains("longer than"), "{e:?}");
}

/// A spec longer than the set-up takes, written in pieces.
fn hand_long(body: &[u8]) -> (&'static str, String) {
    let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let writer = {
        let body = body.to_vec();
        std::thread::spawn(move || {
            let _ = ours.write_all(&body);
        })
    };
    let e = receive(&theirs)
        .err()
        .expect("a spec over the limit accepted");
    drop(theirs);
    writer.join().unwrap();
    e
}

/// The mechanism itself, without the runtime layer in front of it: whatever an image
/// put at `dev`, the result is the standard set inside the root and nothing outside.
#[test]
fn populate_dev_never_writes_through_symlinks() {
    if !root_or_skip("populate_dev_never_writes_through_symlinks") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();

    // `dev` itself a symlink to a directory outside the root.
    let a = tmp.path().join("a");
    std::fs::create_dir(&a).unwrap();
    std::os::unix::fs::symlink(&outside, a.join("dev")).unwrap();
    populate_dev(&a).unwrap();
    assert_dev(&a);

    // Entries in the way: a file at dev/null, a symlink at dev/shm, a wrong node at
    // dev/zero, a symlink to elsewhere at dev/ptmx.
    let b = tmp.path().join("b");
    std::fs::create_dir_all(b.join("dev")).unwrap();
    std::fs::write(b.join("dev/null"), "not a device").unwrap();
    std::os::unix::fs::symlink(&outside, b.join("dev/shm")).unwrap();
    nix::sys::stat::mknod(
        &b.join("dev/zero"),
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(1, 1),
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.join("ptmx"), b.join("dev/ptmx")).unwrap();
    populate_dev(&b).unwrap();
    assert_dev(&b);

    // Run again: nothing to do, nothing changed.
    let before = std::fs::symlink_metadata(b.join("dev/null")).unwrap().ino();
    populate_dev(&b).unwrap();
    assert_eq!(
        std::fs::symlink_metadata(b.join("dev/null")).unwrap().ino(),
        before
    );

    let left: Vec<_> = std::fs::read_dir(&outside).unwrap().collect();
    assert!(left.is_empty(), "wrote outside the root: {left:?}");
}

#[test]
fn the_setup_answers_once_the_init_says_it_listens() {
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    // The byte: ready.
    let (rd, wr) = pipe();
    nix::unistd::write(&wr, b"1").unwrap();
    drop(wr);
    assert!(wait_listening(rd, Duration::from_secs(5)).is_ok());
    // Closed without it: the init exited first.
    let (rd, wr) = pipe();
    drop(wr);
    let (step, msg) = wait_listening(rd, Duration::from_secs(5)).unwrap_err();
    assert_eq!(step, "wait for init");
    assert!(msg.contains("exited before it listened"), "{msg}");
    // Neither within the time: it hangs.
    let (rd, _wr) = pipe();
    let t = std::time::Instant::now();
    let (_, msg) = wait_listening(rd, Duration::from_millis(50)).unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(50));
    assert!(msg.contains("did not listen"), "{msg}");
}
