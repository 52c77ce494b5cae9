//! The benchmark's surroundings: configuration from the environment, skipping what
//! cannot run here, Ctrl-C, running external programs, temporary directories and
//! polling.

use anyhow::{anyhow, bail, Context, Result};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

// ---------------------------------------------------------------------------------------
// Configuration and skipping

/// A positive integer from the environment, or `default`.
pub fn env_usize(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| anyhow!("{name}={v:?}: expected a positive integer")),
        _ => Ok(default),
    }
}

/// A count from the environment (0 allowed: none), or `default`.
pub fn env_count(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<usize>()
            .map_err(|_| anyhow!("{name}={v:?}: expected a count (0 or more)")),
        _ => Ok(default),
    }
}

/// True when running in CI, where nothing may be skipped silently.
pub fn in_ci() -> bool {
    forkd_testing::in_ci()
}

/// Reports that `what` cannot be measured here. Outside CI this prints a `SKIP` line
/// and returns `Ok`; under `CI=true` it is an error.
pub fn skip(what: &str, reason: &str) -> Result<()> {
    if in_ci() {
        bail!("{what} cannot run: {reason} (CI=true: nothing may be skipped)");
    }
    println!("SKIP {what}: {reason}");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Interruption: Ctrl-C ends the run through the normal error path, so guards clean up.

/// Turns SIGINT and SIGTERM into a flag that [`check_interrupted`] reports.
pub fn install_interrupt_handler() {
    if let Err(e) = forkd_sys::flag_interrupts() {
        eprintln!("Ctrl-C will not clean up: {e}");
    }
}

pub fn check_interrupted() -> Result<()> {
    if forkd_sys::interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// External programs

/// Describes a command for error messages: `prog arg arg`.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().to_string();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs a command to completion, capturing its output; a failure names the command,
/// its exit status and its standard error.
pub fn run_checked(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {}", describe(cmd)))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// Runs a command and returns the wall time from spawn to exit, in microseconds.
/// Standard output is discarded; standard error is kept for the error message.
pub fn time_command(cmd: &mut Command) -> Result<u64> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let t = Instant::now();
    let out = cmd
        .output()
        .with_context(|| format!("run {}", describe(cmd)))?;
    let us = t.elapsed().as_micros() as u64;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(us)
}

// ---------------------------------------------------------------------------------------
// Temporary directories and waiting

/// A new, empty directory under the system's temporary directory.
pub fn unique_temp_dir(prefix: &str) -> Result<PathBuf> {
    let base = std::env::temp_dir();
    for attempt in 0..100u32 {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = base.join(format!(
            "{prefix}-{}-{:08x}",
            std::process::id(),
            nanos ^ attempt
        ));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("create {}", dir.display())),
        }
    }
    bail!("no free temporary directory name under {}", base.display())
}

/// Polls `f` every 100 ms until it holds (true) or `limit` has passed (false).
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}
