//! `forkd doctor`: checks that this machine can run and checkpoint sandboxes.
//!
//! Each check probes one mechanism forkd relies on, by trying it rather than by reading
//! configuration where that is cheap: it creates the namespaces in a short-lived child,
//! mounts a real overlay under `/tmp` and writes through it, opens a pidfd and a
//! userfaultfd, and runs `criu check`. A check is either required (forkd cannot work
//! without it: a failure makes the exit code 1) or optional (it only limits what forkd
//! can do, so a failure is reported as a warning). The kernel line is information only.
//!
//! Output: one line per check, `<status> <check> <detail>` in aligned columns, or with
//! `json` an array of `{"check", "status": "ok|warn|fail", "required", "detail"}`.
//! External programs run with a timeout of [`COMMAND_TIMEOUT`] and are killed after it.

use anyhow::{bail, Context};
use serde::Serialize;
use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long an external program (criu, qemu) or the namespace probe may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// The oldest CRIU that works here (Debian 12's 3.17 fails `criu check` on new kernels,
/// and before 4.2 no TCP or UDP socket can be dumped on Linux >= 6.16).
const MIN_CRIU: (u32, u32) = forkd_criu::MIN_VERSION;

/// What `forkd doctor` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct DoctorOptions {
    /// The CRIU binary to check; `None` resolves it like the runtime does: `$FORKD_CRIU`,
    /// then `/opt/forkd/criu/bin/criu`, then `criu` on `PATH`.
    pub criu: Option<PathBuf>,
    /// Print a JSON array instead of aligned text lines.
    pub json: bool,
}

/// Runs every check, prints the report to stdout and returns the process exit code:
/// 0 when every required check passed, 1 otherwise.
pub fn run(opts: &DoctorOptions) -> anyhow::Result<i32> {
    let checks = run_checks(opts);
    let report = if opts.json {
        render_json(&checks)?
    } else {
        render_human(&checks)
    };
    println!("{report}");
    Ok(exit_code(&checks))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    /// The status column of the text report; a failure stands out in capitals.
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        }
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Check {
    check: &'static str,
    status: Status,
    required: bool,
    detail: String,
}

impl Check {
    fn ok(check: &'static str, required: bool, detail: impl Into<String>) -> Self {
        Self::new(check, Status::Ok, required, detail)
    }

    /// A check that did not pass: a failure if it is required, else a warning.
    fn not_ok(check: &'static str, required: bool, detail: impl Into<String>) -> Self {
        let status = if required { Status::Fail } else { Status::Warn };
        Self::new(check, status, required, detail)
    }

    fn new(check: &'static str, status: Status, required: bool, detail: impl Into<String>) -> Self {
        Check {
            check,
            status,
            required,
            detail: one_line(&detail.into()),
        }
    }
}

/// Collapses a detail (which may quote a program's multi-line output) onto one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn run_checks(opts: &DoctorOptions) -> Vec<Check> {
    vec![
        check_root(),
        check_namespaces(),
        check_overlayfs(),
        check_cgroups(),
        check_btrfs(),
        check_pidfd(),
        check_userfaultfd(),
        check_criu(opts.criu.as_deref()),
        check_egress(opts.criu.as_deref()),
        check_qemu(),
        check_kvm(),
        check_kernel(),
    ]
}

fn exit_code(checks: &[Check]) -> i32 {
    let failed = checks
        .iter()
        .any(|c| c.required && c.status == Status::Fail);
    i32::from(failed)
}

fn render_line(check: &Check) -> String {
    format!(
        "{:<5}{:<16}{}",
        check.status.label(),
        check.check,
        check.detail
    )
    .trim_end()
    .to_string()
}

fn render_human(checks: &[Check]) -> String {
    checks
        .iter()
        .map(render_line)
        .collect::<Vec<_>>()
        .join("\n")
}

fn render_json(checks: &[Check]) -> anyhow::Result<String> {
    serde_json::to_string_pretty(checks).context("serialising the doctor report")
}

// ---------------------------------------------------------------------------------------
// root

