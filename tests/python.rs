//! The Python package's tests (`python/tests`, pytest) against a real daemon: the client
//! (sync and asyncio) on every call, its types against `docs/openapi.json`, and the
//! mini-swe-agent environment with mini-swe-agent's own DeterministicModel. They run with
//! the harness environment's Python (`FORKD_PYTHON`, made by `fixtures/setup.sh python`).

#![forbid(unsafe_code)]

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

#[test]
fn python_package_tests_pass_against_a_live_daemon() {
    let name = "python_package_tests_pass_against_a_live_daemon";
    if !can_run_criu(name) {
        return;
    }
    let Some(py) = harness_python(name) else {
        return;
    };
    let d = TestDaemon::start("python");
    let pkg = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python");
    let out = Command::new(&py)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(&pkg)
        .env("FORKD_SOCKET", &d.socket)
        .env("PYTHONPATH", pkg.join("src"))
        .env("MSWEA_SILENT_STARTUP", "1")
        .output()
        .expect("run pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "pytest failed:\n{text}");
    // Every test ran: none skipped, none deselected.
    let summary = text
        .lines()
        .rev()
        .find(|l| l.contains(" passed"))
        .unwrap_or_default();
    assert!(!summary.contains("skipped"), "{summary}");
    let passed: u32 = summary
        .split_whitespace()
        .zip(summary.split_whitespace().skip(1))
        .find(|(_, w)| w.starts_with("passed"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(0);
    assert!(passed >= 20, "only {passed} tests passed: {summary}");
}
