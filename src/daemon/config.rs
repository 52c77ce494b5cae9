//! The daemon's settings: every `FORKD_*` variable it reads, read once at start into
//! typed values and checked there, so that a bad value stops the daemon with an error
//! naming the variable instead of failing requests later. The rest of the daemon takes
//! its values from a [`Config`]; nothing else reads the environment. docs/SETTINGS.md
//! lists them (a test keeps it in step with [`SETTINGS`]).

use std::path::PathBuf;
use std::time::Duration;

/// The task limit a sandbox gets when its request sets none, as podman's. Memory and
/// disk have none unless set; the disk default applies only where disk limits can be
/// held.
pub const DEFAULT_PIDS: u64 = 2048;
/// Spares kept for each source unless `FORKD_SPARE_LAYERS` says otherwise: one covers a
/// create or a single fork arriving at a time, and a second lets the one taken be made
/// again when the daemon is quiet (`quiet.rs`); batches make their own side by side.
pub const DEFAULT_SPARE_LAYERS: usize = 2;
/// How many namespaces are kept ready unless `FORKD_SPARE_NETNS` says otherwise. Each is
/// ~200 KiB of kernel memory; a few cover creates and single forks arriving one at a time.
pub const DEFAULT_SPARE_NETNS: usize = 4;
/// Largest archive `cp` moves either way by default; `FORKD_MAX_COPY_BYTES` sets it.
pub const DEFAULT_MAX_COPY: usize = 1 << 30;

/// One setting as docs/SETTINGS.md shows it.
pub struct Setting {
    pub name: &'static str,
    pub default: &'static str,
    pub unit: &'static str,
    pub what: &'static str,
}

macro_rules! settings {
    ($($name:literal, $default:literal, $unit:literal, $what:literal;)*) => {
        /// Every setting the daemon reads.
        pub const SETTINGS: &[Setting] = &[
            $(Setting { name: $name, default: $default, unit: $unit, what: $what },)*
        ];
    };
}

