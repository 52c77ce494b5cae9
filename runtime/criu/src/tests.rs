//! Unit tests of the driver's pure parts: failures explained, versions, logs, the
//! host's cgroup hierarchies.

use crate::cgroups::*;
use crate::diagnose::*;
use crate::swrk::is_criu_helper;
use crate::*;

#[test]
fn known_failures_are_explained() {
    let e = vec![
        "Can't get rlimit 0: Operation not permitted".to_string(),
        "Dump core (pid: 4000000000) failed with -1".to_string(),
    ];
    let why = explain(&e).unwrap();
    assert!(
        why.contains("CAP_SYS_RESOURCE") && why.contains("other than root"),
        "{why}"
    );
    assert_eq!(explain(&["Can't dump fd 5".to_string()]), None);
}

#[test]
fn the_process_a_dump_stopped_at_is_named() {
    let e = vec![
        "inet: In-flight connection (l) for 54d9e5".to_string(),
        "Dump files (pid: 23359) failed with -1".to_string(),
    ];
    assert_eq!(culprit_pid(&e), Some(23359));
    assert_eq!(culprit_pid(&["Dumping FAILED.".to_string()]), None);
    // This very process, as /proc tells it.
    let me = describe_process(std::process::id()).unwrap();
    let argv0 = std::env::args().next().unwrap();
    assert!(me.contains(&argv0[..argv0.len().min(100)]), "{me}");
    assert!(describe_process(u32::MAX).is_none());
}

#[test]
fn versions_parse() {
    assert_eq!(parse_version("Version: 4.1.1\n"), Some((4, 1)));
    assert_eq!(
        parse_version("Version: 3.17.1\nGitID: v3.17\n"),
        Some((3, 17))
    );
    assert_eq!(parse_version("Version: 4.0\n"), Some((4, 0)));
    assert_eq!(parse_version("garbage"), None);
}

#[test]
fn log_tail_prefers_error_lines() {
    let dir = std::env::temp_dir().join(format!("forkd-criu-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("dump.log");
    std::fs::write(&log, "(00.0) Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self\n(00.1) a\n(00.2) Error (criu/files.c:1): Can't dump fd 5\n(00.3) b\n").unwrap();
    assert_eq!(log_errors(&log), vec!["Can't dump fd 5".to_string()]);
    assert!(log_tail(&log).contains("Can't dump fd 5"));
    assert!(!log_tail(&log).contains("RLIMIT"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn hierarchies_of_a_hybrid_v1_host() {
    let own = "12:pids:/a\n5:cpu,cpuacct:/a\n1:name=systemd:/a\n0::/a\n";
    let mi = "\
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
34 30 0:30 / /sys/fs/cgroup/my\\040pids rw - cgroup cgroup rw,pids
";
    let h = parse_hierarchies(own, mi).unwrap();
    assert_eq!(
        h,
        vec![
            ("pids".to_string(), PathBuf::from("/sys/fs/cgroup/my pids")),
            (
                "cpu,cpuacct".to_string(),
                PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")
            ),
            (
                "systemd".to_string(),
                PathBuf::from("/sys/fs/cgroup/systemd")
            ),
            (
                "unified".to_string(),
                PathBuf::from("/sys/fs/cgroup/unified")
            ),
        ]
    );
}

#[test]
fn the_host_cgroup_root_is_a_yard_only_when_named_as_criu_names() {
    let hybrid = vec![
        ("pids".to_string(), PathBuf::from("/sys/fs/cgroup/pids")),
        (
            "systemd".to_string(),
            PathBuf::from("/sys/fs/cgroup/systemd"),
        ),
        (
            "unified".to_string(),
            PathBuf::from("/sys/fs/cgroup/unified"),
        ),
    ];
    assert_eq!(host_yard(&hybrid), Some(PathBuf::from("/sys/fs/cgroup")));
    let v2 = vec![("unified".to_string(), PathBuf::from("/sys/fs/cgroup"))];
    assert_eq!(host_yard(&v2), None);
    let mut odd = hybrid.clone();
    odd[0].1 = PathBuf::from("/cgroups/pids");
    assert_eq!(host_yard(&odd), None);
}

#[test]
fn hierarchies_of_a_v2_host_and_a_missing_mount() {
    let mi = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
    assert_eq!(
        parse_hierarchies("0::/x\n", mi).unwrap(),
        vec![("unified".to_string(), PathBuf::from("/sys/fs/cgroup"))]
    );
    let err = parse_hierarchies("3:memory:/x\n", mi).unwrap_err();
    assert!(err.to_string().contains("\"memory\""), "{err}");
}

#[test]
fn criu_helpers_are_told_by_their_title_however_criu_was_started() {
    // Started directly.
    assert!(is_criu_helper(b"criu: restore --rpc\0\0\0"));
    // Started through a bundle's loader: the title comes after the loader's arguments.
    assert!(is_criu_helper(
        b"/opt/forkd/criu/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2\0--preload\0/opt/forkd/criu/lib/forkd/rlimit-shim.so\0--library-path\0/opt/x\0criu: restore --rpc\0\0."
    ));
    // CRIU itself, and other children of the daemon, are not helpers.
    assert!(!is_criu_helper(b"/opt/forkd/criu/usr/sbin/criu\0swrk\03\0"));
    assert!(!is_criu_helper(b"forkd-init\0__init\0"));
    assert!(!is_criu_helper(b"/usr/bin/criu-wrapper\0"));
}
