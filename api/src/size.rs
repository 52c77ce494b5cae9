//! Sizes as people write them: `512m`, `2g`, `64kb`, `1048576` (bytes), shared by the
//! CLI's flags and the daemon's settings.

/// Parses sizes like `512m`, `2g`, `1048576`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = match t.trim_end_matches('b').chars().last() {
        Some('k') => (&t[..t.trim_end_matches('b').len() - 1], 1u64 << 10),
        Some('m') => (&t[..t.trim_end_matches('b').len() - 1], 1 << 20),
        Some('g') => (&t[..t.trim_end_matches('b').len() - 1], 1 << 30),
        _ => (t.trim_end_matches('b'), 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("invalid size {s:?} (use e.g. 512m, 2g)"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_parse() {
        assert_eq!(super::parse_size("512m").unwrap(), 512 << 20);
        assert_eq!(super::parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(super::parse_size("100").unwrap(), 100);
        assert_eq!(super::parse_size("64kb").unwrap(), 64 << 10);
        assert!(super::parse_size("lots").is_err());
        assert!(super::parse_size("99999999999999999g").is_err());
    }
}