settings! {
    "FORKD_CERTS_DIRS", "/etc/containers/certs.d:/etc/docker/certs.d", "directories, colon-separated", "where registries' CA certificates and client keys are looked for";
    "FORKD_CGROUP_FAVOR_DYNMODS", "1", "0 or 1", "0 leaves cgroup2's favordynmods mount option as the host has it";
    "FORKD_CGROUP_POOL", "32", "cgroups", "free cgroups kept ready for the next sandboxes (0 keeps none)";
    "FORKD_CRIU", "the bundle, then criu in /usr/sbin, /usr/bin and the like", "path", "the CRIU binary checkpoints and restores use";
    "FORKD_CRIU_DEBUG", "unset", "set, to any value", "prints CRIU's stderr after each call to the daemon's";
    "FORKD_CRIU_LOG_LEVEL", "2", "0 to 4", "CRIU's log level (4 logs every step and slows restores)";
    "FORKD_CRIU_TIMEOUT_SECS", "600", "seconds", "the longest one CRIU call may take before CRIU is killed";
    "FORKD_DIRTY_LIMIT", "32M", "size (binary units), 0 for none", "dirty data the volume's loop device may hold";
    "FORKD_HOST_RESERVE", "5% of the disk, at most 1 GiB", "size (binary units)", "disk space the volume image leaves free under it";
    "FORKD_NFT", "beside CRIU, then nft in /usr/sbin and the like", "path", "the nft binary egress rules are set with";
    "FORKD_OVERLAY_LOWERS", "by the kernel", "append or links", "how an overlay is handed its lower layers (lowerdir+ from Linux 6.8)";
    "FORKD_VOLUME_SIZE", "256G", "size (binary units)", "the most a new volume image may grow to";
    "FORKD_CRIU_ROOT", "base", "base or pivot", "pivot leaves a restored namespace's root to CRIU's pivot_root";
    "FORKD_DEFAULT_DISK", "0", "size (512m, 2g)", "disk limit of a sandbox whose request sets none (0: none)";
    "FORKD_DEFAULT_MEMORY", "0", "size (512m, 2g)", "memory limit of a sandbox whose request sets none (0: none)";
    "FORKD_DEFAULT_PIDS", "2048", "tasks", "task limit of a sandbox whose request sets none (0: none)";
    "FORKD_DISK_QUOTAS", "off", "on or off", "on allows disk limits (btrfs simple quotas) when the volume is the host's own btrfs";
    "FORKD_EGRESS_POOL", "10.213.0.0/16", "IPv4 network, /8 to /29", "addresses of the sandboxes' network links";
    "FORKD_FORK_PARALLEL", "the CPU count", "branches", "branches of one fork request restored at once";
    "FORKD_INIT", "forkd-init beside forkd", "path", "the program every sandbox runs as /.forkd/init";
    "FORKD_KSM", "ask", "ask, on or off", "memory merged between branches: when a fork asks, for every fork, or never";
    "FORKD_KSM_BOOST_PAGES", "4000", "pages", "pages KSM scans a round right after a fork that shares";
    "FORKD_KSM_BOOST_SECS", "30", "seconds", "how long KSM scans at the boosted pace";
    "FORKD_KSM_IDLE_PAGES", "100", "pages", "pages KSM scans a round otherwise";
    "FORKD_KSM_SLEEP_MS", "20", "milliseconds", "KSM's sleep between rounds";
    "FORKD_LISTEN", "none", "tcp://HOST:PORT, comma-separated", "TCP listeners beside the Unix socket: TLS with FORKD_TLS_CERT, else loopback only; every request needs an API key";
    "FORKD_TLS_CERT", "unset", "path (PEM)", "the certificate chain TCP listeners present";
    "FORKD_TLS_KEY", "unset", "path (PEM)", "the private key of FORKD_TLS_CERT";
    "FORKD_TLS_CLIENT_CA", "unset", "path (PEM)", "when set, TCP clients must show a certificate this CA signed (mutual TLS)";
    "FORKD_MAX_CONNECTIONS", "1024", "connections", "open connections each TCP listener serves at once (more wait in the backlog)";
    "FORKD_AUDIT_MAX_BYTES", "16777216", "bytes", "the size at which the audit log is rotated (3 old files kept)";
    "FORKD_E2B_DOMAIN", "unset", "a DNS domain", "E2B's envd is also routed by Host names 49983-ID.DOMAIN (a wildcard domain), beside the E2b-Sandbox-Id header";
    "FORKD_MAX_COPY_BYTES", "1073741824", "bytes", "the largest archive cp carries into or out of a sandbox";
    "FORKD_MAX_LAYERS", "128", "layers (at least 2)", "the deepest layer stack of a checkpoint before it is squashed";
    "FORKD_MEMCG", "limited", "limited or each", "each gives every sandbox a memory cgroup of its own (cgroup v1 shares one otherwise)";
    "FORKD_PULL_PARALLEL", "3", "pulls", "image pulls and builds run at once";
    "FORKD_REGISTRIES_CONF", "/etc/containers/registries.conf", "path", "the registries.conf pulls follow (read again at each pull)";
    "FORKD_SANDBOXES_MEMORY", "memory less a tenth", "size, 0 for none", "the memory all sandboxes together may use";
    "FORKD_SPARE_LAYERS", "1", "0 to 16", "writable layers made ahead for each recent image or checkpoint";
    "FORKD_SPARE_NETNS", "4", "0 to 64", "network namespaces made ahead";
    "FORKD_TEMPLATES", "on", "on or off", "restore templates: branches share their checkpoint's memory";
    "FORKD_TEMPLATE_MIB", "a quarter of memory", "MiB", "the memory restore templates may hold together";
}

/// An error in a setting: names the variable and what it expects.
#[derive(Debug)]
pub struct SettingError(pub String);

impl std::fmt::Display for SettingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SettingError {}

/// How sandboxes without a memory limit get memory cgroups (`FORKD_MEMCG`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryCgroups {
    /// Only a sandbox with a memory limit has one of its own; `said` when the variable
    /// asked for it.
    Limited { said: bool },
    /// Every sandbox has one.
    Each,
}

