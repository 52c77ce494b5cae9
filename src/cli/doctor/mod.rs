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
//!
//! `features.rs` lists the kernel features newer than Linux 5.10 that forkd uses, with
//! what each needs and what is lost without it; `kernel.rs` checks what the kernel and
//! the machine offer (root and capabilities,
//! namespaces, overlayfs, cgroups, btrfs, pidfd, userfaultfd, KVM, the release);
//! `identity.rs` that files in a sandbox's root each have their own (st_dev, st_ino);
//! `programs.rs` the programs forkd drives (CRIU, nft for egress, QEMU). Each probe is
//! the runtime's own (`forkd_sys`, `forkd_cgroups`, `forkd_volume`, `forkd_criu`,
//! `forkd_net`), so what the doctor checks is what the daemon will do.

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
    // Overlays are made the way a daemon started here would make them.
    if let Ok(c) = crate::daemon::config::Config::from_env() {
        forkd_sys::set_program_dirs(c.path);
        if let Some(mode) = c.overlay_lowers {
            forkd_sys::mount::set_lower_mode(mode);
        }
    }
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
    let mut checks = vec![
        check_root(),
        check_namespaces(),
        check_overlayfs(),
        check_cgroups(),
        check_btrfs(),
        check_volume(),
        identity::check_identity(),
        check_pidfd(),
        check_userfaultfd(),
        check_random(),
        check_criu(opts.criu.as_deref()),
        check_templates(opts.criu.as_deref()),
        check_egress(opts.criu.as_deref()),
        check_qemu(),
        check_kvm(),
        check_kernel(),
        check_ceilings(),
    ];
    checks.extend(features::check_features(&forkd_sys::mount::kernel_release()));
    checks
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

mod features;
mod identity;
mod kernel;
mod programs;
#[cfg(test)]
mod tests;

use kernel::*;
use programs::*;

// ---------------------------------------------------------------------------------------
// external programs

pub(super) struct CommandOutput {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `program args`, capturing its output, and kills it after [`COMMAND_TIMEOUT`].
/// Errors name the program.
pub(super) fn run_with_timeout(program: &Path, args: &[&str]) -> anyhow::Result<CommandOutput> {
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
