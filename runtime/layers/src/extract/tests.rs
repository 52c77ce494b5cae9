use super::*;

#[test]
fn normalize_strips_and_rejects() {
    assert_eq!(normalize(b"./a/b").unwrap(), vec![&b"a"[..], b"b"]);
    assert_eq!(
        normalize(b"/etc//passwd").unwrap(),
        vec![&b"etc"[..], b"passwd"]
    );
    assert!(normalize(b"./").unwrap().is_empty());
    assert!(normalize(b"../evil").is_err());
    assert!(normalize(b"/abs/../../evil").is_err());
    assert!(normalize(b"a/..").is_err());
    assert!(normalize(b"a\0b").is_err());
}

#[test]
fn sniffs_compression() {
    assert_eq!(sniff(&[0x1f, 0x8b, 8, 0]), Compression::Gzip);
    assert_eq!(sniff(&[0x28, 0xb5, 0x2f, 0xfd, 0]), Compression::Zstd);
    assert_eq!(sniff(b"\xfd7zXZ\0"), Compression::Xz);
    assert_eq!(sniff(b"etc/"), Compression::None);
}
