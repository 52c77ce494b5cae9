//! What the API shows of sandboxes: the list (its descriptions kept until a record
//! changes, see `super::super::record`), and one sandbox with its memory and disk.

use super::*;

impl Daemon {
    /// Every sandbox, oldest first. The table lock is held only to copy the entries out.
    pub(crate) fn sandboxes_in_order(&self) -> Vec<Arc<Sandbox>> {
        // Sorted by (created, id) before they are described: sorting the descriptions
        // themselves moved thousands of large records (a fifth of a list of 5,000).
        let mut entries: Vec<(u64, Arc<Sandbox>)> = self
            .sandboxes
            .table
            .locked()
            .values()
            .map(|sb| (sb.record.locked().created, sb.clone()))
            .collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.id.cmp(&b.1.id)));
        entries.into_iter().map(|(_, sb)| sb).collect()
    }

    /// Every sandbox, oldest first, each with its cgroup's counters (two file reads a
    /// sandbox).
    pub fn list_sandboxes_with_stats(&self, viewer: Option<&str>) -> Vec<SandboxInfo> {
        self.sandboxes_in_order()
            .iter()
            .filter(|sb| crate::daemon::visible(viewer, sb.record.locked().owner.as_deref()))
            .map(|sb| self.info(sb))
            .collect()
    }

    /// The body of a list of every sandbox, oldest first (a JSON array of
    /// `SandboxInfo`): each description as kept since its record last changed, made
    /// again only for records that did.
    pub fn list_sandboxes_body(&self, viewer: Option<&str>) -> Vec<u8> {
        let shown: Vec<Arc<[u8]>> = self
            .sandboxes_in_order()
            .iter()
            .filter(|sb| crate::daemon::visible(viewer, sb.record.locked().owner.as_deref()))
            .map(|sb| {
                sb.record.locked().shown(|rec| {
                    serde_json::to_vec(&self.describe_record(sb, rec)).expect("answers serialise")
                })
            })
            .collect();
        let mut body = Vec::with_capacity(2 + shown.iter().map(|s| s.len() + 1).sum::<usize>());
        body.push(b'[');
        for (i, s) in shown.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(s);
        }
        body.push(b']');
        body
    }

    /// A sandbox's description, with its cgroup's counters.
    pub fn info(&self, sb: &Sandbox) -> SandboxInfo {
        // Only the fields shown are copied, under the record's lock; the cgroup is read
        // after it is released.
        let (mut info, cg) = {
            let rec = sb.record.locked();
            (
                self.describe_record(sb, &rec),
                rec.cgroup_in(&self.sandboxes.hierarchy),
            )
        };
        if self.node.disk_quotas.is_ok() {
            info.disk_used_bytes = self
                .node
                .volume
                .disk_use(&sb.dir.join("layer"))
                .map(|u| u.used_bytes);
        }
        if info.status == SandboxStatus::Running {
            info.cpu_usage_us = cg.cpu_usage_us();
        }
        if let Some(bytes) = cg.memory_current() {
            info.memory_bytes = Some(bytes);
            info.memory_counted = Some(MemoryCounted::Cgroup);
            info.oom_kills = cg.oom_kills();
        } else if cg.shared_memory().is_some() && info.status == SandboxStatus::Running {
            // Its memory cgroup counts every sharing sandbox: count its processes.
            if let Ok(pids) = cg.pids() {
                info.memory_bytes = Some(pids.into_iter().filter_map(pss_bytes).sum());
                info.memory_counted = Some(MemoryCounted::Processes);
            }
        }
        info
    }

    /// A sandbox's description without its cgroup's counters, from its record.
    fn describe_record(&self, sb: &Sandbox, rec: &SandboxRecord) -> SandboxInfo {
        SandboxInfo {
            id: rec.id.to_string(),
            image: rec.image.clone(),
            status: rec.status,
            created: rec.created,
            hostname: rec.hostname.clone(),
            init_pid: rec.init_pid,
            limits: rec.limits.clone(),
            labels: rec.labels.clone(),
            rootfs: match rec.init_pid {
                Some(pid) => init_root_shown(pid),
                None => sb.shown.rootfs.clone(),
            },
            upper: sb.shown.upper.clone(),
            memory_bytes: None,
            memory_counted: None,
            oom_kills: None,
            cgroup: rec.cgroup.clone(),
            create_us: rec.create_us,
            network: rec
                .lease
                .as_ref()
                .map(|l| crate::daemon::edge::network_info(l, &self.sandboxes.egress.table)),
            seccomp: crate::daemon::edge::api_seccomp(rec.seccomp),
            setuid: rec.setuid,
            expires_at: rec.expires_at,
            cpu_usage_us: None,
            disk_used_bytes: None,
        }
    }
}

/// A process's proportional set size in bytes (`/proc/PID/smaps_rollup`), if it still
/// runs.
fn pss_bytes(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let kib = text
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}
