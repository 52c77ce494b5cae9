//! Start states shipped between nodes. In a sharded run the node that builds a task's
//! clean or residual start state exports it once, as a checkpoint archive, to the run's
//! shared directory: `RUN/archives/<task>/<state>.forkd`, with a record beside it
//! (`<state>.json`: the checkpoint it was made from, the archive's SHA-256 and size, the
//! stack's tree hash, the node). A node that needs a state it does not hold imports the
//! archive instead of building the state again.
//!
//! Archives are thin: the layers of the daemon's store (the run's images, forkd's runtime
//! layer) are named by tree hash, not written, since every node imports the run's images
//! before its states; only what a state added travels. A node lacking a named layer
//! builds the state itself (and exports it again).
//!
//! An archive is checked twice before it is used: the whole file against the record
//! (SHA-256 and size), and, by the daemon's import, every member against the archive's
//! own manifest and every layer's and the stack's tree hash; the imported checkpoint's
//! tree hash must then equal the recorded one. An archive that fails is moved aside
//! (`<state>.forkd.refused-<time>`), its record removed, and the caller builds the state
//! again (and exports it again).

use super::session::Session;
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};

/// What is known of one exported start state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ArchiveRecord {
    pub task: String,
    /// `clean`, or the residual state's id.
    pub state: String,
    /// The checkpoint exported, on the node that built it.
    pub checkpoint: String,
    pub node: String,
    /// The archive's file name, beside the record.
    pub archive: String,
    pub sha256: String,
    pub bytes: u64,
    /// The checkpoint's tree hash (SHA-256 over its layers' tree hashes).
    pub tree_hash: String,
    pub exported: u64,
    pub export_ms: u64,
}

/// Why an archive was not used.
#[derive(Debug)]
pub struct Refused {
    pub archive: PathBuf,
    pub reason: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "archive {} refused: {}",
            self.archive.display(),
            self.reason
        )
    }
}

/// One archive written or read by a node, as the shard's `transfers.jsonl` records it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Transfer {
    /// `export` (the daemon's export and the file's hash) or `import` (the file's hash,
    /// the daemon's import and verification, the tree hash compared).
    pub kind: String,
    pub task: String,
    pub state: String,
    pub node: String,
    pub bytes: u64,
    pub ms: u64,
}

/// The shared directory of a sharded run's start states.
pub struct StateArchives {
    dir: PathBuf,
    node: String,
    /// Where this node's transfers are recorded.
    log: PathBuf,
}

impl StateArchives {
    /// `RUN/archives` of the run at `top`; `node` names this node in the records;
    /// `log` is the file (JSON lines) where its exports and imports are recorded.
    pub fn new(top: &Path, node: &str, log: &Path) -> StateArchives {
        StateArchives {
            dir: top.join("archives"),
            node: node.to_string(),
            log: log.to_path_buf(),
        }
    }

    fn transfer(&self, kind: &str, task: &str, state: &str, bytes: u64, ms: u64) {
        let t = Transfer {
            kind: kind.into(),
            task: task.into(),
            state: state.into(),
            node: self.node.clone(),
            bytes,
            ms,
        };
        // A timing record: losing it loses no result, so a failed write only warns.
        if let Err(e) = super::records::append_jsonl(&self.log, &t) {
            eprintln!("[eval] {}: {e}", self.log.display());
        }
    }

    fn paths(&self, task: &str, state: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        for part in [task, state] {
            anyhow::ensure!(
                !part.is_empty()
                    && part != "."
                    && part != ".."
                    && !part.contains('/')
                    && !part.contains('\0'),
                "start state {task}/{state}: not usable as a file name"
            );
        }
        let d = self.dir.join(task);
        Ok((
            d.join(format!("{state}.forkd")),
            d.join(format!("{state}.json")),
        ))
    }

    /// The record of an exported state, if there is one.
    pub fn record(&self, task: &str, state: &str) -> Option<ArchiveRecord> {
        let (_, rec) = self.paths(task, state).ok()?;
        serde_json::from_slice(&std::fs::read(rec).ok()?).ok()
    }

    /// Exports `checkpoint` as the archive of `task`/`state`, unless that checkpoint is
    /// already the recorded one. The archive is written under a temporary name and
    /// renamed by the daemon; the record after it, the same way.
    pub fn publish(
        &self,
        s: &Session,
        task: &str,
        state: &str,
        checkpoint: &str,
    ) -> anyhow::Result<ArchiveRecord> {
        let (archive, rec_path) = self.paths(task, state)?;
        if let Some(r) = self.record(task, state) {
            if r.checkpoint == checkpoint && archive.exists() {
                return Ok(r);
            }
        }
        std::fs::create_dir_all(archive.parent().expect("archive dir"))?;
        let archive = std::path::absolute(&archive)?;
        let t = std::time::Instant::now();
        // Thin: the node importing it holds the run's images (every shard imports them
        // first), so only what the start state added travels.
        let body = serde_json::json!({ "path": archive, "thin": true });
        let out: serde_json::Value = s
            .client
            .call(
                "POST",
                &format!("/v1/checkpoints/{checkpoint}/export"),
                Some(&body),
            )
            .map_err(|e| {
                anyhow::anyhow!("export start state {task}/{state} (checkpoint {checkpoint}): {e}")
            })?;
        let tree_hash = out["tree_hash"].as_str().unwrap_or_default().to_string();
        anyhow::ensure!(
            !tree_hash.is_empty(),
            "export of {task}/{state}: the daemon named no tree hash"
        );
        let (sha256, bytes) = file_sha256(&archive)?;
        let r = ArchiveRecord {
            task: task.into(),
            state: state.into(),
            checkpoint: checkpoint.into(),
            node: self.node.clone(),
            archive: archive
                .file_name()
                .expect("file name")
                .to_string_lossy()
                .into(),
            sha256,
            bytes,
            tree_hash,
            exported: super::now_secs(),
            export_ms: t.elapsed().as_millis() as u64,
        };
        write_atomic(&rec_path, &serde_json::to_vec_pretty(&r)?)?;
        self.transfer("export", task, state, bytes, r.export_ms);
        eprintln!(
            "[eval] exported {task}/{state}: {} ({:.1} MiB in {} ms)",
            archive.display(),
            bytes as f64 / 1048576.0,
            r.export_ms
        );
        Ok(r)
    }

