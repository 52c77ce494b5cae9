use super::*;
use std::os::unix::fs::symlink;

#[test]
fn dockerignore_last_match_wins_and_covers_children() {
    let ig = Ignore::parse("# c\n*.log\nbuild/\n!keep.log\n/secret\n");
    assert!(ig.excluded("a.log"));
    assert!(!ig.excluded("keep.log"));
    assert!(ig.excluded("build/x/y"));
    assert!(ig.excluded("secret"));
    assert!(!ig.excluded("src/a.log"));
    assert!(!ig.excluded("main.c"));
}

fn tree() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    fs::create_dir_all(r.join("src/sub")).unwrap();
    fs::write(r.join("src/a.py"), "a").unwrap();
    fs::write(r.join("src/sub/b.py"), "b").unwrap();
    fs::write(r.join("src/skip.log"), "x").unwrap();
    fs::write(r.join("top.txt"), "t").unwrap();
    fs::write(r.join(".dockerignore"), "**/*.log\n").unwrap();
    symlink("/etc", r.join("etc")).unwrap();
    symlink("top.txt", r.join("link")).unwrap();
    t
}

fn dests(s: &Selection) -> Vec<&str> {
    s.entries.iter().map(|e| e.dest_rel.as_str()).collect()
}

#[test]
fn select_follows_dockers_rules() {
    let t = tree();
    let c = Context::open(t.path()).unwrap();
    let s = c.select(&["src".into()], "/app").unwrap();
    assert!(s.dest_is_dir);
    assert_eq!(dests(&s), vec!["a.py", "sub", "sub/b.py"]);
    let s = c.select(&["top.txt".into()], "/x/renamed").unwrap();
    assert!(!s.dest_is_dir);
    assert_eq!(dests(&s), vec!["top.txt"]);
    let s = c
        .select(&["src/*.py".into(), "/top.txt".into()], "/d")
        .unwrap();
    assert!(s.dest_is_dir);
    assert_eq!(dests(&s), vec!["a.py", "top.txt"]);
    let s = c.select(&["link".into()], "/d/").unwrap();
    assert_eq!(
        s.entries[0].kind,
        EntryKind::Symlink {
            target: "top.txt".into()
        }
    );
    // Whole context, with the ignored file left out.
    let s = c.select(&[".".into()], "/d").unwrap();
    assert!(!dests(&s).contains(&"src/skip.log"));
    assert!(dests(&s).contains(&"src/sub/b.py"));
}

#[test]
fn select_refuses_escapes() {
    let t = tree();
    let c = Context::open(t.path()).unwrap();
    for (src, word) in [
        ("../x", "'..'"),
        ("src/../../x", "'..'"),
        ("etc/passwd", "symlink"),
        ("/etc/passwd", "symlink"),
        ("nope", "no such file"),
        ("src/skip.log", ".dockerignore"),
        ("*.none", "matches"),
        ("http://x/y", "URL"),
    ] {
        let e = c.select(&[src.into()], "/d/").unwrap_err();
        assert!(e.contains(word), "{src}: {e}");
    }
}

#[test]
fn digest_sees_content_not_time_and_tar_round_trips() {
    let t = tree();
    let c = Context::open(t.path()).unwrap();
    let d1 = c.select(&["src".into()], "/app").unwrap().digest().unwrap();
    let f = t.path().join("src/a.py");
    fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(std::time::SystemTime::UNIX_EPOCH)
        .unwrap();
    assert_eq!(
        c.select(&["src".into()], "/app").unwrap().digest().unwrap(),
        d1
    );
    fs::write(&f, "changed").unwrap();
    assert_ne!(
        c.select(&["src".into()], "/app").unwrap().digest().unwrap(),
        d1
    );
    let s = c.select(&["src".into()], "/app").unwrap();
    let tar = s.tar((7, 8), Some(0o600)).unwrap();
    let mut a = tar::Archive::new(&tar[..]);
    let got: Vec<(String, u64, u32)> = a
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.path().unwrap().display().to_string(),
                e.header().uid().unwrap(),
                e.header().mode().unwrap(),
            )
        })
        .collect();
    assert_eq!(got[0], ("a.py".into(), 7, 0o600));
    assert_eq!(got.len(), 3);
}

#[test]
fn owners_and_modes() {
    let passwd = "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n";
    let group = "root:x:0:\nstaff:x:50:\n";
    assert_eq!(resolve_owner("app", passwd, group), Ok((1000, 1000)));
    assert_eq!(resolve_owner("app:staff", passwd, group), Ok((1000, 50)));
    assert_eq!(resolve_owner("5:6", passwd, group), Ok((5, 6)));
    assert!(resolve_owner("ghost", passwd, group)
        .unwrap_err()
        .contains("ghost"));
    assert_eq!(parse_chmod("0755"), Ok(0o755));
    assert!(parse_chmod("999").is_err());
    assert_eq!(archive_kind(&[0x1f, 0x8b, 8]), Some("gzip"));
    assert_eq!(archive_kind(b"hello"), None);
}
