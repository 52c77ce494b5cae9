//! One exchange with `criu swrk`: the request sent over the socket pair, notifications
//! answered, the response read within the timeout; CRIU's orphaned helpers reaped.

use crate::*;
use protobuf::{Message, MessageField};
use rust_criu::rust_criu_protobuf::rpc;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use template::Process;

impl Criu {
    /// One swrk exchange: request, notifications, response, within [`Criu::timeout`]
    /// (CRIU is killed when it passes, which also lets go of every task it had seized).
    pub(crate) fn call(
        &self,
        kind: rpc::Criu_req_type,
        log: &Path,
        opts: rpc::Criu_opts,
        child_setup: &Child<'_>,
        notify: &mut dyn FnMut(&str) -> bool,
    ) -> Result<rpc::Criu_resp, CriuError> {
        let (mine, theirs) = seqpacket_pair()?;
        // A template that has ended starts no worker: a CRIU of its own does the restore.
        let template = child_setup.template.filter(|t| t.alive());
        let mut child =
            match template {
                None => {
                    let mut cmd = self.command_on(child_setup.on_base)?;
                    cmd.arg("swrk")
                        .arg("3")
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::piped());
                    // The descriptors are placed first (hooks run in the order they are
                    // added), so that a fresh namespace made at its number next cannot land
                    // on a source.
                    let mut fds = vec![(theirs.as_raw_fd(), 3)];
                    if let (Some(fd), Some(ns)) = (child_setup.netns_fd, child_setup.netns) {
                        fds.push((ns.as_raw_fd(), fd));
                    }
                    forkd_sys::inherit_fds(&mut cmd, fds);
                    // A daemon killed mid-dump must not leave CRIU holding the tree seized.
                    forkd_sys::die_with_parent(&mut cmd);
                    self.prepare(&mut cmd, child_setup)?;
                    Process::Spawned(cmd.spawn().map_err(|e| {
                        CriuError::NotFound(format!("{}: {e}", self.path.display()))
                    })?)
                }
                Some(t) => Process::Worker {
                    pid: self.worker_of(t, theirs.as_fd(), child_setup)?,
                    reaped: false,
                },
            };
        drop(theirs);
        for procs in child_setup.join_cgroup_procs {
            if let Err(e) = std::fs::write(procs, child.id().to_string()) {
                child.kill();
                child.wait();
                return Err(io("move criu into the branch cgroup")(e));
            }
        }
        let mut sock = std::fs::File::from(mine);
        let mut req = rpc::Criu_req::new();
        req.set_type(kind);
        req.opts = MessageField::some(opts);
        let bytes = req
            .write_to_bytes()
            .map_err(|e| CriuError::Rpc(e.to_string()))?;
        sock.write_all(&bytes).map_err(io("send request to criu"))?;
        let deadline = Instant::now() + self.timeout;
        let action = match kind {
            rpc::Criu_req_type::DUMP => "dump",
            rpc::Criu_req_type::RESTORE => "restore",
            _ => "request",
        };
        let result = loop {
            // In slices, so that a CRIU that died (its helpers still holding the socket,
            // which then never reads as closed) is noticed at once.
            let slice = deadline.min(Instant::now() + Duration::from_millis(100));
            match wait_readable(&sock, slice) {
                Ok(true) => {}
                Ok(false) if Instant::now() >= deadline => {
                    break Err(CriuError::TimedOut {
                        action,
                        limit: self.timeout,
                        log: log.to_path_buf(),
                    });
                }
                Ok(false) => match child.try_wait() {
                    Some(status) if !wait_readable(&sock, Instant::now()).unwrap_or(false) => {
                        break Err(CriuError::Rpc(format!(
                            "criu {action} ended ({status}) without answering"
                        )));
                    }
                    _ => continue,
                },
                Err(e) => break Err(io("wait for criu")(e)),
            }
            let mut buf = vec![0u8; 1 << 16];
            let n = match sock.read(&mut buf) {
                Ok(0) => {
                    break Err(CriuError::Rpc(
                        "criu closed the connection without answering".into(),
                    ))
                }
                Ok(n) => n,
                Err(e) => break Err(io("read criu response")(e)),
            };
            let resp = match rpc::Criu_resp::parse_from_bytes(&buf[..n]) {
                Ok(r) => r,
                Err(e) => break Err(CriuError::Rpc(format!("bad response: {e}"))),
            };
            if resp.type_() == rpc::Criu_req_type::NOTIFY {
                let script = resp
                    .notify
                    .as_ref()
                    .map(|n| n.script().to_string())
                    .unwrap_or_default();
                let ok = notify(&script);
                let mut ack = rpc::Criu_req::new();
                ack.set_type(rpc::Criu_req_type::NOTIFY);
                ack.set_notify_success(ok);
                let bytes = ack
                    .write_to_bytes()
                    .map_err(|e| CriuError::Rpc(e.to_string()))?;
                if let Err(e) = sock.write_all(&bytes) {
                    break Err(io("answer criu notification")(e));
                }
                continue;
            }
            break Ok(resp);
        };
        drop(sock);
        if result.is_err() {
            // The processes a restore forked hold CRIU's socket and stderr and outlive a
            // CRIU that died half-way; once it is gone they are the caller's children
            // (a subreaper's, as the daemon is), and go too.
            child.kill();
            child.wait();
            kill_orphaned_helpers();
        }
        let stderr = child.stderr();
        match child {
            // A worker that answered exits by itself, tearing down its copy of the
            // template's mappings: reaped off the request's path.
            Process::Worker { pid, reaped: false } if result.is_ok() => {
                std::thread::spawn(move || Process::Worker { pid, reaped: false }.wait());
            }
            mut other => other.wait(),
        }
        if self.debug {
            eprintln!("criu stderr: {stderr}");
        }
        result.map_err(|e| match e {
            CriuError::Rpc(m) if !stderr.trim().is_empty() => {
                CriuError::Rpc(format!("{m}; criu said: {}", stderr.trim()))
            }
            other => other,
        })
    }
}

