//! Image import: turns a directory or an archive into layers in the
//! [`LayerStore`] and a record in the [`ImageStore`].
//!
//! Sources are recognized by content, not by name:
//!
//! - a directory with an `oci-layout` file: an OCI image layout;
//! - any other directory: a root filesystem, imported as one layer;
//! - a file: a tar archive, plain or compressed (gzip `1f 8b`, zstd
//!   `28 b5 2f fd`). It is first extracted, with the safety rules of
//!   [`crate::extract`], into a staging directory inside the layer store. Then
//!   if it holds `oci-layout` it is an OCI layout; if it holds a
//!   `manifest.json` listing `Config` and `Layers` it is a `docker save`
//!   archive; otherwise it is a root filesystem and the staging directory
//!   itself becomes the layer (no second copy).
//!
//! Files inside a layout or archive are opened with `openat2` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, so a crafted archive cannot make
//! us read a host file as a blob. Every OCI blob is checked against its
//! descriptor's size and sha256 digest; `docker save` layers are checked
//! against the config's `rootfs.diff_ids` when it has them. All layers of an
//! image are extracted and verified before any is sealed, so a failed import
//! leaves nothing in the store.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use oci_spec::image::{
    Arch, Descriptor, DigestAlgorithm, ImageConfiguration, ImageIndex, ImageManifest, MediaType,
    OciLayout, Os,
};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::error::{ImportError, LayerError};
use crate::extract::{decompress, TarFlavor};
use crate::fsx::open_file_beneath;
use crate::id::{parse_hex32, to_hex};
use crate::image::{validate_image_name, Image, ImageConfig, ImageStore};
use crate::progress::{Counter, Progress};
use crate::store::{now_secs, LayerStore, Staging};
use crate::LayerId;

/// Largest JSON document (manifest, index, config) read into memory.
mod docker;
use docker::{docker_manifest, import_docker};

const MAX_JSON: u64 = 64 * 1024 * 1024;
/// Nested image indexes followed at most this deep.
const MAX_INDEX_DEPTH: usize = 4;
const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Imports `source` as image `name`, replacing any image of that name (its
/// layers stay in the store until collected).
pub fn import_image(
    layers: &LayerStore,
    images: &ImageStore,
    source: &Path,
    name: &str,
    progress: &mut dyn FnMut(Progress),
) -> Result<Image, ImportError> {
    validate_image_name(name)?;
    let mut counter = Counter::new(progress);
    let meta =
        fs::metadata(source).map_err(|e| ImportError::io("reading metadata of", source, e))?;
    let shown = fs::canonicalize(source).unwrap_or_else(|_| source.to_path_buf());
    let (ids, config, kind) = if meta.is_dir() {
        if source.join("oci-layout").exists() {
            let (ids, config) = import_oci(layers, source, &mut counter)?;
            (ids, config, "oci")
        } else {
            let id = layers.import_dir_counted(source, &mut counter)?;
            (vec![id], ImageConfig::default(), "dir")
        }
    } else if meta.is_file() {
        import_archive(layers, source, &mut counter)?
    } else {
        return Err(ImportError::UnknownSource {
            path: source.to_path_buf(),
        });
    };
    let image = Image {
        name: name.to_owned(),
        layers: ids,
        created: now_secs(),
        source: format!("{kind}:{}", shown.display()),
        config,
        digest: None,
    };
    images.put(&image)?;
    Ok(image)
}

fn import_archive(
    layers: &LayerStore,
    path: &Path,
    counter: &mut Counter<'_>,
) -> Result<(Vec<LayerId>, ImageConfig, &'static str), ImportError> {
    let file = File::open(path).map_err(|e| ImportError::io("opening", path, e))?;
    let (reader, _) = decompress(file).map_err(|e| match e.kind() {
        io::ErrorKind::Unsupported => ImportError::UnsupportedCompression {
            path: path.to_path_buf(),
            format: if e.to_string().starts_with("Xz") {
                "xz"
            } else {
                "bzip2"
            },
        },
        _ => ImportError::io("reading", path, e),
    })?;
    counter.step(format!("extracting {}", path.display()));
    let mut staging = layers.stage_tar(reader, TarFlavor::Rootfs, counter)?;
    let tree = staging.tree();
    let inner = if is_oci_layout(&tree) {
        import_oci(layers, &tree, counter).map(|(ids, c)| (ids, c, "oci-archive"))
    } else {
        match docker_manifest(&tree) {
            Some(entries) => import_docker(layers, &tree, entries, counter)
                .map(|(ids, c)| (ids, c, "docker-archive")),
            None => {
                // A root filesystem: the extracted tree is the layer.
                return match layers.seal(&mut staging, counter) {
                    Ok(id) => Ok((vec![id], ImageConfig::default(), "tar")),
                    Err(e) => Err(crate::store::abort(staging, e).into()),
                };
            }
        }
    };
    let dir = tree.parent().map(Path::to_path_buf).unwrap_or_default();
    match (inner, staging.discard()) {
        (Ok(v), Ok(())) => Ok(v),
        (Ok(_), Err(e)) => Err(ImportError::io("removing", dir, e)),
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(cleanup)) => Err(ImportError::Cleanup {
            path: dir,
            cleanup,
            original: Box::new(e),
        }),
    }
}

