//! The audit log: one JSON line for every mutation a key asked for, and every request
//! refused for want of a key, in `ROOT/audit.log`, rotated by size (`audit.log.1` to
//! `.3`). Bodies are never written: they may carry credentials.

use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

/// Rotated files kept beside the live one.
const KEPT: u32 = 3;

#[derive(Serialize)]
pub struct Entry<'a> {
    /// Milliseconds since the epoch.
    pub t_ms: u64,
    /// The key's name; `null` when none was accepted.
    pub key: Option<&'a str>,
    pub peer: String,
    pub method: &'a str,
    pub path: &'a str,
    /// The operation's id (`createSandbox`); `null` when the path matched none.
    pub op: Option<&'static str>,
    /// The sandbox, checkpoint or image the request named or made.
    pub id: Option<String>,
    pub status: u16,
    pub request_id: &'a str,
}

pub struct Audit {
    path: PathBuf,
    max_bytes: u64,
    file: Mutex<Option<(std::fs::File, u64)>>,
}

impl Audit {
    pub fn new(root: &std::path::Path, max_bytes: u64) -> Audit {
        Audit {
            path: root.join("audit.log"),
            max_bytes,
            file: Mutex::new(None),
        }
    }

    /// Appends `entry`; a log that cannot be written is said on stderr, once a failure.
    pub fn write(&self, entry: &Entry) {
        let mut line = serde_json::to_vec(entry).expect("entries serialise");
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
            a.write(&Entry {
                t_ms: i,
                key: Some("k"),
                peer: "127.0.0.1:1".into(),
                method: "POST",
                path: "/v1/sandboxes",
                op: Some("createSandbox"),
                id: Some(format!("{i:08}")),
                status: 201,
                request_id: "r",
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
}
