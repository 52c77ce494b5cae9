//! `forkd image pull` from a real registry (Debian's docker-registry, the CNCF
//! distribution registry) on loopback: an OCI index with several platforms and an
//! attestation, gzip and zstd layers, a short name resolved through registries.conf,
//! one manifest HEAD for an unchanged image, shared layers fetched once, errors that
//! name the reference, and a corrupt blob that leaves nothing behind.

#![forbid(unsafe_code)]

mod common;

use common::*;
use forkd::api::ImageInfo;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A docker-registry serving plain HTTP on a loopback port, storing under `dir`.
struct Registry {
    child: Child,
    port: u16,
    dir: PathBuf,
    log: PathBuf,
}

impl Registry {
    fn start(dir: &Path) -> Option<Registry> {
        let bin = Path::new("/usr/bin/docker-registry");
        if !require(
            "registry",
            bin.exists(),
            "docker-registry missing (run fixtures/setup.sh packages)",
        ) {
            return None;
        }
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.join("data").display()
            ),
        )
        .unwrap();
        let log = dir.join("registry.log");
        let child = Command::new(bin)
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
            .stderr(Stdio::from(
                std::fs::File::options().append(true).open(&log).unwrap(),
            ))
            .spawn()
            .unwrap();
        let r = Registry {
            child,
            port,
            dir: dir.to_path_buf(),
            log,
        };
        assert!(
            wait_until(Duration::from_secs(20), || ureq::get(&r.url("/v2/"))
                .call()
                .is_ok()),
            "the registry did not answer: {}",
            std::fs::read_to_string(&r.log).unwrap_or_default()
        );
        Some(r)
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Uploads a blob (monolithic POST then PUT); returns its digest.
    fn blob(&self, repo: &str, bytes: &[u8]) -> String {
        let digest = format!("sha256:{}", sha256(bytes));
        let resp = ureq::post(&self.url(&format!("/v2/{repo}/blobs/uploads/")))
            .send_empty()
            .unwrap();
        let loc = resp.headers()["location"].to_str().unwrap().to_string();
        let loc = if loc.starts_with("http") {
            loc
        } else {
            self.url(&loc)
        };
        let sep = if loc.contains('?') { '&' } else { '?' };
        ureq::put(&format!("{loc}{sep}digest={digest}"))
            .header("Content-Type", "application/octet-stream")
            .send(bytes)
            .unwrap();
        digest
    }

    /// Puts a manifest or index under `reference`; returns its digest.
    fn manifest(
        &self,
        repo: &str,
        reference: &str,
        media_type: &str,
        doc: &serde_json::Value,
    ) -> String {
        let bytes = serde_json::to_vec(doc).unwrap();
        ureq::put(&self.url(&format!("/v2/{repo}/manifests/{reference}")))
            .header("Content-Type", media_type)
            .send(&bytes[..])
            .unwrap();
        format!("sha256:{}", sha256(&bytes))
    }

    /// The requests forkd made so far: (method, path).
    fn requests(&self) -> Vec<(String, String)> {
        // The access log: `... "GET /v2/x/manifests/1 HTTP/1.1" 200 ... "forkd/0.1.0"`.
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"forkd/"))
            .filter_map(|l| {
                let req = l.split('"').nth(1)?;
                let mut it = req.split(' ');
                Some((it.next()?.to_string(), it.next()?.to_string()))
            })
            .collect()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn sha256(b: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// A tar of (path, contents) files.
fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, *data).unwrap();
    }
    b.into_inner().unwrap()
}

struct Pushed {
    index: String,
    manifest: String,
    layers: Vec<String>,
}

/// Pushes an image of `layers` (media type, uncompressed tar, blob) with an index
/// listing it for linux/amd64 beside an arm64 entry and an attestation manifest.
fn push_image(
    reg: &Registry,
    repo: &str,
    tag: &str,
    layers: &[(&str, Vec<u8>, Vec<u8>)],
    env: &str,
) -> Pushed {
    let mut descs = Vec::new();
    let mut diff_ids = Vec::new();
    let mut digests = Vec::new();
    for (mt, tar, blob) in layers {
        let d = reg.blob(repo, blob);
        descs.push(serde_json::json!({"mediaType": mt, "digest": d, "size": blob.len()}));
        diff_ids.push(format!("sha256:{}", sha256(tar)));
        digests.push(d);
    }
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin:/usr/bin", env], "WorkingDir": "/etc", "Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let config_bytes = serde_json::to_vec(&config).unwrap();
    let config_digest = reg.blob(repo, &config_bytes);
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_bytes.len()},
        "layers": descs,
    });
    let m = reg.manifest(
        repo,
        &format!("{tag}-amd64"),
        "application/vnd.oci.image.manifest.v1+json",
        &manifest,
    );
    let msize = serde_json::to_vec(&manifest).unwrap().len();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            // An attestation first, and another platform: neither may be taken.
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m, "size": msize,
             "platform": {"os": "unknown", "architecture": "unknown"},
             "annotations": {"vnd.docker.reference.type": "attestation-manifest"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m, "size": msize,
             "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m, "size": msize,
             "platform": {"os": "linux", "architecture": "amd64"}},
        ],
    });
    let i = reg.manifest(repo, tag, "application/vnd.oci.image.index.v1+json", &index);
    Pushed {
        index: i,
        manifest: m,
        layers: digests,
    }
}

