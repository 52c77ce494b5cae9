//! Portable checkpoint archives.
//!
//! `export` writes one file: a tar stream compressed with multithreaded zstd holding
//! - `layers/<n>.tar`: every layer of the checkpoint's stack, topmost first, each a tar in
//!   overlay form (whiteouts and overlay xattrs kept, see `forkd_layers::export_tar`);
//! - `criu/<file>`: the CRIU images of a live checkpoint;
//! - `manifest.json` (last): the checkpoint's description, each layer's tree hash, the
//!   stack's tree hash, and a SHA-256 and size for every other file of the archive.
//!
//! A thin archive names the layers of the content-addressed store (images' layers,
//! forkd's runtime layer) by their tree hash instead of including them: it carries only
//! what the checkpoints themselves added, for a daemon that holds the same images; the
//! importer refuses it (409) if it lacks one of them.
//!
//! `import` unpacks into a staging directory, accepting only those names and regular
//! files, verifies every file against the manifest (no file missing, none extra, no byte
//! changed), imports each layer into the content-addressed store and checks that its
//! tree hash, and the stack's, match; only then does the checkpoint appear. Any failure
//! removes the staging directory and the layers this import added.

use super::checkpoints::{Checkpoint, CheckpointRecord, Lower};
use super::{log, Daemon};
use super::{Lock as _, RwLockExt as _};
use crate::api::{ApiError, ExportResult};
use forkd_layers::{LayerId, LayerStore};
use forkd_sandbox::CheckpointId;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const FORMAT: &str = "forkd-checkpoint-archive-v1";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArchiveLayer {
    /// Path of the layer's tar inside the archive; absent in a thin archive for a layer
    /// of the store, which the importer must already hold (its id is its tree hash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    pub tree_hash: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileEntry {
    pub sha256: String,
    pub size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub checkpoint: CheckpointRecord,
    /// Topmost first.
    pub layers: Vec<ArchiveLayer>,
    pub tree_hash: String,
    pub files: BTreeMap<String, FileEntry>,
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hashes everything written through it.
struct HashingWriter<W> {
    inner: W,
    hash: Sha256,
    size: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Hashes everything read through it.
struct HashingReader<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

fn io_err<'a>(step: &str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ApiError + 'a {
    let step = step.to_string();
    move |e| ApiError::internal(format!("{step} {}: {e}", path.display()))
}

fn append_file<W: Write>(
    b: &mut tar::Builder<W>,
    name: &str,
    path: &Path,
    files: &mut BTreeMap<String, FileEntry>,
) -> Result<(), ApiError> {
    let f = std::fs::File::open(path).map_err(io_err("open", path))?;
    let size = f.metadata().map_err(io_err("stat", path))?.len();
    let mut h = tar::Header::new_gnu();
    h.set_size(size);
    h.set_mode(0o600);
    h.set_entry_type(tar::EntryType::Regular);
    let mut r = HashingReader {
        inner: f.take(size),
        hash: Sha256::new(),
    };
    b.append_data(&mut h, name, &mut r)
        .map_err(io_err("archive", path))?;
    files.insert(
        name.to_string(),
        FileEntry {
            sha256: hex(&r.hash.finalize()),
            size,
        },
    );
    Ok(())
}

impl Daemon {
    /// Waits until a checkpoint's tree hash is known.
    fn wait_tree_hash(&self, c: &Checkpoint) -> Result<String, ApiError> {
        let t = Instant::now();
        loop {
            if let Some(h) = c.record.locked().tree_hash.clone() {
                return Ok(h);
            }
            if t.elapsed() > Duration::from_secs(600) {
                return Err(ApiError::internal(format!(
                    "checkpoint {}: tree hash not computed after 600 s",
                    c.id
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Writes checkpoint `c` to `dest` (atomically: a partial file is never left).
    pub fn export_checkpoint(
        &self,
        c: &Checkpoint,
        dest: &Path,
        thin: bool,
    ) -> Result<ExportResult, ApiError> {
        let t = Instant::now();
        let _in_use = c.use_for("export")?;
        super::paths::host_path("export path", dest, super::paths::Want::InDir)?;
        let tree_hash = self.wait_tree_hash(c)?;
        let rec = c.record.locked().clone();
        let partial = dest.with_file_name(format!(
            ".{}.partial-{}",
            dest.file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default(),
            std::process::id()
        ));
        let tmpdir = self.node.data.join("tmp");
        std::fs::create_dir_all(&tmpdir).map_err(io_err("create", &tmpdir))?;
        let result = (|| -> Result<usize, ApiError> {
            let out = std::fs::File::create(&partial).map_err(io_err("create", &partial))?;
            let mut z = zstd::Encoder::new(out, 3).map_err(io_err("start zstd for", &partial))?;
            let threads = std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1);
            z.multithread(threads)
                .map_err(io_err("set zstd threads for", &partial))?;
            let mut b = tar::Builder::new(z);
            let mut files = BTreeMap::new();
            let mut layers = Vec::new();
            for (i, lower) in rec.lowers.iter().enumerate() {
                if let (true, Lower::Layer(id)) = (thin, lower) {
                    layers.push(ArchiveLayer {
                        file: None,
                        tree_hash: id.to_string(),
                    });
                    continue;
                }
                let dir = self.lower_path(lower);
                let layer_hash = match lower {
                    Lower::Layer(id) => id.to_string(),
                    Lower::Checkpoint(cid) if *cid == c.id => {
                        rec.fs_hash.clone().unwrap_or_default()
                    }
                    Lower::Checkpoint(cid) => self
                        .checkpoints
                        .get(cid.as_str())
                        .ok()
                        .and_then(|p| p.record.locked().fs_hash.clone())
                        .ok_or_else(|| {
                            ApiError::internal(format!("layer {lower}: tree hash unknown"))
                        })?,
                };
                let tmp = tmpdir.join(format!("export-{}-{i}.tar", c.id));
                let res = (|| {
                    let f = std::fs::File::create(&tmp).map_err(io_err("create", &tmp))?;
                    forkd_layers::export_tar(&dir, std::io::BufWriter::new(f))
                        .map_err(|e| ApiError::from_chain(&format!("export layer {lower}"), &e))?;
                    let name = format!("layers/{i}.tar");
                    append_file(&mut b, &name, &tmp, &mut files)?;
                    Ok::<_, ApiError>(name)
                })();
                let _ = std::fs::remove_file(&tmp);
                layers.push(ArchiveLayer {
                    file: Some(res?),
                    tree_hash: layer_hash,
                });
            }
            if rec.live {
                let images = c.images();
                let mut names: Vec<_> = std::fs::read_dir(&images)
                    .map_err(io_err("read", &images))?
                    .flatten()
                    .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .collect();
                names.sort();
                for n in names {
                    append_file(&mut b, &format!("criu/{n}"), &images.join(&n), &mut files)?;
                }
            }
            let count = files.len() + 1;
            let manifest = Manifest {
                format: FORMAT.into(),
                checkpoint: rec.clone(),
                layers,
                tree_hash: tree_hash.clone(),
                files,
            };
            let body = serde_json::to_vec_pretty(&manifest).expect("manifest serialises");
            let mut h = tar::Header::new_gnu();
            h.set_size(body.len() as u64);
            h.set_mode(0o600);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, "manifest.json", &body[..])
                .map_err(io_err("archive manifest into", &partial))?;
            let z = b.into_inner().map_err(io_err("finish tar", &partial))?;
            let f = z.finish().map_err(io_err("finish zstd", &partial))?;
            f.sync_all().map_err(io_err("sync", &partial))?;
            std::fs::rename(&partial, dest).map_err(io_err("rename into place", dest))?;
            Ok(count)
        })();
        let files = match result {
            Ok(n) => n,
            Err(e) => {
                let _ = std::fs::remove_file(&partial);
                return Err(e);
            }
        };
        let bytes = std::fs::metadata(dest).map(|m| m.len()).unwrap_or(0);
        Ok(ExportResult {
            path: dest.display().to_string(),
            bytes,
            files,
            tree_hash,
            duration_us: t.elapsed().as_micros() as u64,
        })
    }

    /// Imports an archive written by `export_checkpoint`; verifies all of it first.
    pub fn import_checkpoint(self: &Arc<Self>, src: &Path) -> Result<Arc<Checkpoint>, ApiError> {
        super::paths::host_path("archive path", src, super::paths::Want::Any)?;
        let file = std::fs::File::open(src).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                ApiError::not_found(format!("archive {} does not exist", src.display()))
            }
            _ => ApiError::internal(format!("open {}: {e}", src.display())),
        })?;
        let _store = self.images.store_lock.read_locked();
        let id = CheckpointId::random();
        let stage = self
            .node
            .data
            .join("checkpoints")
            .join(format!(".stage-{id}"));
        let mut added_layers: Vec<LayerId> = Vec::new();
        let result = self.import_into(src, file, &stage, &id, &mut added_layers);
        match result {
            Ok(c) => Ok(c),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&stage);
                for l in added_layers {
                    if let Err(e) = self.images.layers.remove(&l) {
                        log::warn(&format!("remove layer {l} of a failed import: {e}"));
                    }
                }
                Err(e)
            }
        }
    }

    fn import_into(
        self: &Arc<Self>,
        src: &Path,
        file: std::fs::File,
        stage: &Path,
        id: &CheckpointId,
        added_layers: &mut Vec<LayerId>,
    ) -> Result<Arc<Checkpoint>, ApiError> {
        let bad = |m: String| ApiError::bad_request(format!("archive {}: {m}", src.display()));
        let Verified {
            manifest,
            lowers,
            tree,
        } = unpack_and_verify(&self.images.layers, src, file, stage, added_layers)?;
        if manifest.checkpoint.version != 1 {
            return Err(bad(format!(
                "checkpoint record version {} is not supported (this build reads 1)",
                manifest.checkpoint.version
            )));
        }
        let mut rec = manifest.checkpoint.clone();
        rec.id = id.clone();
        rec.parent = None;
        rec.lowers = lowers;
        // Its branches here stand on the base of its whole stack, made on this node.
        rec.base = None;
        rec.fs_hash = None;
        rec.tree_hash = Some(tree);
        rec.labels.insert(
            "forkd.imported-from".into(),
            manifest.checkpoint.id.to_string(),
        );
        let _ = std::fs::remove_dir_all(stage.join("layers"));
        let body = serde_json::to_vec_pretty(&rec).expect("record serialises");
        std::fs::write(stage.join("meta.json"), body)
            .map_err(io_err("write meta.json in", stage))?;
        let dir = self.node.data.join("checkpoints").join(id.as_str());
        std::fs::rename(stage, &dir).map_err(io_err("rename into place", &dir))?;
        let c = Arc::new(Checkpoint::new(dir, rec));
        self.checkpoints
            .table
            .locked()
            .insert(id.clone(), c.clone());
        Ok(c)
    }
}

/// A checkpoint archive unpacked into its stage and verified whole.
pub struct Verified {
    pub manifest: Manifest,
    /// Its layers, now in the store, topmost first.
    pub lowers: Vec<Lower>,
    /// The stack's tree hash, as computed here (equal to the manifest's).
    pub tree: String,
}

/// Unpacks the archive `file` (named `src` in errors) into `stage` (its CRIU images stay
/// there), verifies every file against the manifest, and imports each layer into
/// `layers`, checking its tree hash and the stack's. Layers it added to the store are
/// pushed to `added_layers`, for the caller to remove if anything fails. Reads untrusted
/// bytes: every refusal is a `bad_request` naming the archive.
pub fn unpack_and_verify(
    layers: &LayerStore,
    src: &Path,
    file: std::fs::File,
    stage: &Path,
    added_layers: &mut Vec<LayerId>,
) -> Result<Verified, ApiError> {
    let bad = |m: String| ApiError::bad_request(format!("archive {}: {m}", src.display()));
    std::fs::create_dir_all(stage.join("criu")).map_err(io_err("create", stage))?;
    std::fs::create_dir_all(stage.join("layers")).map_err(io_err("create", stage))?;
    let z = zstd::Decoder::new(file).map_err(|e| bad(format!("not a zstd stream: {e}")))?;
    let mut archive = tar::Archive::new(z);
    let mut seen: BTreeMap<String, FileEntry> = BTreeMap::new();
    let mut manifest: Option<Manifest> = None;
    let entries = archive
        .entries()
        .map_err(|e| bad(format!("not a tar stream: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(format!("corrupt tar stream: {e}")))?;
        let name = String::from_utf8(entry.path_bytes().into_owned())
            .map_err(|_| bad("an entry name is not UTF-8".into()))?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(bad(format!("entry {name:?} is not a regular file")));
        }
        if name == "manifest.json" {
            let mut body = Vec::new();
            entry
                .read_to_end(&mut body)
                .map_err(|e| bad(format!("read manifest: {e}")))?;
            manifest = Some(
                serde_json::from_slice(&body)
                    .map_err(|e| bad(format!("invalid manifest.json: {e}")))?,
            );
            continue;
        }
        // Only names this format writes, each a single safe component below its directory.
        let ok = match name.split_once('/') {
            Some(("layers", rest)) => rest
                .strip_suffix(".tar")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
            Some(("criu", rest)) => {
                !rest.is_empty()
                    && !rest.starts_with('.')
                    && rest
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            }
            _ => false,
        };
        if !ok {
            return Err(bad(format!(
                "unexpected entry {name:?} (the archive may have been tampered with)"
            )));
        }
        if seen.contains_key(&name) {
            return Err(bad(format!("entry {name:?} appears twice")));
        }
        let dest = stage.join(&name);
        let f = std::fs::File::create(&dest).map_err(io_err("create", &dest))?;
        let mut w = HashingWriter {
            inner: std::io::BufWriter::new(f),
            hash: Sha256::new(),
            size: 0,
        };
        std::io::copy(&mut entry, &mut w).map_err(|e| bad(format!("read {name}: {e}")))?;
        w.flush().map_err(io_err("write", &dest))?;
        seen.insert(
            name,
            FileEntry {
                sha256: hex(&w.hash.finalize()),
                size: w.size,
            },
        );
    }
    let manifest = manifest.ok_or_else(|| bad("manifest.json is missing".into()))?;
    if manifest.format != FORMAT {
        return Err(bad(format!(
            "format {:?} is not {FORMAT:?}",
            manifest.format
        )));
    }
    for (name, want) in &manifest.files {
        match seen.get(name) {
            None => {
                return Err(bad(format!(
                    "file {name} listed in the manifest is missing"
                )))
            }
            Some(got) if got.sha256 != want.sha256 || got.size != want.size => {
                return Err(bad(format!(
                    "file {name} does not match its SHA-256 in the manifest"
                )))
            }
            Some(_) => {}
        }
    }
    if let Some(extra) = seen.keys().find(|k| !manifest.files.contains_key(*k)) {
        return Err(bad(format!("file {extra} is not in the manifest")));
    }
    // Layers: into the store, each checked against its tree hash.
    let mut lowers = Vec::new();
    let mut stack = Sha256::new();
    stack.update(b"forkd-stack-v1\0");
    for layer in &manifest.layers {
        let name = layer.file.as_deref().unwrap_or("(named)");
        let want: LayerId = layer
            .tree_hash
            .parse()
            .map_err(|_| bad(format!("layer {name}: bad tree hash")))?;
        let Some(file) = &layer.file else {
            // Named, not included: the store must hold it already.
            if !layers.exists(&want) {
                return Err(ApiError::conflict(format!(
                    "archive {}: it names layer {want} without including it (a thin archive), and this daemon does not hold that layer: import the image the checkpoint was made from first, or export the checkpoint whole",
                    src.display()
                )));
            }
            stack.update(want.to_string().as_bytes());
            stack.update(b"\n");
            lowers.push(Lower::Layer(want));
            continue;
        };
        if !manifest.files.contains_key(file) {
            return Err(bad(format!(
                "layer {file} is not among the archive's files"
            )));
        }
        let existed = layers.exists(&want);
        let path = stage.join(file);
        let f = std::fs::File::open(&path).map_err(io_err("open", &path))?;
        let got = layers
            .import_tar(
                std::io::BufReader::new(f),
                forkd_layers::TarFlavor::Overlay,
                &mut |_| {},
            )
            .map_err(|e| {
                bad(format!(
                    "layer {file}: {}",
                    ApiError::from_chain("import", &e).message
                ))
            })?;
        if !existed && layers.exists(&got) {
            added_layers.push(got);
        }
        if got != want {
            return Err(bad(format!(
                "layer {file} has tree hash {got}, the manifest says {want}"
            )));
        }
        let _ = std::fs::remove_file(&path);
        stack.update(got.to_string().as_bytes());
        stack.update(b"\n");
        lowers.push(Lower::Layer(got));
    }
    let tree = hex(&stack.finalize());
    if tree != manifest.tree_hash {
        return Err(bad(format!(
            "the layers' tree hash {tree} differs from the manifest's {}",
            manifest.tree_hash
        )));
    }
    Ok(Verified {
        manifest,
        lowers,
        tree,
    })
}
