//! The host's cgroup hierarchies as CRIU names them, and where restored trees may put
//! their cgroups (the yard).

use std::path::PathBuf;

/// The directory where every hierarchy is mounted under its CRIU name, if there is one.
pub(crate) fn host_yard(hierarchies: &[(String, PathBuf)]) -> Option<PathBuf> {
    let root = hierarchies.first()?.1.parent()?.to_path_buf();
    hierarchies
        .iter()
        .all(|(name, point)| *point == root.join(name))
        .then_some(root)
}

/// Every cgroup hierarchy this process belongs to, as (the directory name CRIU gives it
/// in a cgroup yard, where it is mounted here): `cpu,cpuacct` for a v1 hierarchy of
/// those controllers, `systemd` for a named one (`name=systemd`), `unified` for v2.
pub(crate) fn cgroup_hierarchies() -> std::io::Result<Vec<(String, PathBuf)>> {
    let own = std::fs::read_to_string("/proc/self/cgroup")?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    parse_hierarchies(&own, &mounts)
}

pub(crate) fn parse_hierarchies(
    own: &str,
    mountinfo: &str,
) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mounts: Vec<_> = forkd_sys::mountinfo::parse(mountinfo)
        .into_iter()
        .filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2")
        .collect();
    let mut out = Vec::new();
    for line in own.lines().filter(|l| !l.is_empty()) {
        let ctrls = line.split(':').nth(1).unwrap_or("");
        let found = if ctrls.is_empty() {
            mounts
                .iter()
                .find(|m| m.fstype == "cgroup2")
                .map(|m| ("unified".to_string(), m))
        } else {
            mounts
                .iter()
                .find(|m| {
                    m.fstype == "cgroup"
                        && ctrls
                            .split(',')
                            .all(|c| m.super_options.split(',').any(|o| o == c))
                })
                .map(|m| (ctrls.trim_start_matches("name=").to_string(), m))
        };
        let (name, mount) = found.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("cgroup hierarchy {ctrls:?} is not mounted"),
            )
        })?;
        out.push((name, mount.mount_point.clone()));
    }
    Ok(out)
}
