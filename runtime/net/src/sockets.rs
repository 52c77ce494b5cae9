//! Which sockets of a sandbox reach outside it.
//!
//! A live checkpoint keeps a sandbox's sockets as they are, and every branch restores
//! them in a network namespace of its own with an address of its own. A socket on
//! loopback, or bound to the wildcard address, means the same in every branch; one
//! bound to the sandbox's own `eth0` address, or connected to a peer outside the
//! sandbox, does not (that address is not the branch's, that peer never heard of the
//! branch). So a checkpoint asks for those first and refuses, naming each.
//!
//! Read from `/proc/<pid>/net/{tcp,tcp6,udp,udp6}` of the sandbox's init (the files show
//! the namespace of the process named), addresses as the kernel prints them: each
//! 32-bit word in hex, in the host's byte order.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutsideSocket {
    pub proto: &'static str,
    pub local: SocketAddr,
    /// The peer, for a connected socket.
    pub remote: Option<SocketAddr>,
    /// The process holding it, when found.
    pub holder: Option<(i32, String)>,
}

impl fmt::Display for OutsideSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.holder {
            Some((pid, comm)) => write!(f, "process {pid} ({comm}) holds ")?,
            None => f.write_str("a process holds ")?,
        }
        match self.remote {
            Some(r) => write!(f, "a {} connection {} -> {r}", self.proto, self.local),
            None => write!(f, "a {} socket bound to {}", self.proto, self.local),
        }
    }
}

fn inside(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(v) => v.is_loopback() || v.is_unspecified(),
        IpAddr::V6(v) => {
            v.is_loopback()
                || v.is_unspecified()
                || v.to_ipv4_mapped()
                    .is_some_and(|m| m.is_loopback() || m.is_unspecified())
        }
    }
}

fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (a, p) = s.split_once(':')?;
    let port = u16::from_str_radix(p, 16).ok()?;
    let ip = match a.len() {
        8 => IpAddr::V4(Ipv4Addr::from(
            u32::from_str_radix(a, 16).ok()?.to_ne_bytes(),
        )),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                let w = u32::from_str_radix(&a[i * 8..i * 8 + 8], 16).ok()?;
                b[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The sockets in one `/proc/net/{tcp,udp}[6]` text that leave the sandbox, with their
/// inodes. Sockets no descriptor holds (TIME_WAIT, inode 0) are the kernel's alone and
/// are not checkpointed.
pub fn parse_table(proto: &'static str, text: &str) -> Vec<(u64, OutsideSocket)> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            continue;
        }
        let (Some(local), Some(remote), Ok(inode)) =
            (parse_addr(f[1]), parse_addr(f[2]), f[9].parse::<u64>())
        else {
            continue;
        };
        if inode == 0 {
            continue;
        }
        let connected = !remote.ip().is_unspecified() || remote.port() != 0;
        if inside(local.ip()) && (!connected || inside(remote.ip())) {
            continue;
        }
        out.push((
            inode,
            OutsideSocket {
                proto,
                local,
                remote: connected.then_some(remote),
                holder: None,
            },
        ));
    }
    out
}

/// The sockets of the sandbox whose init is `init_pid` that leave it; `pids` are its
/// processes, searched for the holder of each.
pub fn outside(init_pid: i32, pids: &[i32]) -> Vec<OutsideSocket> {
    let mut found = Vec::new();
    for (file, proto) in [
        ("tcp", "TCP"),
        ("tcp6", "TCP"),
        ("udp", "UDP"),
        ("udp6", "UDP"),
    ] {
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{init_pid}/net/{file}")) {
            found.extend(parse_table(proto, &text));
        }
    }
    if found.is_empty() {
        return Vec::new();
    }
    for &pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let t = target.to_string_lossy();
            let Some(inode) = t
                .strip_prefix("socket:[")
                .and_then(|r| r.strip_suffix(']'))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            for (i, s) in found.iter_mut() {
                if *i == inode && s.holder.is_none() {
                    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                        .unwrap_or_default()
                        .trim()
                        .to_string();
                    s.holder = Some((pid, comm));
                }
            }
        }
    }
    found.into_iter().map(|(_, s)| s).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0 100 0 0 10 0
   1: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1002 1 0 100 0 0 10 0
   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 1003 1 0 100 0 0 10 0
   3: 0600D50A:9C40 010012C6:0050 01 00000000:00000000 00:00000000 00000000     0        0 1004 1 0 100 0 0 10 0
   4: 0600D50A:9C41 010012C6:0050 06 00000000:00000000 03:00000000 00000000     0        0 0 3 0
   5: 0600D50A:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1005 1 0 100 0 0 10 0
";

    #[test]
    fn loopback_and_wildcard_stay_outside_goes() {
        let got = parse_table("TCP", TCP);
        let inodes: Vec<u64> = got.iter().map(|(i, _)| *i).collect();
        assert_eq!(inodes, vec![1004, 1005]);
        let s = &got[0].1;
        assert_eq!(
            s.to_string(),
            "a process holds a TCP connection 10.213.0.6:40000 -> 198.18.0.1:80"
        );
        assert_eq!(
            got[1].1.to_string(),
            "a process holds a TCP socket bound to 10.213.0.6:8080"
        );
    }

    #[test]
    fn ipv6_loopback_stays() {
        let t = "  sl  local_address                         remote_address                        st
   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2001 1
   1: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2002 1
";
        assert!(parse_table("TCP", t).is_empty());
    }
}
