//! Doctor checks of what the kernel and the machine offer.

use super::*;

// ---------------------------------------------------------------------------------------
// root

/// Capabilities forkd uses even as root, with what goes wrong without each.
pub(super) const CAPABILITIES: &[(u32, &str, &str)] = &[
    (21, "CAP_SYS_ADMIN", "no namespaces or mounts"),
    (19, "CAP_SYS_PTRACE", "CRIU cannot dump"),
    (12, "CAP_NET_ADMIN", "no sandbox networking"),
    (
        24,
        "CAP_SYS_RESOURCE",
        "rlimits cannot be raised above their hard limits",
    ),
];

pub(super) fn check_root() -> Check {
    const NAME: &str = "root";
    let euid = nix::unistd::geteuid();
    if !euid.is_root() {
        return Check::not_ok(NAME, true, format!("euid {euid}: forkd needs root"));
    }
    let status_path = "/proc/self/status";
    let effective = match fs::read_to_string(status_path) {
        Ok(text) => parse_cap_eff(&text),
        Err(e) => return Check::not_ok(NAME, true, format!("euid 0, but {status_path}: {e}")),
    };
    let Some(effective) = effective else {
        return Check::not_ok(
            NAME,
            true,
            format!("euid 0, but no CapEff line in {status_path}"),
        );
    };
    let missing: Vec<_> = CAPABILITIES
        .iter()
        .filter(|(bit, _, _)| effective & (1u64 << bit) == 0)
        .collect();
    if missing.is_empty() {
        return Check::ok(NAME, true, "euid 0");
    }
    let list = missing
        .iter()
        .map(|(_, name, effect)| format!("{name} ({effect})"))
        .collect::<Vec<_>>()
        .join(", ");
    let detail = format!("euid 0, but missing {list}");
    if missing.iter().any(|(bit, _, _)| *bit == 21) {
        Check::not_ok(NAME, true, detail)
    } else {
        Check::new(NAME, Status::Warn, true, detail)
    }
}

/// The effective capability mask from the text of `/proc/<pid>/status`.
pub(super) fn parse_cap_eff(status: &str) -> Option<u64> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

// ---------------------------------------------------------------------------------------
// namespaces

/// (name in `/proc/self/ns`, `max_*_namespaces` sysctl, clone flag, required).
pub(super) const NAMESPACES: &[(&str, &str, libc::c_int, bool)] = &[
    ("mnt", "max_mnt_namespaces", libc::CLONE_NEWNS, true),
    ("uts", "max_uts_namespaces", libc::CLONE_NEWUTS, true),
    ("ipc", "max_ipc_namespaces", libc::CLONE_NEWIPC, true),
    ("net", "max_net_namespaces", libc::CLONE_NEWNET, true),
    ("pid", "max_pid_namespaces", libc::CLONE_NEWPID, true),
    (
        "cgroup",
        "max_cgroup_namespaces",
        libc::CLONE_NEWCGROUP,
        true,
    ),
    ("user", "max_user_namespaces", libc::CLONE_NEWUSER, false),
    ("time", "max_time_namespaces", libc::CLONE_NEWTIME, false),
];

pub(super) fn check_namespaces() -> Check {
    const NAME: &str = "namespaces";
    let mut problems = Vec::new();
    let mut optional_missing = Vec::new();
    let mut present = Vec::new();
    for &(ns, sysctl, _, required) in NAMESPACES {
        let problem = namespace_problem(ns, sysctl);
        match (problem, required) {
            (None, _) => present.push(ns),
            (Some(p), true) => problems.push(p),
            (Some(p), false) => optional_missing.push(p),
        }
    }
    if !problems.is_empty() {
        return Check::not_ok(NAME, true, problems.join("; "));
    }
    let flags = NAMESPACES
        .iter()
        .filter(|n| n.3)
        .fold(0, |acc, n| acc | n.2);
    if let Err(e) = try_unshare(flags) {
        return Check::not_ok(
            NAME,
            true,
            format!("unshare of mnt uts ipc net pid cgroup: {e}"),
        );
    }
    if let Err(e) = probe_empty_namespace() {
        return Check::not_ok(
            NAME,
            true,
            format!("the empty mount namespace sandboxes start from: {e:#}"),
        );
    }
    let mut detail = format!(
        "{}; unshare works; the empty mount namespace sandboxes start from can be made",
        present.join(" ")
    );
    if optional_missing.is_empty() {
        Check::ok(NAME, true, detail)
    } else {
        detail.push_str(&format!("; optional: {}", optional_missing.join("; ")));
        Check::new(NAME, Status::Warn, true, detail)
    }
}

