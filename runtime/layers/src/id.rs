//! Typed identifiers: [`TreeHash`] (a SHA-256 digest of a canonical tree
//! walk) and [`LayerId`] (a tree hash naming a sealed layer).
//!
//! Both print as 64 lowercase hex characters and serialize as that string.
//! A `LayerId` is validated once, in `FromStr`, so a path built from it can
//! never contain anything but hex digits.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A SHA-256 digest of a directory tree in the canonical format described in
/// [`crate::hash`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TreeHash(pub [u8; 32]);

/// The id of a sealed layer: the tree hash of its contents.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LayerId(TreeHash);

const HEX: &[u8; 16] = b"0123456789abcdef";

pub(crate) fn to_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 0xf)] as char);
    }
    s
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// True when `s` is only lowercase hex digits.
pub(crate) fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|c| hex_val(c).is_some())
}

/// Parses exactly 64 lowercase hex characters.
pub(crate) fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        out[i] = hex_val(pair[0])? << 4 | hex_val(pair[1])?;
    }
    Some(out)
}

impl TreeHash {
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
    pub fn to_hex(&self) -> String {
        to_hex(&self.0)
    }
}

impl fmt::Display for TreeHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for TreeHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TreeHash({self})")
    }
}

/// A string that is not 64 lowercase hex characters (a [`LayerError::InvalidId`] once
/// converted).
///
/// [`LayerError::InvalidId`]: crate::LayerError::InvalidId
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidHex(pub String);

impl fmt::Display for InvalidHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid layer id {:?}: expected 64 lowercase hex characters",
            self.0
        )
    }
}

impl std::error::Error for InvalidHex {}

impl FromStr for TreeHash {
    type Err = InvalidHex;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_hex32(s)
            .map(TreeHash)
            .ok_or_else(|| InvalidHex(s.to_owned()))
    }
}

impl LayerId {
    pub fn tree_hash(&self) -> TreeHash {
        self.0
    }
    pub fn to_hex(&self) -> String {
        self.0.to_hex()
    }
    /// The first 12 hex characters, for display only; resolve it back with
    /// [`crate::LayerStore::resolve_prefix`].
    pub fn short(&self) -> String {
        let mut s = self.to_hex();
        s.truncate(12);
        s
    }
}

impl From<TreeHash> for LayerId {
    fn from(h: TreeHash) -> Self {
        LayerId(h)
    }
}

impl fmt::Display for LayerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for LayerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LayerId({})", self.0)
    }
}

impl FromStr for LayerId {
    type Err = InvalidHex;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TreeHash::from_str(s).map(LayerId)
    }
}

macro_rules! serde_as_hex {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.to_hex())
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
serde_as_hex!(TreeHash);
serde_as_hex!(LayerId);

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn parse_and_print_round_trip() {
        let id: LayerId = SAMPLE.parse().unwrap();
        assert_eq!(id.to_string(), SAMPLE);
        assert_eq!(id.short(), "0123456789ab");
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{SAMPLE}\""));
        let back: LayerId = serde_json::from_str(&json).unwrap();
        assert_eq!(back, id);
    }

    #[test]
    fn rejects_bad_ids() {
        for bad in [
            "",
            "0123",
            &SAMPLE.to_uppercase(),
            &format!("{SAMPLE}0"),
            &SAMPLE.replace('a', "g"),
            "../../../../etc/passwd/0123456789abcdef0123456789abcdef012345678",
        ] {
            assert!(bad.parse::<LayerId>().is_err(), "{bad:?} accepted");
        }
        assert!(serde_json::from_str::<LayerId>("\"abc\"").is_err());
    }
}
