//! forkd on the kernels its users run: Debian 11's Linux 5.10 and Debian 12's 6.1, the
//! distributions' own cloud kernels (fixtures/kernels/fetch.sh, pinned by version and
//! SHA-256), booted under QEMU (TCG) with this build of forkd, the CRIU bundle and the
//! busybox fixture in an initramfs (fixtures/kernels/initramfs.sh). The guest runs
//! fixtures/kernels/smoke.sh and reports on the serial console: doctor, the daemon,
//! an image import, a sandbox, exec and copy, a filesystem checkpoint and fork, a live
//! checkpoint of a counting shell loop forked into 4 branches that count on, memory
//! sharing refused by name (it needs Linux 6.4), a live checkpoint of a TCP service whose
//! 4 branches answer, a two-stage image build, egress to a host in a network namespace
//! the suite makes (and none without it), a QEMU machine under TCG (a counting boot
//! sector, fixtures/kernels/qemu-image.sh) checkpointed live into 2 branches that count
//! on, `forkd eval` on the mini suite and on a task in Harbor's format, and on 5.10 Harbor
//! itself (`harbor run` with the forkd backend, from a read-only disk with Harbor's venv,
//! fixtures/kernels/harbor-disk.sh).

#![forbid(unsafe_code)]

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const FORKD_INIT: &str = env!("CARGO_BIN_EXE_forkd-init");

/// Boots `suite`'s kernel with the smoke suite and the images in `images` beside the
/// busybox fixture, and with `harbor`, the Harbor step's disk; returns its `SMOKE` lines and
/// doctor's (`DOCTOR`).
fn boot(name: &str, suite: &str, images: &Path, harbor: bool) -> Option<Vec<String>> {
    if !can_run_criu(name) {
        return None;
    }
    let venv = cache_dir().join("harbor/venv/bin/harbor");
    if harbor
        && !require(
            name,
            venv.exists(),
            &format!("{} missing (run fixtures/setup.sh harbor)", venv.display()),
        )
    {
        return None;
    }
    let kernel = cache_dir().join(format!("kernels/{suite}/vmlinuz"));
    if !require(
        name,
        kernel.exists(),
        &format!(
            "{} missing (run fixtures/setup.sh kernels)",
            kernel.display()
        ),
    ) {
        return None;
    }
    let qemu = Path::new("/usr/bin/qemu-system-x86_64");
    if !require(
        name,
        qemu.exists(),
        "qemu-system-x86_64 missing (run fixtures/setup.sh packages)",
    ) {
        return None;
    }
    // The QEMU step's image (a machine booting a counting boot sector), made once.
    make_once("qemu-image.sh", &images.join("qemu.tar"));
    let dir = PathBuf::from(format!(
        "/tmp/forkd-test-kernel-{suite}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kernels");
    let mut cmd = Command::new("bash");
    if harbor {
        let disk = images.join("harbor.img");
        make_once("harbor-disk.sh", &disk);
        cmd.env("FORKD_KERNELS_DISK", disk);
    }
    // The guest powers off after the suite; TCG makes it take a few minutes.
    let out = cmd
        .arg(here.join("boot.sh"))
        .args([suite, BIN, FORKD_INIT])
        .arg(here.join("smoke.sh"))
        .arg(&dir)
        .arg("900")
        .env("FORKD_CACHE", cache_dir())
        .env("FORKD_KERNELS_IMAGES", images)
        .output()
        .unwrap();
    let serial = dir.join("serial.log");
    let text = String::from_utf8_lossy(&std::fs::read(&serial).unwrap_or_default()).into_owned();
    assert!(
        out.status.success(),
        "{}{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<String> = text
        .lines()
        .filter_map(|l| {
            ["SMOKE ", "DOCTOR "]
                .iter()
                .find_map(|m| l.find(m))
                .map(|i| l[i..].to_string())
        })
        .collect();
    assert!(
        lines.iter().any(|l| l == "SMOKE done"),
        "{suite}: the suite did not finish: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    // What each step said (with --nocapture): the QEMU step's time, the eval's rows.
    for l in &lines {
        eprintln!("{suite}: {l}");
    }
    Some(lines)
}

/// Runs fixtures/kernels/`script` `out` unless `out` exists (one image for both guests).
fn make_once(script: &str, out: &Path) {
    if out.exists() {
        return;
    }
    let made = Command::new("bash")
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/kernels")
                .join(script),
        )
        .arg(out)
        .env("FORKD_CACHE", cache_dir())
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&made.stderr)
    );
}

