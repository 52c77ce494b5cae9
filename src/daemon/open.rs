//! The daemon's start: the state root locked, the volume, stores and CRIU opened, the
//! kernel's settings raised, and the sandboxes and checkpoints an earlier daemon left
//! recovered.

use super::*;

impl Daemon {
    /// Opens (creating if needed) the state root and recovers sandboxes left by a
    /// previous daemon.
    pub fn open(
        cfg: &DaemonConfig,
        runtime: tokio::runtime::Handle,
    ) -> anyhow::Result<Arc<Daemon>> {
        use anyhow::Context;
        let config = config::Config::from_env()?;
        if !nix::unistd::Uid::effective().is_root() {
            anyhow::bail!(
                "forkd daemon must run as root (it creates namespaces, mounts and cgroups)"
            );
        }
        std::fs::create_dir_all(&cfg.root)
            .with_context(|| format!("create {}", cfg.root.display()))?;
        std::fs::set_permissions(&cfg.root, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("chmod {}", cfg.root.display()))?;
        let lock_path = cfg.root.join("daemon.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("open {}", lock_path.display()))?;
        let lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|_| {
                anyhow::anyhow!(
                    "another forkd daemon is already using {} (lock {})",
                    cfg.root.display(),
                    lock_path.display()
                )
            })?;

        // Inits are reparented to us when their set-up helper exits; we reap them.
        nix::sys::prctl::set_child_subreaper(true).context("become a child subreaper")?;
        // Out of the OOM killer's way, as container daemons keep themselves; where that
        // needs a capability this machine withholds (CAP_SYS_RESOURCE), the sandboxes'
        // processes are raised instead (forkd_sandbox::setup::OOM_SCORE_ADJ) all the same.
        match std::fs::write("/proc/self/oom_score_adj", "-999") {
            Ok(()) => log::info("oom_score_adj -999"),
            Err(e) => log::info(&format!(
                "oom_score_adj left as it is ({e}); sandboxes' processes run at +{}",
                forkd_sandbox::setup::OOM_SCORE_ADJ
            )),
        }
        // Programs no setting names are looked for on the daemon's PATH first.
        forkd_sys::set_program_dirs(config.path.clone());
        let features = features::Features::probe(config.overlay_lowers);
        let volume = forkd_volume::Volume::open(&cfg.root, &config.volume)
            .context("open the data volume")?;
        let data = volume.path().to_path_buf();
        match volume.tune() {
            Ok(done) if !done.is_empty() => log::info(&format!("volume: {}", done.join("; "))),
            Ok(_) => {}
            Err(e) => log::warn(&format!(
                "volume left untuned (checkpoints after large writes will be slower): {e}"
            )),
        }
        let unbacked = match volume.ensure_backed() {
            Ok(done) => {
                for d in done {
                    log::info(&format!("volume: {d}"));
                }
                None
            }
            Err(e) => {
                log::warn(&format!("volume: {e}"));
                Some(e.to_string())
            }
        };
        check_volume_size(&volume);
        // Simple quotas set a feature flag that kernels before 6.7 cannot mount: on a
        // volume that is the host's own btrfs only when the operator says so.
        let disk_quotas = if volume.loop_image().is_none() && !config.disk_quotas_on_host {
            Err(format!(
                "disk limits on {}, the host's own btrfs, need FORKD_DISK_QUOTAS=on (btrfs simple quotas set a feature flag that kernels before 6.7 cannot mount)",
                volume.path().display()
            ))
        } else {
            volume.enable_quotas()
        };
        match &disk_quotas {
            Ok(()) => log::info("disk limits: btrfs simple quotas"),
            Err(e) => log::info(&format!("{e}: a sandbox with a disk limit is refused")),
        }
        log::info(&format!(
            "overlay lower layers: {} (Linux {})",
            match features.lower_mode {
                forkd_sys::mount::LowerMode::Append => "lowerdir+".to_string(),
                forkd_sys::mount::LowerMode::Links => format!(
                    "as links, this kernel has no lowerdir+ (at most {} a stack)",
                    forkd_sys::lowerdir::MAX_LINKED_LOWERS
                ),
            },
            features.kernel
        ));
        for sub in ["sandboxes", "runtime", "checkpoints", "logs"] {
            let d = data.join(sub);
            std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
        }
        let layers = LayerStore::open(&data.join("layers")).context("open layer store")?;
        let images = ImageStore::open(&data.join("images")).context("open image store")?;
        let bases = bases::Bases::open(data.join("bases"), &volume)
            .map_err(|e| anyhow::anyhow!("open the bases: {e}"))?;
        let exe = std::fs::read_link("/proc/self/exe").context("find own executable")?;
        let init = init_program(&exe, config.init.as_deref())?;
        let runtime_layer = ensure_runtime_layer(&data, &layers, &init)?;
        let setup_exe = layers.path(&runtime_layer).join(".forkd/init");
        let (sysfs, sysfs_netns) = {
            let dir = cfg.root.join("sysfs");
            match forkd_sys::mount_quiet_sysfs(&dir) {
                Ok(ns) => (Some(dir), Some(ns)),
                Err(e) => {
                    log::warn(&format!(
                        "every sandbox mounts a sysfs of its own (slower with many alive): mount {}: {e}",
                        dir.display()
                    ));
                    (None, None)
                }
            }
        };
        let empty_mntns = {
            let dir = cfg.root.join("empty-root");
            forkd_sys::mount::empty_namespace(&dir).with_context(|| {
                format!(
                    "make the empty mount namespace that sandboxes start from (on {})",
                    dir.display()
                )
            })?
        };
        let criu = forkd_criu::Criu::locate(None, &config.criu)
            .map(|mut c| {
                // Without it CRIU works, just some 40 ms slower per call.
                if let Err(e) = c.use_private_run(&cfg.root.join("criu-run")) {
                    log::warn(&format!("CRIU will probe the kernel on every call: {e}"));
                }
                // Restores give the namespace its root without `pivot_root`, which walks
                // every task on the host (docs/DESIGN.md, "What still grows");
                // FORKD_CRIU_ROOT=pivot leaves it to CRIU's own.
                if !config.criu_pivot_root {
                    let dir = cfg.root.join("criu-base");
                    match forkd_sys::mount::base_namespace(&dir) {
                        Ok(base) => c.use_root_base(base),
                        Err(e) => log::warn(&format!(
                            "restores pivot: make the namespace CRIU runs on ({}): {e}",
                            dir.display()
                        )),
                    }
                }
                c
            })
            .map_err(|e| e.to_string());
        if criu.is_ok() && forkd_sys::probe::random_ready().ok() == Some(false) {
            log::warn(
                "the kernel's random pool is not ready yet: each CRIU run waits for it (3-4 s \
                 a checkpoint or restore) until it is; a virtual machine needs RDRAND or \
                 virtio-rng (forkd doctor: random)",
            );
        }
        match &criu {
            Err(e) => log::warn(&format!("live checkpoints are unavailable: {e}")),
            // The private /run starts empty: probe the kernel now, off the request path,
            // rather than in the first dump or restore (about 40 ms).
            Ok(c) if c.run_dir().is_some() => {
                let c = c.clone();
                std::thread::Builder::new()
                    .name("criu-kdat".into())
                    .spawn(move || {
                        if let Err(e) = c.cache_kernel_facts() {
                            log::warn(&format!("CRIU's kernel facts not cached ahead: {e}"));
                        }
                    })
                    .context("start the CRIU kernel-facts thread")?;
            }
            Ok(_) => {}
        }
        let hierarchy = Hierarchy::detect().context("detect cgroups")?;
        let activity = Arc::new(quiet::Activity::default());
        let spare_netns = spare_netns::SpareNetns::start(config.spare_netns, activity.clone())?;
        let spare_layers = spare_layers::SpareLayers::start(
            data.join("spare-layers"),
            config.spare_layers,
            activity.clone(),
        )?;
        let templates = Arc::new(templates::Templates::new(
            data.join("logs"),
            config.templates,
            config.template_budget,
        ));
        raise_pid_max();
        // The table's name comes from the data directory, so that daemons on one host
        // (one per state root) never share rules.
        let tag = {
            use sha2::Digest;
            let h = sha2::Sha256::digest(data.as_os_str().as_encoded_bytes());
            h.iter()
                .take(4)
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        let mut cgroups = forkd_cgroups::Pool::new(&hierarchy, "forkd", &tag, config.cgroup_pool);
        bound_sandboxes_memory(&hierarchy, config.sandboxes_memory)?;
        if let config::MemoryCgroups::Limited { said: asked } = config.memory_cgroups {
            cgroups = cgroups.sharing_memory();
            match cgroups.shared_memory_for(&forkd_cgroups::Limits::default()) {
                Some(shared) => log::info(&format!(
                    "cgroup: sandboxes without a memory limit share the memory cgroup {shared}"
                )),
                None if asked => log::warn(
                    "cgroup: FORKD_MEMCG=limited needs cgroup v1; every sandbox has a memory cgroup of its own",
                ),
                None => {}
            }
        }
        let swept = cgroups.sweep();
        if swept > 0 {
            log::info(&format!(
                "cgroup: removed {swept} free cgroups an earlier daemon kept"
            ));
        }
        let nft = forkd_net::locate_nft(
            config.nft.as_deref(),
            criu.as_ref().ok().map(|c| c.path.as_path()),
        );
        let egress = forkd_net::Egress::new(config.egress_pool, &tag, nft);
        let sharing = sharing::Sharing::new(config.ksm.clone(), features.memory_merge.clone())?;
        // The socket's directory (/run/forkd by default) is gone after every boot; the
        // grants' directory sits beside the socket.
        if let Some(parent) = cfg.socket.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("create {}", parent.display()))?;
        }
        let grant_dir = {
            let mut p = cfg.socket.clone().into_os_string();
            p.push(".grants");
            PathBuf::from(p)
        };
        let grants = grants::Grants::open(grant_dir).context("prepare the grant directory")?;
        let daemon = Arc::new(Daemon {
            node: services::Node {
                root: cfg.root.clone(),
                data,
                volume,
                disk_quotas,
                volume_watch: health::Watch {
                    unbacked: Mutex::new(unbacked),
                    ..Default::default()
                },
                metrics: metrics::Metrics::default(),
                keys: forkd_keys::Keys::at(&cfg.root),
                audit: super::server::audit::Audit::new(&cfg.root, config.listen.audit_max_bytes),
                favor_dynmods: config.cgroup_favor_dynmods,
                favor_dynmods_failed: std::sync::atomic::AtomicBool::new(false),
                _lock: lock,
                next_request: AtomicU64::new(1),
                activity,
            },
            images: services::Images {
                layers,
                store: images,
                bases,
                runtime_layer,
                store_lock: std::sync::RwLock::new(()),
                pulls: pull::Pulls::new(config.pull_parallel),
                builds: build::Builds::default(),
                spare_layers,
            },
            sandboxes: services::Sandboxes {
                table: Mutex::new(table::SandboxTable::default()),
                hierarchy,
                cgroups,
                exits: forkd_sys::exits::ExitWatcher::start("init-exits")
                    .context("start the watcher of init exits")?,
                proc_events: open_proc_events(features.proc_events_filter),
                egress,
                leases: Mutex::new(HashMap::new()),
                spare_netns,
                sysfs,
                _sysfs_netns: sysfs_netns,
                empty_mntns,
                setup_exe,
                grants,
            },
            checkpoints: services::Checkpoints {
                table: Mutex::new(HashMap::new()),
                criu,
                templates,
                sharing,
            },
            e2b: super::e2b::E2b::new(&config),
            config,
            features,
            runtime,
        });
        daemon
            .watch_volume()
            .context("start the volume's watcher")?;
        daemon.watch_expiry().context("start the expiry watcher")?;
        daemon.keep_migrations_cheap();
        if daemon.node.favor_dynmods {
            // Another program's mount of cgroup2 clears the flag; set it again within a
            // second, off the request path (setting it waits for an RCU grace period).
            let weak = Arc::downgrade(&daemon);
            std::thread::Builder::new()
                .name("favordynmods".into())
                .spawn(move || loop {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                    match weak.upgrade() {
                        Some(d) => d.keep_migrations_cheap(),
                        None => break,
                    }
                })
                .context("start the favordynmods watcher")?;
        }
        daemon.recover_resumes();
        daemon.sweep_build_contexts();
        daemon
            .recover()
            .map_err(|e| anyhow::anyhow!("recover sandboxes: {e}"))?;
        daemon.restore_disk_limits();
        daemon
            .recover_checkpoints()
            .map_err(|e| anyhow::anyhow!("recover checkpoints: {e}"))?;
        Ok(daemon)
    }
}

