//! Sandbox networking.
//!
//! Every sandbox has a network namespace of its own. With the default mode, `none`, it
//! holds only loopback. With `egress` or `allowlist`, the daemon gives it one veth pair:
//! `eth0` inside, `fkd<id>` on the host, a /30 of the daemon's pool between them
//! (`.1` the host's end and the sandbox's gateway, `.2` the sandbox), and a chain of its
//! own in the daemon's nftables table ([`nft`]) that decides where its packets may go.
//! Name service comes as files ([`dns`]). The pieces:
//! - [`mode`]: what a sandbox asks for, and how allowlists are read and resolved;
//! - [`netlink`]: the rtnetlink requests that make and configure the veth pair;
//! - [`nft`]: the rules;
//! - [`sockets`]: which sockets of a sandbox reach outside it (a live checkpoint refuses
//!   those: a branch has another address);
//! - [`Egress`] here: the pool, and one lease per sandbox, made or undone as a whole.

#![forbid(unsafe_code)]

pub mod dns;
pub mod mode;
pub mod netlink;
pub mod nft;
pub mod sockets;

pub use mode::{Mode, Net4, Network};

use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

/// The pool used when the daemon is given none (`FORKD_EGRESS_POOL` overrides it).
pub const DEFAULT_POOL: &str = "10.213.0.0/16";

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{0}")]
    Invalid(String),
    #[error("egress is unavailable: {0}")]
    Unavailable(String),
    #[error("the egress pool {0} is exhausted (every /30 in it is in use)")]
    PoolExhausted(Net4),
    #[error("{step}: {source}")]
    Io {
        step: String,
        #[source]
        source: std::io::Error,
    },
    #[error("nftables: {0}")]
    Rules(String),
}

fn io(step: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetError {
    let step = step.into();
    move |source| NetError::Io { step, source }
}

/// A sandbox's share of the network: kept in its record for as long as it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// What the sandbox asked for.
    pub network: Network,
    /// The network address of its /30.
    pub block: Ipv4Addr,
    /// The host-side veth.
    pub link: String,
    /// Allowlist: the networks it may reach (names resolved when the lease was made).
    #[serde(default)]
    pub allowed: Vec<Net4>,
    /// Allowlist: each name with the addresses it resolved to (the hosts file).
    #[serde(default)]
    pub names: Vec<(String, Vec<Ipv4Addr>)>,
    /// Egress: the name servers in its resolv.conf.
    #[serde(default)]
    pub nameservers: Vec<Ipv4Addr>,
}

impl Lease {
    /// The host's end, the sandbox's gateway.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.block) + 1)
    }
    /// The sandbox's address.
    pub fn address(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.block) + 2)
    }
    pub fn allowlisted(&self) -> bool {
        self.network.mode == mode::Mode::Allowlist
    }
}

/// The interface name inside every sandbox.
pub const SANDBOX_LINK: &str = "eth0";
const PREFIX_LEN: u8 = 30;

/// What a new lease needs besides an address: the resolved policy, decided once so that
/// every branch of a sandbox gets the same.
#[derive(Debug, Clone)]
pub struct Policy {
    pub network: Network,
    pub allowed: Vec<Net4>,
    pub names: Vec<(String, Vec<Ipv4Addr>)>,
    pub nameservers: Vec<Ipv4Addr>,
}

impl Policy {
    /// Checks and resolves `network` now. `None` for mode `none`.
    pub fn resolve(network: &Network) -> Result<Option<Policy>, NetError> {
        let hosts = network.validate().map_err(NetError::Invalid)?;
        Ok(match network.mode {
            mode::Mode::None => None,
            mode::Mode::Egress => Some(Policy {
                network: network.clone(),
                allowed: Vec::new(),
                names: Vec::new(),
                nameservers: dns::host_nameservers(),
            }),
            mode::Mode::Allowlist => {
                let r = mode::resolve(&hosts).map_err(NetError::Invalid)?;
                Some(Policy {
                    network: network.clone(),
                    allowed: r.nets,
                    names: r.names,
                    nameservers: Vec::new(),
                })
            }
        })
    }

    /// The policy a lease carries (what a branch of its sandbox inherits).
    pub fn of(lease: &Lease) -> Policy {
        Policy {
            network: lease.network.clone(),
            allowed: lease.allowed.clone(),
            names: lease.names.clone(),
            nameservers: lease.nameservers.clone(),
        }
    }
}

/// One daemon's egress: its pool, its nftables table, the `nft` it runs.
pub struct Egress {
    pub pool: Net4,
    pub table: String,
    /// The interface group of this daemon's host-side links (from its tag): a link of
    /// the group with no chain of its own is refused, never let through.
    pub group: u32,
    nft: Result<PathBuf, String>,
    /// Serialises allocations of this host (all daemons): held from choosing a block to
    /// putting its address on the host's end, where the next allocation sees it.
    lock_path: PathBuf,
    /// Whether this daemon has made its table since it started.
    table_made: std::sync::Mutex<bool>,
}

