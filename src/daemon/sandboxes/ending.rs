//! How sandboxes end: a stop (SIGTERM, then SIGKILL after the grace period), a removal,
//! the teardown both share, and the watcher that notices an init that exits on its own.

use super::{Sandbox, ROOTFS};
use crate::api::{ApiError, SandboxStatus};
use crate::daemon::lifecycle::{Begun, Held, Verb};
use crate::daemon::{log, Daemon, Lock};
use forkd_cgroups::Cgroup;
use forkd_sandbox::host;
use forkd_sandbox::SandboxId;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

impl Daemon {
    /// Kills what runs, unmounts, hands the cgroup to the pool (which keeps or removes
    /// it) and gives back the network lease.
    /// Idempotent; failures are logged.
    pub(in crate::daemon) fn teardown(
        &self,
        id: &SandboxId,
        dir: &Path,
        cg: &Cgroup,
        pid: Option<i32>,
    ) {
        let cgroup = cg.name();
        if let Some(pid) = pid {
            if let Ok(fd) = forkd_sys::pidfd_open(pid) {
                let _ = forkd_sys::pidfd_send_signal(std::os::fd::AsFd::as_fd(&fd), libc::SIGKILL);
            }
        }
        if let Err(e) = cg.kill_all(Duration::from_secs(5)) {
            log::warn(&format!("kill processes of {cgroup}: {e}"));
        }
        if let Some(pid) = pid {
            reap(pid);
        }
        // The root went with the sandbox's mount namespace; only a sandbox made by an
        // older daemon, which mounted roots on the host, still has one here.
        let rootfs = dir.join(ROOTFS);
        if let Err(e) = host::unmount(&rootfs) {
            log::warn(&format!("unmount {}: {e}", rootfs.display()));
        }
        if let Err(e) = self.sandboxes.cgroups.give_back(cg) {
            log::warn(&format!("remove cgroup {cgroup}: {e}"));
        }
        self.sandboxes.disconnect(id);
    }

    /// SIGTERM to the init (which passes it on), SIGKILL for all after `grace`. The
    /// sandbox is `stopping` meanwhile; no lock is held through the grace period.
    pub fn stop_sandbox(&self, sb: &Sandbox, grace: Duration) -> Result<(), ApiError> {
        match sb.begin(Verb::Stop)? {
            Begun::Nothing => Ok(()),
            Begun::Held(held) => self.stop_held(sb, held, grace),
        }
    }

    /// Stops a sandbox an operation already holds (a stop, a checkpoint that stops it,
    /// the clean-up after an init that exited) and settles it as `stopped`.
    pub(in crate::daemon) fn stop_held(
        &self,
        sb: &Sandbox,
        held: Held<'_>,
        grace: Duration,
    ) -> Result<(), ApiError> {
        self.end_processes(sb, &held, grace);
        held.settle(SandboxStatus::Stopped, |rec| {
            rec.lease = None;
            rec.init_pid = None;
            rec.init_start = None;
            crate::daemon::write_json_atomic(
                &sb.dir,
                "state.json",
                &*rec,
                crate::daemon::Survive::DaemonCrash,
            )
        })
    }

    /// Ends a held sandbox's processes (`grace` for them to exit on SIGTERM) and tears
    /// down what they used. The record is read, not changed.
    fn end_processes(&self, sb: &Sandbox, held: &Held<'_>, grace: Duration) {
        let (pid, start, cgroup) = {
            let rec = held.record();
            (
                rec.init_pid,
                rec.init_start,
                rec.cgroup_in(&self.sandboxes.hierarchy),
            )
        };
        if held.prior() != SandboxStatus::Running {
            return;
        }
        if let Some(pid) = pid {
            if let Ok(fd) = forkd_sys::pidfd_open(pid) {
                // Checked after the pidfd is open: it then names this init, not a reuse.
                let ours = forkd_sys::process_start_time(pid) == start;
                if ours {
                    self.release_network_later(pid, &fd);
                }
                if ours && !grace.is_zero() {
                    let _ =
                        forkd_sys::pidfd_send_signal(std::os::fd::AsFd::as_fd(&fd), libc::SIGTERM);
                    // Over the moment the init exits, which the kernel lets happen only
                    // once every other process of its pid namespace is gone (a grace of
                    // centuries is a wait until then).
                    let fd = std::os::fd::AsFd::as_fd(&fd);
                    if let Err(e) = forkd_sys::pidfd_wait_exit(fd, grace) {
                        log::warn(&format!("sandbox {}: wait for init {pid}: {e}", sb.id));
                    }
                }
            }
        }
        self.teardown(&sb.id, &sb.dir, &cgroup, pid);
    }

    /// Removes a sandbox entirely. A running one needs `force` (its processes are
    /// killed first). The sandbox is `removing` meanwhile.
    pub fn remove_sandbox(&self, sb: &Sandbox, force: bool) -> Result<(), ApiError> {
        let held = match sb.begin(Verb::Remove { force })? {
            Begun::Held(h) => h,
            Begun::Nothing => return Ok(()),
        };
        self.sandboxes.grants.revoke_of(&sb.id);
        self.end_processes(sb, &held, Duration::ZERO);
        self.sandboxes.table.locked().remove(&sb.id);
        self.delete_sandbox_dir(&sb.dir);
        held.settle(SandboxStatus::Removing, |rec| {
            rec.lease = None;
            rec.init_pid = None;
            rec.init_start = None;
            Ok(())
        })
    }

