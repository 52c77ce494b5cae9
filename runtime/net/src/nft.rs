//! The daemon's nftables table: its text, and `nft -f -` to apply it.
//!
//! Each daemon owns one table, `inet forkd_<tag>` (the tag comes from its state root, so
//! two daemons on one host never touch each other's rules), made when its first sandbox
//! with egress starts and deleted when its last one goes:
//!
//! ```text
//! table inet forkd_T {
//!   map links { type ifname : verdict }          # host-side veth -> jump sb_<link>
//!   chain refuse { tcp: reset; else: icmpx admin-prohibited }
//!   chain input   (hook input):   from any forkd link -> refuse   (the host itself)
//!   chain forward (hook forward): forkd link to forkd link -> refuse (other sandboxes)
//!                                 iifname vmap @links             (each sandbox's policy)
//!                                 a link of ours without a chain -> refuse (fail closed)
//!                                 to a forkd link: replies only
//!   chain postrouting (nat): from the pool, leaving by a non-forkd link -> masquerade
//!   chain sb_<link>: source must be the sandbox's address; IPv6 -> refuse;
//!                    egress: accept | allowlist: daddr @allow_<link> accept, else refuse
//! }
//! ```
//! Refusing rather than dropping makes a blocked connection fail at once in the sandbox
//! (`Connection refused`), never hang. Every change is one `nft -f` transaction: adding
//! or removing a sandbox touches only its own chain, set and map element, so the cost of
//! a change does not grow with the number of sandboxes.

use crate::mode::Net4;
use crate::Lease;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// The prefix of every host-side veth forkd makes (`fkd` + 12 characters of the id).
pub const LINK_PREFIX: &str = "fkd";

fn chain(lease: &Lease) -> String {
    format!("sb_{}", lease.link)
}

fn set(lease: &Lease) -> String {
    format!("allow_{}", lease.link)
}

/// The whole table with the sandboxes `leases`, replacing whatever the table held.
pub fn rebuild(table: &str, group: u32, pool: Net4, leases: &[&Lease]) -> String {
    let mut s = String::new();
    let p = LINK_PREFIX;
    let _ = writeln!(s, "add table inet {table}\ndelete table inet {table}");
    let _ = write!(
        s,
        "table inet {table} {{
  map links {{ type ifname : verdict; }}
  chain refuse {{
    meta l4proto tcp reject with tcp reset
    reject with icmpx admin-prohibited
  }}
  chain input {{
    type filter hook input priority filter; policy accept;
    iifname \"{p}*\" jump refuse
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname \"{p}*\" oifname \"{p}*\" jump refuse
    iifname vmap @links
    iifgroup {group} jump refuse
    oifname \"{p}*\" ct state established,related accept
    oifname \"{p}*\" drop
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {pool} oifname != \"{p}*\" masquerade
  }}
}}
"
    );
    for l in leases {
        s.push_str(&add(table, l));
    }
    s
}

/// Adds one sandbox's chain (and set) and routes its link to them.
pub fn add(table: &str, lease: &Lease) -> String {
    let (c, link) = (chain(lease), &lease.link);
    let mut s = String::new();
    let _ = writeln!(s, "add chain inet {table} {c}");
    let _ = writeln!(
        s,
        "add rule inet {table} {c} ip saddr != {} drop",
        lease.address()
    );
    let _ = writeln!(s, "add rule inet {table} {c} meta nfproto ipv6 jump refuse");
    if lease.allowlisted() {
        let set = set(lease);
        let _ = writeln!(
            s,
            "add set inet {table} {set} {{ type ipv4_addr; flags interval; }}"
        );
        if !lease.allowed.is_empty() {
            let elems: Vec<String> = lease.allowed.iter().map(|n| n.to_string()).collect();
            let _ = writeln!(
                s,
                "add element inet {table} {set} {{ {} }}",
                elems.join(", ")
            );
        }
        let _ = writeln!(s, "add rule inet {table} {c} ip daddr @{set} accept");
        let _ = writeln!(s, "add rule inet {table} {c} jump refuse");
    } else {
        let _ = writeln!(s, "add rule inet {table} {c} accept");
    }
    let _ = writeln!(
        s,
        "add element inet {table} links {{ \"{link}\" : jump {c} }}"
    );
    s
}

