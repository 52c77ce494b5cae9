//! Running a host program as an unprivileged user that cannot see chosen directories.
//!
//! An agent under evaluation runs on the host (its harness, its model client) but must not
//! read what the trial hides from it: the suite's hidden tests and solutions, the run's
//! other trials, the daemon's state. [`confine`] makes a command, between fork and exec:
//! 1. enter a mount namespace of its own, private, so nothing it mounts leaks back;
//! 2. clone its own directory (`keep`) as a detached mount while it is still visible;
//! 3. cover every directory in `hide` with an empty, read-only-for-others tmpfs;
//! 4. put the clone of `keep` back at its own path (making the directories above it inside
//!    the covering tmpfs), and change into it;
//! 5. drop every supplementary group, take `gid` and `uid` (real, effective and saved),
//!    and set `no_new_privs`, so neither it nor anything it runs can become root again.
//!
//! Everything the hook needs (C strings, the directory list) is made before the fork: the
//! hook only makes system calls.

use crate::mount::{c_path, MOVE_MOUNT_F_EMPTY_PATH, OPEN_TREE_CLOEXEC, OPEN_TREE_CLONE};
use std::ffi::CString;
use std::io;
use std::path::PathBuf;

/// Who the command runs as, and what it cannot see.
#[derive(Debug, Clone)]
pub struct Confinement {
    pub uid: u32,
    pub gid: u32,
    /// Directories covered by an empty tmpfs (those that do not exist are skipped; one
    /// inside another is covered with it).
    pub hide: Vec<PathBuf>,
    /// The command's own directory: visible (and the working directory) even when it lies
    /// under a hidden one.
    pub keep: PathBuf,
}

/// The covering mounts (outermost only, existing only) and the directories to make inside
/// them down to `keep`, in order.
fn plan(c: &Confinement) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut hide: Vec<PathBuf> = c
        .hide
        .iter()
        .filter(|p| p.is_absolute() && p.is_dir())
        .cloned()
        .collect();
    hide.sort();
    hide.dedup();
    let mut outer: Vec<PathBuf> = Vec::new();
    for h in hide {
        if !outer.iter().any(|o| h.starts_with(o)) {
            outer.push(h);
        }
    }
    let mut make = Vec::new();
    if let Some(cover) = outer.iter().find(|o| c.keep.starts_with(o)) {
        let mut at = cover.clone();
        if let Ok(rest) = c.keep.strip_prefix(cover) {
            for part in rest.components() {
                at.push(part);
                make.push(at.clone());
            }
        }
    }
    (outer, make)
}

