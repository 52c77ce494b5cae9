//! `favor_dynamic_changes` against the machine's real cgroup2 mount (root only).

use std::os::unix::fs::MetadataExt;

fn favordynmods_on() -> Option<bool> {
    forkd_sys::mountinfo::mounts()
        .unwrap()
        .into_iter()
        .find(|m| m.fstype == "cgroup2")
        .map(|m| m.super_options.split(',').any(|o| o == "favordynmods"))
}

use forkd_testing::skip;

#[test]
fn favordynmods_is_set_again_after_another_cgroup2_mount_clears_it() {
    let name = "favordynmods_is_set_again_after_another_cgroup2_mount_clears_it";
    if std::fs::metadata("/proc/self").map(|m| m.uid()).ok() != Some(0) {
        return skip(name, "needs root");
    }
    if forkd_sys::probe::cgroup_favordynmods() == Some(false) {
        // A kernel without the option (before 6.0) refuses the remount; the daemon asks
        // the probe first and says so once.
        let e = forkd_cgroups::favor_dynamic_changes()
            .unwrap_err()
            .to_string();
        assert!(e.contains("favordynmods"), "{e}");
        return;
    }
    let Some((point, _)) = forkd_cgroups::favor_dynamic_changes().unwrap() else {
        return skip(name, "this machine has no cgroup2 mount");
    };
    assert_eq!(
        favordynmods_on(),
        Some(true),
        "not set on {}",
        point.display()
    );
    let flags_before = forkd_sys::mountinfo::mount_at(&point)
        .unwrap()
        .unwrap()
        .mount_options;
    // Any new mount of cgroup2 without the option clears it for the whole hierarchy
    // (what CRIU does when it builds its own cgroup yard).
    let scratch = std::env::temp_dir().join(format!("forkd-cg2-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    nix::mount::mount(
        Some("none"),
        &scratch,
        Some("cgroup2"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    nix::mount::umount(&scratch).unwrap();
    std::fs::remove_dir(&scratch).unwrap();
    assert_eq!(
        favordynmods_on(),
        Some(false),
        "a plain cgroup2 mount left it set"
    );
    let (again, set_now) = forkd_cgroups::favor_dynamic_changes().unwrap().unwrap();
    assert_eq!(again, point);
    assert!(set_now, "reported as already set");
    assert_eq!(favordynmods_on(), Some(true));
    // The mount keeps its own flags.
    let m = forkd_sys::mountinfo::mount_at(&point).unwrap().unwrap();
    assert_eq!(m.mount_options, flags_before);
}