    /// The local checkpoint holding `task`/`state`: the recorded one, if this node has
    /// it (built here, or imported before), else imported from the archive. `Ok(None)`:
    /// nothing was exported. `Err`: the archive was refused and moved aside.
    pub fn resolve(
        &self,
        s: &Session,
        task: &str,
        state: &str,
    ) -> anyhow::Result<Result<Option<String>, Refused>> {
        let Some(r) = self.record(task, state) else {
            return Ok(Ok(None));
        };
        let (archive, _) = self.paths(task, state)?;
        let held = s.checkpoints().map_err(|e| anyhow::anyhow!("{e}"))?;
        if let Some(c) = held.iter().find(|c| {
            (c.id == r.checkpoint || c.labels.get("forkd.imported-from") == Some(&r.checkpoint))
                && c.tree_hash.as_deref().is_none_or(|h| h == r.tree_hash)
        }) {
            return Ok(Ok(Some(c.id.clone())));
        }
        let refuse = |reason: String| -> anyhow::Result<Result<Option<String>, Refused>> {
            let aside = archive.with_extension(format!("forkd.refused-{}", super::now_secs()));
            let _ = std::fs::rename(&archive, &aside);
            let (_, rec) = self.paths(task, state)?;
            let _ = std::fs::remove_file(rec);
            eprintln!("[eval] archive {} refused: {reason}", archive.display());
            Ok(Err(Refused {
                archive: archive.clone(),
                reason,
            }))
        };
        let t = std::time::Instant::now();
        let (sha, bytes) = match file_sha256(&archive) {
            Ok(x) => x,
            Err(e) => return refuse(format!("unreadable: {e}")),
        };
        if sha != r.sha256 || bytes != r.bytes {
            return refuse(format!(
                "the file is not the one exported (SHA-256 {sha}, {bytes} bytes; recorded {}, {} bytes)",
                r.sha256, r.bytes
            ));
        }
        let body = serde_json::json!({ "path": std::path::absolute(&archive)? });
        let info: forkd_api::CheckpointInfo =
            match s.client.call("POST", "/v1/checkpoints/import", Some(&body)) {
                Ok(i) => i,
                // The daemon refuses an archive that fails its own verification (400);
                // anything else is the node's problem, not the archive's.
                Err(forkd_api::client::ClientError::Api(e))
                    if e.kind == forkd_api::ErrorKind::BadRequest =>
                {
                    return refuse(format!("the daemon's verification: {}", e.message))
                }
                // A thin archive naming a layer this node lacks (its images or forkd's
                // runtime layer differ from the exporter's): not a damaged archive, so
                // not moved aside; this node builds the state itself.
                Err(forkd_api::client::ClientError::Api(e))
                    if e.kind == forkd_api::ErrorKind::Conflict =>
                {
                    eprintln!(
                        "[eval] archive {} not usable on node {}: {}; building {task}/{state} here",
                        archive.display(),
                        self.node,
                        e.message
                    );
                    return Ok(Ok(None));
                }
                Err(e) => anyhow::bail!("import {}: {e}", archive.display()),
            };
        if info.tree_hash.as_deref() != Some(r.tree_hash.as_str()) {
            s.remove_checkpoint(&info.id);
            return refuse(format!(
                "imported tree hash {:?}, recorded {}",
                info.tree_hash, r.tree_hash
            ));
        }
        let ms = t.elapsed().as_millis() as u64;
        self.transfer("import", task, state, bytes, ms);
        eprintln!(
            "[eval] imported {task}/{state} from {} as {} ({ms} ms, verified)",
            archive.display(),
            info.id,
        );
        Ok(Ok(Some(info.id)))
    }
}

/// SHA-256 (hex) and size of a file.
pub fn file_sha256(path: &Path) -> std::io::Result<(String, u64)> {
    use sha2::Digest;
    let mut f = std::fs::File::open(path)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((h.finalize().iter().map(|b| format!("{b:02x}")).collect(), n))
}

/// Writes `path` whole or not at all (a temporary file beside it, renamed).
pub fn write_atomic(path: &Path, body: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, body)?;
    std::fs::rename(&tmp, path)
}