/// Finds `nft`: `explicit` (the daemon's `FORKD_NFT`), beside the CRIU bundle's wrapper,
/// then in the system's program directories.
pub fn locate_nft(explicit: Option<&Path>, criu: Option<&Path>) -> Result<PathBuf, String> {
    let candidates = explicit
        .map(Path::to_path_buf)
        .into_iter()
        .chain(criu.and_then(Path::parent).map(|d| d.join("nft")))
        .chain([PathBuf::from("/opt/forkd/criu/bin/nft")])
        .chain(forkd_sys::program_dirs().into_iter().map(|d| d.join("nft")));
    for c in candidates {
        if c.is_file() {
            return Ok(c);
        }
    }
    Err("nft not found (set FORKD_NFT, or run fixtures/setup.sh criu, which installs it beside CRIU)".into())
}

impl Egress {
    pub fn new(pool: Net4, tag: &str, nft: Result<PathBuf, String>) -> Egress {
        Egress {
            pool,
            table: format!("forkd_{tag}"),
            group: group_of(tag),
            nft,
            lock_path: PathBuf::from("/run/forkd-egress.lock"),
            table_made: std::sync::Mutex::new(false),
        }
    }

    /// Where `nft` is, or why there is none.
    pub fn nft_path(&self) -> Result<&Path, &str> {
        self.nft.as_deref().map_err(|e| e.as_str())
    }

    fn nft(&self) -> Result<&Path, NetError> {
        self.nft
            .as_deref()
            .map_err(|e| NetError::Unavailable(e.clone()))
    }

    /// The first /30 of the pool that no lease of `taken` holds and no address of the
    /// host falls in (one pass over each: linear in the sandboxes alive).
    fn allocate(&self, taken: &[Ipv4Addr]) -> Result<Ipv4Addr, NetError> {
        let block_of = |a: Ipv4Addr| u32::from(a) & mode::mask(PREFIX_LEN);
        let mut used: std::collections::HashSet<u32> = nix::ifaddrs::getifaddrs()
            .map_err(|e| io("list the host's addresses")(e.into()))?
            .filter_map(|i| i.address)
            .filter_map(|a| a.as_sockaddr_in().map(|s| block_of(s.ip())))
            .collect();
        used.extend(taken.iter().map(|b| block_of(*b)));
        let size = 1u64 << (32 - self.pool.prefix as u32);
        let base = u32::from(self.pool.addr);
        (0..size / 4)
            .map(|i| base + (i as u32) * 4)
            .find(|b| !used.contains(b))
            .map(Ipv4Addr::from)
            .ok_or(NetError::PoolExhausted(self.pool))
    }