/// The bound on all sandboxes' memory (`FORKD_SANDBOXES_MEMORY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxesMemory {
    /// The machine's memory less a tenth (at least 1 GiB).
    Default,
    None,
    Bytes(u64),
}

/// Every setting, read once.
#[derive(Debug, Clone)]
pub struct Config {
    pub cgroup_favor_dynmods: bool,
    pub cgroup_pool: usize,
    /// `FORKD_CRIU_ROOT=pivot`: restores leave the namespace's root to CRIU's `pivot_root`.
    pub criu_pivot_root: bool,
    pub criu: forkd_criu::Settings,
    pub nft: Option<PathBuf>,
    /// `None`: decided by the kernel.
    pub overlay_lowers: Option<forkd_sys::mount::LowerMode>,
    pub volume: forkd_volume::Settings,
    /// `FORKD_REGISTRIES_CONF`.
    pub registries_conf: PathBuf,
    /// `FORKD_CERTS_DIRS`.
    pub certs_dirs: Vec<PathBuf>,
    /// `PATH`, where programs no setting names are looked for before the system's
    /// directories.
    pub path: Vec<PathBuf>,
    pub default_pids: Option<u64>,
    pub default_memory: Option<u64>,
    pub default_disk: Option<u64>,
    pub disk_quotas_on_host: bool,
    pub egress_pool: forkd_net::Net4,
    pub fork_parallel: usize,
    pub init: Option<PathBuf>,
    pub ksm: super::sharing::Settings,
    pub max_copy_bytes: usize,
    pub max_layers: usize,
    pub memory_cgroups: MemoryCgroups,
    pub pull_parallel: usize,
    pub sandboxes_memory: SandboxesMemory,
    pub spare_layers: usize,
    pub spare_netns: usize,
    pub templates: bool,
    /// `FORKD_TEMPLATE_MIB` in bytes; `None`: a quarter of the machine's memory.
    pub template_budget: Option<u64>,
    /// The TCP listeners and their TLS.
    pub listen: Listen,
}

/// Reads variables, and says which were asked for (a test holds them against
/// [`SETTINGS`]).
struct Vars<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
    asked: std::cell::RefCell<Vec<String>>,
}

impl Vars<'_> {
    /// The value of `name`, trimmed; an empty one counts as unset.
    fn get(&self, name: &str) -> Option<String> {
        self.asked.borrow_mut().push(name.to_string());
        (self.get)(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    fn parsed<T: std::str::FromStr>(
        &self,
        name: &str,
        default: T,
        expect: &str,
        ok: impl Fn(&T) -> bool,
    ) -> Result<T, SettingError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse::<T>()
                .ok()
                .filter(|n| ok(n))
                .ok_or_else(|| SettingError(format!("{name}={v:?}: expected {expect}"))),
        }
    }

    fn size(&self, name: &str) -> Result<Option<u64>, SettingError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => forkd_api::parse_size(&v)
                .map(Some)
                .map_err(|e| SettingError(format!("{name}={v:?}: {e}"))),
        }
    }

    /// A size where `0` means none.
    fn size_or_none(&self, name: &str) -> Result<Option<u64>, SettingError> {
        Ok(self.size(name)?.filter(|&n| n > 0))
    }

    fn choice<T: Copy>(
        &self,
        name: &str,
        default: T,
        choices: &[(&str, T)],
    ) -> Result<T, SettingError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => choices
                .iter()
                .find(|(c, _)| *c == v)
                .map(|(_, t)| *t)
                .ok_or_else(|| {
                    let names: Vec<&str> = choices.iter().map(|(c, _)| *c).collect();
                    SettingError(format!("{name}={v:?}: expected {}", names.join(", ")))
                }),
        }
    }

    /// A size as the volume takes it (binary units, `T` and `TiB` too).
    fn volume_size(&self, name: &str) -> Result<Option<u64>, SettingError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) if v == "0" => Ok(Some(0)),
            Some(v) => forkd_volume::parse_size(&v).map(Some).ok_or_else(|| {
                SettingError(format!(
                    "{name}={v:?}: expected a size: bytes, or a number with K, M, G or T"
                ))
            }),
        }
    }

    /// Whether `name` is set at all (empty included).
    fn is_set(&self, name: &str) -> bool {
        self.asked.borrow_mut().push(name.to_string());
        (self.get)(name).is_some()
    }

    fn path(&self, name: &str) -> Option<PathBuf> {
        self.get(name).map(PathBuf::from)
    }
}

