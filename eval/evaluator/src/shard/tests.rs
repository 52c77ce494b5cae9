use super::*;

#[test]
fn split_keeps_tasks_whole_and_in_order() {
    let t: Vec<String> = ["a", "b", "c", "d", "e"].map(String::from).to_vec();
    let s = split(&t, 2);
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].tasks, ["a", "c", "e"]);
    assert_eq!(s[1].tasks, ["b", "d"]);
    assert_eq!(split(&t, 9).len(), 5, "never more shards than tasks");
    assert_eq!(split(&t, 0).len(), 1, "at least one shard");
    assert!(split(&[], 3).is_empty());
}

#[test]
fn a_newer_attempt_fences_out_an_older_one() {
    let dir = std::env::temp_dir().join(format!("forkd-fence-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let old = Fence::take(&dir, "slurm:7_1.0", "n1").unwrap();
    assert_eq!(old.lost(), None);
    let new = Fence::take(&dir, "slurm:7_1.1", "n2").unwrap();
    assert_eq!(old.lost().as_deref(), Some("slurm:7_1.1"));
    assert_eq!(new.lost(), None);
    std::fs::remove_dir_all(&dir).unwrap();
}
