//! `docker save` archives: the manifest, its layers checked against the digests their
//! names promise, and the image's configuration.

use super::*;

#[derive(Debug, Deserialize)]
pub(super) struct DockerEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
}

pub(super) fn docker_manifest(dir: &Path) -> Option<Vec<DockerEntry>> {
    let bytes = read_small(dir, "manifest.json").ok()?;
    let entries: Vec<DockerEntry> = serde_json::from_slice(&bytes).ok()?;
    (!entries.is_empty()).then_some(entries)
}

/// The sha256 a `docker save` file name promises (`<hex>.json`,
/// `blobs/sha256/<hex>`), if any.
fn promised_digest(rel: &str) -> Option<String> {
    let name = rel.rsplit('/').next()?;
    let stem = name.strip_suffix(".json").unwrap_or(name);
    parse_hex32(stem).map(|_| stem.to_owned())
}

pub(super) fn import_docker(
    layers: &LayerStore,
    dir: &Path,
    mut entries: Vec<DockerEntry>,
    counter: &mut Counter<'_>,
) -> Result<(Vec<LayerId>, ImageConfig), ImportError> {
    if entries.len() != 1 {
        let list = entries
            .iter()
            .map(|e| match &e.repo_tags {
                Some(tags) if !tags.is_empty() => tags.join(","),
                _ => e.config.clone(),
            })
            .collect::<Vec<_>>()
            .join("; ");
        return Err(ImportError::Ambiguous {
            path: dir.join("manifest.json"),
            count: entries.len(),
            list,
        });
    }
    let entry = entries.remove(0);
    let config_bytes = read_small(dir, &entry.config)?;
    if let Some(want) = promised_digest(&entry.config) {
        let actual = to_hex(&Sha256::digest(&config_bytes));
        if actual != want {
            return Err(ImportError::DigestMismatch {
                digest: format!("{} (sha256:{want})", entry.config),
                actual,
            });
        }
    }
    let config_path = dir.join(&entry.config);
    let config = lenient_config(&config_bytes)
        .map_err(|e| ImportError::parse("image config", &config_path, e))?;
    #[derive(Deserialize, Default)]
    struct RootFs {
        #[serde(default)]
        diff_ids: Vec<String>,
    }
    #[derive(Deserialize)]
    struct WithRootFs {
        #[serde(default)]
        rootfs: Option<RootFs>,
    }
    let diff_ids = serde_json::from_slice::<WithRootFs>(&config_bytes)
        .ok()
        .and_then(|c| c.rootfs)
        .unwrap_or_default()
        .diff_ids;
    let check_ids = diff_ids.len() == entry.layers.len();

    let total = entry.layers.len();
    let mut staged = Vec::with_capacity(total);
    for (i, rel) in entry.layers.iter().enumerate() {
        counter.step(format!("layer {}/{} {rel}", i + 1, total));
        let want = check_ids.then(|| diff_ids[i].as_str());
        match stage_docker_layer(layers, dir, rel, want, counter) {
            Ok(s) => staged.push(s),
            Err(e) => return Err(discard_all(staged, e)),
        }
    }
    let ids = seal_all(layers, staged, counter)?;
    Ok((ids, config))
}

fn stage_docker_layer(
    layers: &LayerStore,
    dir: &Path,
    rel: &str,
    diff_id: Option<&str>,
    counter: &mut Counter<'_>,
) -> Result<Staging, ImportError> {
    let path: PathBuf = dir.join(rel);
    let file = open_file_beneath(dir, rel).map_err(|e| ImportError::io("opening", &path, e))?;
    let (tar, _) = decompress(file).map_err(|e| ImportError::io("decompressing", &path, e))?;
    // diff_ids are digests of the uncompressed tar.
    let mut plain = HashingReader::new(tar);
    let staging = layers
        .stage_tar(&mut plain, TarFlavor::OciLayer, counter)
        .map_err(|source| ImportError::InLayer {
            layer: rel.to_owned(),
            source,
        })?;
    let verdict = match (plain.finish(), diff_id) {
        (Err(e), _) => Err(ImportError::io("reading", &path, e)),
        (Ok((actual, _)), Some(want)) if want.strip_prefix("sha256:") != Some(actual.as_str()) => {
            Err(ImportError::DigestMismatch {
                digest: format!("{rel} ({want})"),
                actual,
            })
        }
        (Ok(_), _) => Ok(()),
    };
    match verdict {
        Ok(()) => Ok(staging),
        Err(e) => Err(discard_all(vec![staging], e)),
    }
}
