//! Unit tests of the doctor's parsing and rendering, and the whole run as root.

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
    let value: serde_json::Value = serde_json::from_str(&render_json(&checks).unwrap()).unwrap();
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
            "volume",
            "identity",
            "pidfd",
            "userfaultfd",
            "random",
            "criu",
            "templates",
            "egress",
            "qemu",
            "kvm",
            "kernel",
            "ceilings",
            "mount-api",
            "pidfd-calls",
            "close_range",
            "cloexec-range",
            "rseq-dump",
            "favordynmods",
            "bdi-max-bytes",
            "memory-merge",
            "simple-quotas",
            "lowerdir+",
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
    if forkd_testing::require_root("doctor_required_checks_pass_as_root") {
        let failed: Vec<_> = checks
            .iter()
            .filter(|c| c.required && c.status == Status::Fail)
            .map(|c| format!("{}: {}", c.check, c.detail))
            .collect();
        assert!(failed.is_empty(), "required checks failed: {failed:?}");
        assert_eq!(exit_code(&checks), 0);
    }
}

#[test]
fn kernel_features_say_what_each_kernel_lacks() {
    let by_name = |release: &str| -> std::collections::BTreeMap<&'static str, Check> {
        features::check_features(release)
            .into_iter()
            .map(|c| (c.check, c))
            .collect()
    };
    let now = by_name("6.18.2");
    assert!(now.values().all(|c| c.status == Status::Ok), "{now:?}");
    let bookworm = by_name("6.1.0-27-amd64");
    assert_eq!(bookworm["favordynmods"].status, Status::Ok);
    for missing in ["bdi-max-bytes", "memory-merge", "lowerdir+"] {
        let c = &bookworm[missing];
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(
            c.detail.contains("not on 6.1.0-27-amd64") && c.detail.contains("without it"),
            "{c:?}"
        );
    }
    let bullseye = by_name("5.10.0-33-amd64");
    assert_eq!(bullseye["cloexec-range"].status, Status::Warn);
    assert_eq!(bullseye["favordynmods"].status, Status::Warn);
    assert_eq!(bullseye["close_range"].status, Status::Ok);
    assert_eq!(bullseye["rseq-dump"].status, Status::Warn);
    assert_eq!(bookworm["rseq-dump"].status, Status::Ok);
    // The running kernel is asked, not its version read: these machines' (6.18) has
    // every feature, and each probe that can ask must find it.
    let release = forkd_sys::mount::kernel_release();
    if forkd_sys::mount::kernel_version(&release).is_some_and(|v| v >= (6, 8)) {
        let running = by_name(&release);
        let missing: Vec<_> = running
            .values()
            .filter(|c| c.status != Status::Ok)
            .collect();
        assert!(missing.is_empty(), "{missing:?}");
    }
    let old = by_name("4.19.0");
    assert_eq!(
        old["mount-api"].status,
        Status::Fail,
        "a required feature missing fails"
    );
    assert_eq!(exit_code(&features::check_features("4.19.0")), 1);
    assert_eq!(exit_code(&features::check_features("5.10.0")), 0);
}
