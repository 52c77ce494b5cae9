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

/// Writes both files under `root/.forkd/net/`.
pub fn write(root: &Path, lease: &Lease, hostname: &str) -> std::io::Result<()> {
    let dir = root.join(DIR);
    std::fs::create_dir_all(&dir)?;
    for (name, text) in [
        ("resolv.conf", resolv_conf(lease)),
        ("hosts", hosts(lease, hostname)),
    ] {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, dir.join(name))?;
    }
    Ok(())
}
