use super::*;

#[test]
fn unwritten_bytes_add_the_named_lines_of_memory_stat() {
    let v1 = "cache 8192\ndirty 4096\nwriteback 8192\ntotal_dirty 999\n";
    assert_eq!(stat_sum(v1, &["dirty", "writeback"]), Some(12288));
    let v2 = "anon 1\nfile_dirty 0\nfile_writeback 4096\n";
    assert_eq!(stat_sum(v2, &["file_dirty", "file_writeback"]), Some(4096));
    // A line missing or garbled: unknown, not zero.
    assert_eq!(stat_sum("dirty 4096\n", &["dirty", "writeback"]), None);
    assert_eq!(
        stat_sum("dirty x\nwriteback 0\n", &["dirty", "writeback"]),
        None
    );
    // A name is matched whole, not as a prefix of another.
    assert_eq!(
        stat_sum("dirty_x 5\ndirty 1\nwriteback 2\n", &["dirty", "writeback"]),
        Some(3)
    );
}

#[test]
fn detects_v1_layout() {
    let dir = std::env::temp_dir().join(format!("forkd-cg-test-{}", std::process::id()));
    for c in ["memory", "pids", "cpu"] {
        fs::create_dir_all(dir.join(c)).unwrap();
        fs::write(dir.join(c).join("cgroup.procs"), "").unwrap();
    }
    let h = Hierarchy::detect_at(&dir).unwrap();
    assert_eq!(h.version(), 1);
    assert_eq!(
        h.controllers(),
        &["memory".to_string(), "pids".into(), "cpu".into()]
    );
    let cg = Cgroup::new(&h, "forkd/abc");
    let dirs: Vec<PathBuf> = h.dirs(cg.name()).into_iter().map(|(_, d)| d).collect();
    assert_eq!(dirs[0], dir.join("memory/forkd/abc"));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn detects_v2_layout() {
    let dir = std::env::temp_dir().join(format!("forkd-cg2-test-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("cgroup.controllers"),
        "cpuset cpu io memory pids\n",
    )
    .unwrap();
    let h = Hierarchy::detect_at(&dir).unwrap();
    assert_eq!(h.version(), 2);
    assert!(h.controllers().contains(&"pids".to_string()));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_hierarchy_is_an_error_naming_the_root() {
    let dir = std::env::temp_dir().join(format!("forkd-cg0-test-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let err = Hierarchy::detect_at(&dir).unwrap_err().to_string();
    assert!(err.contains(&dir.display().to_string()), "{err}");
    fs::remove_dir_all(&dir).unwrap();
}