/// Removes what [`add`] added.
pub fn remove(table: &str, lease: &Lease) -> String {
    let (c, link) = (chain(lease), &lease.link);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "delete element inet {table} links {{ \"{link}\" : jump {c} }}"
    );
    let _ = writeln!(s, "flush chain inet {table} {c}");
    let _ = writeln!(s, "delete chain inet {table} {c}");
    if lease.allowlisted() {
        let _ = writeln!(s, "delete set inet {table} {}", set(lease));
    }
    s
}

/// Deletes the table (whether or not it exists).
pub fn clear(table: &str) -> String {
    format!("add table inet {table}\ndelete table inet {table}\n")
}

/// Runs `nft -f -` on `script`: one transaction, all of it or none.
pub fn apply(nft: &Path, script: &str) -> Result<(), String> {
    let mut child = Command::new(nft)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("run {}: {e}", nft.display()))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let written = stdin.write_all(script.as_bytes());
    drop(stdin);
    let out = child
        .wait_with_output()
        .map_err(|e| format!("wait for {}: {e}", nft.display()))?;
    written.map_err(|e| format!("write rules to {}: {e}", nft.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "{} -f - failed ({}): {}",
            nft.display(),
            out.status,
            err.trim()
        ));
    }
    Ok(())
}

/// Whether `table` exists.
pub fn exists(nft: &Path, table: &str) -> bool {
    Command::new(nft)
        .args(["list", "table", "inet", table])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mode::Network;

    fn lease(n: Network, allowed: &[&str]) -> Lease {
        Lease {
            network: n,
            block: "10.213.0.4".parse().unwrap(),
            link: "fkd0123456789ab".into(),
            allowed: allowed.iter().map(|a| a.parse().unwrap()).collect(),
            names: vec![],
            nameservers: vec![],
        }
    }

    #[test]
    fn egress_chain_accepts_after_the_source_check() {
        let l = lease(Network::egress(), &[]);
        let s = add("forkd_t", &l);
        assert!(s.contains("add rule inet forkd_t sb_fkd0123456789ab ip saddr != 10.213.0.6 drop"));
        assert!(s.contains("sb_fkd0123456789ab accept"));
        assert!(!s.contains("add set"));
        assert!(s.contains(
            "add element inet forkd_t links { \"fkd0123456789ab\" : jump sb_fkd0123456789ab }"
        ));
        assert!(!remove("forkd_t", &l).contains("delete set"));
    }

    #[test]
    fn allowlist_chain_refuses_what_is_not_listed() {
        let l = lease(
            Network::allowlist(vec!["198.18.0.1".into()]),
            &["198.18.0.1/32", "10.9.0.0/16"],
        );
        let s = add("forkd_t", &l);
        assert!(s.contains("{ 198.18.0.1/32, 10.9.0.0/16 }"));
        let accept = s.find("ip daddr @allow_fkd0123456789ab accept").unwrap();
        let refuse = s.rfind("jump refuse").unwrap();
        assert!(accept < refuse);
        assert!(remove("forkd_t", &l).contains("delete set inet forkd_t allow_fkd0123456789ab"));
    }

    #[test]
    fn rebuild_replaces_the_table() {
        let l = lease(Network::egress(), &[]);
        let s = rebuild("forkd_t", 1234, "10.213.0.0/16".parse().unwrap(), &[&l]);
        assert!(s.starts_with("add table inet forkd_t\ndelete table inet forkd_t\n"));
        assert!(s.contains("ip saddr 10.213.0.0/16 oifname != \"fkd*\" masquerade"));
        assert!(s.contains("iifname \"fkd*\" oifname \"fkd*\" jump refuse"));
        assert!(s.contains("add chain inet forkd_t sb_fkd0123456789ab"));
        let vmap = s.find("iifname vmap @links").unwrap();
        assert!(
            s[vmap..].starts_with("iifname vmap @links\n    iifgroup 1234 jump refuse"),
            "{s}"
        );
    }
}
