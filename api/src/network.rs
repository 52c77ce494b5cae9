//! What network a sandbox asks for, and its system-call filter: the API's own forms,
//! which the daemon hands the runtime as its types.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A sandbox's network: `{"mode": "none"}`, `{"mode": "egress"}` or
/// `{"mode": "allowlist", "hosts": ["198.18.0.1", "pypi.example", "10.0.0.0/8"]}`.
/// Written `none`, `egress` or `allowlist=HOST,...` on command lines and in task files.
/// The daemon checks the hosts' form and resolves names when the sandbox is made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    pub mode: NetworkMode,
    /// Allowlist only: IPv4 addresses, IPv4 networks, DNS names.
    #[serde(default)]
    pub hosts: Vec<String>,
}

/// `none` (loopback only, the default), `egress` (the outside world through NAT, never
/// the host or other sandboxes) or `allowlist` (egress to the listed hosts only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    #[default]
    None,
    Egress,
    Allowlist,
}

impl Network {
    pub fn none() -> Network {
        Network::default()
    }
    pub fn egress() -> Network {
        Network {
            mode: NetworkMode::Egress,
            hosts: Vec::new(),
        }
    }
    pub fn allowlist(hosts: Vec<String>) -> Network {
        Network {
            mode: NetworkMode::Allowlist,
            hosts,
        }
    }
    pub fn is_none(&self) -> bool {
        self.mode == NetworkMode::None
    }
}

impl FromStr for Network {
    type Err = String;
    fn from_str(s: &str) -> Result<Network, String> {
        match s.trim() {
            "none" => Ok(Network::none()),
            "egress" => Ok(Network::egress()),
            other => match other.split_once('=') {
                Some(("allowlist", list)) => Ok(Network::allowlist(
                    list.split(',').map(|h| h.trim().to_string()).collect(),
                )),
                _ => Err(format!(
                    "unknown network mode {other:?}: use none, egress or allowlist=HOST,..."
                )),
            },
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mode {
            NetworkMode::None => f.write_str("none"),
            NetworkMode::Egress => f.write_str("egress"),
            NetworkMode::Allowlist => write!(f, "allowlist={}", self.hosts.join(",")),
        }
    }
}

/// Whether a sandbox runs under forkd's system-call filter (docs/DESIGN.md, "The
/// system-call filter"): `default`, or `unconfined` for none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Seccomp {
    #[default]
    Default,
    Unconfined,
}

impl Seccomp {
    pub fn as_str(self) -> &'static str {
        match self {
            Seccomp::Default => "default",
            Seccomp::Unconfined => "unconfined",
        }
    }
}

impl FromStr for Seccomp {
    type Err = String;
    fn from_str(s: &str) -> Result<Seccomp, String> {
        match s {
            "default" => Ok(Seccomp::Default),
            "unconfined" => Ok(Seccomp::Unconfined),
            other => Err(format!(
                "seccomp {other:?} is not known: it is \"default\" (the system-call filter) or \"unconfined\" (none)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_by_name() {
        assert_eq!("default".parse::<Seccomp>(), Ok(Seccomp::Default));
        assert_eq!("unconfined".parse::<Seccomp>(), Ok(Seccomp::Unconfined));
        let e = "none".parse::<Seccomp>().unwrap_err();
        assert!(e.contains("\"none\"") && e.contains("unconfined"), "{e}");
    }

    #[test]
    fn modes_parse_and_print() {
        for s in ["none", "egress", "allowlist=198.18.0.1,pypi.example"] {
            assert_eq!(s.parse::<Network>().unwrap().to_string(), s);
        }
        assert_eq!(
            " allowlist= a , b ".parse::<Network>().unwrap().hosts,
            vec!["a", "b"]
        );
        assert!("bridged"
            .parse::<Network>()
            .unwrap_err()
            .contains("bridged"));
        let json = serde_json::to_string(&Network::allowlist(vec!["10.0.0.0/8".into()])).unwrap();
        assert_eq!(json, r#"{"mode":"allowlist","hosts":["10.0.0.0/8"]}"#);
    }
}
