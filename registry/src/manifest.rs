//! Manifests, indexes and layer media types: OCI image spec v1 and Docker's schema 2
//! (the same shapes under other media type names), read leniently.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

use crate::error::RegistryError;
use crate::reference::Digest;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_SCHEMA1: &[&str] = &[
    "application/vnd.docker.distribution.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v1+prettyjws",
];
const IMAGE_CONFIGS: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];
/// What a manifest request accepts, most wanted first.
pub const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";
/// Manifests and indexes larger than this are refused (the distribution spec's limit).
pub const MAX_MANIFEST: u64 = 4 * 1024 * 1024;
/// Image configs larger than this are refused.
pub const MAX_CONFIG: u64 = 64 * 1024 * 1024;

/// A content descriptor.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<PlatformJson>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub urls: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PlatformJson {
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub variant: Option<String>,
}

/// An image manifest (OCI, or Docker schema 2).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    #[serde(default)]
    pub media_type: Option<String>,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    #[serde(default)]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
}

/// What a manifest document turned out to be.
pub enum Document {
    Index(Index),
    Manifest(Manifest),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Probe {
    #[serde(default)]
    schema_version: Option<u32>,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<serde_json::Value>,
}

/// Reads a manifest or an index, by its `mediaType`, else the answer's content type,
/// else its shape.
pub fn parse_document(
    reference: &str,
    content_type: Option<&str>,
    bytes: &[u8],
) -> Result<Document, RegistryError> {
    let invalid = |reason: String| RegistryError::Invalid {
        reference: reference.to_owned(),
        what: "manifest".into(),
        reason,
    };
    let probe: Probe = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
    let content_type = content_type.map(|c| c.split(';').next().unwrap_or(c).trim());
    let mt = probe.media_type.as_deref().or(content_type).unwrap_or("");
    if DOCKER_SCHEMA1.contains(&mt) || probe.schema_version == Some(1) {
        return Err(RegistryError::Unsupported {
            reference: reference.to_owned(),
            what: "Docker schema 1 manifests are not supported (deprecated since 2017; push the image again with a current client)".into(),
        });
    }
    let is_index =
        mt == OCI_INDEX || mt == DOCKER_LIST || (mt.is_empty() && probe.manifests.is_some());
    if is_index {
        return serde_json::from_slice(bytes)
            .map(Document::Index)
            .map_err(|e| invalid(format!("image index: {e}")));
    }
    if !(mt == OCI_MANIFEST || mt == DOCKER_MANIFEST || mt.is_empty()) {
        return Err(RegistryError::Unsupported {
            reference: reference.to_owned(),
            what: format!("not an image manifest or index (media type {mt})"),
        });
    }
    let m: Manifest = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
    if !m.config.media_type.is_empty() && !IMAGE_CONFIGS.contains(&m.config.media_type.as_str()) {
        return Err(RegistryError::Unsupported {
            reference: reference.to_owned(),
            what: format!(
                "not a container image (its config is {})",
                m.config.media_type
            ),
        });
    }
    Ok(Document::Manifest(m))
}

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// The compression of a layer of this media type, or why it is refused.
pub fn layer_compression(media_type: &str) -> Result<Compression, String> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar" | "application/vnd.docker.image.rootfs.diff.tar" => Ok(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip" | "application/vnd.docker.image.rootfs.diff.tar.gzip" => {
            Ok(Compression::Gzip)
        }
        "application/vnd.oci.image.layer.v1.tar+zstd" | "application/vnd.docker.image.rootfs.diff.tar.zstd" => {
            Ok(Compression::Zstd)
        }
        mt if mt.contains("foreign") || mt.contains("nondistributable") => Err(format!(
            "foreign (non-distributable) layers are not supported ({mt}): their content is not in the registry"
        )),
        mt if mt.contains("+encrypted") => Err(format!("encrypted layers are not supported ({mt})")),
        "" => Err("a layer without a media type".into()),
        mt => Err(format!("unsupported layer media type {mt}")),
    }
}

/// os/architecture[/variant], as `--platform` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Default for Platform {
    fn default() -> Platform {
        Platform {
            os: "linux".into(),
            architecture: "amd64".into(),
            variant: None,
        }
    }
}

impl FromStr for Platform {
    type Err = RegistryError;
    fn from_str(s: &str) -> Result<Platform, RegistryError> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok =
            |p: &str| !p.is_empty() && p.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_');
        if !(2..=3).contains(&parts.len()) || !parts.iter().all(|p| ok(p)) {
            return Err(RegistryError::BadReference {
                reference: s.to_owned(),
                reason: "a platform is OS/ARCH[/VARIANT], such as linux/amd64 or linux/arm64/v8"
                    .into(),
            });
        }
        Ok(Platform {
            os: parts[0].to_owned(),
            architecture: parts[1].to_owned(),
            variant: parts.get(2).map(|v| v.to_string()),
        })
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// The default variant of an architecture, where an index may leave it out.
fn default_variant(arch: &str) -> Option<&'static str> {
    match arch {
        "arm64" => Some("v8"),
        _ => None,
    }
}

fn is_attestation(d: &Descriptor) -> bool {
    d.annotations
        .get("vnd.docker.reference.type")
        .is_some_and(|t| t == "attestation-manifest")
        || d.platform
            .as_ref()
            .is_some_and(|p| p.os == "unknown" && p.architecture == "unknown")
}

