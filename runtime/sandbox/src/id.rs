//! Typed sandbox ids, validated once so that a path built from one can never climb out
//! of the state root.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

pub const ID_LEN: usize = 16;

/// Defines a typed id: 16 lowercase hex characters, random, validated in `FromStr`.
macro_rules! hex_id {
    ($name:ident, $what:literal) => {
        #[doc = concat!("A ", $what, " id: 16 lowercase hex characters, random.")]
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// A fresh random id.
            pub fn random() -> Self {
                $name(random_hex(ID_LEN / 2))
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
            /// The 12-character form shown in tables.
            pub fn short(&self) -> &str {
                &self.0[..12]
            }
        }

        impl FromStr for $name {
            type Err = InvalidId;
            fn from_str(s: &str) -> Result<Self, InvalidId> {
                if s.len() == ID_LEN
                    && s.bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    Ok($name(s.to_string()))
                } else {
                    Err(InvalidId {
                        what: $what,
                        id: s.to_string(),
                    })
                }
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidId;
            fn try_from(s: String) -> Result<Self, InvalidId> {
                s.parse()
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

hex_id!(SandboxId, "sandbox");
hex_id!(CheckpointId, "checkpoint");

/// `n` random bytes from the kernel, as hex.
pub fn random_hex(n: usize) -> String {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("reading /dev/urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} id {id:?}: expected {ID_LEN} lowercase hex characters")]
pub struct InvalidId {
    pub what: &'static str,
    pub id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_validated() {
        let id = SandboxId::random();
        assert_eq!(id.as_str().len(), ID_LEN);
        assert_eq!(id.as_str().parse::<SandboxId>().unwrap(), id);
        for bad in [
            "",
            "..",
            "../../etc/passwd",
            "0123456789abcdeF",
            "0123456789abcde",
            "0123456789abcdef0",
        ] {
            assert!(bad.parse::<SandboxId>().is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<SandboxId>("\"../x\"").is_err());
    }
}
