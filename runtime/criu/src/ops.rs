//! The calls: a dump, a restore, and the lazy-pages server of a lazy restore.

use super::*;

impl Criu {
    /// Dumps a process tree. `post_dump` runs while the tree is still frozen, after its
    /// state is written; if it fails the dump fails (and the tree is resumed).
    pub fn dump(
        &self,
        opts: &DumpOpts,
        post_dump: &mut dyn FnMut() -> Result<(), String>,
    ) -> Result<DumpReport, CriuError> {
        let start = Instant::now();
        let images = open_dir(&opts.images_dir)?;
        let mut o = base_opts(&images, &opts.log_file, self.log_level);
        o.set_pid(opts.pid);
        o.set_root(opts.root.display().to_string());
        o.set_leave_running(opts.leave_running);
        o.set_notify_scripts(true);
        // Without a yard a dump mounts every cgroup hierarchy to read the tree's cgroups,
        // and its cgroup2 mount clears `favordynmods` machine-wide (see forkd_cgroups).
        if let Some(yard) = self.cgroup_yard() {
            o.set_cgroup_yard(yard.display().to_string());
        }
        if opts.external_net {
            let ns = format!("/proc/{}/ns/net", opts.pid);
            let ino = std::fs::metadata(&ns)
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                .map_err(|e| CriuError::Io {
                    step: "read the tree's network namespace",
                    source: std::io::Error::new(e.kind(), format!("{ns}: {e}")),
                })?;
            o.external.push(format!("net[{ino}]:{NETNS_KEY}"));
        }
        for (mountpoint, key) in &opts.external_mounts {
            let mut m = rpc::Ext_mount_map::new();
            m.set_key(mountpoint.clone());
            m.set_val(key.clone());
            o.ext_mnt.push(m);
        }
        if let Some(cg) = &opts.freeze_cgroup {
            o.set_freeze_cgroup(cg.display().to_string());
        }
        let log = opts.images_dir.join(&opts.log_file);
        let mut hook = Duration::ZERO;
        let mut hook_error = None;
        let resp = self.call(
            rpc::Criu_req_type::DUMP,
            &log,
            o,
            &Child::default(),
            &mut |script| {
                if script == "post-dump" {
                    let t = Instant::now();
                    let r = post_dump();
                    hook = t.elapsed();
                    if let Err(e) = r {
                        hook_error = Some(e);
                        return false;
                    }
                }
                true
            },
        );
        if let Some(e) = hook_error {
            return Err(CriuError::Failed {
                action: "dump",
                message: format!("post-dump step: {e}"),
                log,
                tail: String::new(),
            });
        }
        check(resp?, "dump", &log)?;
        Ok(DumpReport {
            duration: start.elapsed(),
            hook,
        })
    }

    /// Restores a dumped tree into the root `opts.root`, in new namespaces.
    pub fn restore(&self, opts: &RestoreOpts) -> Result<RestoreReport, CriuError> {
        let start = Instant::now();
        let work = open_dir(&opts.work_dir)?;
        let images = open_dir(&opts.images_dir)?;
        let mut o = base_opts(&images, &opts.log_file, self.log_level);
        o.set_root(opts.root.display().to_string());
        o.set_rst_sibling(true);
        o.set_work_dir_fd(work.as_raw_fd());
        o.set_lazy_pages(opts.lazy_pages);
        // CRIU's older mount engine: it gives the restored namespace its root with one
        // `pivot_root`, where the newer one (made for trees with shared and slave mounts)
        // first pivots into an empty namespace of its own and then again into the root.
        // Each `pivot_root` walks every task on the host (see docs/DESIGN.md, "Many
        // sandboxes"). A sandbox's mounts are all private and it cannot make others (it
        // has no CAP_SYS_ADMIN), so the older engine restores every tree forkd dumps.
        o.set_mntns_compat_mode(true);
        // Soft mode with the branch's own cgroups as roots: the tree lands in them, and
        // threads whose cgroup sets CRIU recorded apart from their process's (it does so
        // inside a cgroup namespace) are placed there too; in "ignore" mode CRIU cannot
        // move such threads on cgroup v1.
        o.set_manage_cgroups(true);
        o.set_manage_cgroups_mode(rpc::Criu_cg_mode::SOFT);
        if let Some(yard) = self.cgroup_yard() {
            o.set_cgroup_yard(yard.display().to_string());
        }
        for (key, source) in &opts.external_mounts {
            let mut m = rpc::Ext_mount_map::new();
            m.set_key(key.clone());
            m.set_val(source.display().to_string());
            o.ext_mnt.push(m);
        }
        for (ctrl, path) in &opts.cgroup_roots {
            let mut r = rpc::Cgroup_root::new();
            if !ctrl.is_empty() {
                r.set_ctrl(ctrl.clone());
            }
            r.set_path(path.clone());
            o.cg_root.push(r);
        }
        let log = opts.work_dir.join(&opts.log_file);
        // Images whose network namespace is external take this one; others ignore it.
        let mut fd = rpc::Inherit_fd::new();
        fd.set_key(NETNS_KEY.to_string());
        fd.set_fd(NETNS_FD);
        o.inherit_fd.push(fd);
        let child = Child {
            join_cgroup_procs: &opts.join_cgroup_procs,
            netns_fd: Some(NETNS_FD),
            netns: opts.netns.as_deref(),
            root_mount: opts.root_mount.as_deref().map(|m| (m, opts.root.as_path())),
            mergeable: opts.mergeable,
            on_base: true,
            template: opts.template.as_deref(),
        };
        let resp = self.call(rpc::Criu_req_type::RESTORE, &log, o, &child, &mut |_| true)?;
        let resp = check(resp, "restore", &log)?;
        let pid = resp.restore.as_ref().map(|r| r.pid()).unwrap_or(0);
        if pid <= 0 {
            return Err(CriuError::Rpc("restore reported no pid".into()));
        }
        Ok(RestoreReport {
            pid,
            duration: start.elapsed(),
        })
    }

    /// Starts `criu lazy-pages` serving the pages of `images_dir` to one lazy restore
    /// that uses the same `work_dir`. Returns once its socket is ready.
    pub fn start_lazy_pages(
        &self,
        images_dir: &Path,
        work_dir: &Path,
    ) -> Result<std::process::Child, CriuError> {
        let log = work_dir.join("lazy-pages.log");
        let child = self
            .command()?
            .arg("lazy-pages")
            .arg("--images-dir")
            .arg(images_dir)
            .arg("--work-dir")
            .arg(work_dir)
            .arg("--log-file")
            .arg("lazy-pages.log")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io("start criu lazy-pages"))?;
        let sock = work_dir.join("lazy-pages.socket");
        let t = Instant::now();
        while !sock.exists() {
            if t.elapsed() > Duration::from_secs(10) {
                return Err(CriuError::Failed {
                    action: "lazy-pages",
                    message: "its socket did not appear within 10 s".into(),
                    tail: log_tail(&log),
                    log,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(child)
    }
}