/// Makes `cmd` run confined as [`Confinement`] says. Needs root (CAP_SYS_ADMIN for the
/// mounts, CAP_SETUID/CAP_SETGID for the change of user) in the caller.
pub fn confine(cmd: &mut std::process::Command, c: &Confinement) -> io::Result<()> {
    use std::os::unix::process::CommandExt;
    if c.uid == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a confined command runs as a user other than root",
        ));
    }
    if !c.keep.is_absolute() || !c.keep.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: not a directory", c.keep.display()),
        ));
    }
    let (cover, make) = plan(c);
    let cover = cover
        .iter()
        .map(|p| c_path(p))
        .collect::<io::Result<Vec<CString>>>()?;
    let make = make
        .iter()
        .map(|p| c_path(p))
        .collect::<io::Result<Vec<CString>>>()?;
    let keep = c_path(&c.keep)?;
    let (uid, gid) = (c.uid as libc::uid_t, c.gid as libc::gid_t);
    // SAFETY: the hook runs between fork and exec in the single-threaded child and makes
    // only system calls (unshare, mount, open_tree, mkdir, move_mount, close, chdir,
    // setgroups, setresgid, setresuid, prctl) on C strings allocated before the fork; it
    // allocates nothing and keeps no pointer past a call.
    unsafe {
        cmd.pre_exec(move || {
            let fail = || Err(io::Error::last_os_error());
            let none = std::ptr::null::<libc::c_char>();
            if libc::unshare(libc::CLONE_NEWNS) < 0
                || libc::mount(
                    none,
                    c"/".as_ptr(),
                    none,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) < 0
            {
                return fail();
            }
            let tree = libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                keep.as_ptr(),
                OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as libc::c_uint,
            );
            if tree < 0 {
                return fail();
            }
            for dir in &cover {
                if libc::mount(
                    c"forkd-hidden".as_ptr(),
                    dir.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"mode=0755,size=1m".as_ptr().cast(),
                ) < 0
                {
                    return fail();
                }
            }
            for dir in &make {
                if libc::mkdir(dir.as_ptr(), 0o755) < 0
                    && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                {
                    return fail();
                }
            }
            if !make.is_empty()
                && libc::syscall(
                    libc::SYS_move_mount,
                    tree as libc::c_int,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    keep.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                ) < 0
            {
                return fail();
            }
            libc::close(tree as libc::c_int);
            if libc::chdir(keep.as_ptr()) < 0
                || libc::setgroups(0, std::ptr::null()) < 0
                || libc::setresgid(gid, gid, gid) < 0
                || libc::setresuid(uid, uid, uid) < 0
                || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) < 0
            {
                return fail();
            }
            Ok(())
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_cover_the_outermost_existing_directories_and_the_way_back_to_keep() {
        let base = std::env::temp_dir().join(format!("forkd-confine-plan-{}", std::process::id()));
        let keep = base.join("run/trials/t1/agent");
        std::fs::create_dir_all(&keep).unwrap();
        std::fs::create_dir_all(base.join("suite")).unwrap();
        let c = Confinement {
            uid: 1000,
            gid: 1000,
            hide: vec![
                base.join("run"),
                base.join("run/trials"),
                base.join("suite"),
                base.join("missing"),
                PathBuf::from("relative"),
            ],
            keep: keep.clone(),
        };
        let (cover, make) = plan(&c);
        assert_eq!(cover, vec![base.join("run"), base.join("suite")]);
        assert_eq!(
            make,
            vec![
                base.join("run/trials"),
                base.join("run/trials/t1"),
                base.join("run/trials/t1/agent")
            ]
        );
        let outside = Confinement {
            keep: base.clone(),
            ..c
        };
        assert!(plan(&outside).1.is_empty());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_confined_command_runs_as_its_user_and_sees_only_its_own_directory() {
        if !forkd_testing::require_root(
            "a_confined_command_runs_as_its_user_and_sees_only_its_own_directory",
        ) {
            return;
        }
        let base = std::env::temp_dir().join(format!("forkd-confine-run-{}", std::process::id()));
        let secret = base.join("run/secret");
        let keep = base.join("run/trials/t1/agent");
        std::fs::create_dir_all(&keep).unwrap();
        std::fs::write(&secret, "hidden\n").unwrap();
        std::os::unix::fs::chown(&keep, Some(2_000_000_123), Some(2_000_000_123)).unwrap();
        std::fs::write(keep.join("brief"), "mine\n").unwrap();
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c").arg(format!(
            "id -u; id -G; pwd; cat brief; cat {} || echo no-secret; ls {}; touch ok && echo wrote; touch {}/x || echo no-write",
            secret.display(),
            base.join("run").display(),
            base.join("run").display()
        ));
        confine(
            &mut cmd,
            &Confinement {
                uid: 2_000_000_123,
                gid: 2_000_000_123,
                hide: vec![base.join("run")],
                keep: keep.clone(),
            },
        )
        .unwrap();
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "2000000123", "{text}");
        assert_eq!(lines[1], "2000000123", "no supplementary groups: {text}");
        assert_eq!(lines[2], keep.display().to_string(), "{text}");
        assert_eq!(lines[3], "mine", "{text}");
        assert_eq!(lines[4], "no-secret", "{text}");
        assert_eq!(
            lines[5], "trials",
            "the cover holds only the way back: {text}"
        );
        assert_eq!(lines[6], "wrote", "{text}");
        assert_eq!(lines[7], "no-write", "{text}");
        // The caller's view is unchanged, and so is the secret.
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "hidden\n");
        assert!(keep.join("ok").is_file());
        let mine = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mine.contains("forkd-hidden"), "{mine}");
        std::fs::remove_dir_all(&base).unwrap();
        // Root is refused, and so is a directory to keep that does not exist.
        let c = Confinement {
            uid: 0,
            gid: 0,
            hide: vec![],
            keep: std::env::temp_dir(),
        };
        assert!(confine(&mut std::process::Command::new("true"), &c).is_err());
        let c = Confinement {
            uid: 5,
            gid: 5,
            hide: vec![],
            keep: base.join("gone"),
        };
        assert!(confine(&mut std::process::Command::new("true"), &c).is_err());
    }
}
