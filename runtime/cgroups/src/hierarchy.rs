//! The machine's cgroup hierarchy (v1 or v2, and its controllers), and what forkd sets
//! on it as a whole: `favordynmods` on cgroup2, and the bound on all sandboxes' memory.

use super::*;

/// Which cgroup hierarchy this machine uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "version", rename_all = "lowercase")]
pub enum Hierarchy {
    V1 {
        root: PathBuf,
        controllers: Vec<String>,
    },
    V2 {
        root: PathBuf,
        controllers: Vec<String>,
    },
}

impl Hierarchy {
    /// Detects the hierarchy mounted at `/sys/fs/cgroup`.
    pub fn detect() -> Result<Self, CgroupError> {
        Self::detect_at(Path::new("/sys/fs/cgroup"))
    }

    pub fn detect_at(root: &Path) -> Result<Self, CgroupError> {
        let v2_controllers = root.join("cgroup.controllers");
        if v2_controllers.exists() {
            let text = fs::read_to_string(&v2_controllers)
                .map_err(io_err(&v2_controllers, "read controllers"))?;
            return Ok(Hierarchy::V2 {
                root: root.to_path_buf(),
                controllers: text.split_whitespace().map(String::from).collect(),
            });
        }
        let controllers: Vec<String> = V1_CONTROLLERS
            .iter()
            .filter(|c| root.join(c).join("cgroup.procs").exists())
            .map(|c| c.to_string())
            .collect();
        if controllers.iter().any(|c| c == "memory") && controllers.iter().any(|c| c == "pids") {
            Ok(Hierarchy::V1 {
                root: root.to_path_buf(),
                controllers,
            })
        } else {
            Err(CgroupError::NoHierarchy(root.to_path_buf()))
        }
    }

    pub fn version(&self) -> u8 {
        match self {
            Hierarchy::V1 { .. } => 1,
            Hierarchy::V2 { .. } => 2,
        }
    }

    pub fn controllers(&self) -> &[String] {
        match self {
            Hierarchy::V1 { controllers, .. } | Hierarchy::V2 { controllers, .. } => controllers,
        }
    }

    /// The directories that make up the cgroup `name` (one per v1 controller).
    pub(crate) fn dirs(&self, name: &str) -> Vec<(Option<String>, PathBuf)> {
        match self {
            Hierarchy::V1 { root, controllers } => controllers
                .iter()
                .map(|c| (Some(c.clone()), root.join(c).join(name)))
                .collect(),
            Hierarchy::V2 { root, .. } => vec![(None, root.join(name))],
        }
    }
}

/// Makes task migrations between cgroups cheap: sets `favordynmods` on the machine's
/// cgroup2 mount (the pure v2 hierarchy, or the `unified` one beside v1 controllers).
///
/// Every move of a process into a cgroup (a sandbox's set-up helper joining its cgroup,
/// CRIU placing a restored tree) takes the kernel's global threadgroup lock for writing,
/// which by default waits for an RCU grace period: 7 to 19 ms per branch measured here.
/// With `favordynmods` (Linux 6.0+) it does not, at the documented price of slightly
/// slower forks and exits machine-wide. The flag is global, and any later mount of
/// cgroup2 without it (CRIU mounting its own cgroup yard, as other runtimes' restores
/// do) clears it again, so callers re-assert it where it matters; this costs a read of
/// mountinfo when it is still set.
///
/// Returns the cgroup2 mount point and whether this call set the flag; `None` when the
/// machine has no cgroup2 mount.
pub fn favor_dynamic_changes() -> Result<Option<(PathBuf, bool)>, CgroupError> {
    let mountinfo = Path::new("/proc/self/mountinfo");
    let mounts = forkd_sys::mountinfo::mounts().map_err(io_err(mountinfo, "read"))?;
    let Some(cgroup2) = mounts.into_iter().find(|m| m.fstype == "cgroup2") else {
        return Ok(None);
    };
    let point = cgroup2.mount_point;
    if cgroup2
        .super_options
        .split(',')
        .any(|o| o == "favordynmods")
    {
        return Ok(Some((point, false)));
    }
    // The other cgroup2 options (nsdelegate, memory_recursiveprot, ...) are set by the
    // same call, so they go along.
    let mut data: Vec<&str> = cgroup2
        .super_options
        .split(',')
        .filter(|o| !o.is_empty() && *o != "rw" && *o != "ro")
        .collect();
    data.push("favordynmods");
    forkd_sys::remount(&point, &cgroup2.mount_options, &data.join(","))
        .map_err(io_err(&point, "remount with favordynmods"))?;
    Ok(Some((point, true)))
}

/// Bounds the memory of the cgroup `name` (the parent of every sandbox's, such as
/// `forkd`), made if missing: all sandboxes together, whatever their own limits, so that
/// a hog meets the OOM killer inside it rather than the host's. On cgroup v1 the bound
/// holds only where the memory hierarchy is hierarchical (`memory.use_hierarchy`, always
/// so since Linux 6.x); the error says when it is not.
pub fn bound_memory(hierarchy: &Hierarchy, name: &str, bytes: u64) -> Result<PathBuf, CgroupError> {
    let (dir, file) = match hierarchy {
        Hierarchy::V1 { root, .. } => (root.join("memory").join(name), "memory.limit_in_bytes"),
        Hierarchy::V2 { root, .. } => (root.join(name), "memory.max"),
    };
    fs::create_dir_all(&dir).map_err(io_err(&dir, "create"))?;
    if let Hierarchy::V1 { .. } = hierarchy {
        let h = dir.join("memory.use_hierarchy");
        if fs::read_to_string(&h).is_ok_and(|v| v.trim() == "0") {
            return Err(CgroupError::Io {
                path: h.clone(),
                step: "bound memory",
                source: io::Error::other("the memory hierarchy is flat here: a parent's limit does not hold its children"),
            });
        }
    }
    let path = dir.join(file);
    write(&path, &bytes.to_string(), "bound memory")?;
    Ok(path)
}