/// Makes the mount namespace every sandbox's is copied from, as the daemon does at start
/// (`forkd_sys::mount::empty_namespace`), and checks that it holds one mount.
pub(super) fn probe_empty_namespace() -> anyhow::Result<()> {
    use anyhow::Context;
    let dir = std::env::temp_dir().join(format!("forkd-doctor-empty-{}", std::process::id()));
    let made = forkd_sys::mount::empty_namespace(&dir);
    let _ = fs::remove_dir(&dir);
    let ns = made.with_context(|| format!("make it on {}", dir.display()))?;
    match forkd_sys::mount::namespace_mounts(std::os::fd::AsFd::as_fd(&ns)) {
        Ok(1) => Ok(()),
        Ok(n) => anyhow::bail!("it holds {n} mounts, not one"),
        // Kernels before 6.12 cannot count a namespace's mounts; it was made.
        Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => Ok(()),
        Err(e) => Err(e).context("count its mounts"),
    }
}

/// Why namespace `ns` cannot be used, if it cannot.
pub(super) fn namespace_problem(ns: &str, sysctl: &str) -> Option<String> {
    let file = Path::new("/proc/self/ns").join(ns);
    if !file.exists() {
        return Some(format!("{} missing", file.display()));
    }
    let limit = Path::new("/proc/sys/user").join(sysctl);
    match fs::read_to_string(&limit) {
        Ok(text) if text.trim() == "0" => Some(format!("{ns} disabled ({} is 0)", limit.display())),
        Ok(_) => None,
        // An older kernel without the limit does not restrict the namespace.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(format!("{}: {e}", limit.display())),
    }
}

/// Creates the namespaces in `flags` in a child that exits at once (see
/// `forkd_sys::probe_unshare`). Proves more than the `/proc/self/ns` files do.
pub(super) fn try_unshare(flags: libc::c_int) -> anyhow::Result<()> {
    forkd_sys::probe_unshare(flags, COMMAND_TIMEOUT).map_err(anyhow::Error::from)
}

// ---------------------------------------------------------------------------------------
// overlayfs

pub(super) fn check_overlayfs() -> Check {
    const NAME: &str = "overlayfs";
    // The probe first: on a stock system overlay is a module the kernel loads at the
    // first mount, so /proc/filesystems lacks it until then, and the daemon's own mounts
    // load it the same way.
    match overlay_probe() {
        Ok(how) => Check::ok(
            NAME,
            true,
            format!("mount as the daemon does, write to upper ({how})"),
        ),
        Err(e) => {
            let filesystems = "/proc/filesystems";
            let listed = fs::read_to_string(filesystems)
                .map(|text| has_filesystem(&text, "overlay"))
                .unwrap_or(false);
            let why = if listed {
                String::new()
            } else {
                format!(" (no overlay in {filesystems}, and the kernel did not load it)")
            };
            Check::not_ok(NAME, true, format!("{e:#}{why}"))
        }
    }
}

/// Whether the text of `/proc/filesystems` lists `fs` (lines are `[nodev]\t<name>`).
pub(super) fn has_filesystem(text: &str, fs: &str) -> bool {
    text.lines()
        .any(|l| l.split_whitespace().last() == Some(fs))
}

