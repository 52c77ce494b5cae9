//! Restore templates: one `criu template` process per checkpoint holds the private
//! anonymous memory of every task of its images, read once; each restore from it is a
//! worker the template forks, whose tree takes that memory by `mremap` and shares it
//! copy-on-write with the template and every other tree restored from it. The CRIU side
//! is forkd's patch (fixtures/criu/patches/0001-restore-templates.patch, `template.c`);
//! this is its caller. The protocol, over a SOCK_SEQPACKET pair:
//!
//! - once loaded, the template sends [`Ready`] (a zero magic: it failed; its log says why);
//! - each request ([`Request`], with descriptors as SCM_RIGHTS) starts one worker, which
//!   places the descriptors at the given numbers, enters the mount namespace and root
//!   passed last (when asked), sets the environment, and serves one RPC exchange as
//!   `criu swrk` does; the answer is the worker's pid, a child of the caller
//!   (`CLONE_PARENT`), or -errno;
//! - the template exits when its end of the pair is closed.

use crate::*;
use std::io::Read;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Mutex;

const MAGIC: u32 = 0x544b_5246;
const MAX_FDS: usize = 8;
const ENV_MAX: usize = 2048;
const F_MERGE: u32 = 1;
const F_NS: u32 = 2;
/// `struct template_request`: magic, flags, nfds, target[8], rpc_fd, env_len, env.
const REQUEST_LEN: usize = 4 * 3 + 4 * MAX_FDS + 4 + 4 + ENV_MAX;

/// A running template.
#[derive(Debug)]
pub struct Template {
    ctl: Mutex<std::fs::File>,
    child: Mutex<std::process::Child>,
    /// Bytes it holds (resident), in how many areas, loaded in how long.
    pub bytes: u64,
    pub areas: u32,
    pub load: Duration,
}

/// What a worker is given besides the RPC socket.
pub(crate) struct WorkerSetup<'a> {
    /// Descriptors placed at numbers in the worker: (descriptor, number).
    pub fds: Vec<(BorrowedFd<'a>, RawFd)>,
    /// The number of the RPC socket among them.
    pub rpc_fd: RawFd,
    /// A mount namespace and a root directory to take.
    pub ns: Option<(BorrowedFd<'a>, BorrowedFd<'a>)>,
    pub env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    pub mergeable: bool,
}

