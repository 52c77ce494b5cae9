//! A real registry for the pull tests: Debian's docker-registry on a loopback port,
//! images pushed into it over the distribution API, and the Python test hosts of
//! `tests/hosts/registry_hosts.py` (a token server, a proxy that injects faults).

use super::*;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A docker-registry serving plain HTTP on a loopback port, storing under `dir`.
pub struct Registry {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
    pub log: PathBuf,
    /// The `Authorization` header pushes send.
    pub push_auth: Option<String>,
}

impl Registry {
    pub fn start(dir: &Path) -> Option<Registry> {
        Self::start_with(dir, "", None)
    }

    /// A registry with `extra` YAML at the end of its configuration (top-level keys such
    /// as auth and middleware; indented, keys of `http:` such as `tls`); `push_auth`
    /// gives the header pushes need, from its log once it runs.
    pub fn start_with(
        dir: &Path,
        extra: &str,
        push_auth: Option<fn(&str) -> Option<String>>,
    ) -> Option<Registry> {
        Self::start_on(dir, &dir.join("data"), extra, push_auth)
    }

    /// Like [`Registry::start_with`], serving the storage under `data` (which another
    /// registry may serve too).
    pub fn start_on(
        dir: &Path,
        data: &Path,
        extra: &str,
        push_auth: Option<fn(&str) -> Option<String>>,
    ) -> Option<Registry> {
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
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{extra}",
                data.display()
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
        let mut r = Registry {
            child,
            port,
            dir: dir.to_path_buf(),
            log,
            push_auth: None,
        };
        // Any answer (a 401 included) means it listens.
        assert!(
            wait_until(Duration::from_secs(20), || matches!(
                ureq::get(&format!("http://127.0.0.1:{port}/v2/")).call(),
                Ok(_) | Err(ureq::Error::StatusCode(_))
            )),
            "the registry did not answer: {}",
            std::fs::read_to_string(&r.log).unwrap_or_default()
        );
        if let Some(f) = push_auth {
            let log = r.log.clone();
            assert!(
                wait_until(Duration::from_secs(10), || {
                    f(&std::fs::read_to_string(&log).unwrap_or_default()).is_some()
                }),
                "no push credentials in the registry's log"
            );
            r.push_auth = f(&std::fs::read_to_string(&r.log).unwrap_or_default());
        }
        Some(r)
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Uploads a blob (monolithic POST then PUT); returns its digest.
    pub fn blob(&self, repo: &str, bytes: &[u8]) -> String {
        let digest = format!("sha256:{}", sha256(bytes));
        let mut post = ureq::post(&self.url(&format!("/v2/{repo}/blobs/uploads/")));
        if let Some(a) = &self.push_auth {
            post = post.header("Authorization", a);
        }
        let resp = post.send_empty().unwrap();
        let loc = resp.headers()["location"].to_str().unwrap().to_string();
        let loc = if loc.starts_with("http") {
            loc
        } else {
            self.url(&loc)
        };
        let sep = if loc.contains('?') { '&' } else { '?' };
        let mut put = ureq::put(&format!("{loc}{sep}digest={digest}"))
            .header("Content-Type", "application/octet-stream");
        if let Some(a) = &self.push_auth {
            put = put.header("Authorization", a);
        }
        put.send(bytes).unwrap();
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
        let mut put = ureq::put(&self.url(&format!("/v2/{repo}/manifests/{reference}")))
            .header("Content-Type", media_type);
        if let Some(a) = &self.push_auth {
            put = put.header("Authorization", a);
        }
        put.send(&bytes[..]).unwrap();
        format!("sha256:{}", sha256(&bytes))
    }

    /// The requests forkd made so far: (method, path).
    pub fn requests(&self) -> Vec<(String, String)> {
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

pub fn sha256(b: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

pub fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// A tar of (path, contents) files.
pub fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let with_modes: Vec<(&str, &[u8], u32)> = files.iter().map(|(p, d)| (*p, *d, 0o644)).collect();
    tar_with_modes(&with_modes)
}

/// A tar of (path, contents, mode) files, owned by root.
pub fn tar_with_modes(files: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data, mode) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, *data).unwrap();
    }
    b.into_inner().unwrap()
}

pub struct Pushed {
    pub index: String,
    pub manifest: String,
    pub layers: Vec<String>,
}

/// Pushes an image of `layers` (media type, uncompressed tar, blob) with an OCI index
/// listing it for linux/amd64 beside an arm64 entry and an attestation manifest.
pub fn push_image(
    reg: &Registry,
    repo: &str,
    tag: &str,
    layers: &[(&str, Vec<u8>, Vec<u8>)],
    env: &str,
) -> Pushed {
    push_image_as(reg, repo, tag, layers, env, false)
}