/// The manifest of `want` in an index: an exact variant first, then an entry that
/// leaves the variant out. Attestation manifests are skipped.
pub fn select_platform(
    reference: &str,
    index: &Index,
    want: &Platform,
) -> Result<Descriptor, RegistryError> {
    let candidates: Vec<&Descriptor> = index
        .manifests
        .iter()
        .filter(|d| !is_attestation(d))
        .filter(|d| {
            d.media_type.is_empty()
                || d.media_type == OCI_MANIFEST
                || d.media_type == DOCKER_MANIFEST
        })
        .collect();
    let variant_of = |p: &PlatformJson| {
        p.variant
            .clone()
            .or_else(|| default_variant(&p.architecture).map(str::to_owned))
    };
    let want_variant = want
        .variant
        .clone()
        .or_else(|| default_variant(&want.architecture).map(str::to_owned));
    let same_arch = |d: &&&Descriptor| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.os == want.os && p.architecture == want.architecture)
    };
    let exact = candidates
        .iter()
        .filter(same_arch)
        .find(|d| d.platform.as_ref().and_then(variant_of) == want_variant);
    let loose = || {
        candidates.iter().filter(same_arch).find(|d| {
            want.variant.is_none() || d.platform.as_ref().is_some_and(|p| p.variant.is_none())
        })
    };
    if let Some(d) = exact.or_else(loose) {
        return Ok((*d).clone());
    }
    let available: Vec<String> = candidates
        .iter()
        .filter_map(|d| d.platform.as_ref())
        .map(|p| match &p.variant {
            Some(v) => format!("{}/{}/{v}", p.os, p.architecture),
            None => format!("{}/{}", p.os, p.architecture),
        })
        .collect();
    Err(RegistryError::NoPlatform {
        reference: reference.to_owned(),
        platform: want.to_string(),
        available: if available.is_empty() {
            "nothing".into()
        } else {
            available.join(", ")
        },
    })
}

/// A descriptor's digest, sha256 only.
pub fn descriptor_digest(reference: &str, d: &Descriptor) -> Result<Digest, RegistryError> {
    d.digest
        .parse()
        .map_err(|e: RegistryError| RegistryError::Unsupported {
            reference: reference.to_owned(),
            what: e.to_string(),
        })
}

/// The `rootfs.diff_ids` and the platform of an image config.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigHead {
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(entries: &[(&str, &str, Option<&str>)]) -> Index {
        let manifests: Vec<serde_json::Value> = entries
            .iter()
            .enumerate()
            .map(|(i, (os, arch, v))| {
                let mut p = serde_json::json!({"os": os, "architecture": arch});
                if let Some(v) = v {
                    p["variant"] = (*v).into();
                }
                serde_json::json!({"mediaType": OCI_MANIFEST, "digest": format!("sha256:{:064x}", i), "size": 1, "platform": p})
            })
            .collect();
        serde_json::from_value(serde_json::json!({"manifests": manifests})).unwrap()
    }

    #[test]
    fn platforms_are_matched_with_variants_and_attestations_skipped() {
        let mut idx = index(&[
            ("unknown", "unknown", None),
            ("linux", "arm64", Some("v8")),
            ("linux", "amd64", None),
            ("linux", "arm", Some("v7")),
        ]);
        idx.manifests[0].annotations.insert(
            "vnd.docker.reference.type".into(),
            "attestation-manifest".into(),
        );
        let pick = |p: &str| select_platform("r", &idx, &p.parse().unwrap()).map(|d| d.digest);
        assert!(pick("linux/amd64").unwrap().ends_with('2'));
        assert!(
            pick("linux/arm64").unwrap().ends_with('1'),
            "arm64 means v8"
        );
        assert!(pick("linux/arm64/v8").unwrap().ends_with('1'));
        assert!(pick("linux/arm/v7").unwrap().ends_with('3'));
        let e = pick("linux/s390x").unwrap_err().to_string();
        assert!(
            e.contains("no linux/s390x in the index")
                && e.contains("linux/arm/v7")
                && !e.contains("unknown"),
            "{e}"
        );
        assert!(pick("linux/arm/v6").is_err());
    }

    #[test]
    fn media_types_are_sorted_or_refused_by_name() {
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar+zstd"),
            Ok(Compression::Zstd)
        );
        assert_eq!(
            layer_compression("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Ok(Compression::Gzip)
        );
        assert!(
            layer_compression("application/vnd.docker.image.rootfs.foreign.diff.tar.gzip")
                .unwrap_err()
                .contains("foreign")
        );
        assert!(
            layer_compression("application/vnd.oci.image.layer.v1.tar+gzip+encrypted")
                .unwrap_err()
                .contains("encrypted")
        );
        let e = parse_document("r", None, br#"{"schemaVersion":1,"fsLayers":[]}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("schema 1"), "{e}");
        let art = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.cncf.helm.config.v1+json","digest":"sha256:00","size":1},"layers":[]}"#;
        let e = parse_document("r", None, art).err().unwrap().to_string();
        assert!(e.contains("not a container image"), "{e}");
        let idx = br#"{"schemaVersion":2,"manifests":[]}"#;
        assert!(matches!(
            parse_document("r", None, idx),
            Ok(Document::Index(_))
        ));
        assert!("linux".parse::<Platform>().is_err());
        assert_eq!(
            "linux/arm64/v8".parse::<Platform>().unwrap().to_string(),
            "linux/arm64/v8"
        );
    }
}