/// Capabilities forkd uses even as root, with what goes wrong without each.
const CAPABILITIES: &[(u32, &str, &str)] = &[
    (21, "CAP_SYS_ADMIN", "no namespaces or mounts"),
    (19, "CAP_SYS_PTRACE", "CRIU cannot dump"),
    (12, "CAP_NET_ADMIN", "no sandbox networking"),
    (
        24,
        "CAP_SYS_RESOURCE",
        "rlimits cannot be raised above their hard limits",
    ),
];

fn check_root() -> Check {
    const NAME: &str = "root";
    let euid = nix::unistd::geteuid();
    if !euid.is_root() {
        return Check::not_ok(NAME, true, format!("euid {euid}: forkd needs root"));
    }
    let status_path = "/proc/self/status";
    let effective = match fs::read_to_string(status_path) {
        Ok(text) => parse_cap_eff(&text),
        Err(e) => return Check::not_ok(NAME, true, format!("euid 0, but {status_path}: {e}")),
    };
    let Some(effective) = effective else {
        return Check::not_ok(
            NAME,
            true,
            format!("euid 0, but no CapEff line in {status_path}"),
        );
    };
    let missing: Vec<_> = CAPABILITIES
        .iter()
        .filter(|(bit, _, _)| effective & (1u64 << bit) == 0)
        .collect();
    if missing.is_empty() {
        return Check::ok(NAME, true, "euid 0");
    }
    let list = missing
        .iter()
        .map(|(_, name, effect)| format!("{name} ({effect})"))
        .collect::<Vec<_>>()
        .join(", ");
    let detail = format!("euid 0, but missing {list}");
    if missing.iter().any(|(bit, _, _)| *bit == 21) {
        Check::not_ok(NAME, true, detail)
    } else {
        Check::new(NAME, Status::Warn, true, detail)
    }
}

/// The effective capability mask from the text of `/proc/<pid>/status`.
fn parse_cap_eff(status: &str) -> Option<u64> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

// ---------------------------------------------------------------------------------------
// namespaces

/// (name in `/proc/self/ns`, `max_*_namespaces` sysctl, clone flag, required).
const NAMESPACES: &[(&str, &str, libc::c_int, bool)] = &[
    ("mnt", "max_mnt_namespaces", libc::CLONE_NEWNS, true),
    ("uts", "max_uts_namespaces", libc::CLONE_NEWUTS, true),
    ("ipc", "max_ipc_namespaces", libc::CLONE_NEWIPC, true),
    ("net", "max_net_namespaces", libc::CLONE_NEWNET, true),
    ("pid", "max_pid_namespaces", libc::CLONE_NEWPID, true),
    (
        "cgroup",
        "max_cgroup_namespaces",
        libc::CLONE_NEWCGROUP,
        true,
    ),
    ("user", "max_user_namespaces", libc::CLONE_NEWUSER, false),
    ("time", "max_time_namespaces", libc::CLONE_NEWTIME, false),
];

fn check_namespaces() -> Check {
    const NAME: &str = "namespaces";
    let mut problems = Vec::new();
    let mut optional_missing = Vec::new();
    let mut present = Vec::new();
    for &(ns, sysctl, _, required) in NAMESPACES {
        let problem = namespace_problem(ns, sysctl);
        match (problem, required) {
            (None, _) => present.push(ns),
            (Some(p), true) => problems.push(p),
            (Some(p), false) => optional_missing.push(p),
        }
    }
    if !problems.is_empty() {
        return Check::not_ok(NAME, true, problems.join("; "));
    }
    let flags = NAMESPACES
        .iter()
        .filter(|n| n.3)
        .fold(0, |acc, n| acc | n.2);
    if let Err(e) = try_unshare(flags) {
        return Check::not_ok(
            NAME,
            true,
            format!("unshare of mnt uts ipc net pid cgroup: {e}"),
        );
    }
    let mut detail = format!("{}; unshare works", present.join(" "));
    if optional_missing.is_empty() {
        Check::ok(NAME, true, detail)
    } else {
        detail.push_str(&format!("; optional: {}", optional_missing.join("; ")));
        Check::new(NAME, Status::Warn, true, detail)
    }
}

