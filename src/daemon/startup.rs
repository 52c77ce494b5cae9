//! What the daemon's start-up reads and sets up besides its tables: the bound on all
//! sandboxes' memory, the volume's size said in plain words, the sandboxes' init and the
//! layer that carries it, cgroup settings from the environment, and `favordynmods` kept
//! on the cgroup2 mount.

use super::{log, Daemon};
use forkd_layers::{LayerId, LayerStore};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// Environment variable with the memory all sandboxes together may use (`0`: no bound).
pub const SANDBOXES_MEMORY_ENV: &str = "FORKD_SANDBOXES_MEMORY";

/// Bounds every sandbox's memory together (the `forkd` cgroup, shared by every daemon
/// on the host), by default to the machine's memory less a tenth (at least 1 GiB) for
/// the daemon and the host: a memory bomb without a limit of its own meets the OOM killer
/// in there, never the host's. A bad setting stops the daemon; a kernel that refuses
/// the bound is said once.
pub(super) fn bound_sandboxes_memory(
    hierarchy: &forkd_cgroups::Hierarchy,
    setting: super::config::SandboxesMemory,
) -> anyhow::Result<()> {
    use super::config::SandboxesMemory;
    let bytes = match setting {
        SandboxesMemory::None => return Ok(()),
        SandboxesMemory::Bytes(b) => b,
        SandboxesMemory::Default => {
            let total = forkd_sys::proc_kib_field("/proc/meminfo", "MemTotal:").unwrap_or(0);
            if total == 0 {
                return Ok(());
            }
            total - (total / 10).max(1 << 30).min(total / 2)
        }
    };
    match forkd_cgroups::bound_memory(hierarchy, "forkd", bytes) {
        Ok(path) => log::info(&format!(
            "cgroup: all sandboxes together may use {} MiB of memory ({}; {SANDBOXES_MEMORY_ENV})",
            bytes >> 20,
            path.display()
        )),
        Err(e) => log::warn(&format!("cgroup: sandboxes' memory left unbounded: {e}")),
    }
    Ok(())
}

/// Says in plain words, at start, how far the volume can really grow: the most it may
/// grow to against what the disk under it can give.
pub(super) fn check_volume_size(volume: &forkd_volume::Volume) {
    let Ok(s) = volume.space() else { return };
    if volume.loop_image().is_none() {
        return;
    }
    let reachable = s.can_grow_to();
    log::info(&format!(
        "volume: {} MiB now, {} MiB free; may grow to {} MiB ({}), keeping {} MiB free on the disk under it",
        s.fs_bytes >> 20,
        s.fs_free >> 20,
        s.max_bytes >> 20,
        forkd_volume::SIZE_ENV,
        s.host_reserve >> 20
    ));
    if reachable < s.max_bytes {
        log::warn(&format!(
            "volume: {} allows {} MiB but the disk under {} has room for {} MiB of it: past that, writes in sandboxes fail with ENOSPC (the volume itself stays writable)",
            forkd_volume::SIZE_ENV,
            s.max_bytes >> 20,
            volume.loop_image().map(|p| p.display().to_string()).unwrap_or_default(),
            reachable >> 20
        ));
    }
}

impl Daemon {
    /// Keeps `favordynmods` set on the cgroup2 mount, so that moving a process into a
    /// cgroup does not wait for an RCU grace period (see
    /// [`forkd_cgroups::favor_dynamic_changes`]). Called at start-up and then once a
    /// second by a watcher thread: another program's mount of cgroup2 clears the flag.
    pub(crate) fn keep_migrations_cheap(&self) {
        if !self.node.favor_dynmods {
            return;
        }
        if !self.features.cgroup_favordynmods {
            let release = &self.features.kernel;
            if !self.node.favor_dynmods_failed.swap(true, Ordering::Relaxed) {
                log::info(&format!(
                    "cgroup: favordynmods needs Linux 6.0; this kernel is {release}: each \
                     task migration may wait for RCU (7-19 ms)"
                ));
            }
            return;
        }
        match forkd_cgroups::favor_dynamic_changes() {
            Ok(Some((at, true))) => {
                self.node
                    .favor_dynmods_failed
                    .store(false, Ordering::Relaxed);
                log::info(&format!(
                    "cgroup: set favordynmods on {} (task migrations do not wait for RCU; \
                     FORKD_CGROUP_FAVOR_DYNMODS=0 leaves it alone)",
                    at.display()
                ));
            }
            Ok(_) => {}
            Err(e) => {
                if !self.node.favor_dynmods_failed.swap(true, Ordering::Relaxed) {
                    let why = anyhow::Error::from(e)
                        .chain()
                        .map(|c| c.to_string())
                        .collect::<Vec<_>>()
                        .join(": ");
                    log::warn(&format!(
                        "cgroup: favordynmods not set, each migration may wait 7-19 ms: {why}"
                    ));
                }
            }
        }
    }
}

/// The program every sandbox runs as `/.forkd/init`: `FORKD_INIT`, or `forkd-init` beside
/// this executable (where `cargo build` puts it).
pub(super) fn init_program(exe: &Path, setting: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = setting {
        let p = p.to_path_buf();
        anyhow::ensure!(p.is_file(), "FORKD_INIT={}: no such file", p.display());
        return Ok(p);
    }
    let init = exe.with_file_name("forkd-init");
    anyhow::ensure!(
        init.is_file(),
        "{} is missing: it is the program inside every sandbox, built with forkd (cargo build builds both); or set FORKD_INIT",
        init.display()
    );
    Ok(init)
}

/// Makes sure the layer holding this build's init exists; returns its id. The layer is
/// `/.forkd/init` (a copy of `forkd-init`) plus empty `/.forkd/run` and `/.forkd/logs`;
/// its id is cached per executable digest.
pub(super) fn ensure_runtime_layer(
    root: &Path,
    layers: &LayerStore,
    exe: &Path,
) -> anyhow::Result<LayerId> {
    use anyhow::Context;
    use sha2::Digest;
    let bytes = std::fs::read(exe).with_context(|| format!("read {}", exe.display()))?;
    let digest: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let cache = root.join("runtime").join(format!("{digest}.layer"));
    if let Ok(text) = std::fs::read_to_string(&cache) {
        if let Ok(id) = text.trim().parse::<LayerId>() {
            if layers.exists(&id) {
                return Ok(id);
            }
        }
    }
    let stage = root
        .join("runtime")
        .join(format!(".stage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&stage);
    let build = || -> anyhow::Result<LayerId> {
        let dir = stage.join(".forkd");
        for d in ["run", "logs"] {
            std::fs::create_dir_all(dir.join(d))?;
        }
        std::fs::set_permissions(dir.join("run"), std::fs::Permissions::from_mode(0o700))?;
        std::fs::write(dir.join("init"), &bytes)?;
        std::fs::set_permissions(dir.join("init"), std::fs::Permissions::from_mode(0o755))?;
        // Every sandbox's /dev (device nodes, pts/, shm/, the usual symlinks): above the
        // image's layers, so a sandbox's set-up finds it ready and writes nothing.
        forkd_sandbox::setup::populate_dev(&stage)?;
        Ok(layers.import_dir(&stage, &mut |_| {})?)
    };
    let res = build();
    let _ = std::fs::remove_dir_all(&stage);
    let id = res.context("build the runtime layer")?;
    std::fs::write(&cache, id.to_string()).with_context(|| format!("write {}", cache.display()))?;
    Ok(id)
}
