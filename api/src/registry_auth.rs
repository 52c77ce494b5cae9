//! The caller's registry credentials, as a request carries them: the header
//! `X-Registry-Config`, base64url (padded or not; standard base64 is taken too) of a JSON
//! object from registry host to credentials, Docker's form for the same header. A client
//! sends only the credentials for the registry of the image it asks for; a daemon that
//! gets the header uses those alone, and never keeps or logs them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The header's name.
pub const HEADER: &str = "X-Registry-Config";

/// One registry's credentials: a user and password, or an identity token (an OAuth
/// refresh token, Docker's `identitytoken`).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryAuth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identitytoken: Option<String>,
    /// Where the caller found them (a file, a helper), for messages; not a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        write!(f, "RegistryAuth({:?} from {:?})", self.username, self.from)
    }
}

/// Registry host to credentials.
pub type RegistryConfig = BTreeMap<String, RegistryAuth>;

/// The header's value for `config`.
pub fn encode(config: &RegistryConfig) -> String {
    let json = serde_json::to_vec(config).expect("credentials serialise");
    crate::b64::encode(&json)
        .replace('+', "-")
        .replace('/', "_")
        .trim_end_matches('=')
        .to_string()
}

/// The credentials a header's value carries; the error never quotes the value.
pub fn decode(value: &str) -> Result<RegistryConfig, String> {
    let mut text: String = value
        .trim()
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    let pad = (4 - text.len() % 4) % 4;
    text.extend(std::iter::repeat_n('=', pad));
    let bytes = crate::b64::decode(&text).map_err(|e| format!("{HEADER} is not base64 ({e})"))?;
    // serde's message may quote a value (a secret): say only what kind of error, where.
    serde_json::from_slice(&bytes).map_err(|e| {
        format!(
            "{HEADER} is not a JSON object of registry hosts and credentials ({:?} error at line {}, column {})",
            e.classify(),
            e.line(),
            e.column()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_round_trips_and_never_shows_a_secret() {
        let mut c = RegistryConfig::new();
        c.insert(
            "127.0.0.1:5000".into(),
            RegistryAuth {
                username: Some("docker".into()),
                password: Some("s3cr?t>>".into()),
                identitytoken: None,
                from: Some("/x/auth.json".into()),
            },
        );
        let v = encode(&c);
        assert!(
            !v.contains('=') && !v.contains('+') && !v.contains('/'),
            "{v}"
        );
        assert_eq!(decode(&v).unwrap(), c);
        assert!(!format!("{c:?}").contains("s3cr"));
        let e = decode("not base64 at all!").unwrap_err();
        assert!(e.contains(HEADER), "{e}");
        assert!(decode(&crate::b64::encode(b"[1]")).is_err());
        // A value of the wrong shape is not quoted back.
        let e = decode(&crate::b64::encode(
            br#"{"r": {"password": 7, "username": "hunter2-secret"}}"#,
        ))
        .unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
        let e = decode(&crate::b64::encode(br#"{"password": "hunter2-secret"}"#)).unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
    }
}
