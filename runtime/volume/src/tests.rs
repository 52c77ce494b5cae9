use super::*;

#[test]
fn sizes() {
    assert_eq!(parse_size("256G"), Some(256 << 30));
    assert_eq!(parse_size("512m"), Some(512 << 20));
    assert_eq!(parse_size("1TiB"), Some(1 << 40));
    assert_eq!(parse_size("4096"), Some(4096));
    assert_eq!(parse_size(" 2 GB "), Some(2 << 30));
    for bad in ["", "G", "0", "12Q", "-1G", "1.5G", "99999999999T"] {
        assert_eq!(parse_size(bad), None, "{bad:?}");
    }
}

#[test]
fn paths_stay_inside_the_volume() {
    let volume = Volume {
        root: PathBuf::from("/state/vol"),
        loop_image: None,
        sysfs: Default::default(),
        settings: Settings::default(),
    };
    assert_eq!(
        volume.resolve(Path::new("a/b")).unwrap(),
        Path::new("/state/vol/a/b")
    );
    assert_eq!(
        volume.resolve(Path::new("/state/vol/a")).unwrap(),
        Path::new("/state/vol/a")
    );
    for bad in ["../x", "/state/other", "a/../../x", "/state/vol/a/.."] {
        let e = volume.resolve(Path::new(bad));
        assert!(
            matches!(e, Err(VolumeError::OutsideVolume { .. })),
            "{bad}: {e:?}"
        );
    }
    assert!(volume.split(Path::new("/state/vol")).is_err());
    let (_, parent, name) = volume.split(Path::new("a/b")).unwrap();
    assert_eq!(parent, Path::new("/state/vol/a"));
    assert_eq!(name.as_bytes(), b"b");
}
