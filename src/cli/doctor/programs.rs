//! Doctor checks of the programs forkd drives: CRIU (found by the daemon's own rules,
//! its version, `criu check`), nft and the address pool for egress, QEMU.

use super::*;

// ---------------------------------------------------------------------------------------
// criu

pub(super) fn check_criu(explicit: Option<&Path>) -> Check {
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

/// Whether the CRIU has restore templates (forkd's patch, docs/DESIGN.md "Memory shared
/// between branches"): `criu template` without arguments then says how it is used.
/// Optional: without them every branch reads its checkpoint's pages.
pub(super) fn check_templates(explicit: Option<&Path>) -> Check {
    const NAME: &str = "templates";
    let Ok(criu) = resolve_criu(explicit) else {
        return Check::not_ok(NAME, false, "no CRIU (see the criu check)");
    };
    match run_with_timeout(&criu, &["template"]) {
        Ok(out) if out.stderr.contains("Usage: criu template") => Check::ok(
            NAME,
            false,
            "branches of a live checkpoint share its memory copy-on-write",
        ),
        Ok(_) => Check::not_ok(
            NAME,
            false,
            format!(
                "{} has no restore templates: every branch reads its checkpoint's pages \
                 (time and memory in proportion to the state); fixtures/setup.sh criu builds forkd's",
                criu.display()
            ),
        ),
        Err(e) => Check::not_ok(NAME, false, format!("{e:#}")),
    }
}

/// The daemon's settings as a daemon started here would read them; defaults where they
/// do not read (the egress check names the bad one).
fn daemon_settings() -> crate::daemon::config::Config {
    crate::daemon::config::Config::from_env()
        .unwrap_or_else(|_| crate::daemon::config::Config::read(&|_| None).expect("defaults"))
}

/// The CRIU to use, found by the daemon's own rules (`forkd_criu::Criu::locate`: the
/// explicit path, `FORKD_CRIU`, the pinned install, the system's program directories).
/// Its version is checked below with a bounded wait, and so is not required of the
/// locator.
pub(super) fn resolve_criu(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let settings = daemon_settings().criu;
    match forkd_criu::Criu::locate(explicit, &settings) {
        Ok(c) => Ok(c.path),
        // Found but too old: reported with its version by the check itself.
        Err(forkd_criu::CriuError::TooOld { .. }) => {
            forkd_criu::Criu::candidates(explicit, &settings)
                .into_iter()
                .find(|p| p.is_file())
                .context("criu not found")
        }
        Err(e) => Err(anyhow::anyhow!("{e}")),
    }
}

pub(super) fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

pub(super) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// (major, minor, patch) from `criu --version` output (`Version: 4.1.1`, maybe followed
/// by a `GitID:` line). A missing patch level reads as 0.
pub(super) fn parse_criu_version(output: &str) -> Option<(u32, u32, u32)> {
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

pub(super) fn criu_version_ok(version: (u32, u32, u32)) -> bool {
    (version.0, version.1) >= MIN_CRIU
}

/// The last meaningful line `criu check` printed: from stdout (`Looks good.`) when it
/// passed, from stderr (the error) when it failed. rlimit complaints are expected when
/// CAP_SYS_RESOURCE is missing and say nothing about the verdict.
pub(super) fn criu_check_summary<'a>(
    stdout: &'a str,
    stderr: &'a str,
    passed: bool,
) -> Option<&'a str> {
    let meaningful = |l: &&str| !l.trim().is_empty() && !l.to_ascii_lowercase().contains("rlimit");
    let last_of = |text: &'a str| text.lines().rev().find(meaningful).map(str::trim);
    let (first, second) = if passed {
        (stdout, stderr)
    } else {
        (stderr, stdout)
    };
    last_of(first).or_else(|| last_of(second))
}

/// Sandbox egress (docs/NETWORK.md): `nft` found and answering, and the pool clear of
/// the host's own addresses.
pub(super) fn check_egress(criu: Option<&Path>) -> Check {
    const NAME: &str = "egress";
    let criu = resolve_criu(criu).ok();
    let nft = match forkd_net::locate_nft(daemon_settings().nft.as_deref(), criu.as_deref()) {
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
    // The pool the daemon would take, from the same settings.
    let pool = match crate::daemon::config::Config::from_env() {
        Ok(c) => c.egress_pool,
        Err(e) => return Check::not_ok(NAME, false, e.to_string()),
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

pub(super) fn check_qemu() -> Check {
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