fn is_oci_layout(dir: &Path) -> bool {
    open_file_beneath(dir, "oci-layout").is_ok()
}

// ---------------------------------------------------------------------------
// OCI image layout

fn read_small(dir: &Path, rel: &str) -> Result<Vec<u8>, ImportError> {
    let path = dir.join(rel);
    let f = open_file_beneath(dir, rel).map_err(|e| ImportError::io("opening", &path, e))?;
    let mut buf = Vec::new();
    f.take(MAX_JSON + 1)
        .read_to_end(&mut buf)
        .map_err(|e| ImportError::io("reading", &path, e))?;
    if buf.len() as u64 > MAX_JSON {
        return Err(ImportError::invalid(path, "larger than 64 MiB"));
    }
    Ok(buf)
}

fn blob_rel(desc: &Descriptor) -> Result<String, ImportError> {
    let digest = desc.digest();
    if *digest.algorithm() != DigestAlgorithm::Sha256 || parse_hex32(digest.digest()).is_none() {
        return Err(ImportError::UnsupportedDigest {
            digest: digest.to_string(),
        });
    }
    Ok(format!("blobs/sha256/{}", digest.digest()))
}

/// Reads a small blob (manifest, index, config) and verifies it.
fn read_blob(dir: &Path, desc: &Descriptor) -> Result<Vec<u8>, ImportError> {
    let rel = blob_rel(desc)?;
    if desc.size() > MAX_JSON {
        return Err(ImportError::invalid(dir.join(&rel), "larger than 64 MiB"));
    }
    let bytes = read_small(dir, &rel)?;
    let digest = desc.digest().to_string();
    if bytes.len() as u64 != desc.size() {
        return Err(ImportError::SizeMismatch {
            digest,
            expected: desc.size(),
            actual: bytes.len() as u64,
        });
    }
    let actual = to_hex(&Sha256::digest(&bytes));
    if actual != desc.digest().digest() {
        return Err(ImportError::DigestMismatch { digest, actual });
    }
    Ok(bytes)
}

fn import_oci(
    layers: &LayerStore,
    dir: &Path,
    counter: &mut Counter<'_>,
) -> Result<(Vec<LayerId>, ImageConfig), ImportError> {
    let layout_path = dir.join("oci-layout");
    let layout: OciLayout = serde_json::from_slice(&read_small(dir, "oci-layout")?)
        .map_err(|e| ImportError::parse("oci-layout", &layout_path, e))?;
    if !layout.image_layout_version().starts_with("1.") {
        return Err(ImportError::invalid(
            layout_path,
            format!(
                "unsupported imageLayoutVersion {:?}",
                layout.image_layout_version()
            ),
        ));
    }
    let index_path = dir.join("index.json");
    let index = ImageIndex::from_reader(&read_small(dir, "index.json")?[..])
        .map_err(|e| ImportError::parse("image index", &index_path, e))?;
    let desc = pick_manifest(dir, &index)?;
    let manifest = ImageManifest::from_reader(&read_blob(dir, &desc)?[..]).map_err(|e| {
        ImportError::parse(
            "image manifest",
            dir.join(blob_rel(&desc).unwrap_or_default()),
            e,
        )
    })?;
    let config_desc = manifest.config();
    let config_bytes = read_blob(dir, config_desc)?;
    let config = match ImageConfiguration::from_reader(&config_bytes[..]) {
        Ok(c) => config_from_oci(&c),
        // Some producers write configs oci-spec finds too strict (missing
        // rootfs or history); the run settings are all we need from it.
        Err(_) => lenient_config(&config_bytes).map_err(|e| {
            ImportError::parse(
                "image config",
                dir.join(blob_rel(config_desc).unwrap_or_default()),
                e,
            )
        })?,
    };

    let total = manifest.layers().len();
    let mut staged: Vec<Staging> = Vec::with_capacity(total);
    for (i, desc) in manifest.layers().iter().enumerate() {
        counter.step(format!("layer {}/{} {}", i + 1, total, desc.digest()));
        match stage_oci_layer(layers, dir, desc, counter) {
            Ok(s) => staged.push(s),
            Err(e) => return Err(discard_all(staged, e)),
        }
    }
    let ids = seal_all(layers, staged, counter)?;
    Ok((ids, config))
}

