//! E2B's messages as JSON: the control plane's (camelCase, its REST schema) and envd's
//! (proto3's JSON mapping: camelCase names, which the original snake_case names also
//! read as, `int64` as strings, `bytes` as base64, enums by name, defaults left out).

use forkd_api::{FsEntry, FsKind};
use serde::Deserialize;
use serde_json::{json, Value};

/// `POST /sandboxes` and `POST /v2/sandboxes`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    pub timeout: Option<u64>,
    pub metadata: Option<std::collections::BTreeMap<String, String>>,
    pub env_vars: Option<std::collections::BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access", alias = "allowInternetAccess")]
    pub allow_internet_access: Option<bool>,
    pub network: Option<SandboxNetwork>,
    pub secure: Option<bool>,
    pub auto_pause: Option<bool>,
}

/// A sandbox's network settings: the egress allowed and denied.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SandboxNetwork {
    pub allow_out: Option<Vec<String>>,
    pub deny_out: Option<Vec<String>>,
    pub allow_public_traffic: Option<bool>,
}

/// RFC 3339 (UTC, seconds) of a Unix time.
pub fn rfc3339(secs: u64) -> String {
    forkd_api::time::rfc3339(secs as i64, 0)
}

/// Go's `FileMode.String()` of a `st_mode`: what envd answers as `permissions`.
pub fn permissions(mode: u32, kind: FsKind) -> String {
    let first = match kind {
        FsKind::Dir => 'd',
        FsKind::Symlink => 'L',
        FsKind::File => '-',
        FsKind::Other => '?',
    };
    let mut s = String::with_capacity(10);
    s.push(first);
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

/// envd's `EntryInfo` of a forkd file entry; `None` for a kind envd has no name for.
pub fn entry_info(e: &FsEntry) -> Option<Value> {
    let kind = match e.kind {
        FsKind::File => "FILE_TYPE_FILE",
        FsKind::Dir => "FILE_TYPE_DIRECTORY",
        FsKind::Symlink => "FILE_TYPE_SYMLINK",
        FsKind::Other => return None,
    };
    let mut v = json!({
        "name": e.name,
        "type": kind,
        "path": e.path,
        "size": e.size.to_string(),
        "mode": e.mode & 0o7777,
        "permissions": permissions(e.mode, e.kind),
        "owner": e.owner,
        "group": e.group,
        "modifiedTime": forkd_api::time::rfc3339(
            e.modified_ns.div_euclid(1_000_000_000),
            e.modified_ns.rem_euclid(1_000_000_000) as u32,
        ),
    });
    if let Some(t) = &e.symlink_target {
        v["symlinkTarget"] = json!(t);
        v["isSymlink"] = json!(true);
    }
    Some(v)
}

/// A field of a proto3 JSON message by its JSON (camelCase) or original name.
pub fn field<'a>(v: &'a Value, camel: &str, snake: &str) -> Option<&'a Value> {
    v.get(camel)
        .or_else(|| v.get(snake))
        .filter(|f| !f.is_null())
}

/// A `uint32`/`int64` field, which proto3 JSON may give as a number or a string.
pub fn number(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_modes_read_as_go_prints_them() {
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(permissions(0o100644, FsKind::File), "-rw-r--r--");
        assert_eq!(permissions(0o40755, FsKind::Dir), "drwxr-xr-x");
        assert_eq!(permissions(0o120777, FsKind::Symlink), "Lrwxrwxrwx");
        assert_eq!(number(Some(&json!("12"))), Some(12));
        assert_eq!(number(Some(&json!(7))), Some(7));
        let v = json!({"exit_code": 3});
        assert_eq!(field(&v, "exitCode", "exit_code"), Some(&json!(3)));
    }
}