/// A fresh directory under /tmp, removed again on drop.
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn new(prefix: &str) -> anyhow::Result<Self> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            nanos.unwrap_or(0)
        ));
        fs::create_dir(&path).with_context(|| format!("create {}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Builds an overlay exactly as the daemon builds a sandbox's root (the same code:
/// `forkd_sys::mount::overlay`, a detached mount with one `lowerdir+` per layer, or on
/// kernels without it the layers as one-byte links: `forkd_sys::lowerdir`), checks
/// that a lower file shows through and that a write through it lands in the upper
/// directory. The mount is detached, so it is in no mount table and goes with its
/// descriptor.
pub(super) fn overlay_probe() -> anyhow::Result<String> {
    let tmp = TempDir::new("forkd-doctor")?;
    let [lower, upper, work] = ["lower", "upper", "work"].map(|d| tmp.0.join(d));
    for dir in [&lower, &upper, &work] {
        fs::create_dir(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let lower_file = lower.join("from-lower");
    fs::write(&lower_file, b"lower\n")
        .with_context(|| format!("write {}", lower_file.display()))?;
    let mnt = forkd_sys::mount::overlay(&[&lower], Some((&upper, &work)))
        .map_err(|e| anyhow::anyhow!("{}", error_chain(&e)))?;
    let merged = forkd_sys::mount::fd_path(std::os::fd::AsFd::as_fd(&mnt));
    let seen = merged.join("from-lower");
    let text = fs::read_to_string(&seen).with_context(|| format!("read {}", seen.display()))?;
    if text != "lower\n" {
        bail!("the overlay does not show the lower file's content");
    }
    let probe = merged.join("probe");
    fs::write(&probe, b"forkd\n").context("write through the overlay")?;
    drop(mnt);
    let landed = upper.join("probe");
    match fs::read(&landed) {
        Ok(bytes) if bytes == b"forkd\n" => {}
        Ok(_) => bail!(
            "{} has the wrong content after a write through the overlay",
            landed.display()
        ),
        Err(e) => bail!(
            "a write through the overlay did not reach {}: {e}",
            landed.display()
        ),
    }
    if lower.join("probe").exists() {
        bail!(
            "a write through the overlay reached the lower directory {}",
            lower.display()
        );
    }
    let how = match forkd_sys::mount::lower_mode() {
        forkd_sys::mount::LowerMode::Append => "lowerdir+ (any depth)".to_string(),
        forkd_sys::mount::LowerMode::Links => format!(
            "layers as links, no lowerdir+ (at most {} layers)",
            forkd_sys::lowerdir::MAX_LINKED_LOWERS
        ),
    };
    Ok(format!(
        "{how} on Linux {}, under {}",
        forkd_sys::mount::kernel_release(),
        tmp.0.parent().unwrap_or(Path::new("/")).display()
    ))
}

/// An error and its sources on one line.
pub(super) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        text.push_str(": ");
        text.push_str(&s.to_string());
        cur = s.source();
    }
    text
}

// ---------------------------------------------------------------------------------------
// cgroups

pub(super) fn check_cgroups() -> Check {
    const NAME: &str = "cgroups";
    let hierarchy = match forkd_cgroups::Hierarchy::detect() {
        Ok(h) => h,
        Err(e) => return Check::not_ok(NAME, true, e.to_string()),
    };
    let version = hierarchy.version();
    let controllers = hierarchy.controllers();
    let has = |c: &str| controllers.iter().any(|x| x == c);
    let mut detail = format!("v{version}: {}", controllers.join(" "));
    let missing_required: Vec<_> = ["memory", "pids"].into_iter().filter(|c| !has(c)).collect();
    if !missing_required.is_empty() {
        detail.push_str(&format!(
            "; missing {} (limits need them)",
            missing_required.join(" ")
        ));
        return Check::not_ok(NAME, true, detail);
    }
    let mut warnings = Vec::new();
    if !has("cpu") {
        warnings.push("no cpu controller: CPU limits are not applied");
    }
    if version == 1 {
        if has("freezer") {
            detail.push_str("; freezer present (live checkpoints need it on v1)");
        } else {
            warnings.push("no freezer controller: live checkpoints need it on cgroup v1");
        }
    }
    let cgroup2 = forkd_sys::mountinfo::mounts()
        .unwrap_or_default()
        .into_iter()
        .find(|m| m.fstype == "cgroup2");
    match cgroup2 {
        Some(m) if m.super_options.split(',').any(|o| o == "favordynmods") => {
            detail.push_str(&format!(
                "; favordynmods on {} (cheap migrations)",
                m.mount_point.display()
            ))
        }
        // The kernel has no such option (see the favordynmods row below).
        Some(_) if forkd_sys::probe::cgroup_favordynmods() == Some(false) => {}
        Some(m) => detail.push_str(&format!(
            "; favordynmods off on {} (the daemon sets it unless FORKD_CGROUP_FAVOR_DYNMODS=0)",
            m.mount_point.display()
        )),
        None => {}
    }
    if warnings.is_empty() {
        Check::ok(NAME, true, detail)
    } else {
        detail.push_str(&format!("; {}", warnings.join("; ")));
        Check::new(NAME, Status::Warn, true, detail)
    }
}

// ---------------------------------------------------------------------------------------
// pidfd and userfaultfd

/// The data volume is btrfs (O(1) snapshots of sandbox layers): the kernel must know
/// btrfs and mkfs.btrfs must exist to format the volume image.
pub(super) fn check_btrfs() -> Check {
    const NAME: &str = "btrfs";
    let known = std::fs::read_to_string("/proc/filesystems")
        .map(|t| {
            t.lines()
                .any(|l| l.split_whitespace().last() == Some("btrfs"))
        })
        .unwrap_or(false);
    if !known {
        return Check::not_ok(
            NAME,
            true,
            "btrfs is not in /proc/filesystems (the data volume needs it)".to_string(),
        );
    }
    match forkd_volume::require_tools() {
        Ok(()) => Check::ok(
            NAME,
            true,
            "kernel support and mkfs.btrfs present (data volume, O(1) snapshots)",
        ),
        Err(e) => Check::not_ok(NAME, true, format!("{e}")),
    }
}

/// The data volume of the state root (`FORKD_ROOT`, default `/var/lib/forkd`), if there
/// is one: writable, without device errors, and how full. Read-only and errors fail the
/// check (no sandbox can be made there); a volume not made yet is fine.
pub(super) fn check_volume() -> Check {
    const NAME: &str = "volume";
    let root = crate::api::defaults::root();
    let mounted = root.join("vol");
    let path = if forkd_volume::mountinfo::mount_at(&mounted)
        .ok()
        .flatten()
        .is_some()
    {
        mounted
    } else if forkd_sys::btrfs::is_btrfs(&root).unwrap_or(false) {
        root.clone()
    } else {
        return Check::ok(
            NAME,
            false,
            format!(
                "no volume at {} yet (the daemon makes it at its first start)",
                root.display()
            ),
        );
    };
    let vfs = match nix::sys::statvfs::statvfs(&path) {
        Ok(v) => v,
        Err(e) => return Check::not_ok(NAME, true, format!("statfs {}: {e}", path.display())),
    };
    if vfs.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY) {
        return Check::not_ok(
            NAME,
            true,
            format!(
                "{} is read-only (btrfs stops writing after an I/O error: see the kernel log); stop the daemon, unmount it and run `btrfs check` on its image",
                path.display()
            ),
        );
    }
    if let Some(errors) = forkd_volume::device_errors(&path).filter(|e| !e.is_empty()) {
        return Check::not_ok(
            NAME,
            true,
            format!("{}: device errors: {errors}", path.display()),
        );
    }
    let frsize = vfs.fragment_size();
    Check::ok(
        NAME,
        true,
        format!(
            "{}: writable, {} MiB free of {} MiB",
            path.display(),
            (vfs.blocks_available() * frsize) >> 20,
            (vfs.blocks() * frsize) >> 20
        ),
    )
}

pub(super) fn check_pidfd() -> Check {
    const NAME: &str = "pidfd";
    if let Err(e) = forkd_sys::pidfd_open(std::process::id() as libc::pid_t) {
        return Check::not_ok(
            NAME,
            true,
            format!("pidfd_open on self: {e} (needs Linux >= 5.3)"),
        );
    }
    Check::ok(NAME, true, "pidfd_open works")
}

pub(super) fn check_random() -> Check {
    const NAME: &str = "random";
    match forkd_sys::probe::random_ready() {
        Ok(true) => Check::ok(NAME, false, "the kernel's random pool is ready"),
        Ok(false) => Check::new(
            NAME,
            Status::Warn,
            false,
            "the kernel's random pool is not ready yet (getrandom would block): CRIU waits \
             up to 1 s for each id it draws, 3-4 s a checkpoint or restore, until it is; \
             a virtual machine needs RDRAND or a virtio-rng device (dmesg says \
             'crng init done' once ready)",
        ),
        Err(e) => Check::new(NAME, Status::Warn, false, format!("getrandom: {e}")),
    }
}

pub(super) fn check_userfaultfd() -> Check {
    const NAME: &str = "userfaultfd";
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let e = match forkd_sys::userfaultfd(flags) {
        Ok(_) => return Check::ok(NAME, false, "userfaultfd works (lazy restore possible)"),
        Err(e) => e,
    };
    // CRIU falls back to the device (Linux >= 6.1) when the syscall is not allowed.
    let device = "/dev/userfaultfd";
    let device_error = match fs::OpenOptions::new().read(true).write(true).open(device) {
        Ok(_) => {
            let detail = format!("userfaultfd(2): {e}, but {device} opens read-write");
            return Check::ok(NAME, false, detail);
        }
        Err(dev_e) if dev_e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(dev_e) => format!("; {device}: {dev_e}"),
    };
    let sysctl = Path::new("/proc/sys/vm/unprivileged_userfaultfd");
    let kernel = if sysctl.exists() {
        ""
    } else {
        "; kernel lacks CONFIG_USERFAULTFD"
    };
    Check::not_ok(
        NAME,
        false,
        format!("userfaultfd(2): {e}{device_error}{kernel}; lazy restore unavailable"),
    )
}

pub(super) fn check_kvm() -> Check {
    const NAME: &str = "kvm";
    const NOTE: &str = "checkpointable guests use TCG; KVM is not used";
    let dev = "/dev/kvm";
    match fs::OpenOptions::new().read(true).write(true).open(dev) {
        Ok(_) => Check::ok(NAME, false, format!("{dev} opens read-write ({NOTE})")),
        Err(e) => Check::not_ok(NAME, false, format!("{dev}: {e} ({NOTE})")),
    }
}

pub(super) fn check_kernel() -> Check {
    const NAME: &str = "kernel";
    let path = "/proc/sys/kernel/osrelease";
    match fs::read_to_string(path) {
        Ok(release) => Check::ok(
            NAME,
            false,
            format!("Linux {} {}", release.trim(), std::env::consts::ARCH),
        ),
        Err(e) => Check::new(NAME, Status::Warn, false, format!("{path}: {e}")),
    }
}

/// The host's ceilings on how many sandboxes may run (`forkd_sys::ceilings`), and how
/// many more of two tasks each fit: information, a warning below a thousand.
pub(super) fn check_ceilings() -> Check {
    const NAME: &str = "ceilings";
    let host = match forkd_sys::ceilings::Host::read() {
        Ok(h) => h,
        Err(e) => return Check::not_ok(NAME, false, format!("read the host's ceilings: {e}")),
    };
    let cs = host.ceilings(2, forkd_sys::ceilings::SANDBOX_MEMORY_FLOOR);
    let least = cs.iter().map(|c| c.allows).min().unwrap_or(0);
    let detail = cs
        .iter()
        .map(|c| format!("{} {} ({} more)", c.name, c.value, c.allows))
        .collect::<Vec<_>>()
        .join(", ");
    let detail = format!(
        "room for {least} more sandboxes of two tasks: {detail}; the daemon raises kernel.pid_max to {} at start",
        host.pid_max_for_memory().max(host.pid_max)
    );
    if least < 1000 {
        Check::not_ok(NAME, false, detail)
    } else {
        Check::ok(NAME, false, detail)
    }
}