fn config_from_oci(c: &ImageConfiguration) -> ImageConfig {
    match c.config() {
        Some(run) => ImageConfig {
            env: run.env().clone().unwrap_or_default(),
            cmd: run.cmd().clone().unwrap_or_default(),
            entrypoint: run.entrypoint().clone().unwrap_or_default(),
            working_dir: run.working_dir().clone().filter(|s| !s.is_empty()),
            user: run.user().clone().filter(|s| !s.is_empty()),
            labels: run
                .labels()
                .clone()
                .map(|l| l.into_iter().collect())
                .unwrap_or_default(),
            ..Default::default()
        },
        None => ImageConfig::default(),
    }
}

/// The run settings of an image config document (OCI or Docker), as a registry serves it.
pub fn parse_image_config(bytes: &[u8]) -> Result<ImageConfig, serde_json::Error> {
    match ImageConfiguration::from_reader(bytes) {
        Ok(c) => Ok(config_from_oci(&c)),
        Err(_) => lenient_config(bytes),
    }
}

/// The run settings of an OCI or Docker image config, read leniently.
fn lenient_config(bytes: &[u8]) -> Result<ImageConfig, serde_json::Error> {
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase")]
    struct Run {
        env: Option<Vec<String>>,
        cmd: Option<Vec<String>>,
        entrypoint: Option<Vec<String>>,
        working_dir: Option<String>,
        user: Option<String>,
    }
    #[derive(Deserialize)]
    struct Doc {
        #[serde(default)]
        config: Option<Run>,
    }
    let doc: Doc = serde_json::from_slice(bytes)?;
    let run = doc.config.unwrap_or_default();
    Ok(ImageConfig {
        env: run.env.unwrap_or_default(),
        cmd: run.cmd.unwrap_or_default(),
        entrypoint: run.entrypoint.unwrap_or_default(),
        working_dir: run.working_dir.filter(|s| !s.is_empty()),
        user: run.user.filter(|s| !s.is_empty()),
        ..Default::default()
    })
}

fn is_index(mt: &MediaType) -> bool {
    match mt {
        MediaType::ImageIndex => true,
        MediaType::Other(s) => s == DOCKER_MANIFEST_LIST,
        _ => false,
    }
}

fn is_manifest(mt: &MediaType) -> bool {
    match mt {
        MediaType::ImageManifest => true,
        MediaType::Other(s) => s == DOCKER_MANIFEST,
        _ => false,
    }
}

/// Picks the one image manifest of a layout: the only one, or the only one
/// for this host's platform; otherwise an error listing them.
fn pick_manifest(dir: &Path, index: &ImageIndex) -> Result<Descriptor, ImportError> {
    let mut found = Vec::new();
    collect_manifests(dir, index.manifests(), 0, &mut found)?;
    if found.len() > 1 {
        let host: Vec<&Descriptor> = found
            .iter()
            .filter(|d| {
                d.platform().as_ref().is_some_and(|p| {
                    *p.os() == Os::default() && *p.architecture() == Arch::default()
                })
            })
            .collect();
        if host.len() == 1 {
            return Ok(host[0].clone());
        }
    }
    match found.len() {
        0 => Err(ImportError::invalid(
            dir.join("index.json"),
            "lists no image manifest",
        )),
        1 => Ok(found.remove(0)),
        n => Err(ImportError::Ambiguous {
            path: dir.to_path_buf(),
            count: n,
            list: found.iter().map(describe).collect::<Vec<_>>().join("; "),
        }),
    }
}