fn base_layer() -> (&'static str, Vec<u8>, Vec<u8>) {
    let tar = std::fs::read(busybox_tar()).unwrap();
    let blob = gzip(&tar);
    ("application/vnd.oci.image.layer.v1.tar+gzip", tar, blob)
}

fn top_layer(text: &str) -> (&'static str, Vec<u8>, Vec<u8>) {
    let tar = tar_of(&[("etc/pulled", text.as_bytes()), ("bin/.wh.vi", b"")]);
    let blob = zstd::encode_all(&tar[..], 3).unwrap();
    ("application/vnd.oci.image.layer.v1.tar+zstd", tar, blob)
}

fn pull(d: &TestDaemon, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["image", "pull"];
    all.extend_from_slice(args);
    let out = d.cli(&all);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn daemon_with_registry(name: &str, reg: &Registry) -> TestDaemon {
    let conf = reg.dir.join("registries.conf");
    std::fs::write(
        &conf,
        format!("unqualified-search-registries = [\"{}\"]\n", reg.host()),
    )
    .unwrap();
    TestDaemon::start_with_env(
        name,
        &[
            ("FORKD_REGISTRIES_CONF", conf.to_str().unwrap()),
            // No credentials of the machine's own reach the test registry.
            (
                "REGISTRY_AUTH_FILE",
                reg.dir.join("auth.json").to_str().unwrap(),
            ),
            ("DOCKER_CONFIG", reg.dir.to_str().unwrap()),
        ],
    )
}

#[test]
fn a_pushed_image_is_pulled_run_and_pulled_again_with_one_head() {
    let name = "a_pushed_image_is_pulled_run_and_pulled_again_with_one_head";
    if !can_run(name) {
        return;
    }
    let Some(reg) = Registry::start(Path::new("/tmp/forkd-test-registry-pull")) else {
        return;
    };
    let pushed = push_image(
        &reg,
        "forkd/app",
        "1",
        &[base_layer(), top_layer("layer two\n")],
        "FROM_CONFIG=yes",
    );
    let d = daemon_with_registry("registry-pull", &reg);

    // A short name, resolved on the search registry; the index's amd64 entry.
    let (ok, out, err) = pull(&d, &["forkd/app:1"]);
    assert!(ok, "pull failed: {err}");
    let full = format!("{}/forkd/app:1", reg.host());
    assert_eq!(out, full);
    let img: ImageInfo = d
        .client
        .call(
            "GET",
            &format!("/v1/images/{}", forkd::api::url::encode_segment(&full)),
            None,
        )
        .unwrap();
    assert_eq!(img.digest.as_deref(), Some(pushed.index.as_str()));
    assert_eq!(img.source, format!("registry:{full}"));
    assert_eq!(img.layers.len(), 2);
    let blobs = |reqs: &[(String, String)]| {
        reqs.iter()
            .filter(|(m, p)| m == "GET" && p.contains("/blobs/"))
            .count()
    };
    let first = reg.requests();
    assert_eq!(
        blobs(&first),
        3,
        "two layers and the config, once each: {first:?}"
    );

    // The image runs: both layers, the whiteout, the config's env and working directory.
    let sb = d.create(serde_json::json!({ "image": full }));
    let (code, out, _) = d.sh(&sb.id, "cat /etc/pulled; pwd; echo $FROM_CONFIG; test -e /bin/vi || echo no-vi; /bin/busybox true && echo busybox");
    assert_eq!(code, 0);
    assert_eq!(out, "layer two\n/etc\nyes\nno-vi\nbusybox\n");
    d.remove(&sb.id);

    // Pulled again: one manifest HEAD and nothing else.
    let (ok, _, err) = pull(&d, &["forkd/app:1"]);
    assert!(ok, "{err}");
    let again: Vec<_> = reg.requests()[first.len()..].to_vec();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].0, "HEAD");
    assert!(again[0].1.ends_with("/manifests/1"), "{again:?}");

    // By the platform manifest's digest, under a name of its own: the layers are in the
    // store, so only the manifest and the config are read.
    let before = reg.requests().len();
    let by_digest = format!("{}/forkd/app@{}", reg.host(), pushed.manifest);
    let (ok, out, err) = pull(&d, &[&by_digest]);
    assert!(ok, "{err}");
    assert_eq!(out, by_digest, "a digest reference names the image");
    let now = reg.requests()[before..].to_vec();
    assert_eq!(blobs(&now), 1, "only the config: {now:?}");

    // A second image over the same base: only its own layer is fetched.
    let second = push_image(
        &reg,
        "forkd/other",
        "2",
        &[base_layer(), top_layer("other\n")],
        "FROM_CONFIG=two",
    );
    let before = reg.requests().len();
    let (ok, _, err) = pull(&d, &[&format!("{}/forkd/other:2", reg.host())]);
    assert!(ok, "{err}");
    let now = reg.requests()[before..].to_vec();
    let fetched: Vec<_> = now
        .iter()
        .filter(|(m, p)| m == "GET" && p.contains("/blobs/"))
        .map(|(_, p)| p.clone())
        .collect();
    assert_eq!(
        fetched.len(),
        2,
        "the config and the new layer: {fetched:?}"
    );
    assert!(fetched.iter().any(|p| p.ends_with(&second.layers[1])));
    assert!(
        !fetched.iter().any(|p| p.ends_with(&pushed.layers[0])),
        "the shared base is not fetched again"
    );

    // Errors name the reference and the step.
    let (ok, _, err) = pull(&d, &["forkd/app:nope"]);
    assert!(!ok);
    assert!(
        err.contains("manifest unknown") && err.contains("forkd/app:nope"),
        "{err}"
    );
    let (ok, _, err) = pull(&d, &["--platform", "linux/s390x", "forkd/app:1"]);
    assert!(!ok);
    assert!(
        err.contains("no linux/s390x in the index") && err.contains("linux/arm64/v8"),
        "{err}"
    );
    let (ok, _, err) = pull(&d, &["Bad//Ref"]);
    assert!(!ok);
    assert!(err.contains("bad image reference"), "{err}");
    let images: Vec<ImageInfo> = d.client.call("GET", "/v1/images", None).unwrap();
    assert!(!images
        .iter()
        .any(|i| i.name.contains("nope") || i.name.contains("s390x")));

    // `image ls` shows the digest and the source.
    let ls = String::from_utf8_lossy(&d.cli(&["image", "ls"]).stdout).into_owned();
    let line = ls
        .lines()
        .find(|l| l.starts_with(&full))
        .unwrap_or_else(|| panic!("{ls}"));
    assert!(
        line.contains(&pushed.index[..19]) && line.contains("registry:"),
        "{line}"
    );
}

