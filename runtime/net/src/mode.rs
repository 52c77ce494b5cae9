//! What network a sandbox asks for: `none` (loopback only, the default), `egress` (the
//! outside world through NAT, never the host or other sandboxes) or `allowlist` (egress
//! to the listed hosts only). Written `none`, `egress`, `allowlist=HOST,...` on command
//! lines and in task files; an object (`{"mode": "allowlist", "hosts": [...]}`) in the
//! API.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{Ipv4Addr, ToSocketAddrs};
use std::str::FromStr;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    pub mode: Mode,
    /// Allowlist only: IPv4 addresses, IPv4 networks, DNS names.
    #[serde(default)]
    pub hosts: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    None,
    Egress,
    Allowlist,
}

/// One allowlist entry, checked for form (names are resolved later, by [`resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Addr(Ipv4Addr),
    /// A network: address and prefix length.
    Net(Ipv4Addr, u8),
    Name(String),
}

/// An IPv4 network `addr/prefix` with the host bits cleared, as nftables writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash, PartialOrd, Ord)]
#[serde(try_from = "String", into = "String")]
pub struct Net4 {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Net4 {
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Net4 {
        let mask = mask(prefix);
        Net4 {
            addr: Ipv4Addr::from(u32::from(addr) & mask),
            prefix,
        }
    }
    pub fn contains(&self, a: Ipv4Addr) -> bool {
        u32::from(a) & mask(self.prefix) == u32::from(self.addr)
    }
    pub fn overlaps(&self, other: &Net4) -> bool {
        let m = mask(self.prefix.min(other.prefix));
        u32::from(self.addr) & m == u32::from(other.addr) & m
    }
}

pub(crate) fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix as u32)
    }
}

impl fmt::Display for Net4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Net4 {
    type Err = String;
    fn from_str(s: &str) -> Result<Net4, String> {
        let (a, p) = s.split_once('/').unwrap_or((s, "32"));
        let addr: Ipv4Addr = a
            .parse()
            .map_err(|_| format!("{s:?} is not an IPv4 address"))?;
        let prefix: u8 = p
            .parse()
            .ok()
            .filter(|p| *p <= 32)
            .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to 32"))?;
        Ok(Net4::new(addr, prefix))
    }
}

impl TryFrom<String> for Net4 {
    type Error = String;
    fn try_from(s: String) -> Result<Net4, String> {
        s.parse()
    }
}

impl From<Net4> for String {
    fn from(n: Net4) -> String {
        n.to_string()
    }
}

impl Network {
    pub fn none() -> Network {
        Network::default()
    }
    pub fn egress() -> Network {
        Network {
            mode: Mode::Egress,
            hosts: Vec::new(),
        }
    }
    pub fn allowlist(hosts: Vec<String>) -> Network {
        Network {
            mode: Mode::Allowlist,
            hosts,
        }
    }
    pub fn is_none(&self) -> bool {
        self.mode == Mode::None
    }

    /// Checks every allowlist entry's form; names are not resolved here.
    pub fn validate(&self) -> Result<Vec<Host>, String> {
        match self.mode {
            Mode::None | Mode::Egress if !self.hosts.is_empty() => {
                Err(format!("hosts are only for mode allowlist, not {self}"))
            }
            Mode::None | Mode::Egress => Ok(Vec::new()),
            Mode::Allowlist => {
                if self.hosts.is_empty() {
                    return Err("allowlist: name at least one host (or use --network none)".into());
                }
                self.hosts.iter().map(|h| parse_host(h)).collect()
            }
        }
    }
}

/// One allowlist entry: an IPv4 address, an IPv4 network (`a.b.c.d/n`) or a DNS name.
pub fn parse_host(h: &str) -> Result<Host, String> {
    let h = h.trim();
    if h.is_empty() {
        return Err("allowlist: an empty host name".into());
    }
    if h.contains(':') {
        return Err(format!(
            "allowlist host {h:?}: IPv6 is not supported (sandbox egress is IPv4 only); ports are not part of an allowlist"
        ));
    }
    if h.contains('/') {
        let n: Net4 = h.parse().map_err(|e| format!("allowlist host {e}"))?;
        return Ok(Host::Net(n.addr, n.prefix));
    }
    if let Ok(a) = h.parse::<Ipv4Addr>() {
        return Ok(Host::Addr(a));
    }
    if h.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!("allowlist host {h:?} is not a valid IPv4 address"));
    }
    let name = h.strip_suffix('.').unwrap_or(h);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!(
            "allowlist host {h:?} is neither an IPv4 address nor a valid DNS name"
        ));
    }
    Ok(Host::Name(name.to_ascii_lowercase()))
}

/// An allowlist resolved to addresses: the networks to allow, and the names with the
/// addresses each resolved to (written into the sandbox's hosts file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    pub nets: Vec<Net4>,
    pub names: Vec<(String, Vec<Ipv4Addr>)>,
}