    /// Gives the sandbox whose network namespace is `netns` a lease: a block of the pool,
    /// its rules, and the veth pair with both ends configured (the rules first, so that
    /// the link never exists without them). All of it or, on error, none of it. `held`
    /// are this daemon's other leases (a table made now holds their rules too); `link`
    /// the host-side veth's name. The caller serialises this with [`Egress::release`]
    /// (both change the table).
    pub fn lease(
        &self,
        policy: &Policy,
        link: &str,
        held: &[&Lease],
        netns: BorrowedFd<'_>,
    ) -> Result<Lease, NetError> {
        let taken: Vec<Ipv4Addr> = held.iter().map(|l| l.block).collect();
        let nft = self.nft()?.to_path_buf();
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock_path)
            .map_err(io(format!("open {}", self.lock_path.display())))?;
        let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| io(format!("lock {}", self.lock_path.display()))(e.into()))?;
        let block = self.allocate(&taken)?;
        let lease = Lease {
            network: policy.network.clone(),
            block,
            link: link.to_string(),
            allowed: policy.allowed.clone(),
            names: policy.names.clone(),
            nameservers: policy.nameservers.clone(),
        };
        let first = !*self.table_made.lock().unwrap();
        if first {
            enable_forwarding()?;
            let mut all = held.to_vec();
            all.push(&lease);
            nft::apply(
                &nft,
                &nft::rebuild(&self.table, self.group, self.pool, &all),
            )
            .map_err(NetError::Rules)?;
            *self.table_made.lock().unwrap() = true;
        } else {
            nft::apply(&nft, &nft::add(&self.table, &lease)).map_err(NetError::Rules)?;
        }
        if let Err(e) = self.plumb(&lease, netns) {
            let _ = netlink::Route::open().and_then(|mut r| r.delete_link(link));
            // Back to the rules of the other leases (or none at all).
            let undo = if !first {
                nft::remove(&self.table, &lease)
            } else if held.is_empty() {
                nft::clear(&self.table)
            } else {
                nft::rebuild(&self.table, self.group, self.pool, held)
            };
            if nft::apply(&nft, &undo).is_ok() && first && held.is_empty() {
                *self.table_made.lock().unwrap() = false;
            }
            return Err(e);
        }
        Ok(lease)
    }

    /// The veth pair, addresses, links up, the sandbox's default route.
    fn plumb(&self, lease: &Lease, netns: BorrowedFd<'_>) -> Result<(), NetError> {
        let link = &lease.link;
        let mut host = netlink::Route::open().map_err(io("open rtnetlink"))?;
        host.add_veth(link, self.group, SANDBOX_LINK, netns)
            .map_err(io(format!("create veth {link}")))?;
        let index = netlink::index_of(link).map_err(io(format!("find {link}")))?;
        host.add_address(index, lease.gateway(), PREFIX_LEN)
            .map_err(io(format!("address {} on {link}", lease.gateway())))?;
        host.set_up(index).map_err(io(format!("set {link} up")))?;
        let (addr, gw) = (lease.address(), lease.gateway());
        netlink::in_netns(netns, move || {
            let mut r = netlink::Route::open()?;
            let i = netlink::index_of(SANDBOX_LINK)?;
            r.add_address(i, addr, PREFIX_LEN)?;
            r.set_up(i)?;
            r.add_default_route(i, gw)
        })
        .map_err(io(format!(
            "configure {SANDBOX_LINK} ({addr}) in the sandbox"
        )))
    }

    /// Undoes a lease: its rules, then its link (which the namespace's end goes with).
    /// `remaining` are the leases still held; with none, the table goes too. Failures are
    /// returned after everything has been tried.
    pub fn release(&self, lease: &Lease, remaining: &[&Lease]) -> Result<(), NetError> {
        let mut first = None;
        if let Ok(nft) = self.nft() {
            let script = if remaining.is_empty() {
                nft::clear(&self.table)
            } else {
                nft::remove(&self.table, lease)
            };
            if let Err(e) = nft::apply(nft, &script) {
                // The sandbox's rules were not (all) there: rewrite the table from what
                // is held, which is right whatever state it was in.
                if let Err(e2) = nft::apply(
                    nft,
                    &nft::rebuild(&self.table, self.group, self.pool, remaining),
                ) {
                    first = Some(NetError::Rules(format!("{e}; rebuilding the table: {e2}")));
                }
            }
            if remaining.is_empty() {
                *self.table_made.lock().unwrap() = false;
            }
        }
        if let Err(e) = netlink::Route::open().and_then(|mut r| r.delete_link(&lease.link)) {
            first.get_or_insert(io(format!("delete link {}", lease.link))(e));
        }
        first.map_or(Ok(()), Err)
    }

    /// Makes the table hold exactly the rules of `leases` (after a daemon restart):
    /// stale chains of sandboxes that went while no daemon watched are dropped, and
    /// with no lease the table is deleted.
    pub fn reconcile(&self, leases: &[&Lease]) -> Result<(), NetError> {
        let nft = match self.nft() {
            Ok(n) => n,
            Err(e) if leases.is_empty() => {
                let _ = e;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let mut made = self.table_made.lock().unwrap();
        if leases.is_empty() {
            if nft::exists(nft, &self.table) {
                nft::apply(nft, &nft::clear(&self.table)).map_err(NetError::Rules)?;
            }
            *made = false;
        } else {
            enable_forwarding()?;
            nft::apply(
                nft,
                &nft::rebuild(&self.table, self.group, self.pool, leases),
            )
            .map_err(NetError::Rules)?;
            *made = true;
        }
        Ok(())
    }
}

/// A daemon's interface group: 30 bits of its tag, never 0 (the default group).
fn group_of(tag: &str) -> u32 {
    let h = tag.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    });
    (h & 0x3fff_ffff) | 0x4000_0000
}

/// Turns on IPv4 forwarding on the host if it is off (egress is routed through it).
fn enable_forwarding() -> Result<(), NetError> {
    let path = "/proc/sys/net/ipv4/ip_forward";
    let now = std::fs::read_to_string(path).map_err(io(format!("read {path}")))?;
    if now.trim() != "1" {
        std::fs::write(path, "1").map_err(io(format!("enable IPv4 forwarding ({path})")))?;
    }
    Ok(())
}

/// The host-side veth name of a sandbox (`fkd` + the first 12 characters of its id).
pub fn link_name(sandbox_id: &str) -> String {
    let short: String = sandbox_id.chars().take(12).collect();
    format!("{}{short}", nft::LINK_PREFIX)
}
