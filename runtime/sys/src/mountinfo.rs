//! Reading `/proc/self/mountinfo`: which mounts exist in this process's mount namespace.
//! (Plain parsing, no `unsafe`; here because every crate that looks at mounts uses it.)
//!
//! Each line is `id parent major:minor root mount-point options [optional...] - fstype
//! source super-options`; paths escape space, tab, newline and backslash as `\ooo`.

use std::path::{Path, PathBuf};

const MOUNTINFO: &str = "/proc/self/mountinfo";

/// One mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The filesystem's device, `major:minor`: two mounts of one superblock share it.
    pub device: String,
    pub mount_point: PathBuf,
    /// The mount's own options (`rw,nosuid,relatime`).
    pub mount_options: String,
    pub fstype: String,
    pub source: String,
    /// The filesystem's own options (`rw,cpu,cpuacct` for a cgroup hierarchy).
    pub super_options: String,
}

/// Every mount of this mount namespace, in mount order.
pub fn mounts() -> std::io::Result<Vec<Mount>> {
    let text = std::fs::read_to_string(MOUNTINFO)
        .map_err(|e| std::io::Error::new(e.kind(), format!("read {MOUNTINFO}: {e}")))?;
    Ok(parse(&text))
}

/// The topmost mount at exactly `path` (which must be canonical), if any.
pub fn mount_at(path: &Path) -> std::io::Result<Option<Mount>> {
    Ok(mounts()?.into_iter().rev().find(|m| m.mount_point == path))
}

/// Mount points strictly below `path` (which must be canonical).
pub fn mounts_below(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    Ok(mounts()?
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p != path && p.starts_with(path))
        .collect())
}

/// Parses the text of a mountinfo file.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (head, tail) = line.split_once(" - ")?;
            let mut head = head.split(' ').skip(2);
            let device = head.next()?;
            let mount_point = head.nth(1)?;
            let mount_options = head.next().unwrap_or("");
            let mut tail = tail.split(' ');
            let fstype = tail.next()?;
            let source = tail.next()?;
            let super_options = tail.next().unwrap_or("");
            Some(Mount {
                device: device.to_string(),
                mount_point: PathBuf::from(unescape(mount_point)),
                mount_options: mount_options.to_string(),
                fstype: unescape(fstype),
                source: unescape(source),
                super_options: unescape(super_options),
            })
        })
        .collect()
}

/// Undoes the kernel's `\ooo` octal escapes.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(b) = u8::from_str_radix(digits, 8) {
                out.push(b);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_with_optional_fields_and_escapes() {
        let text = "\
22 1 0:21 / /proc rw,nosuid shared:5 - proc proc rw
36 35 98:0 / /srv/forkd\\040state/vol rw,noatime master:1 shared:2 - btrfs /dev/loop3 rw,discard
";
        let mounts = parse(text);
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].device, "0:21");
        assert_eq!(mounts[1].device, "98:0");
        assert_eq!(mounts[1].mount_point, Path::new("/srv/forkd state/vol"));
        assert_eq!(mounts[1].fstype, "btrfs");
        assert_eq!(mounts[1].source, "/dev/loop3");
        assert_eq!(mounts[1].super_options, "rw,discard");
        assert_eq!(mounts[1].mount_options, "rw,noatime");
    }

    #[test]
    fn unescape_leaves_stray_backslashes() {
        assert_eq!(unescape("a\\134b"), "a\\b");
        assert_eq!(unescape("a\\9"), "a\\9");
        assert_eq!(unescape("end\\"), "end\\");
    }
}
