//! The two name-service files a sandbox with egress gets, bind-mounted read-only over
//! its `/etc/resolv.conf` and `/etc/hosts` from `/.forkd/net/` (forkd's own directory,
//! which no checkpoint's file diff includes).
//!
//! - egress: the host's upstream name servers (IPv4, not loopback: a loopback resolver
//!   of the host is the host, which no sandbox reaches);
//! - allowlist: no name server at all (a lookup fails at once on the sandbox's own
//!   loopback); every allowlisted name is in the hosts file with the addresses it
//!   resolved to when the sandbox was made, which are the addresses its rules allow.

use crate::Lease;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;

/// Directory of the files inside the sandbox root.
pub const DIR: &str = ".forkd/net";

/// The host's name servers a sandbox can use: IPv4, not loopback. Read from
/// `/etc/resolv.conf`, or systemd-resolved's upstream list when the host's own file
/// names only its local stub.
pub fn host_nameservers() -> Vec<Ipv4Addr> {
    for file in ["/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let found: Vec<Ipv4Addr> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("nameserver"))
            .filter_map(|a| a.trim().parse::<Ipv4Addr>().ok())
            .filter(|a| !a.is_loopback() && !a.is_unspecified())
            .collect();
        if !found.is_empty() {
            return found;
        }
    }
    Vec::new()
}

pub fn resolv_conf(lease: &Lease) -> String {
    let mut s = String::from("# Written by forkd for this sandbox.\n");
    if lease.allowlisted() {
        s.push_str("# Allowlist egress: no name server; the allowed names are in /etc/hosts.\n");
    } else if lease.nameservers.is_empty() {
        s.push_str("# The host has no name server a sandbox can reach.\n");
    }
    for ns in &lease.nameservers {
        let _ = writeln!(s, "nameserver {ns}");
    }
    s
}

pub fn hosts(lease: &Lease, hostname: &str) -> String {
    let mut s = String::from("# Written by forkd for this sandbox.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    let _ = writeln!(s, "{}\t{hostname}", lease.address());
    for (name, addrs) in &lease.names {
        for a in addrs {
            let _ = writeln!(s, "{a}\t{name}");
        }
    }
    s
}

/// Writes both files under `root/.forkd/net/`, from the host, into a root no process
/// runs in yet (a new sandbox, or a branch before its restore). Nothing on the way is
/// followed: the root's layers may hold anything at these paths (a symlink planted in a
/// checkpoint to point them at the host's `/etc`), so whatever is not a plain directory
/// is replaced by one, and the files are written without following a link.
pub fn write(root: &Path, lease: &Lease, hostname: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut dir = root.to_path_buf();
    for part in DIR.split('/') {
        dir.push(part);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => {
                std::fs::remove_file(&dir)?;
                std::fs::create_dir(&dir)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir(&dir)?,
            Err(e) => return Err(e),
        }
    }
    for (name, text) in [
        ("resolv.conf", resolv_conf(lease)),
        ("hosts", hosts(lease, hostname)),
    ] {
        let tmp = dir.join(format!(".{name}.tmp"));
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        drop(f);
        // rename(2) replaces the name itself, a link there included, never its target.
        std::fs::rename(&tmp, dir.join(name))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_symlink_is_replaced_not_followed() {
        let t = std::env::temp_dir().join(format!("forkd-dns-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        let (root, victim) = (t.join("root"), t.join("victim"));
        std::fs::create_dir_all(root.join(".forkd")).unwrap();
        std::fs::create_dir_all(&victim).unwrap();
        std::fs::write(victim.join("hosts"), "host's own\n").unwrap();
        std::os::unix::fs::symlink(&victim, root.join(".forkd/net")).unwrap();
        let lease = Lease {
            network: crate::Network::egress(),
            block: "10.213.0.4".parse().unwrap(),
            link: "fkd0123456789ab".into(),
            allowed: vec![],
            names: vec![],
            nameservers: vec!["192.0.2.53".parse().unwrap()],
        };
        write(&root, &lease, "h").unwrap();
        assert_eq!(
            std::fs::read_to_string(victim.join("hosts")).unwrap(),
            "host's own\n"
        );
        assert!(!victim.join("resolv.conf").exists());
        assert!(std::fs::symlink_metadata(root.join(".forkd/net"))
            .unwrap()
            .is_dir());
        assert!(std::fs::read_to_string(root.join(".forkd/net/hosts"))
            .unwrap()
            .contains("10.213.0.6\th"));
        std::fs::remove_dir_all(&t).unwrap();
    }
}
