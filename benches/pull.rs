//! Image pull benchmark: `forkd image pull` next to `podman pull`, both from the same
//! registry (Debian's docker-registry on a loopback port, plain HTTP), in the same run.
//!
//! The image is shaped like a task environment: the Debian fixture's root filesystem as
//! its base layer (gzip), 64 MiB of incompressible files (gzip, as a pip install would
//! add), 32 MiB more (zstd), and a small top layer. A second image shares the base.
//! Cases, each a fresh sample:
//! - cold: neither the image nor any of its layers is here (forkd: `image rm` and
//!   `gc`; podman: `rmi`);
//! - present: the image is here and unchanged (forkd asks one manifest HEAD);
//! - shared base: the second image, whose base layer is here already.
//!
//! Also the daemon's peak RSS during a cold pull (blobs are streamed, never held whole),
//! and the bytes the registry served per cold pull. Writes target/bench/pull.json and .md.

#![forbid(unsafe_code)]

mod common;
mod peers;

use anyhow::{bail, Context, Result};
use common::{DaemonGuard, Report};
use peers::podman::Podman;
use serde_json::json;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn main() {
    common::install_interrupt_handler();
    if let Err(e) = run() {
        eprintln!("bench pull: error: {e:#}");
        std::process::exit(1);
    }
}

/// docker-registry on a loopback port, killed when dropped.
struct Registry {
    child: Child,
    port: u16,
}

impl Registry {
    fn start(dir: &Path) -> Result<Registry> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.join("data").display()
            ),
        )?;
        let child = Command::new("/usr/bin/docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(
                dir.join("registry.log"),
            )?))
            .spawn()
            .context("start docker-registry")?;
        let r = Registry { child, port };
        let url = r.url("/v2/");
        if !common::wait_until(Duration::from_secs(20), || ureq::get(&url).call().is_ok()) {
            bail!("docker-registry did not answer on {url}");
        }
        Ok(r)
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn push_blob(&self, repo: &str, bytes: &[u8]) -> Result<String> {
        let digest = format!("sha256:{}", sha256_hex(bytes));
        let resp = ureq::post(&self.url(&format!("/v2/{repo}/blobs/uploads/"))).send_empty()?;
        let loc = resp.headers()["location"].to_str()?.to_string();
        let loc = if loc.starts_with("http") {
            loc
        } else {
            self.url(&loc)
        };
        let sep = if loc.contains('?') { '&' } else { '?' };
        ureq::put(&format!("{loc}{sep}digest={digest}"))
            .header("Content-Type", "application/octet-stream")
            .send(bytes)?;
        Ok(digest)
    }

    /// Pushes an OCI image of (media type, uncompressed tar, blob) layers.
    fn push_image(&self, repo: &str, tag: &str, layers: &[(&str, &[u8], &[u8])]) -> Result<()> {
        let mut descs = Vec::new();
        let mut diff_ids = Vec::new();
        for (mt, tar, blob) in layers {
            let d = self.push_blob(repo, blob)?;
            descs.push(json!({"mediaType": mt, "digest": d, "size": blob.len()}));
            diff_ids.push(format!("sha256:{}", sha256_hex(tar)));
        }
        let config = serde_json::to_vec(&json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Cmd": ["bash"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))?;
        let cd = self.push_blob(repo, &config)?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len()},
            "layers": descs,
        }))?;
        ureq::put(&self.url(&format!("/v2/{repo}/manifests/{tag}")))
            .header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
            .send(&manifest[..])?;
        Ok(())
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn gzip(b: &[u8]) -> Result<Vec<u8>> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(b)?;
    Ok(e.finish()?)
}