/// [`push_image`] with Docker's schema 2 media types (a manifest list) when `docker`.
pub fn push_image_as(
    reg: &Registry,
    repo: &str,
    tag: &str,
    layers: &[(&str, Vec<u8>, Vec<u8>)],
    env: &str,
    docker: bool,
) -> Pushed {
    let (index_type, manifest_type, config_type) = if docker {
        (
            "application/vnd.docker.distribution.manifest.list.v2+json",
            "application/vnd.docker.distribution.manifest.v2+json",
            "application/vnd.docker.container.image.v1+json",
        )
    } else {
        (
            "application/vnd.oci.image.index.v1+json",
            "application/vnd.oci.image.manifest.v1+json",
            "application/vnd.oci.image.config.v1+json",
        )
    };
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
        "mediaType": manifest_type,
        "config": {"mediaType": config_type, "digest": config_digest, "size": config_bytes.len()},
        "layers": descs,
    });
    let m = reg.manifest(repo, &format!("{tag}-amd64"), manifest_type, &manifest);
    let msize = serde_json::to_vec(&manifest).unwrap().len();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": index_type,
        "manifests": [
            // An attestation first, and another platform: neither may be taken.
            {"mediaType": manifest_type, "digest": m, "size": msize,
             "platform": {"os": "unknown", "architecture": "unknown"},
             "annotations": {"vnd.docker.reference.type": "attestation-manifest"}},
            {"mediaType": manifest_type, "digest": m, "size": msize,
             "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
            {"mediaType": manifest_type, "digest": m, "size": msize,
             "platform": {"os": "linux", "architecture": "amd64"}},
        ],
    });
    let i = reg.manifest(repo, tag, index_type, &index);
    Pushed {
        index: i,
        manifest: m,
        layers: digests,
    }
}

pub fn base_layer() -> (&'static str, Vec<u8>, Vec<u8>) {
    let tar = std::fs::read(busybox_tar()).unwrap();
    let blob = gzip(&tar);
    ("application/vnd.oci.image.layer.v1.tar+gzip", tar, blob)
}

pub fn top_layer(text: &str) -> (&'static str, Vec<u8>, Vec<u8>) {
    let tar = tar_of(&[("etc/pulled", text.as_bytes()), ("bin/.wh.vi", b"")]);
    let blob = zstd::encode_all(&tar[..], 3).unwrap();
    ("application/vnd.oci.image.layer.v1.tar+zstd", tar, blob)
}

pub fn pull(d: &TestDaemon, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["image", "pull"];
    all.extend_from_slice(args);
    let out = d.cli(&all);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn daemon_with_registry(name: &str, reg: &Registry) -> TestDaemon {
    daemon_with_registry_env(name, reg, &[])
}

/// [`daemon_with_registry`] with more environment for the daemon.
pub fn daemon_with_registry_env(name: &str, reg: &Registry, more: &[(&str, &str)]) -> TestDaemon {
    let conf = reg.dir.join("registries.conf");
    std::fs::write(
        &conf,
        format!("unqualified-search-registries = [\"{}\"]\n", reg.host()),
    )
    .unwrap();
    let auth = reg.dir.join("auth.json");
    let mut env = vec![
        ("FORKD_REGISTRIES_CONF", conf.to_str().unwrap()),
        // No credentials of the machine's own reach the test registry.
        ("REGISTRY_AUTH_FILE", auth.to_str().unwrap()),
        ("DOCKER_CONFIG", reg.dir.to_str().unwrap()),
    ];
    env.extend_from_slice(more);
    TestDaemon::start_with_env(name, &env)
}

/// A Python test host of `tests/hosts/registry_hosts.py`, killed on drop.
pub struct Host {
    child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Host {
    /// Starts `registry_hosts.py ARGS... PORTFILE LOG` and waits for it to listen.
    pub fn start(dir: &Path, name: &str, args: &[&str]) -> Host {
        let portfile = dir.join(format!("{name}.port"));
        let log = dir.join(format!("{name}.log"));
        let _ = std::fs::remove_file(&portfile);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hosts/registry_hosts.py");
        let child = Command::new("/usr/bin/python3")
            .arg(script)
            .args(args)
            .arg(&portfile)
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join(format!("{name}.err"))).unwrap(),
            ))
            .spawn()
            .expect("run python3");
        assert!(
            wait_until(Duration::from_secs(20), || portfile.exists()),
            "{name} did not start"
        );
        let port = std::fs::read_to_string(&portfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        Host { child, port, log }
    }

    /// The requests it logged.
    pub fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
