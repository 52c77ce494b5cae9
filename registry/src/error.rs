//! The errors of a pull: each names the reference or registry, and the step.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("bad image reference {reference:?}: {reason}")]
    BadReference { reference: String, reason: String },
    #[error("bad digest {digest:?}: {reason}")]
    BadDigest { digest: String, reason: String },
    #[error("{}: {reason}", path.display())]
    Config { path: PathBuf, reason: String },
    #[error("{reference}: the registry is blocked by {files}")]
    Blocked { reference: String, files: String },
    #[error("{status} on {reference}: {reason}")]
    Auth {
        reference: String,
        status: u16,
        reason: String,
    },
    #[error("manifest unknown: {reference}")]
    ManifestUnknown { reference: String },
    #[error("{reference}: no {platform} in the index (it has: {available})")]
    NoPlatform {
        reference: String,
        platform: String,
        available: String,
    },
    #[error("{reference}: {what}")]
    Unsupported { reference: String, what: String },
    #[error("{reference}: {step}: HTTP {status} from {url}{}", detail_suffix(.detail))]
    Http {
        reference: String,
        step: String,
        url: String,
        status: u16,
        detail: String,
    },
    #[error("{reference}: {step}: {url}: {reason}")]
    Transport {
        reference: String,
        step: String,
        url: String,
        reason: String,
    },
    #[error("{reference}: {what} {expected} does not match what was received ({actual})")]
    Mismatch {
        reference: String,
        what: String,
        expected: String,
        actual: String,
    },
    #[error("{reference}: {what}: {reason}")]
    Invalid {
        reference: String,
        what: String,
        reason: String,
    },
    #[error("credentials for {registry} from {from}: {reason}")]
    Credentials {
        registry: String,
        from: String,
        reason: String,
    },
    #[error("{step} {}: {source}", path.display())]
    Io {
        step: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn detail_suffix(d: &str) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(": {d}")
    }
}

impl RegistryError {
    /// Whether the failure says something about the input (a reference, a file, a
    /// registry's answer) rather than this machine.
    pub fn is_user_error(&self) -> bool {
        !matches!(self, RegistryError::Io { .. })
    }

    /// Whether another endpoint (the next mirror) might do better.
    pub fn try_next_endpoint(&self) -> bool {
        matches!(
            self,
            RegistryError::ManifestUnknown { .. }
                | RegistryError::Http { .. }
                | RegistryError::Transport { .. }
                | RegistryError::Auth { .. }
        )
    }
}