fn check(suite: &str, release: &str, harbor: bool, lines: &[String]) {
    let find = |step: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(&format!("SMOKE {step} ")))
            .unwrap_or_else(|| panic!("{suite}: no {step} step in {lines:#?}"))
            .clone()
    };
    assert!(find("kernel").contains(release), "{lines:#?}");
    for step in [
        "doctor",
        "daemon",
        "import",
        "run",
        "exec",
        "copy",
        "fs-checkpoint",
        "fs-fork",
        "live-checkpoint",
        "live-fork",
        "identity",
        "identity-branch",
        "tcp-service",
        "build",
        "egress",
        "no-network",
        "eval-validate",
        "eval-run",
        "eval-harbor",
        "qemu",
    ]
    .into_iter()
    .chain(harbor.then_some("harbor"))
    {
        let l = find(step);
        assert!(
            l.starts_with(&format!("SMOKE {step} ok")),
            "{suite}: {l}\n{lines:#?}"
        );
    }
    // Doctor's rows of kernel features, each the answer of a probe on a real older kernel
    // (where the feature has one): Debian carries none of these back, so each answer must
    // be the one the version gives.
    let version = forkd_sys::mount::kernel_version(release).unwrap();
    for (feature, since) in [
        ("mount-api", (5, 2)),
        ("pidfd-calls", (5, 3)),
        ("close_range", (5, 9)),
        ("cloexec-range", (5, 11)),
        ("rseq-dump", (5, 13)),
        ("favordynmods", (6, 0)),
        ("bdi-max-bytes", (6, 2)),
        ("memory-merge", (6, 4)),
        ("simple-quotas", (6, 7)),
        ("lowerdir+", (6, 8)),
    ] {
        let row = lines
            .iter()
            .find(|l| l.starts_with("DOCTOR ") && l.split_whitespace().nth(2) == Some(feature))
            .unwrap_or_else(|| panic!("{suite}: no doctor row {feature}: {lines:#?}"));
        let want = if version >= since { "ok" } else { "warn" };
        assert_eq!(row.split_whitespace().nth(1), Some(want), "{suite}: {row}");
    }
    assert!(
        find("overlay").contains("as links"),
        "{suite}: the overlay fallback: {lines:#?}"
    );
    assert_eq!(
        find("share-memory"),
        format!(
            "SMOKE share-memory refused forkd: share_memory: memory sharing needs Linux 6.4 (PR_SET_MEMORY_MERGE); this kernel is {release}"
        )
    );
    assert!(
        !lines.iter().any(|l| l.contains(" FAIL ")),
        "{suite}: {lines:#?}"
    );
}

/// One guest after the other: each has both CPUs of the host (two TCG guests at once on
/// two CPUs slow every step and make the suite's timing-bound checks ragged).
#[test]
fn debian_11_and_12_kernels_run_the_smoke_suite() {
    let name = "debian_11_and_12_kernels_run_the_smoke_suite";
    let images = Cleanup(
        std::env::temp_dir().join(format!("forkd-test-kernel-images-{}", std::process::id())),
    );
    // Harbor itself on the oldest kernel only: its Python start-up alone takes minutes
    // under TCG. (The evaluator runs the same Harbor task on both.)
    for (suite, release, harbor) in [
        ("bullseye", "5.10.0-32-cloud-amd64", true),
        ("bookworm", "6.1.0-50-cloud-amd64", false),
    ] {
        if let Some(lines) = boot(name, suite, &images.0, harbor) {
            check(suite, release, harbor, &lines);
        }
    }
}

/// The images and the disk (some 750 MB) go when the test ends, passed or not.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