impl Criu {
    /// What a restore's CRIU needs besides its descriptors: the root base, its own
    /// `/run`, a fresh network namespace, the restored root attached, memory merging.
    fn prepare(&self, cmd: &mut Command, child_setup: &Child<'_>) -> Result<(), CriuError> {
        if let (Some(fd), None) = (child_setup.netns_fd, child_setup.netns) {
            forkd_sys::fresh_netns_fd(cmd, fd);
        }
        if child_setup.mergeable {
            forkd_sys::memory_merge_in_child(cmd);
        }
        if let Some((mnt, at)) = child_setup.root_mount {
            // After the hook that gives CRIU its own namespace, when there is one.
            let own_namespace = self.private_run.is_none();
            forkd_sys::attach_in_child(cmd, mnt.as_fd(), at, own_namespace)
                .map_err(io("attach the restored tree's root"))?;
        }
        Ok(())
    }

    /// A worker of template `t` for one exchange on `sock`, set up as a CRIU of its own
    /// would be. The set-up is made once, as it is for such a CRIU, in a short-lived
    /// holder (`sleep`, its hooks run): the worker takes the holder's mount namespace,
    /// root, environment and network namespace, and the holder is done.
    fn worker_of(
        &self,
        t: &Template,
        sock: std::os::fd::BorrowedFd<'_>,
        child_setup: &Child<'_>,
    ) -> Result<i32, CriuError> {
        let mut holder = Command::new("/bin/sleep");
        holder
            .arg("600")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut holder = self.place(holder, child_setup.on_base)?;
        // What the placing set (the root base's device, for CRIU's root shim).
        let envs: Vec<(std::ffi::OsString, std::ffi::OsString)> = holder
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_os_string(), v?.to_os_string())))
            .collect();
        forkd_sys::die_with_parent(&mut holder);
        self.prepare(&mut holder, child_setup)?;
        let mut h = holder
            .spawn()
            .map_err(|e| io("start a template worker's holder")(e))?;
        let result = (|| {
            let mnt = template::open_proc(h.id(), "ns/mnt")?;
            let root = template::open_proc(h.id(), "root")?;
            let fresh_netns = match (child_setup.netns_fd, child_setup.netns) {
                (Some(fd), None) => Some(template::open_proc(h.id(), &format!("fd/{fd}"))?),
                _ => None,
            };
            let mut fds = vec![(sock, 3)];
            match (child_setup.netns_fd, child_setup.netns, &fresh_netns) {
                (Some(fd), Some(ns), _) => fds.push((ns.as_fd(), fd)),
                (Some(fd), None, Some(ns)) => fds.push((ns.as_fd(), fd)),
                _ => {}
            }
            t.start_worker(&template::WorkerSetup {
                fds,
                rpc_fd: 3,
                ns: Some((mnt.as_fd(), root.as_fd())),
                env: envs,
                mergeable: child_setup.mergeable,
            })
        })();
        let _ = h.kill();
        let _ = h.wait();
        result
    }
}

/// Kills the children of this process that a CRIU left behind when it died: their
/// command line carries CRIU's title (`criu: restore ...`, see [`is_criu_helper`]), and
/// their parent is now this process. A live CRIU's helpers are its own children, never
/// ours, and are not touched.
pub(crate) fn kill_orphaned_helpers() {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for pid in dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
    {
        let ours = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1).map(|p| p == me))
            })
            .unwrap_or(false);
        let criu = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| is_criu_helper(&c))
            .unwrap_or(false);
        if ours && criu {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        }
    }
}

/// Whether a command line (`/proc/PID/cmdline`) is a CRIU helper's: CRIU titles the
/// processes it forks `criu: <action> ...`, written over its own argument area. Started
/// directly, that is the first field; started through a bundle's loader (`ld.so
/// --preload ... --library-path ... criu ...`, see `bundle.rs`), the loader's arguments
/// come first and the title is a later field. CRIU itself (`... swrk 3`) has no title.
pub(crate) fn is_criu_helper(cmdline: &[u8]) -> bool {
    cmdline
        .split(|&b| b == 0)
        .any(|field| field.starts_with(b"criu: "))
}

/// Options common to every request. CRIU reaches the directories through the caller's
/// own descriptors (`/proc/<caller>/fd/N`), so they stay open, close-on-exec, here.
pub(crate) fn base_opts(images: &OwnedFd, log_file: &str, log_level: i32) -> rpc::Criu_opts {
    let mut o = rpc::Criu_opts::new();
    o.set_images_dir_fd(images.as_raw_fd());
    o.set_log_file(log_file.to_string());
    o.set_log_level(log_level);
    // Sandboxes have no outside network: nothing to lock, and no iptables dependency.
    o.set_network_lock(rpc::Criu_network_lock_method::SKIP);
    o.set_file_locks(true);
    // TCP connections between a sandbox's own processes (over its loopback) are dumped
    // and restored with TCP repair, in-flight data included; both ends are in the tree.
    o.set_tcp_established(true);
    o
}

pub(crate) fn open_dir(path: &Path) -> Result<OwnedFd, CriuError> {
    std::fs::File::open(path)
        .map(OwnedFd::from)
        .map_err(|e| CriuError::Io {
            step: "open image directory",
            source: std::io::Error::new(e.kind(), format!("{}: {e}", path.display())),
        })
}
