//! The device nodes every sandbox root carries in its own `dev/`.
//!
//! A sandbox's `/dev` is a directory of its root filesystem, not a mount: the
//! daemon's runtime layer carries these nodes above the image's layers, and a
//! sandbox's set-up makes again (before it drops CAP_MKNOD) any its root lacks.
//! So they are part of every checkpoint's stack and of every branch forked from
//! one, and CRIU never has to save and restore a `/dev` tmpfs (an external tar
//! each way) on a live checkpoint or fork.
//!
//! Layers keep exactly these nodes, when they appear at `dev/NAME` with their
//! own numbers, so that an exported checkpoint imports with the same tree
//! hash; any other device node under `dev/` is skipped and one anywhere else
//! is rejected.

/// A character device of the standard set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    /// The name under `dev/`.
    pub name: &'static str,
    pub major: u32,
    pub minor: u32,
    /// Permission bits a new node gets.
    pub mode: u32,
}

/// null, zero, full, random, urandom and tty: what programs expect and nothing
/// that reaches a host resource.
pub const DEVICES: &[Device] = &[
    Device {
        name: "null",
        major: 1,
        minor: 3,
        mode: 0o666,
    },
    Device {
        name: "zero",
        major: 1,
        minor: 5,
        mode: 0o666,
    },
    Device {
        name: "full",
        major: 1,
        minor: 7,
        mode: 0o666,
    },
    Device {
        name: "random",
        major: 1,
        minor: 8,
        mode: 0o666,
    },
    Device {
        name: "urandom",
        major: 1,
        minor: 9,
        mode: 0o666,
    },
    Device {
        name: "tty",
        major: 5,
        minor: 0,
        mode: 0o666,
    },
];

/// Whether a character device at `rel` (a path relative to the root, `/`
/// separated, no leading `/` or `./`) with these numbers is one of
/// [`DEVICES`] in its place.
pub fn is_standard(rel: &[u8], major: u32, minor: u32) -> bool {
    let Some(name) = rel.strip_prefix(b"dev/") else {
        return false;
    };
    DEVICES
        .iter()
        .any(|d| d.name.as_bytes() == name && d.major == major && d.minor == minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_standard_nodes_in_their_places() {
        assert!(is_standard(b"dev/null", 1, 3));
        assert!(is_standard(b"dev/tty", 5, 0));
        // Right name, wrong numbers: /dev/null pointing at /dev/mem.
        assert!(!is_standard(b"dev/null", 1, 1));
        // Right numbers, wrong place.
        assert!(!is_standard(b"etc/null", 1, 3));
        assert!(!is_standard(b"dev/sub/null", 1, 3));
        assert!(!is_standard(b"dev/", 1, 3));
        assert!(!is_standard(b"dev/loop-control", 10, 237));
    }
}