    /// Watches the init: when it dies on its own, the sandbox is stopped and cleaned up.
    ///
    /// Through the host's process events where the daemon has them (one descriptor for
    /// every init: `forkd_sys::proc_events`); otherwise through a pidfd of the exit
    /// watcher, which then also holds the sandbox's mount namespace until the init has
    /// exited. A stop holds the mount and network namespaces while it lasts
    /// (`release_network_later`), so that their end happens on the watcher's releasing
    /// thread after the exit is seen, not inside the init's exit, which the stop waits
    /// for: the end of a mount namespace unmounts its tree and waits for an expedited RCU
    /// grace period before it frees the mounts, and the last reference to an overlay
    /// mount unmounts it, which syncs the filesystem under it (the shared volume, with
    /// whatever every sandbox has written since its last commit).
    pub(in crate::daemon) fn watch(self: &Arc<Self>, sb: Arc<Sandbox>) {
        let (Some(pid), start) = ({
            let rec = sb.record.locked();
            (rec.init_pid, rec.init_start)
        }) else {
            return;
        };
        let daemon = self.clone();
        let runtime = self.runtime.clone();
        let on_exit = move || {
            // On the watcher's thread: the cleanup blocks, so it runs on the blocking pool.
            drop(runtime.spawn_blocking(move || loop {
                // A checkpoint in progress settles first; a stop or removal in progress
                // cleans up after the init itself.
                if sb.record.locked().init_pid != Some(pid) {
                    reap(pid);
                    return;
                }
                match sb.begin(Verb::Exited) {
                    Ok(Begun::Held(held)) => {
                        log::info(&format!("sandbox {}: init {pid} exited; stopping", sb.id));
                        let _ = daemon.stop_held(&sb, held, Duration::ZERO);
                        return;
                    }
                    Ok(Begun::Nothing) => {
                        reap(pid);
                        return;
                    }
                    Err(_) => sb.wait_settled(),
                }
            }));
        };
        // One descriptor for every init; the namespace is then held only while a stop
        // lasts (`release_namespaces_later`).
        if let Some(events) = &self.sandboxes.proc_events {
            events.watch(pid, start, on_exit);
            return;
        }
        let Ok(pidfd) = forkd_sys::pidfd_open(pid) else {
            return;
        };
        // The pidfd takes one descriptor of the watcher's table, the namespace another.
        let mounts = if self.sandboxes.exits.room() >= 2 {
            hold_namespace(pid, "mnt")
        } else {
            None
        };
        if let Err(e) =
            self.sandboxes
                .exits
                .watch_keeping(pidfd, mounts.into_iter().collect(), on_exit)
        {
            log::warn(&format!("watch init {pid} for its exit: {e}"));
        }
    }
}

/// Collects the exit status of `pid` if it is our child (the daemon is a subreaper, so
/// inits become its children once their set-up helper exits).
fn reap(pid: i32) {
    use nix::sys::wait::{waitpid, WaitPidFlag};
    for _ in 0..200 {
        match waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(nix::sys::wait::WaitStatus::StillAlive) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            _ => return,
        }
    }
}

/// A descriptor of the init `pid`'s namespace `ns` (`/proc/<pid>/ns/<ns>`), which keeps
/// the namespace alive while it is open.
fn hold_namespace(pid: i32, ns: &str) -> Option<std::os::fd::OwnedFd> {
    std::fs::File::open(format!("/proc/{pid}/ns/{ns}"))
        .ok()
        .map(Into::into)
}

impl Daemon {
    /// Holds the network namespace of the init `pid`, which is about to be ended, until
    /// its exit has been seen, then lets the watcher's releasing thread close it. The
    /// last reference to a network namespace wakes a kernel worker that dismantles it
    /// (about a millisecond of CPU): dropped by the exiting init, that worker preempted
    /// the init on its CPU, and with the host's other CPU busy, a stop waited for it.
    /// Held only for the stop (two descriptors of the watcher's table while it lasts),
    /// not for every sandbox alive, whose table `RLIMIT_NOFILE` bounds.
    fn release_network_later(&self, pid: i32, pidfd: &std::os::fd::OwnedFd) {
        if self.sandboxes.exits.room() < 3 {
            return;
        }
        let (Ok(pidfd), Some(net)) = (pidfd.try_clone(), hold_namespace(pid, "net")) else {
            return;
        };
        // With process events the watch holds no mount namespace: this one does, for
        // the same reason.
        let mut keep = vec![net];
        if self.sandboxes.proc_events.is_some() {
            keep.extend(hold_namespace(pid, "mnt"));
        }
        if let Err(e) = self.sandboxes.exits.watch_keeping(pidfd, keep, || ()) {
            log::warn(&format!("hold the namespaces of init {pid}: {e}"));
        }
    }
}