impl Config {
    /// The daemon's settings from its environment.
    pub fn from_env() -> Result<Config, SettingError> {
        Config::read(&|name| std::env::var(name).ok())
    }

    /// The settings from `get`, which answers a variable's value.
    pub fn read(get: &dyn Fn(&str) -> Option<String>) -> Result<Config, SettingError> {
        Config::read_asked(get).map(|(c, _)| c)
    }

    fn read_asked(
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(Config, Vec<String>), SettingError> {
        use super::sharing::Mode;
        let v = Vars {
            get,
            asked: Default::default(),
        };
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let count = |name: &str, default: usize, most: usize| {
            v.parsed(
                name,
                default,
                &format!("a count from 0 to {most}"),
                |n: &usize| *n <= most,
            )
        };
        let positive = |name: &str, default: u64| {
            v.parsed(name, default, "a positive integer", |n: &u64| *n > 0)
        };
        let egress_pool = {
            let text = v
                .get("FORKD_EGRESS_POOL")
                .unwrap_or_else(|| forkd_net::DEFAULT_POOL.into());
            let pool: forkd_net::Net4 = text
                .parse()
                .map_err(|e| SettingError(format!("FORKD_EGRESS_POOL={text:?}: {e}")))?;
            if !(8..=29).contains(&pool.prefix) {
                return Err(SettingError(format!(
                    "FORKD_EGRESS_POOL={text:?}: the prefix length must be 8 to 29"
                )));
            }
            pool
        };
        let sandboxes_memory = match v.get("FORKD_SANDBOXES_MEMORY").as_deref() {
            None => SandboxesMemory::Default,
            Some("0") => SandboxesMemory::None,
            Some(_) => {
                SandboxesMemory::Bytes(v.size("FORKD_SANDBOXES_MEMORY")?.unwrap_or_default())
            }
        };
        let listen = listen(&v)?;
        let config = Config {
            listen,
            cgroup_favor_dynmods: v.choice(
                "FORKD_CGROUP_FAVOR_DYNMODS",
                true,
                &[("0", false), ("1", true)],
            )?,
            cgroup_pool: v.parsed(
                "FORKD_CGROUP_POOL",
                32,
                "a number of cgroups (0 keeps none)",
                |_| true,
            )?,
            criu_pivot_root: v.choice(
                "FORKD_CRIU_ROOT",
                false,
                &[("base", false), ("pivot", true)],
            )?,
            criu: forkd_criu::Settings {
                program: v.path("FORKD_CRIU"),
                log_level: v.parsed(
                    "FORKD_CRIU_LOG_LEVEL",
                    forkd_criu::DEFAULT_LOG_LEVEL,
                    "0 to 4",
                    |l: &i32| (0..=4).contains(l),
                )?,
                timeout: Duration::from_secs(v.parsed(
                    "FORKD_CRIU_TIMEOUT_SECS",
                    forkd_criu::DEFAULT_TIMEOUT.as_secs(),
                    "a positive number of seconds",
                    |n: &u64| *n > 0,
                )?),
                // Set at all, even empty.
                debug: v.is_set("FORKD_CRIU_DEBUG"),
            },
            nft: v.path("FORKD_NFT"),
            overlay_lowers: v.choice(
                "FORKD_OVERLAY_LOWERS",
                None,
                &[
                    ("append", Some(forkd_sys::mount::LowerMode::Append)),
                    ("links", Some(forkd_sys::mount::LowerMode::Links)),
                ],
            )?,
            volume: {
                let d = forkd_volume::Settings::default();
                forkd_volume::Settings {
                    size: match v.volume_size("FORKD_VOLUME_SIZE")? {
                        Some(0) => {
                            return Err(SettingError(
                                "FORKD_VOLUME_SIZE=\"0\": the volume needs a size above 0".into(),
                            ))
                        }
                        other => other.unwrap_or(d.size),
                    },
                    dirty: v.volume_size("FORKD_DIRTY_LIMIT")?.unwrap_or(d.dirty),
                    host_reserve: v.volume_size("FORKD_HOST_RESERVE")?,
                }
            },
            registries_conf: v
                .path("FORKD_REGISTRIES_CONF")
                .unwrap_or_else(|| PathBuf::from(forkd_registry::config::DEFAULT_PATH)),
            certs_dirs: match v.get("FORKD_CERTS_DIRS") {
                Some(dirs) => dirs
                    .split(':')
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from)
                    .collect(),
                None => forkd_registry::client::DEFAULT_CERTS_DIRS
                    .iter()
                    .map(PathBuf::from)
                    .collect(),
            },
            path: get("PATH")
                .map(|p| {
                    std::env::split_paths(&p)
                        .filter(|d| d.is_absolute())
                        .collect()
                })
                .unwrap_or_default(),
            default_pids: match v.get("FORKD_DEFAULT_PIDS").as_deref() {
                Some("0") => None,
                _ => Some(v.parsed(
                    "FORKD_DEFAULT_PIDS",
                    DEFAULT_PIDS,
                    "a number of tasks",
                    |_| true,
                )?),
            },
            default_memory: v.size_or_none("FORKD_DEFAULT_MEMORY")?,
            default_disk: v.size_or_none("FORKD_DEFAULT_DISK")?,
            disk_quotas_on_host: v.choice(
                "FORKD_DISK_QUOTAS",
                false,
                &[("off", false), ("on", true)],
            )?,
            egress_pool,
            fork_parallel: v.parsed(
                "FORKD_FORK_PARALLEL",
                cpus,
                "at least 1 branch",
                |n: &usize| *n >= 1,
            )?,
            init: v.path("FORKD_INIT"),
            ksm: super::sharing::Settings {
                mode: v.choice(
                    "FORKD_KSM",
                    Mode::Ask,
                    &[
                        ("ask", Mode::Ask),
                        ("on", Mode::On),
                        ("1", Mode::On),
                        ("off", Mode::Off),
                        ("0", Mode::Off),
                    ],
                )?,
                boost_pages: positive("FORKD_KSM_BOOST_PAGES", 4000)?,
                idle_pages: positive("FORKD_KSM_IDLE_PAGES", 100)?,
                sleep_ms: positive("FORKD_KSM_SLEEP_MS", 20)?,
                boost: Duration::from_secs(positive("FORKD_KSM_BOOST_SECS", 30)?),
            },
            max_copy_bytes: v.parsed(
                "FORKD_MAX_COPY_BYTES",
                DEFAULT_MAX_COPY,
                "a positive number of bytes",
                |n: &usize| *n > 0,
            )?,
            max_layers: v.parsed("FORKD_MAX_LAYERS", 128, "at least 2 layers", |n: &usize| {
                *n >= 2
            })?,
            memory_cgroups: v.choice(
                "FORKD_MEMCG",
                MemoryCgroups::Limited { said: false },
                &[
                    ("limited", MemoryCgroups::Limited { said: true }),
                    ("each", MemoryCgroups::Each),
                ],
            )?,
            pull_parallel: v.parsed("FORKD_PULL_PARALLEL", 3, "at least 1 pull", |n: &usize| {
                *n >= 1
            })?,
            sandboxes_memory,
            spare_layers: count("FORKD_SPARE_LAYERS", DEFAULT_SPARE_LAYERS, 16)?,
            spare_netns: count("FORKD_SPARE_NETNS", DEFAULT_SPARE_NETNS, 64)?,
            templates: v.choice("FORKD_TEMPLATES", true, &[("on", true), ("off", false)])?,
            template_budget: match v.get("FORKD_TEMPLATE_MIB") {
                None => None,
                Some(_) => Some(v.parsed("FORKD_TEMPLATE_MIB", 0u64, "MiB", |_| true)? << 20),
            },
        };
        let asked = v.asked.into_inner();
        Ok((config, asked))
    }
}