#[test]
fn a_corrupt_blob_fails_the_pull_and_leaves_nothing() {
    let name = "a_corrupt_blob_fails_the_pull_and_leaves_nothing";
    if !can_run(name) {
        return;
    }
    let Some(reg) = Registry::start(Path::new("/tmp/forkd-test-registry-corrupt")) else {
        return;
    };
    let pushed = push_image(
        &reg,
        "forkd/bad",
        "1",
        &[base_layer(), top_layer("bad\n")],
        "X=1",
    );
    // Damage the top layer's stored bytes (same length, other content).
    let hex = pushed.layers[1].trim_start_matches("sha256:");
    let data = reg.dir.join(format!(
        "data/docker/registry/v2/blobs/sha256/{}/{hex}/data",
        &hex[..2]
    ));
    let mut bytes = std::fs::read(&data).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    std::fs::write(&data, &bytes).unwrap();
    let d = daemon_with_registry("registry-corrupt", &reg);
    let (ok, _, err) = pull(&d, &["forkd/bad:1"]);
    assert!(!ok, "a corrupt blob was accepted");
    assert!(
        err.contains(&pushed.layers[1]),
        "the error names the layer: {err}"
    );
    let images: Vec<ImageInfo> = d.client.call("GET", "/v1/images", None).unwrap();
    assert!(
        !images.iter().any(|i| i.name.contains("forkd/bad")),
        "no image was written"
    );
    let tmp = d.data().join("layers/tmp");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "no half layer: {left:?}");

    // Repaired, the same pull completes, keeping the whole layer it had.
    bytes[n / 2] ^= 0xff;
    std::fs::write(&data, &bytes).unwrap();
    let before = reg.requests().len();
    let (ok, _, err) = pull(&d, &["forkd/bad:1"]);
    assert!(ok, "{err}");
    let now = reg.requests()[before..].to_vec();
    assert!(
        !now.iter().any(|(_, p)| p.ends_with(&pushed.layers[0])),
        "the base was kept: {now:?}"
    );
}