impl Criu {
    /// Starts a template over `images_dir`, logging to `log`, and waits until it holds
    /// the memory (charged to the caller's cgroup).
    pub fn start_template(&self, images_dir: &Path, log: &Path) -> Result<Template, CriuError> {
        let start = Instant::now();
        let (mine, theirs) = seqpacket_pair()?;
        let mut cmd = Command::new(&self.launch.program);
        cmd.args(&self.launch.args)
            .arg(format!("-v{}", self.log_level))
            .arg("template")
            .arg("3")
            .arg(images_dir)
            .arg(log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        forkd_sys::inherit_fds(&mut cmd, vec![(theirs.as_raw_fd(), 3)]);
        let mut child = cmd
            .spawn()
            .map_err(|e| CriuError::NotFound(format!("{}: {e}", self.path.display())))?;
        drop(theirs);
        let mut ctl = std::fs::File::from(mine);
        let deadline = Instant::now() + self.timeout;
        let ready = loop {
            match wait_readable(
                &ctl,
                deadline.min(Instant::now() + Duration::from_millis(100)),
            ) {
                Ok(true) => break Ok(()),
                Ok(false) if Instant::now() >= deadline => {
                    break Err(CriuError::TimedOut {
                        action: "template",
                        limit: self.timeout,
                        log: log.to_path_buf(),
                    })
                }
                Ok(false) => {
                    if let Ok(Some(status)) = child.try_wait() {
                        break Err(CriuError::Failed {
                            action: "template",
                            message: format!("it ended ({status}) before it was ready"),
                            log: log.to_path_buf(),
                            tail: log_tail(log),
                        });
                    }
                }
                Err(e) => break Err(io("wait for the template")(e)),
            }
        };
        let mut buf = [0u8; 24];
        let n = match ready {
            Ok(()) => ctl
                .read(&mut buf)
                .map_err(io("read the template's answer"))?,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        let word = |i: usize| u32::from_ne_bytes(buf[i..i + 4].try_into().expect("4 bytes"));
        let quad = |i: usize| u64::from_ne_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
        if n != buf.len() || word(0) != MAGIC {
            let _ = child.kill();
            let _ = child.wait();
            return Err(CriuError::Failed {
                action: "template",
                message: "it could not load the images".into(),
                log: log.to_path_buf(),
                tail: log_tail(log),
            });
        }
        // What it holds: its resident memory (huge pages included), at least the pages it
        // read.
        let rss = forkd_sys::proc_kib_field(&format!("/proc/{}/smaps_rollup", child.id()), "Rss:")
            .unwrap_or(0);
        let t = Template {
            ctl: Mutex::new(ctl),
            child: Mutex::new(child),
            areas: word(4),
            bytes: quad(8).max(rss),
            load: start.elapsed(),
        };
        Ok(t)
    }
}

impl Criu {
    /// Whether this CRIU has restore templates (forkd's patch): `criu template` without
    /// its arguments says how it is used rather than that it is unknown.
    pub fn has_templates(&self) -> bool {
        let mut cmd = Command::new(&self.launch.program);
        cmd.args(&self.launch.args)
            .arg("template")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd.output()
            .map(|o| String::from_utf8_lossy(&o.stderr).contains("Usage: criu template"))
            .unwrap_or(false)
    }
}

impl Template {
    /// The template's pid.
    pub fn pid(&self) -> u32 {
        self.child.lock().unwrap_or_else(|e| e.into_inner()).id()
    }

    /// Whether it still runs (one killed, or ended, starts no more workers).
    pub fn alive(&self) -> bool {
        matches!(
            self.child
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .try_wait(),
            Ok(None)
        )
    }

    /// Starts a worker; returns its pid (a child of this process).
    pub(crate) fn start_worker(&self, setup: &WorkerSetup<'_>) -> Result<i32, CriuError> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        let mut fds: Vec<RawFd> = setup.fds.iter().map(|(fd, _)| fd.as_raw_fd()).collect();
        let mut req = vec![0u8; REQUEST_LEN];
        let mut put = |at: usize, v: u32| req[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        let mut flags = 0;
        if setup.mergeable {
            flags |= F_MERGE;
        }
        if let Some((mnt, root)) = &setup.ns {
            flags |= F_NS;
            fds.push(mnt.as_raw_fd());
            fds.push(root.as_raw_fd());
        }
        if fds.len() > MAX_FDS {
            return Err(CriuError::Rpc(format!(
                "a template worker takes at most {MAX_FDS} descriptors, not {}",
                fds.len()
            )));
        }
        put(0, MAGIC);
        put(4, flags);
        put(8, fds.len() as u32);
        for (i, (_, target)) in setup.fds.iter().enumerate() {
            put(12 + 4 * i, *target as u32);
        }
        put(12 + 4 * MAX_FDS, setup.rpc_fd as u32);
        let mut env = Vec::new();
        for (k, v) in &setup.env {
            use std::os::unix::ffi::OsStrExt;
            env.extend_from_slice(k.as_bytes());
            env.push(b'=');
            env.extend_from_slice(v.as_bytes());
            env.push(0);
        }
        if env.len() > ENV_MAX {
            return Err(CriuError::Rpc(format!(
                "a template worker's environment takes at most {ENV_MAX} bytes, not {}",
                env.len()
            )));
        }
        put(16 + 4 * MAX_FDS, env.len() as u32);
        let at = 20 + 4 * MAX_FDS;
        req[at..at + env.len()].copy_from_slice(&env);
        let ctl = self.ctl.lock().unwrap_or_else(|e| e.into_inner());
        let iov = [std::io::IoSlice::new(&req)];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        sendmsg::<()>(ctl.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)
            .map_err(|e| io("ask the template for a worker")(e.into()))?;
        let mut reply = [0u8; 8];
        let n = (&*ctl)
            .read(&mut reply)
            .map_err(io("read the template's answer"))?;
        let magic = u32::from_ne_bytes(reply[0..4].try_into().expect("4 bytes"));
        let pid = i32::from_ne_bytes(reply[4..8].try_into().expect("4 bytes"));
        if n != reply.len() || magic != MAGIC {
            return Err(CriuError::Rpc("the template did not answer".into()));
        }
        if pid <= 0 {
            return Err(io("start a template worker")(
                std::io::Error::from_raw_os_error(-pid),
            ));
        }
        Ok(pid)
    }
}

impl Drop for Template {
    fn drop(&mut self) {
        // Closing its end ends it; what it restored is not its and goes on.
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A worker's or a spawned CRIU's process, as one exchange sees it.
pub(crate) enum Process {
    Spawned(std::process::Child),
    /// A template's worker: our child by `CLONE_PARENT`, reaped here by pid, once (its
    /// pid may be another child's after that).
    Worker {
        pid: i32,
        reaped: bool,
    },
}

impl Process {
    pub fn id(&self) -> u32 {
        match self {
            Process::Spawned(c) => c.id(),
            Process::Worker { pid, .. } => *pid as u32,
        }
    }

    /// Its end, if it has ended (reaped then), described.
    pub fn try_wait(&mut self) -> Option<String> {
        match self {
            Process::Spawned(c) => c.try_wait().ok().flatten().map(|s| s.to_string()),
            Process::Worker { reaped: true, .. } => Some("reaped".into()),
            Process::Worker { pid, reaped } => {
                use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
                match waitpid(nix::unistd::Pid::from_raw(*pid), Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) => None,
                    Ok(s) => {
                        *reaped = true;
                        Some(format!("{s:?}"))
                    }
                    Err(e) => {
                        *reaped = true;
                        Some(format!("gone ({e})"))
                    }
                }
            }
        }
    }

    pub fn kill(&mut self) {
        match self {
            Process::Spawned(c) => {
                let _ = c.kill();
            }
            Process::Worker { reaped: true, .. } => {}
            Process::Worker { pid, .. } => {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    pub fn wait(&mut self) {
        match self {
            Process::Spawned(c) => {
                let _ = c.wait();
            }
            Process::Worker { reaped: true, .. } => {}
            Process::Worker { pid, reaped } => {
                let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(*pid), None);
                *reaped = true;
            }
        }
    }

    /// What it wrote on stderr (a worker shares the template's, which is discarded).
    pub fn stderr(&mut self) -> String {
        let mut s = String::new();
        if let Process::Spawned(c) = self {
            if let Some(mut e) = c.stderr.take() {
                let _ = e.read_to_string(&mut s);
            }
        }
        s
    }
}

/// `/proc/PID/WHAT` opened (a namespace, `root`, or `fd/N`), to be passed on.
pub(crate) fn open_proc(pid: u32, what: &str) -> Result<OwnedFd, CriuError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = format!("/proc/{pid}/{what}");
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    if what == "root" {
        o.custom_flags(nix::fcntl::OFlag::O_DIRECTORY.bits());
    }
    o.open(&path).map(OwnedFd::from).map_err(|e| CriuError::Io {
        step: "open what a template worker takes",
        source: std::io::Error::new(e.kind(), format!("{path}: {e}")),
    })
}