/// Why namespace `ns` cannot be used, if it cannot.
fn namespace_problem(ns: &str, sysctl: &str) -> Option<String> {
    let file = Path::new("/proc/self/ns").join(ns);
    if !file.exists() {
        return Some(format!("{} missing", file.display()));
    }
    let limit = Path::new("/proc/sys/user").join(sysctl);
    match fs::read_to_string(&limit) {
        Ok(text) if text.trim() == "0" => Some(format!("{ns} disabled ({} is 0)", limit.display())),
        Ok(_) => None,
        // An older kernel without the limit does not restrict the namespace.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(format!("{}: {e}", limit.display())),
    }
}

/// Creates the namespaces in `flags` in a child that exits at once (see
/// `forkd_sys::probe_unshare`). Proves more than the `/proc/self/ns` files do.
fn try_unshare(flags: libc::c_int) -> anyhow::Result<()> {
    forkd_sys::probe_unshare(flags, COMMAND_TIMEOUT).map_err(anyhow::Error::from)
}

// ---------------------------------------------------------------------------------------
// overlayfs

fn check_overlayfs() -> Check {
    const NAME: &str = "overlayfs";
    let filesystems = "/proc/filesystems";
    match fs::read_to_string(filesystems) {
        Ok(text) if has_filesystem(&text, "overlay") => {}
        Ok(_) => return Check::not_ok(NAME, true, format!("no overlay in {filesystems}")),
        Err(e) => return Check::not_ok(NAME, true, format!("{filesystems}: {e}")),
    }
    match overlay_probe() {
        Ok(how) => Check::ok(
            NAME,
            true,
            format!("mount as the daemon does, write to upper ({how})"),
        ),
        Err(e) => Check::not_ok(NAME, true, format!("{e:#}")),
    }
}

/// Whether the text of `/proc/filesystems` lists `fs` (lines are `[nodev]\t<name>`).
fn has_filesystem(text: &str, fs: &str) -> bool {
    text.lines()
        .any(|l| l.split_whitespace().last() == Some(fs))
}

