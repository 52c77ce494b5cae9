//! Layers that arrive as compressed blobs (a registry's), and which blobs the store
//! already holds.
//!
//! # A blob into a layer
//! [`LayerStore::stage_blob`] takes the blob as a stream: it is decompressed (gzip,
//! zstd or none, told by its first bytes) and extracted into a staging directory as it
//! arrives, by the same safe extraction as every import (OCI whiteouts kept), while the
//! uncompressed bytes are hashed: that is the layer's `diff_id`. The uncompressed stream
//! is read to its end; the caller then reads the blob to its end (where a registry
//! blob's digest is checked), checks the `diff_id` against the image config, and seals
//! the [`PendingLayer`], or drops it (which removes the staging directory).
//!
//! # The index
//! `<store>/index/blob/<hex>` holds the `diff_id` a compressed blob unpacks to, and
//! `<store>/index/diff/<hex>` the layer (tree hash) a `diff_id` made. So a blob the
//! store has unpacked before is never fetched again, whichever registry or name it
//! comes under, and one that arrives compressed differently is not unpacked again
//! either. Each entry is one small file written atomically; an entry whose layer has
//! been removed is treated as absent and is pruned by [`LayerStore::prune_index`].

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::error::{io_at, LayerError};
use crate::extract::{decompress, TarFlavor};
use crate::id::{is_lower_hex, to_hex};
use crate::progress::{Counter, Progress};
use crate::store::{abort, LayerStore, Staging};
use crate::LayerId;

const INDEX: &str = "index";
const BLOB: &str = "blob";
const DIFF: &str = "diff";

/// A layer extracted from a blob and not sealed yet. Dropping it removes it.
pub struct PendingLayer {
    staging: Option<Staging>,
    /// sha256 hex of the uncompressed tar.
    pub diff_id: String,
    /// Bytes of the uncompressed tar.
    pub tar_bytes: u64,
}

struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

fn check_hex(what: &str, hex: &str) -> Result<(), LayerError> {
    if hex.len() == 64 && is_lower_hex(hex) {
        Ok(())
    } else {
        Err(LayerError::io(
            "indexing",
            Path::new(what),
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{hex:?} is not a sha256 hex digest"),
            ),
        ))
    }
}

impl LayerStore {
    /// Extracts a layer blob as it is read (see the module's header).
    pub fn stage_blob<R: Read>(
        &self,
        blob: R,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<PendingLayer, LayerError> {
        let mut counter = Counter::new(progress);
        let (tar, _) = decompress(blob).map_err(|e| LayerError::Tar {
            offset: 0,
            context: "detecting compression".into(),
            source: e,
        })?;
        let mut plain = Hashing {
            inner: tar,
            hasher: Sha256::new(),
            count: 0,
        };
        let staging = self.stage_tar(&mut plain, TarFlavor::OciLayer, &mut counter)?;
        // The tar's end marker may come before the end of the stream (padding).
        let drained = io::copy(&mut plain, &mut io::sink());
        let (count, diff_id) = (plain.count, to_hex(&plain.hasher.finalize()));
        if let Err(e) = drained {
            return Err(abort(
                staging,
                LayerError::Tar {
                    offset: count,
                    context: "reading the rest of the layer".into(),
                    source: e,
                },
            ));
        }
        Ok(PendingLayer {
            staging: Some(staging),
            diff_id,
            tar_bytes: count,
        })
    }

    /// Seals a pending layer into the store.
    pub fn seal_pending(
        &self,
        mut p: PendingLayer,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<LayerId, LayerError> {
        let mut counter = Counter::new(progress);
        let staging = p.staging.take().expect("a pending layer is sealed once");
        self.seal_or_discard(staging, &mut counter)
    }

    fn index_dir(&self, kind: &str) -> PathBuf {
        self.root().join(INDEX).join(kind)
    }

    fn read_entry(&self, kind: &str, hex: &str) -> Option<String> {
        if hex.len() != 64 || !is_lower_hex(hex) {
            return None;
        }
        let s = fs::read_to_string(self.index_dir(kind).join(hex)).ok()?;
        let v = s.trim();
        (v.len() == 64 && is_lower_hex(v)).then(|| v.to_owned())
    }

    /// The layer a `diff_id` made, if it is still in the store.
    pub fn layer_of_diff(&self, diff_id: &str) -> Option<LayerId> {
        let id: LayerId = self.read_entry(DIFF, diff_id)?.parse().ok()?;
        self.exists(&id).then_some(id)
    }

    /// The `diff_id` and layer of a compressed blob the store has unpacked before.
    pub fn layer_of_blob(&self, blob: &str) -> Option<(String, LayerId)> {
        let diff = self.read_entry(BLOB, blob)?;
        let id = self.layer_of_diff(&diff)?;
        Some((diff, id))
    }

    /// Records that `blob` unpacks to `diff_id`, which is layer `id`.
    pub fn record_blob(&self, blob: &str, diff_id: &str, id: &LayerId) -> Result<(), LayerError> {
        check_hex("blob", blob)?;
        check_hex("diff_id", diff_id)?;
        self.write_entry(DIFF, diff_id, &id.to_hex())?;
        self.write_entry(BLOB, blob, diff_id)
    }

    fn write_entry(&self, kind: &str, key: &str, value: &str) -> Result<(), LayerError> {
        let dir = self.index_dir(kind);
        fs::create_dir_all(&dir).map_err(io_at("creating", &dir))?;
        let path = dir.join(key);
        if fs::read_to_string(&path).is_ok_and(|v| v.trim() == value) {
            return Ok(());
        }
        let tmp = dir.join(format!(
            ".{key}.{}.{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let written = fs::File::create(&tmp).and_then(|mut f| f.write_all(value.as_bytes()));
        if let Err(e) = written.and_then(|_| fs::rename(&tmp, &path)) {
            let _ = fs::remove_file(&tmp);
            return Err(LayerError::io("writing", &path, e));
        }
        Ok(())
    }

    /// Removes index entries whose layer is gone; how many.
    pub fn prune_index(&self) -> Result<usize, LayerError> {
        let mut removed = 0;
        for kind in [DIFF, BLOB] {
            let dir = self.index_dir(kind);
            let rd = match fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(LayerError::io("reading directory", &dir, e)),
            };
            for ent in rd {
                let ent = ent.map_err(io_at("reading directory", &dir))?;
                let name = ent.file_name().to_string_lossy().into_owned();
                let live = match kind {
                    DIFF => self.layer_of_diff(&name).is_some(),
                    _ => self.layer_of_blob(&name).is_some(),
                };
                if !live {
                    let p = ent.path();
                    fs::remove_file(&p).map_err(io_at("removing", &p))?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}