fn describe(d: &Descriptor) -> String {
    let name = d
        .annotations()
        .as_ref()
        .and_then(|a| a.get(REF_NAME))
        .map(String::as_str)
        .unwrap_or("-");
    let platform = d
        .platform()
        .as_ref()
        .map(|p| format!("{}/{}", p.os(), p.architecture()))
        .unwrap_or_else(|| "-".into());
    format!("{} (name {name}, platform {platform})", d.digest())
}

fn collect_manifests(
    dir: &Path,
    descs: &[Descriptor],
    depth: usize,
    out: &mut Vec<Descriptor>,
) -> Result<(), ImportError> {
    for d in descs {
        if is_manifest(d.media_type()) {
            out.push(d.clone());
        } else if is_index(d.media_type()) {
            if depth >= MAX_INDEX_DEPTH {
                return Err(ImportError::invalid(
                    dir.join("index.json"),
                    "image indexes nested too deep",
                ));
            }
            let nested = ImageIndex::from_reader(&read_blob(dir, d)?[..]).map_err(|e| {
                ImportError::parse("image index", dir.join(blob_rel(d).unwrap_or_default()), e)
            })?;
            collect_manifests(dir, nested.manifests(), depth + 1, out)?;
        }
    }
    Ok(())
}

/// Counts and hashes the bytes that pass through.
struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }
    /// Reads what is left, then returns (hex digest, byte count).
    fn finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((to_hex(&self.hasher.finalize()), self.count))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

fn stage_oci_layer(
    layers: &LayerStore,
    dir: &Path,
    desc: &Descriptor,
    counter: &mut Counter<'_>,
) -> Result<Staging, ImportError> {
    let rel = blob_rel(desc)?;
    let path = dir.join(&rel);
    let digest = desc.digest().to_string();
    let file = open_file_beneath(dir, &rel).map_err(|e| ImportError::io("opening", &path, e))?;
    let len = file
        .metadata()
        .map_err(|e| ImportError::io("reading metadata of", &path, e))?
        .len();
    if len != desc.size() {
        return Err(ImportError::SizeMismatch {
            digest,
            expected: desc.size(),
            actual: len,
        });
    }
    let mut raw = HashingReader::new(file);
    let staged = match decompress(&mut raw) {
        Ok((tar, _)) => layers.stage_tar(tar, TarFlavor::OciLayer, counter),
        Err(e) => Err(LayerError::io("decompressing", &path, e)),
    };
    // The digest covers the whole blob, including anything after the tar's
    // end marker, so read the rest before comparing. A damaged blob usually
    // fails to extract too; its digest then names the real cause.
    let finished = raw.finish();
    let staging = match staged {
        Ok(s) => s,
        Err(source) => {
            return Err(match finished {
                Ok((actual, _)) if actual != desc.digest().digest() => {
                    ImportError::DigestMismatch { digest, actual }
                }
                _ => ImportError::InLayer {
                    layer: digest,
                    source,
                },
            })
        }
    };
    let verdict = match finished {
        Err(e) => Err(ImportError::io("reading", &path, e)),
        Ok((actual, _)) if actual != desc.digest().digest() => {
            Err(ImportError::DigestMismatch { digest, actual })
        }
        Ok(_) => Ok(()),
    };
    match verdict {
        Ok(()) => Ok(staging),
        Err(e) => Err(discard_all(vec![staging], e)),
    }
}

/// Discards staged layers after `err`, keeping a cleanup failure too.
fn discard_all(staged: Vec<Staging>, err: ImportError) -> ImportError {
    let mut err = err;
    for s in staged {
        let path = s.tree();
        if let Err(cleanup) = s.discard() {
            err = ImportError::Cleanup {
                path,
                cleanup,
                original: Box::new(err),
            };
        }
    }
    err
}

fn seal_all(
    layers: &LayerStore,
    staged: Vec<Staging>,
    counter: &mut Counter<'_>,
) -> Result<Vec<LayerId>, ImportError> {
    let mut ids = Vec::with_capacity(staged.len());
    let mut rest = staged.into_iter();
    while let Some(mut s) = rest.next() {
        match layers.seal(&mut s, counter) {
            Ok(id) => ids.push(id),
            Err(e) => {
                let e = crate::store::abort(s, e);
                return Err(discard_all(rest.collect(), e.into()));
            }
        }
    }
    Ok(ids)
}
