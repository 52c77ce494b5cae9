use super::*;
use std::fs;
use std::path::PathBuf;

/// A scratch directory under /tmp that is unmounted and removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("forkd-sys-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn dir(&self, rel: &str) -> PathBuf {
        let p = self.0.join(rel);
        fs::create_dir_all(&p).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let merged = self.0.join("merged");
        let _ = nix_free_umount(&merged);
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn nix_free_umount(path: &Path) -> io::Result<()> {
    let c = c_path(path)?;
    // SAFETY: a NUL-terminated path that lives for the call.
    check(unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } as libc::c_long)?;
    Ok(())
}

fn root_or_skip(name: &str) -> bool {
    forkd_testing::require_root(name)
}

fn chain(e: &io::Error) -> String {
    let mut text = e.to_string();
    let mut cur: Option<&(dyn std::error::Error + 'static)> =
        e.get_ref().and_then(|inner| inner.source());
    while let Some(err) = cur {
        text.push_str(": ");
        text.push_str(&err.to_string());
        cur = err.source();
    }
    text
}

#[test]
fn deep_stack_of_long_paths_mounts() {
    if !root_or_skip("deep_stack_of_long_paths_mounts") {
        return;
    }
    let scratch = Scratch::new("deep");
    let long = "l".repeat(150);
    let lowers: Vec<PathBuf> = (0..120)
        .map(|i| {
            let dir = scratch.dir(&format!("layers/{i:03}-{long}"));
            fs::write(dir.join("generation"), format!("{i}")).unwrap();
            fs::write(dir.join(format!("only-{i}")), "").unwrap();
            dir
        })
        .collect();
    let total: usize = lowers.iter().map(|p| p.as_os_str().len() + 1).sum();
    assert!(total > 4096, "the stack must not fit in mount(2)'s page");
    let (upper, work, merged) = (
        scratch.dir("upper"),
        scratch.dir("work"),
        scratch.dir("merged"),
    );
    let refs: Vec<&Path> = lowers.iter().map(PathBuf::as_path).collect();

    mount_overlay(&refs, Some((&upper, &work)), &merged).unwrap();

    assert_eq!(fs::read_to_string(merged.join("generation")).unwrap(), "0");
    assert!(merged.join("only-119").exists());
    assert!(merged.join("only-0").exists());
    fs::write(merged.join("generation"), "new").unwrap();
    assert_eq!(fs::read_to_string(upper.join("generation")).unwrap(), "new");
    assert_eq!(
        fs::read_to_string(lowers[0].join("generation")).unwrap(),
        "0"
    );
}

#[test]
fn kernel_versions_parse() {
    assert_eq!(kernel_version("6.1.0-27-amd64"), Some((6, 1)));
    assert_eq!(kernel_version("6.18.2"), Some((6, 18)));
    assert_eq!(kernel_version("5.15.0-1051-azure"), Some((5, 15)));
    assert_eq!(kernel_version("6.8-rc1"), Some((6, 8)));
    assert_eq!(kernel_version("garbage"), None);
}

#[test]
fn read_only_overlay_refuses_writes() {
    if !root_or_skip("read_only_overlay_refuses_writes") {
        return;
    }
    let scratch = Scratch::new("ro");
    let (top, bottom, merged) = (
        scratch.dir("top"),
        scratch.dir("bottom"),
        scratch.dir("merged"),
    );
    fs::write(top.join("a"), "top").unwrap();
    fs::write(bottom.join("a"), "bottom").unwrap();
    fs::write(bottom.join("b"), "bottom").unwrap();

    mount_overlay(&[&top, &bottom], None, &merged).unwrap();

    assert_eq!(fs::read_to_string(merged.join("a")).unwrap(), "top");
    assert_eq!(fs::read_to_string(merged.join("b")).unwrap(), "bottom");
    let e = fs::write(merged.join("c"), "x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let e = fs::remove_file(merged.join("b")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
}

#[test]
fn errors_name_the_step_and_the_kernels_reason() {
    if !root_or_skip("errors_name_the_step_and_the_kernels_reason") {
        return;
    }
    let scratch = Scratch::new("errors");
    let (lower, upper, merged) = (
        scratch.dir("lower"),
        scratch.dir("upper"),
        scratch.dir("merged"),
    );
    let missing = scratch.0.join("missing");

    let e = mount_overlay(
        &[&lower, &missing],
        Some((&upper, &scratch.dir("work"))),
        &merged,
    )
    .unwrap_err();
    let text = chain(&e);
    let option = match lower_mode() {
        LowerMode::Append => "lowerdir+",
        LowerMode::Links => "lowerdir",
    };
    assert!(
        text.starts_with(&format!("fsconfig {option} {}", missing.display())),
        "{text}"
    );
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{text}");

    // A work directory inside the upper directory passes every fsconfig call and is
    // refused only when the superblock is built (overlayfs explains in dmesg only).
    let nested_work = scratch.dir("upper/work");
    let e = mount_overlay(&[&lower], Some((&upper, &nested_work)), &merged).unwrap_err();
    let text = chain(&e);
    assert!(text.starts_with("fsconfig create"), "{text}");
    assert_eq!(e.raw_os_error(), None, "the errno is in the source: {text}");
    let inner = e.get_ref().unwrap().downcast_ref::<MountError>().unwrap();
    assert_eq!(inner.raw_os_error(), Some(libc::EINVAL), "{text}");

    // What the kernel logs in the context comes with the error. Overlayfs before
    // Linux 6.5 parses its options only at the create, and logs to dmesg alone.
    let fs = FsContext::open(c"overlay").unwrap();
    match fs.set_path("no-such-option", &lower) {
        Err(e) => {
            let text = chain(&e);
            assert!(
                text.contains("Unknown parameter 'no-such-option'"),
                "{text}"
            );
        }
        Ok(()) => {
            let text = chain(&fs.create().unwrap_err());
            assert!(text.starts_with("fsconfig create"), "{text}");
        }
    }

    let e = mount_overlay(&[&lower], None, &merged).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");

    let e = mount_overlay(&[&lower, &upper], None, &scratch.0.join("no-target")).unwrap_err();
    assert!(chain(&e).starts_with("move_mount onto"), "{}", chain(&e));
}