/// Resolves names with the host's resolver, now: the rules hold the addresses they had
/// at this moment, for the sandbox's whole life (and its branches').
pub fn resolve(hosts: &[Host]) -> Result<Resolved, String> {
    let mut out = Resolved::default();
    for h in hosts {
        match h {
            Host::Addr(a) => out.nets.push(Net4::new(*a, 32)),
            Host::Net(a, p) => out.nets.push(Net4::new(*a, *p)),
            Host::Name(n) => {
                let addrs: Vec<Ipv4Addr> = (n.as_str(), 0)
                    .to_socket_addrs()
                    .map_err(|e| format!("allowlist host {n:?} does not resolve: {e}"))?
                    .filter_map(|sa| match sa.ip() {
                        std::net::IpAddr::V4(a) => Some(a),
                        _ => None,
                    })
                    .collect();
                let mut addrs = addrs;
                addrs.sort();
                addrs.dedup();
                if addrs.is_empty() {
                    return Err(format!("allowlist host {n:?} has no IPv4 address"));
                }
                out.nets.extend(addrs.iter().map(|a| Net4::new(*a, 32)));
                out.names.push((n.clone(), addrs));
            }
        }
    }
    out.nets.sort();
    out.nets.dedup();
    Ok(out)
}

impl FromStr for Network {
    type Err = String;
    fn from_str(s: &str) -> Result<Network, String> {
        let n = match s.trim() {
            "none" => Network::none(),
            "egress" => Network::egress(),
            other => match other.split_once('=') {
                Some(("allowlist", list)) => {
                    Network::allowlist(list.split(',').map(|h| h.trim().to_string()).collect())
                }
                _ => {
                    return Err(format!(
                        "unknown network mode {other:?}: use none, egress or allowlist=HOST,..."
                    ))
                }
            },
        };
        n.validate()?;
        Ok(n)
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mode {
            Mode::None => f.write_str("none"),
            Mode::Egress => f.write_str("egress"),
            Mode::Allowlist => write!(f, "allowlist={}", self.hosts.join(",")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for s in [
            "none",
            "egress",
            "allowlist=198.18.0.1,example.org,10.0.0.0/8",
        ] {
            let n: Network = s.parse().unwrap();
            assert_eq!(n.to_string(), s);
        }
        assert!("allowlist="
            .parse::<Network>()
            .unwrap_err()
            .contains("empty host"));
        assert!("bridge"
            .parse::<Network>()
            .unwrap_err()
            .contains("unknown network mode"));
        assert!("allowlist=a..b"
            .parse::<Network>()
            .unwrap_err()
            .contains("valid DNS name"));
        assert!("allowlist=300.1.1.1"
            .parse::<Network>()
            .unwrap_err()
            .contains("IPv4"));
        assert!("allowlist=::1"
            .parse::<Network>()
            .unwrap_err()
            .contains("IPv6"));
        assert!("allowlist=1.2.3.4/33"
            .parse::<Network>()
            .unwrap_err()
            .contains("prefix"));
        assert!("allowlist=h:80"
            .parse::<Network>()
            .unwrap_err()
            .contains("ports"));
        assert!("allowlist=-x.org".parse::<Network>().is_err());
    }

    #[test]
    fn api_form_is_an_object() {
        let n: Network =
            serde_json::from_str(r#"{"mode":"allowlist","hosts":["198.18.0.1"]}"#).unwrap();
        assert_eq!(n, Network::allowlist(vec!["198.18.0.1".into()]));
        assert_eq!(
            serde_json::to_string(&Network::egress()).unwrap(),
            r#"{"mode":"egress","hosts":[]}"#
        );
        let e: Network = serde_json::from_str(r#"{"mode":"egress"}"#).unwrap();
        assert_eq!(e, Network::egress());
        assert!(serde_json::from_str::<Network>(r#"{"mode":"bridge"}"#).is_err());
        assert!(serde_json::from_str::<Network>(r#"{"mode":"egress","ports":[]}"#).is_err());
        let bad = Network {
            mode: Mode::Egress,
            hosts: vec!["1.2.3.4".into()],
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .contains("only for mode allowlist"));
    }

    #[test]
    fn networks_are_normalised_and_compared() {
        let n: Net4 = "10.1.2.3/16".parse().unwrap();
        assert_eq!(n.to_string(), "10.1.0.0/16");
        assert!(n.contains("10.1.255.1".parse().unwrap()));
        assert!(!n.contains("10.2.0.1".parse().unwrap()));
        assert!(n.overlaps(&"10.1.7.0/30".parse().unwrap()));
        assert!(!n.overlaps(&"10.2.0.0/30".parse().unwrap()));
        let r = resolve(&[
            Host::Addr("1.2.3.4".parse().unwrap()),
            Host::Net("1.2.3.0".parse().unwrap(), 24),
        ])
        .unwrap();
        assert_eq!(r.nets.len(), 2);
    }
}
