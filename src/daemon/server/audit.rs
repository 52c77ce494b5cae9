//! The audit log: one JSON line for every mutation a key asked for, and every request
//! refused for want of a key, in `ROOT/audit.log`, rotated by size (`audit.log.1` to
//! `.3`). Bodies are never written: they may carry credentials. Refusals without a key
//! are written at most [`KEYLESS_PER_SECOND`] a second (the next one written says how
//! many were not), so that a flood of them cannot rotate away what keys did.

use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

/// Rotated files kept beside the live one.
const KEPT: u32 = 3;
/// Entries without a key written a second, at most.
pub const KEYLESS_PER_SECOND: u32 = 20;

/// Now, in milliseconds since the epoch (an entry's `t_ms`).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

#[derive(Serialize)]
pub struct Entry<'a> {
    /// Milliseconds since the epoch.
    pub t_ms: u64,
    /// The key's name; `null` when none was accepted.
    pub key: Option<&'a str>,
    /// The key's id (what owns what it made).
    pub key_id: Option<&'a str>,
    pub peer: String,
    pub method: &'a str,
    pub path: &'a str,
    /// The operation's id (`createSandbox`); `null` when the path matched none.
    pub op: Option<&'static str>,
    /// The sandbox, checkpoint or image the request named or made.
    pub id: Option<String>,
    pub status: u16,
    pub request_id: &'a str,
    /// Refusals without a key not written since the last one that was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suppressed: Option<u64>,
}

/// How many key-less entries this second, and how many went unwritten.
#[derive(Default)]
struct Keyless {
    second: u64,
    written: u32,
    suppressed: u64,
}

pub struct Audit {
    path: PathBuf,
    max_bytes: u64,
    file: Mutex<Option<(std::fs::File, u64)>>,
    keyless: Mutex<Keyless>,
}

impl Audit {
    pub fn new(root: &std::path::Path, max_bytes: u64) -> Audit {
        Audit {
            path: root.join("audit.log"),
            max_bytes,
            file: Mutex::new(None),
            keyless: Mutex::new(Keyless::default()),
        }
    }

    /// Appends `entry`; a log that cannot be written is said on stderr, once a failure.
    pub fn write(&self, mut entry: Entry) {
        if entry.key.is_none() {
            let mut k = self.keyless.lock().unwrap_or_else(|e| e.into_inner());
            let second = entry.t_ms / 1000;
            if k.second != second {
                (k.second, k.written) = (second, 0);
            }
            if k.written >= KEYLESS_PER_SECOND {
                k.suppressed += 1;
                return;
            }
            k.written += 1;
            if k.suppressed > 0 {
                entry.suppressed = Some(std::mem::take(&mut k.suppressed));
            }
        }
        let mut line = serde_json::to_vec(&entry).expect("entries serialise");
        line.push(b'\n');
        let mut held = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = self.append(&mut held, &line) {
            *held = None;
            super::log::warn(&format!("audit log {}: {e}", self.path.display()));
        }
    }

    fn append(&self, held: &mut Option<(std::fs::File, u64)>, line: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        if held
            .as_ref()
            .is_some_and(|(_, n)| *n + line.len() as u64 > self.max_bytes)
        {
            *held = None;
            for i in (1..KEPT).rev() {
                let _ = std::fs::rename(self.rotated(i), self.rotated(i + 1));
            }
            std::fs::rename(&self.path, self.rotated(1))?;
        }
        if held.is_none() {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&self.path)?;
            let n = f.metadata()?.len();
            *held = Some((f, n));
        }
        let (f, n) = held.as_mut().expect("opened above");
        f.write_all(line)?;
        *n += line.len() as u64;
        Ok(())
    }

    fn rotated(&self, i: u32) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(format!(".{i}"));
        PathBuf::from(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_rotates_and_keeps_three() {
        let dir = std::env::temp_dir().join(format!("forkd-audit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let a = Audit::new(&dir, 4096);
        for i in 0..200 {
            a.write(Entry {
                t_ms: i,
                key: Some("k"),
                key_id: Some("0123456789abcdef"),
                peer: "127.0.0.1:1".into(),
                method: "POST",
                path: "/v1/sandboxes",
                op: Some("createSandbox"),
                id: Some(format!("{i:08}")),
                status: 201,
                request_id: "r",
                suppressed: None,
            });
        }
        for i in 1..=3 {
            assert!(dir.join(format!("audit.log.{i}")).exists());
        }
        assert!(!dir.join("audit.log.4").exists());
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            assert!(
                std::fs::metadata(&f).unwrap().len() <= 4096,
                "{}",
                f.display()
            );
        }
        let last = std::fs::read_to_string(dir.join("audit.log")).unwrap();
        let line: serde_json::Value = serde_json::from_str(last.lines().last().unwrap()).unwrap();
        assert_eq!(line["id"], "00000199");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refusals_without_a_key_are_bounded_and_counted() {
        let dir = std::env::temp_dir().join(format!("forkd-audit-keyless-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let a = Audit::new(&dir, 1 << 20);
        let refusal = |t_ms| Entry {
            t_ms,
            key: None,
            key_id: None,
            peer: "127.0.0.1:1".into(),
            method: "GET",
            path: "/",
            op: None,
            id: None,
            status: 401,
            request_id: "r",
            suppressed: None,
        };
        for _ in 0..1000 {
            a.write(refusal(5_000));
        }
        a.write(refusal(6_000));
        let text = std::fs::read_to_string(dir.join("audit.log")).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), KEYLESS_PER_SECOND as usize + 1);
        assert_eq!(
            lines.last().unwrap()["suppressed"],
            1000 - KEYLESS_PER_SECOND as u64
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