/// A tar of `count` files of `size` incompressible bytes each under `dir/`.
fn noise_tar(dir: &str, count: usize, size: usize, seed: u64) -> Result<Vec<u8>> {
    let mut x = seed | 1;
    let mut b = tar::Builder::new(Vec::new());
    for i in 0..count {
        let data: Vec<u8> = (0..size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut h = tar::Header::new_gnu();
        h.set_size(size as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, format!("{dir}/f{i:03}.bin"), &data[..])?;
    }
    Ok(b.into_inner()?)
}

/// Polls a process's RSS until stopped; returns the peak in KiB.
fn watch_rss(pid: u32) -> (Arc<AtomicBool>, Arc<AtomicU64>, std::thread::JoinHandle<()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let (s, p) = (stop.clone(), peak.clone());
    let h = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            if let Ok(kib) = common::rss_kib(pid) {
                p.fetch_max(kib, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    (stop, peak, h)
}

fn run() -> Result<()> {
    let Some(debian) = common::root_and_debian("bench pull")? else {
        return Ok(());
    };
    if !Path::new("/usr/bin/docker-registry").exists() {
        return common::skip(
            "bench pull",
            "docker-registry is missing (run fixtures/setup.sh packages)",
        );
    }
    let n_cold = common::env_usize("FORKD_BENCH_PULL_COLD", 5)?;
    let n_warm = common::env_usize("FORKD_BENCH_PULL_WARM", 20)?;
    let n_shared = common::env_usize("FORKD_BENCH_PULL_SHARED", 5)?;
    let podman = Podman::detect()?;
    let date = common::utc_now();
    let load_start = common::load_average();
    let scratch = common::unique_temp_dir("forkd-bench-pull")?;
    let reg = Registry::start(&scratch)?;

    eprintln!("preparing the image (the Debian fixture as its base layer) ...");
    let base_tar = {
        let out = common::run_checked(Command::new("zstd").args(["-dc", "-T0"]).arg(&debian))?;
        out.stdout
    };
    let base_blob = gzip(&base_tar)?;
    let pip_tar = noise_tar("usr/lib/python3/dist-packages/bench", 64, 1 << 20, 7)?;
    let pip_blob = gzip(&pip_tar)?;
    let data_tar = noise_tar("opt/data", 32, 1 << 20, 11)?;
    let data_blob = zstd::encode_all(&data_tar[..], 3)?;
    let app_tar = noise_tar("app", 4, 4096, 13)?;
    let app_blob = gzip(&app_tar)?;
    let other_tar = noise_tar("opt/other", 16, 1 << 20, 17)?;
    let other_blob = gzip(&other_tar)?;
    let gz = "application/vnd.oci.image.layer.v1.tar+gzip";
    let zs = "application/vnd.oci.image.layer.v1.tar+zstd";
    reg.push_image(
        "bench/env",
        "1",
        &[
            (gz, &base_tar, &base_blob),
            (gz, &pip_tar, &pip_blob),
            (zs, &data_tar, &data_blob),
            (gz, &app_tar, &app_blob),
        ],
    )?;
    reg.push_image(
        "bench/other",
        "1",
        &[(gz, &base_tar, &base_blob), (gz, &other_tar, &other_blob)],
    )?;
    let compressed: usize = [&base_blob, &pip_blob, &data_blob, &app_blob]
        .iter()
        .map(|b| b.len())
        .sum();
    let uncompressed: usize = [&base_tar, &pip_tar, &data_tar, &app_tar]
        .iter()
        .map(|b| b.len())
        .sum();
    drop((
        base_tar, base_blob, pip_tar, pip_blob, data_tar, data_blob, app_tar, app_blob, other_tar,
        other_blob,
    ));
    let host = format!("127.0.0.1:{}", reg.port);
    let image = format!("{host}/bench/env:1");
    let other = format!("{host}/bench/other:1");

    let bin = PathBuf::from(env!("CARGO_BIN_EXE_forkd"));
    let d = DaemonGuard::start(&bin)?;
    let forkd = |args: &[&str]| {
        let mut c = Command::new(&bin);
        c.env("FORKD_SOCKET", &d.socket).args(args);
        c
    };
    let forkd_drop = |name: &str| -> Result<()> {
        let _ = forkd(&["image", "rm", name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        common::run_checked(&mut forkd(&["gc"]))?;
        Ok(())
    };
    let mut report = Report::new("pull");
    let pid = d.pid()?;
    let rss_before = d.rss_kib()?;
    let mut peak_rss = 0;
    report.row(
        "cold: forkd image pull",
        common::sample("forkd cold", 0, n_cold, || {
            forkd_drop(&image)?;
            let (stop, peak, h) = watch_rss(pid);
            let us = common::time_command(&mut forkd(&["image", "pull", &image]));
            stop.store(true, Ordering::Relaxed);
            let _ = h.join();
            peak_rss = peak_rss.max(peak.load(Ordering::Relaxed));
            us
        })?,
    );
    report.row(
        "present (unchanged): forkd image pull",
        common::sample("forkd present", 1, n_warm, || {
            common::time_command(&mut forkd(&["image", "pull", &image]))
        })?,
    );
    report.row(
        "shared base: forkd image pull",
        common::sample("forkd shared", 0, n_shared, || {
            forkd_drop(&other)?;
            common::time_command(&mut forkd(&["image", "pull", &other]))
        })?,
    );
    // What a cold pull left behind as files: the layers' trees.
    let _ = forkd_drop(&other);
    if let Some(p) = &podman {
        let podman_drop = |name: &str| {
            let _ = p
                .command()
                .args(["rmi", "-f", name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        let pull = |name: &str| {
            let mut c = p.command();
            c.args(["pull", "-q", "--tls-verify=false", name]);
            c
        };
        podman_drop(&other);
        report.row(
            "cold: podman pull",
            common::sample("podman cold", 0, n_cold, || {
                podman_drop(&image);
                common::time_command(&mut pull(&image))
            })?,
        );
        report.row(
            "present (unchanged): podman pull",
            common::sample("podman present", 1, n_warm, || {
                common::time_command(&mut pull(&image))
            })?,
        );
        report.row(
            "shared base: podman pull",
            common::sample("podman shared", 0, n_shared, || {
                podman_drop(&other);
                common::time_command(&mut pull(&other))
            })?,
        );
        podman_drop(&image);
        podman_drop(&other);
    }
    let mut ratios = Vec::new();
    for case in ["cold", "present (unchanged)", "shared base"] {
        if let (Some(a), Some(b)) = (
            report.summary(&format!("{case}: forkd image pull")),
            report.summary(&format!("{case}: podman pull")),
        ) {
            ratios.push((
                format!("{case} p50: forkd / podman"),
                format!("{:.3}", a.p50 as f64 / b.p50 as f64),
            ));
        }
    }
    report.sections.push(("Ratios".into(), ratios));
    report.sections.push((
        "Image and memory".into(),
        vec![
            ("layers".into(), "4 (gzip, gzip, zstd, gzip)".into()),
            (
                "compressed bytes".into(),
                format!("{:.1} MiB", compressed as f64 / 1048576.0),
            ),
            (
                "uncompressed bytes".into(),
                format!("{:.1} MiB", uncompressed as f64 / 1048576.0),
            ),
            ("daemon RSS before".into(), format!("{rss_before} KiB")),
            (
                "daemon peak RSS during cold pulls".into(),
                format!("{peak_rss} KiB"),
            ),
            (
                "fetches at once (FORKD_PULL_PARALLEL)".into(),
                std::env::var("FORKD_PULL_PARALLEL").unwrap_or_else(|_| "3 (default)".into()),
            ),
        ],
    ));
    let _ = forkd_drop(&image);
    let cleanup = d.stop();
    drop(reg);
    let _ = std::fs::remove_dir_all(&scratch);
    let run = common::RunInfo::at_end(&date, &load_start);
    let header = run.header(
        json!({ "cold": n_cold, "present": n_warm, "shared": n_shared }),
        (
            "peers",
            json!({ "podman": podman.as_ref().map(|p| json!({"version": p.version, "runtime": p.runtime})) }),
        ),
    );
    let title = run.title("peer: podman pull, same registry");
    let (json_path, md_path, md) = report.write(&header, &title)?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    for p in &cleanup.problems {
        eprintln!("bench pull: {p}");
    }
    Ok(())
}