/// The TCP listeners (`FORKD_LISTEN`) and what they share.
#[derive(Debug, Clone, Default)]
pub struct Listen {
    pub tcp: Vec<std::net::SocketAddr>,
    pub tls: Option<TlsFiles>,
    /// Connections each listener serves at once.
    pub max_connections: usize,
    pub audit_max_bytes: u64,
    /// E2B's envd Host names: `49983-<id>.<domain>`.
    pub e2b_domain: Option<String>,
}

/// PEM files: the listeners' certificate chain and key, and the CA clients' certificates
/// must chain to (mutual TLS).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub client_ca: Option<std::path::PathBuf>,
}

/// `FORKD_LISTEN` and what goes with it. Plain TCP is allowed on loopback only: a key
/// sent in the clear elsewhere would be anyone's.
fn listen(v: &Vars) -> Result<Listen, SettingError> {
    use std::net::ToSocketAddrs;
    let mut tcp = Vec::new();
    for item in v
        .get("FORKD_LISTEN")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let bad = |why: &str| SettingError(format!("FORKD_LISTEN={item:?}: {why}"));
        let hostport = item
            .strip_prefix("tcp://")
            .ok_or_else(|| bad("expected tcp://HOST:PORT (the Unix socket is --socket)"))?;
        let addrs: Vec<std::net::SocketAddr> = hostport
            .to_socket_addrs()
            .map_err(|e| bad(&format!("not an address and port: {e}")))?
            .collect();
        // A name stands for its first address, as a listener binds one.
        let addr = addrs
            .first()
            .ok_or_else(|| bad("the name has no address"))?;
        tcp.push((item.to_string(), *addr));
    }
    let cert = v.path("FORKD_TLS_CERT");
    let key = v.path("FORKD_TLS_KEY");
    let client_ca = v.path("FORKD_TLS_CLIENT_CA");
    let tls = match (cert, key) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert,
            key,
            client_ca,
        }),
        (None, None) if client_ca.is_some() => {
            return Err(SettingError(
                "FORKD_TLS_CLIENT_CA is set without FORKD_TLS_CERT and FORKD_TLS_KEY: mutual TLS needs TLS"
                    .into(),
            ))
        }
        (None, None) => None,
        (Some(_), None) => {
            return Err(SettingError(
                "FORKD_TLS_CERT is set without FORKD_TLS_KEY".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(SettingError(
                "FORKD_TLS_KEY is set without FORKD_TLS_CERT".into(),
            ))
        }
    };
    if tls.is_none() {
        if let Some((item, _)) = tcp.iter().find(|(_, a)| !a.ip().is_loopback()) {
            return Err(SettingError(format!(
                "FORKD_LISTEN={item:?}: plain TCP is allowed on loopback only; set FORKD_TLS_CERT and FORKD_TLS_KEY to listen there"
            )));
        }
    }
    Ok(Listen {
        tcp: tcp.into_iter().map(|(_, a)| a).collect(),
        tls,
        max_connections: v.parsed(
            "FORKD_MAX_CONNECTIONS",
            1024,
            "a positive number of connections",
            |n: &usize| *n > 0,
        )?,
        audit_max_bytes: v.parsed(
            "FORKD_AUDIT_MAX_BYTES",
            16 << 20,
            "at least 4096 bytes",
            |n: &u64| *n >= 4096,
        )?,
        e2b_domain: match v.get("FORKD_E2B_DOMAIN") {
            None => None,
            Some(d) => {
                let d = d.trim_matches('.').to_ascii_lowercase();
                let ok = !d.is_empty()
                    && d.split('.').all(|l| {
                        !l.is_empty()
                            && l.len() <= 63
                            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    });
                if !ok {
                    return Err(SettingError(format!(
                        "FORKD_E2B_DOMAIN={d:?}: expected a DNS domain (labels of letters, digits and '-')"
                    )));
                }
                Some(d)
            }
        },
    })
}

#[cfg(test)]
mod tests;