/// The host's process events for inits' exits, or `None` (said in the log) where the
/// kernel's connector cannot be had: outside the host's pid or network namespace, or
/// without `CAP_NET_ADMIN`.
fn open_proc_events(filter: bool) -> Option<forkd_sys::proc_events::ProcEvents> {
    match forkd_sys::proc_events::ProcEvents::open("proc-events", filter) {
        Ok(p) => Some(p),
        Err(e) => {
            log::warn(&format!(
                "the kernel's process events cannot be had ({e}): each sandbox's init is \
                 watched through a descriptor of its own, and RLIMIT_NOFILE bounds how many \
                 sandboxes may run"
            ));
            None
        }
    }
}

/// Raises `kernel.pid_max` to what the host's memory can carry where it is lower (every
/// branch takes two pids or more), and says so; says why not where it cannot.
fn raise_pid_max() {
    let host = match forkd_sys::ceilings::Host::read() {
        Ok(h) => h,
        Err(e) => return log::warn(&format!("read the host's ceilings: {e}")),
    };
    match forkd_sys::ceilings::raise_pid_max(&host) {
        Ok(Some((before, after))) => log::info(&format!(
            "kernel.pid_max raised from {before} to {after} (what {} MiB of memory can carry): \
             every sandbox takes two pids or more",
            host.mem_total >> 20
        )),
        Ok(None) => {}
        Err(e) => log::warn(&format!(
            "kernel.pid_max is {} and could not be raised to {}: {e}; it bounds how many \
             sandboxes may run",
            host.pid_max,
            host.pid_max_for_memory()
        )),
    }
}