/// A fresh directory under /tmp, removed again on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> anyhow::Result<Self> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            nanos.unwrap_or(0)
        ));
        fs::create_dir(&path).with_context(|| format!("create {}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Builds an overlay exactly as the daemon builds a sandbox's root (the same code:
/// `forkd_sys::mount::overlay`, a detached mount with one `lowerdir+` per layer), checks
/// that a lower file shows through and that a write through it lands in the upper
/// directory. The mount is detached, so it is in no mount table and goes with its
/// descriptor.
fn overlay_probe() -> anyhow::Result<String> {
    let tmp = TempDir::new("forkd-doctor")?;
    let [lower, upper, work] = ["lower", "upper", "work"].map(|d| tmp.0.join(d));
    for dir in [&lower, &upper, &work] {
        fs::create_dir(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let lower_file = lower.join("from-lower");
    fs::write(&lower_file, b"lower\n")
        .with_context(|| format!("write {}", lower_file.display()))?;
    let mnt = forkd_sys::mount::overlay(&[&lower], Some((&upper, &work)))
        .map_err(|e| anyhow::anyhow!("{}", error_chain(&e)))?;
    let merged = forkd_sys::mount::fd_path(std::os::fd::AsFd::as_fd(&mnt));
    let seen = merged.join("from-lower");
    let text = fs::read_to_string(&seen).with_context(|| format!("read {}", seen.display()))?;
    if text != "lower\n" {
        bail!("the overlay does not show the lower file's content");
    }
    let probe = merged.join("probe");
    fs::write(&probe, b"forkd\n").context("write through the overlay")?;
    drop(mnt);
    let landed = upper.join("probe");
    match fs::read(&landed) {
        Ok(bytes) if bytes == b"forkd\n" => {}
        Ok(_) => bail!(
            "{} has the wrong content after a write through the overlay",
            landed.display()
        ),
        Err(e) => bail!(
            "a write through the overlay did not reach {}: {e}",
            landed.display()
        ),
    }
    if lower.join("probe").exists() {
        bail!(
            "a write through the overlay reached the lower directory {}",
            lower.display()
        );
    }
    Ok(format!(
        "lowerdir+ on Linux {}, under {}",
        forkd_sys::mount::kernel_release(),
        tmp.0.parent().unwrap_or(Path::new("/")).display()
    ))
}

/// An error and its sources on one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        text.push_str(": ");
        text.push_str(&s.to_string());
        cur = s.source();
    }
    text
}

// ---------------------------------------------------------------------------------------
// cgroups

fn check_cgroups() -> Check {
    const NAME: &str = "cgroups";
    let hierarchy = match forkd_cgroups::Hierarchy::detect() {
        Ok(h) => h,
        Err(e) => return Check::not_ok(NAME, true, e.to_string()),
    };
    let version = hierarchy.version();
    let controllers = hierarchy.controllers();
    let has = |c: &str| controllers.iter().any(|x| x == c);
    let mut detail = format!("v{version}: {}", controllers.join(" "));
    let missing_required: Vec<_> = ["memory", "pids"].into_iter().filter(|c| !has(c)).collect();
    if !missing_required.is_empty() {
        detail.push_str(&format!(
            "; missing {} (limits need them)",
            missing_required.join(" ")
        ));
        return Check::not_ok(NAME, true, detail);
    }
    let mut warnings = Vec::new();
    if !has("cpu") {
        warnings.push("no cpu controller: CPU limits are not applied");
    }
    if version == 1 {
        if has("freezer") {
            detail.push_str("; freezer present (live checkpoints need it on v1)");
        } else {
            warnings.push("no freezer controller: live checkpoints need it on cgroup v1");
        }
    }
    let cgroup2 = forkd_sys::mountinfo::mounts()
        .unwrap_or_default()
        .into_iter()
        .find(|m| m.fstype == "cgroup2");
    match cgroup2 {
        Some(m) if m.super_options.split(',').any(|o| o == "favordynmods") => {
            detail.push_str(&format!(
                "; favordynmods on {} (cheap migrations)",
                m.mount_point.display()
            ))
        }
        Some(m) => detail.push_str(&format!(
            "; favordynmods off on {} (the daemon sets it unless FORKD_CGROUP_FAVOR_DYNMODS=0)",
            m.mount_point.display()
        )),
        None => {}
    }
    if warnings.is_empty() {
        Check::ok(NAME, true, detail)
    } else {
        detail.push_str(&format!("; {}", warnings.join("; ")));
        Check::new(NAME, Status::Warn, true, detail)
    }
}

// ---------------------------------------------------------------------------------------
// pidfd and userfaultfd

/// The data volume is btrfs (O(1) snapshots of sandbox layers): the kernel must know
/// btrfs and mkfs.btrfs must exist to format the volume image.
fn check_btrfs() -> Check {
    const NAME: &str = "btrfs";
    let known = std::fs::read_to_string("/proc/filesystems")
        .map(|t| {
            t.lines()
                .any(|l| l.split_whitespace().last() == Some("btrfs"))
        })
        .unwrap_or(false);
    if !known {
        return Check::not_ok(
            NAME,
            true,
            "btrfs is not in /proc/filesystems (the data volume needs it)".to_string(),
        );
    }
    match forkd_volume::require_tools() {
        Ok(()) => Check::ok(
            NAME,
            true,
            "kernel support and mkfs.btrfs present (data volume, O(1) snapshots)",
        ),
        Err(e) => Check::not_ok(NAME, true, format!("{e}")),
    }
}

fn check_pidfd() -> Check {
    const NAME: &str = "pidfd";
    if let Err(e) = forkd_sys::pidfd_open(std::process::id() as libc::pid_t) {
        return Check::not_ok(
            NAME,
            true,
            format!("pidfd_open on self: {e} (needs Linux >= 5.3)"),
        );
    }
    Check::ok(NAME, true, "pidfd_open works")
}

fn check_userfaultfd() -> Check {
    const NAME: &str = "userfaultfd";
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let e = match forkd_sys::userfaultfd(flags) {
        Ok(_) => return Check::ok(NAME, false, "userfaultfd works (lazy restore possible)"),
        Err(e) => e,
    };
    // CRIU falls back to the device (Linux >= 6.1) when the syscall is not allowed.
    let device = "/dev/userfaultfd";
    let device_error = match fs::OpenOptions::new().read(true).write(true).open(device) {
        Ok(_) => {
            let detail = format!("userfaultfd(2): {e}, but {device} opens read-write");
            return Check::ok(NAME, false, detail);
        }
        Err(dev_e) if dev_e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(dev_e) => format!("; {device}: {dev_e}"),
    };
    let sysctl = Path::new("/proc/sys/vm/unprivileged_userfaultfd");
    let kernel = if sysctl.exists() {
        ""
    } else {
        "; kernel lacks CONFIG_USERFAULTFD"
    };
    Check::not_ok(
        NAME,
        false,
        format!("userfaultfd(2): {e}{device_error}{kernel}; lazy restore unavailable"),
    )
}

// ---------------------------------------------------------------------------------------
// criu

fn check_criu(explicit: Option<&Path>) -> Check {
    const NAME: &str = "criu";
    let criu = match resolve_criu(explicit) {
        Ok(path) => path,
        Err(e) => return Check::not_ok(NAME, true, format!("{e:#}; run fixtures/setup.sh criu")),
    };
    let shown = criu.display();
    let version_out = match run_with_timeout(&criu, &["--version"]) {
        Ok(out) => out,
        Err(e) => return Check::not_ok(NAME, true, format!("{e:#}; run fixtures/setup.sh criu")),
    };
    let Some(version) = parse_criu_version(&version_out.stdout) else {
        let detail = format!("{shown} --version printed no `Version: X.Y` line");
        return Check::not_ok(NAME, true, detail);
    };
    let version_text = format!("{}.{}.{}", version.0, version.1, version.2);
    if !criu_version_ok(version) {
        let detail = format!(
            "{shown} is CRIU {version_text}; need >= {}.{} (Debian 12's 3.17 fails `criu check` \
             on this kernel); run fixtures/setup.sh criu",
            MIN_CRIU.0, MIN_CRIU.1
        );
        return Check::not_ok(NAME, true, detail);
    }
    let check_out = match run_with_timeout(&criu, &["check"]) {
        Ok(out) => out,
        Err(e) => return Check::not_ok(NAME, true, format!("{version_text} ({shown}): {e:#}")),
    };
    // The exit code is the verdict: CRIU logs harmless errors (rlimits, iptables).
    let passed = check_out.status.success();
    let last = criu_check_summary(&check_out.stdout, &check_out.stderr, passed);
    let last = last.unwrap_or("no output");
    if passed {
        let detail = format!("{version_text} ({shown}); check: {last}");
        // Set-up re-resolved the bundle because the pinned files had left the mirror:
        // it works, but it is not what the pins say, and that must be seen.
        let note = criu
            .parent()
            .and_then(|bin| bin.parent())
            .map(|p| p.join(".resolved"));
        match note.and_then(|p| std::fs::read_to_string(p).ok()) {
            Some(text) => {
                let installed = text.lines().nth(1).unwrap_or("").trim();
                Check::new(
                    NAME,
                    Status::Warn,
                    true,
                    format!("{detail}; NOT the pinned bundle ({installed}): run fixtures/criu/install.sh --repin and commit pins.txt"),
                )
            }
            None => Check::ok(NAME, true, detail),
        }
    } else {
        let status = check_out.status;
        let detail = format!("{version_text} ({shown}); `criu check` failed ({status}): {last}");
        Check::not_ok(NAME, true, detail)
    }
}

/// The CRIU to use, found by the daemon's own rules (`forkd_criu::Criu::locate`: the
/// explicit path, `$FORKD_CRIU`, the pinned install, `PATH`). Its version is checked
/// below with a bounded wait, and so is not required of the locator.
fn resolve_criu(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    match forkd_criu::Criu::locate(explicit) {
        Ok(c) => Ok(c.path),
        // Found but too old: reported with its version by the check itself.
        Err(forkd_criu::CriuError::TooOld { .. }) => forkd_criu::Criu::candidates(explicit)
            .into_iter()
            .find(|p| p.is_file())
            .context("criu not found"),
        Err(e) => Err(anyhow::anyhow!("{e}")),
    }
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// (major, minor, patch) from `criu --version` output (`Version: 4.1.1`, maybe followed
/// by a `GitID:` line). A missing patch level reads as 0.
fn parse_criu_version(output: &str) -> Option<(u32, u32, u32)> {
    let text = output
        .lines()
        .find_map(|l| l.trim().strip_prefix("Version:"))?
        .trim();
    let mut parts = text.split('.').map(|p| {
        let digits: String = p.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits.parse::<u32>().ok()
    });
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

fn criu_version_ok(version: (u32, u32, u32)) -> bool {
    (version.0, version.1) >= MIN_CRIU
}

/// The last meaningful line `criu check` printed: from stdout (`Looks good.`) when it
/// passed, from stderr (the error) when it failed. rlimit complaints are expected when
/// CAP_SYS_RESOURCE is missing and say nothing about the verdict.
fn criu_check_summary<'a>(stdout: &'a str, stderr: &'a str, passed: bool) -> Option<&'a str> {
    let meaningful = |l: &&str| !l.trim().is_empty() && !l.to_ascii_lowercase().contains("rlimit");
    let last_of = |text: &'a str| text.lines().rev().find(meaningful).map(str::trim);
    let (first, second) = if passed {
        (stdout, stderr)
    } else {
        (stderr, stdout)
    };
    last_of(first).or_else(|| last_of(second))
}

// ---------------------------------------------------------------------------------------
// qemu, kvm, kernel

/// Sandbox egress (docs/NETWORK.md): `nft` found and answering, and the pool clear of
/// the host's own addresses.
fn check_egress(criu: Option<&Path>) -> Check {
    const NAME: &str = "egress";
    let criu = resolve_criu(criu).ok();
    let nft = match forkd_net::locate_nft(criu.as_deref()) {
        Ok(n) => n,
        Err(e) => {
            return Check::not_ok(
                NAME,
                false,
                format!("{e}; sandboxes can only use --network none"),
            )
        }
    };
    let out = match run_with_timeout(&nft, &["list", "tables"]) {
        Ok(o) => o,
        Err(e) => return Check::not_ok(NAME, false, format!("{}: {e:#}", nft.display())),
    };
    if !out.status.success() {
        return Check::not_ok(
            NAME,
            false,
            format!(
                "{} list tables: {}: {}",
                nft.display(),
                out.status,
                one_line(&out.stderr)
            ),
        );
    }
    let pool =
        std::env::var("FORKD_EGRESS_POOL").unwrap_or_else(|_| forkd_net::DEFAULT_POOL.into());
    let pool: forkd_net::Net4 = match pool.parse() {
        Ok(p) => p,
        Err(e) => return Check::not_ok(NAME, false, format!("FORKD_EGRESS_POOL: {e}")),
    };
    let taken = nix::ifaddrs::getifaddrs()
        .map(|all| {
            all.filter(|i| !i.interface_name.starts_with(forkd_net::nft::LINK_PREFIX))
                .filter_map(|i| i.address.and_then(|a| a.as_sockaddr_in().map(|s| s.ip())))
                .filter(|a| pool.contains(*a))
                .count()
        })
        .unwrap_or(0);
    let note = if taken > 0 {
        format!("; {taken} host address(es) fall in the pool {pool} (their /30s are skipped)")
    } else {
        String::new()
    };
    Check::ok(
        NAME,
        false,
        format!("nft at {}, pool {pool}{note}", nft.display()),
    )
}

fn check_qemu() -> Check {
    const NAME: &str = "qemu";
    const QEMU: &str = "qemu-system-x86_64";
    let Some(qemu) = find_on_path(QEMU) else {
        return Check::not_ok(
            NAME,
            false,
            format!("{QEMU} not found on PATH; the QEMU guest needs it"),
        );
    };
    match run_with_timeout(&qemu, &["--version"]) {
        Ok(out) if out.status.success() => {
            let first = out.stdout.lines().next().unwrap_or("").trim();
            let version = first
                .strip_prefix("QEMU emulator version ")
                .unwrap_or(first);
            Check::ok(NAME, false, format!("{version} ({})", qemu.display()))
        }
        Ok(out) => Check::not_ok(
            NAME,
            false,
            format!("{} --version: {}", qemu.display(), out.status),
        ),
        Err(e) => Check::not_ok(NAME, false, format!("{e:#}")),
    }
}

fn check_kvm() -> Check {
    const NAME: &str = "kvm";
    const NOTE: &str = "checkpointable guests use TCG; KVM is not used";
    let dev = "/dev/kvm";
    match fs::OpenOptions::new().read(true).write(true).open(dev) {
        Ok(_) => Check::ok(NAME, false, format!("{dev} opens read-write ({NOTE})")),
        Err(e) => Check::not_ok(NAME, false, format!("{dev}: {e} ({NOTE})")),
    }
}

fn check_kernel() -> Check {
    const NAME: &str = "kernel";
    let path = "/proc/sys/kernel/osrelease";
    match fs::read_to_string(path) {
        Ok(release) => Check::ok(
            NAME,
            false,
            format!("Linux {} {}", release.trim(), std::env::consts::ARCH),
        ),
        Err(e) => Check::new(NAME, Status::Warn, false, format!("{path}: {e}")),
    }
}

// ---------------------------------------------------------------------------------------
// external programs

struct CommandOutput {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `program args`, capturing its output, and kills it after [`COMMAND_TIMEOUT`].
/// Errors name the program.
fn run_with_timeout(program: &Path, args: &[&str]) -> anyhow::Result<CommandOutput> {
    let shown = || format!("{} {}", program.display(), args.join(" "));
    let mut child = Command::new(program)
        .args(args.iter().map(OsStr::new))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("{}: cannot start", program.display()))?;
    // Readers drain the pipes while we wait, so a chatty program cannot block on a
    // full pipe. They are detached on timeout: a grandchild may hold the pipe open.
    let spawn_reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let stdout = spawn_reader(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = spawn_reader(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        match child
            .try_wait()
            .with_context(|| format!("{}: wait", shown()))?
        {
            Some(status) => break status,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "{}: no answer after {} s, killed",
                    shown(),
                    COMMAND_TIMEOUT.as_secs()
                );
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    Ok(CommandOutput {
        status,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_criu_versions() {
        assert_eq!(parse_criu_version("Version: 4.1.1\n"), Some((4, 1, 1)));
        assert_eq!(
            parse_criu_version("Version: 3.17.1\nGitID: v3.17.1\n"),
            Some((3, 17, 1))
        );
        assert_eq!(parse_criu_version("Version: 4.0\n"), Some((4, 0, 0)));
        assert_eq!(parse_criu_version("  Version:  4.2-rc1\n"), Some((4, 2, 0)));
        assert_eq!(
            parse_criu_version("GitID: v4.1\nVersion: 4.1\n"),
            Some((4, 1, 0))
        );
        assert_eq!(parse_criu_version("criu: command not found"), None);
        assert_eq!(parse_criu_version("Version: four"), None);
        assert_eq!(parse_criu_version("Version: 4"), None);
    }

    #[test]
    fn criu_4_0_is_the_minimum() {
        assert!(!criu_version_ok((3, 17, 1)));
        assert!(!criu_version_ok((3, 99, 99)));
        assert!(
            !criu_version_ok((4, 1, 1)),
            "4.1 cannot dump TCP or UDP sockets"
        );
        assert!(criu_version_ok((4, 2, 1)));
        assert!(criu_version_ok((5, 0, 0)));
    }

    #[test]
    fn criu_check_summary_skips_rlimit_noise() {
        let out = "Looks good.\n";
        let err = "Error (criu/util.c:123): rlimit: Can't setup RLIMIT_NOFILE for self\n";
        assert_eq!(criu_check_summary(out, err, true), Some("Looks good."));
        let err = "Error: vdso: Unexpected rt vDSO area bounds\nrlimit: Can't setup\n\n";
        assert_eq!(
            criu_check_summary("Version: 4.1\n", err, false),
            Some("Error: vdso: Unexpected rt vDSO area bounds")
        );
        assert_eq!(
            criu_check_summary("Looks good.\n", "", false),
            Some("Looks good.")
        );
        assert_eq!(criu_check_summary("", "rlimit: x\n", true), None);
    }

    #[test]
    fn parses_proc_helpers() {
        let status = "Name:\tx\nCapEff:\t000001ffffffffff\nCapBnd:\t0\n";
        assert_eq!(parse_cap_eff(status), Some(0x1ff_ffff_ffff));
        assert_eq!(parse_cap_eff("Name:\tx\n"), None);
        let filesystems = "nodev\tsysfs\nnodev\toverlay\n\text4\n";
        assert!(has_filesystem(filesystems, "overlay"));
        assert!(has_filesystem(filesystems, "ext4"));
        assert!(!has_filesystem(filesystems, "over"));
    }

    #[test]
    fn formats_aligned_lines() {
        let ns = Check::ok("namespaces", true, "mount uts ipc net pid cgroup");
        assert_eq!(
            render_line(&ns),
            "ok   namespaces      mount uts ipc net pid cgroup"
        );
        let criu = Check::not_ok("criu", true, "3.17.1\n too old ");
        assert_eq!(render_line(&criu), "FAIL criu            3.17.1 too old");
        let qemu = Check::not_ok("qemu", false, "not found");
        assert_eq!(render_line(&qemu), "warn qemu            not found");
        assert_eq!(render_line(&Check::ok("kvm", false, "")), "ok   kvm");
    }

    #[test]
    fn json_has_the_documented_fields() {
        let checks = [
            Check::not_ok("criu", true, "missing"),
            Check::not_ok("qemu", false, "x"),
        ];
        let value: serde_json::Value =
            serde_json::from_str(&render_json(&checks).unwrap()).unwrap();
        assert_eq!(
            value,
            serde_json::json!([
                {"check": "criu", "status": "fail", "required": true, "detail": "missing"},
                {"check": "qemu", "status": "warn", "required": false, "detail": "x"},
            ])
        );
    }

    #[test]
    fn exit_code_counts_only_required_failures() {
        let ok = Check::ok("a", true, "");
        let warn = Check::not_ok("b", false, "");
        let required_warn = Check::new("c", Status::Warn, true, "");
        let fail = Check::not_ok("d", true, "");
        assert_eq!(exit_code(&[ok.clone(), warn.clone(), required_warn]), 0);
        assert_eq!(exit_code(&[ok, warn, fail]), 1);
        assert_eq!(exit_code(&[]), 0);
    }

    /// Runs every check on this machine and reads the rendered reports back (their shape
    /// is checked either way); as root, every required check must pass.
    #[test]
    fn all_checks_render_and_agree_with_the_exit_code() {
        let checks = run_checks(&DoctorOptions::default());
        let names: Vec<_> = checks.iter().map(|c| c.check).collect();
        assert_eq!(
            names,
            [
                "root",
                "namespaces",
                "overlayfs",
                "cgroups",
                "btrfs",
                "pidfd",
                "userfaultfd",
                "criu",
                "egress",
                "qemu",
                "kvm",
                "kernel"
            ]
        );

        let text = render_human(&checks);
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), checks.len(), "one line per check:\n{text}");
        let mut required_failed_in_text = false;
        for (line, check) in lines.iter().zip(&checks) {
            let label = &line[..5];
            let status = match label.trim_end() {
                "ok" => Status::Ok,
                "warn" => Status::Warn,
                "FAIL" => Status::Fail,
                other => panic!("unknown status {other:?} in {line:?}"),
            };
            assert_eq!(status, check.status, "{line}");
            assert_eq!(
                line[5..].split_whitespace().next(),
                Some(check.check),
                "{line}"
            );
            if !check.required {
                assert_ne!(status, Status::Fail, "optional checks only warn: {line}");
            }
            required_failed_in_text |= status == Status::Fail && check.required;
        }
        assert_eq!(exit_code(&checks), i32::from(required_failed_in_text));

        let json: Vec<serde_json::Value> =
            serde_json::from_str(&render_json(&checks).unwrap()).unwrap();
        assert_eq!(json.len(), checks.len());
        for (value, check) in json.iter().zip(&checks) {
            assert_eq!(value["check"], check.check);
            assert!(
                ["ok", "warn", "fail"].contains(&value["status"].as_str().unwrap()),
                "{value}"
            );
            assert_eq!(value["required"], check.required);
            assert_eq!(value["detail"], check.detail.as_str());
        }
        println!("{text}");
        // As root on a machine set up as the README says (CI is one), every required
        // check passes.
        if forkd_sys::testing::require_root("doctor_required_checks_pass_as_root") {
            let failed: Vec<_> = checks
                .iter()
                .filter(|c| c.required && c.status == Status::Fail)
                .map(|c| format!("{}: {}", c.check, c.detail))
                .collect();
            assert!(failed.is_empty(), "required checks failed: {failed:?}");
            assert_eq!(exit_code(&checks), 0);
        }
    }
}
