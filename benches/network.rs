//! The API over the network: the same daemon answering on its Unix socket and on a TLS
//! listener on loopback (P-256 certificate, an API key), in one run, with podman's own
//! remote API (`podman system service` on TCP, `podman --url`) as the peer.
//!
//! Rows (client-side wall time):
//! - `exec true` round trip in one running sandbox: Unix socket; TLS on a kept-alive
//!   connection; TLS with a new connection (and handshake) each time.
//! - create -> first exec, a fresh sandbox per sample: Unix socket; TLS.
//! - the CLI binary's `exec true` (process start included): on the socket; over TLS;
//!   podman's `podman exec` locally and `podman --url tcp://... exec` remotely.
//! - throughput: `FORKD_BENCH_CLIENTS` (64) clients each running `exec true` in a
//!   sandbox of its own for `FORKD_BENCH_SECS` (10) seconds, on the socket and over TLS:
//!   execs a second and the latency percentiles.
//!
//! The goal this measures: TLS within 1 ms of the Unix socket at the median.
//!
//! Output: `target/bench/network.json` and `.md`. Environment: `FORKD_BENCH_SAMPLES`
//! (default 200), `FORKD_BENCH_PODMAN=0` skips podman. Needs root, openssl and the busybox
//! fixture; without them it prints `SKIP` lines, which are errors under `CI=true`.

#![forbid(unsafe_code)]

mod common;
mod peers;
#[path = "../tests/common/pki.rs"]
mod pki;

use anyhow::{anyhow, Context, Result};
use common::{sample, DaemonGuard, Report};
use forkd::api::transport::Endpoint;
use forkd::client::Client;
use peers::podman::{Podman, PodmanContainer};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const IMAGE: &str = "busybox";
const PODMAN_IMAGE: &str = "localhost/forkd-bench-busybox";

fn main() {
    common::install_interrupt_handler();
    if let Err(e) = run() {
        eprintln!("bench network: error: {e:#}");
        std::process::exit(1);
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn exec_true(c: &Client, id: &str) -> Result<()> {
    let r: forkd::api::ExecResult = c
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&json!({ "argv": ["true"] })),
        )
        .with_context(|| format!("exec true in {id}"))?;
    anyhow::ensure!(
        r.exit.exit_code == 0,
        "exec true exited {}",
        r.exit.exit_code
    );
    Ok(())
}

fn create(c: &Client) -> Result<String> {
    let info: forkd::api::SandboxInfo = c
        .call("POST", "/v1/sandboxes", Some(&json!({ "image": IMAGE })))
        .context("create")?;
    Ok(info.id)
}

fn remove(c: &Client, id: &str) -> Result<()> {
    let _: serde_json::Value = c
        .call("DELETE", &format!("/v1/sandboxes/{id}?force=true"), None)
        .with_context(|| format!("remove {id}"))?;
    Ok(())
}

fn cli_ok(cmd: &mut Command) -> Result<u64> {
    let t = Instant::now();
    let out = cmd.output().context("run the CLI")?;
    let us = t.elapsed().as_micros() as u64;
    anyhow::ensure!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(us)
}

/// `clients` threads, each with a sandbox of its own, running `exec true` for `secs`:
/// (execs a second, every latency).
fn throughput(make: &dyn Fn() -> Client, clients: usize, secs: u64) -> Result<(f64, Vec<u64>)> {
    let owner = make();
    let ids: Vec<String> = (0..clients)
        .map(|_| create(&owner))
        .collect::<Result<_>>()?;
    let times = Mutex::new(Vec::new());
    let errors = Mutex::new(Vec::<String>::new());
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    std::thread::scope(|s| {
        for id in &ids {
            let (times, errors) = (&times, &errors);
            let c = make();
            s.spawn(move || {
                let mut mine = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    match exec_true(&c, id) {
                        Ok(()) => mine.push(t.elapsed().as_micros() as u64),
                        Err(e) => {
                            errors.lock().unwrap().push(format!("{e:#}"));
                            break;
                        }
                    }
                }
                times.lock().unwrap().extend(mine);
            });
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    for id in &ids {
        remove(&owner, id)?;
    }
    let errors = errors.into_inner().unwrap();
    anyhow::ensure!(
        errors.is_empty(),
        "{} execs failed: {}",
        errors.len(),
        errors[0]
    );
    let times = times.into_inner().unwrap();
    Ok((times.len() as f64 / elapsed, times))
}

fn run() -> Result<()> {
    let samples = common::env_usize("FORKD_BENCH_SAMPLES", 200)?;
    let clients = common::env_usize("FORKD_BENCH_CLIENTS", 64)?;
    let secs = common::env_usize("FORKD_BENCH_SECS", 10)? as u64;
    if !nix::unistd::Uid::effective().is_root() {
        return common::skip("bench network", "needs root (namespaces, mounts, cgroups)");
    }
    if !Path::new("/usr/bin/openssl").exists() {
        return common::skip(
            "bench network",
            "openssl is missing (run fixtures/setup.sh packages)",
        );
    }
    let tar = common::fixture_image("busybox.tar");
    if !tar.is_file() {
        return common::skip(
            "bench network",
            &format!(
                "fixture {} is missing (run fixtures/setup.sh busybox)",
                tar.display()
            ),
        );
    }
    let podman = Podman::detect()?;
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_forkd"));
    let date = common::utc_now();
    let load_start = common::load_average();

    let pki_dir = common::unique_temp_dir("forkd-bench-pki")?;
    pki::make_pki(&pki_dir);
    let port = free_port()?;
    let host = format!("tcp://127.0.0.1:{port}");
    let (cert, key) = (
        pki_dir.join("server.crt").display().to_string(),
        pki_dir.join("server.key").display().to_string(),
    );
    let daemon = DaemonGuard::start_with_env(
        &bin,
        &[
            ("FORKD_LISTEN", &host),
            ("FORKD_TLS_CERT", &cert),
            ("FORKD_TLS_KEY", &key),
        ],
    )?;
    let out = Command::new(&bin)
        .args(["key", "create", "bench", "--root"])
        .arg(&daemon.root)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "key create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let api_key = String::from_utf8(out.stdout)?.trim().to_string();
    let ca = pki_dir.join("ca.crt").display().to_string();
    let remote_env = [
        ("FORKD_HOST", host.clone()),
        ("FORKD_API_KEY", api_key.clone()),
        ("FORKD_CA_CERT", ca.clone()),
    ];
    let endpoint = Endpoint::parse(&host, &|k: &str| {
        remote_env
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.clone())
    })
    .map_err(|e| anyhow!(e))?;
    let unix = daemon.client();
    let tls = Client::at(endpoint.clone());
    daemon.import(&tar, IMAGE)?;

    let mut report = Report::new("network");
    let measured = (|| -> Result<()> {
        eprintln!("[1/4] exec round trip");
        let id = create(&unix)?;
        let n = 2 * samples;
        report.row(
            "exec true, Unix socket",
            sample("exec unix", 20, n, || {
                let t = Instant::now();
                exec_true(&unix, &id)?;
                Ok(t.elapsed().as_micros() as u64)
            })?,
        );
        report.row(
            "exec true, TLS (kept-alive connection)",
            sample("exec tls", 20, n, || {
                let t = Instant::now();
                exec_true(&tls, &id)?;
                Ok(t.elapsed().as_micros() as u64)
            })?,
        );
        report.row(
            "exec true, TLS (new connection and handshake)",
            sample("exec tls new", 20, n, || {
                let fresh = Client::at(endpoint.clone());
                let t = Instant::now();
                exec_true(&fresh, &id)?;
                Ok(t.elapsed().as_micros() as u64)
            })?,
        );

        eprintln!("[2/4] create -> first exec");
        for (row, c) in [
            ("create -> first exec, Unix socket", &unix),
            ("create -> first exec, TLS", &tls),
        ] {
            report.row(
                row,
                sample(row, 5, samples, || {
                    let t = Instant::now();
                    let sb = create(c)?;
                    exec_true(c, &sb)?;
                    let us = t.elapsed().as_micros() as u64;
                    remove(c, &sb)?;
                    Ok(us)
                })?,
            );
        }

        eprintln!("[3/4] the CLI, and podman's remote API");
        let cli_n = samples / 2;
        report.row(
            "forkd exec true (CLI, Unix socket)",
            sample("cli unix", 5, cli_n, || {
                cli_ok(
                    Command::new(&bin)
                        .args(["exec", &id, "--", "true"])
                        .env("FORKD_SOCKET", &daemon.socket),
                )
            })?,
        );
        report.row(
            "forkd exec true (CLI, TLS)",
            sample("cli tls", 5, cli_n, || {
                cli_ok(
                    Command::new(&bin)
                        .args(["exec", &id, "--", "true"])
                        .env_remove("FORKD_SOCKET")
                        .envs(remote_env.iter().map(|(k, v)| (*k, v.as_str()))),
                )
            })?,
        );
        if let Some(p) = &podman {
            p.import(&tar, PODMAN_IMAGE)?;
            let ctr =
                PodmanContainer::start(p, "forkd-bench-net", PODMAN_IMAGE, &["sleep", "100000"])?;
            report.row(
                "podman exec true (local)",
                sample("podman exec", 5, cli_n, || {
                    cli_ok(p.command().args(["exec", &ctr.name, "true"]))
                })?,
            );
            let pport = free_port()?;
            let url = format!("tcp://127.0.0.1:{pport}");
            let mut service = p
                .command()
                .args(["system", "service", "--time=0", &url])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .context("podman system service")?;
            let up = (0..100).any(|_| {
                std::thread::sleep(Duration::from_millis(100));
                std::net::TcpStream::connect(("127.0.0.1", pport)).is_ok()
            });
            let remote = if up {
                sample("podman remote exec", 5, cli_n, || {
                    cli_ok(p.command().args(["--url", &url, "exec", &ctr.name, "true"]))
                })
            } else {
                Err(anyhow!("podman system service did not listen on {url}"))
            };
            let _ = service.kill();
            let _ = service.wait();
            report.row(
                "podman --url tcp:// exec true (its remote API, plain TCP)",
                remote?,
            );
        }
        remove(&unix, &id)?;

        eprintln!("[4/4] throughput, {clients} clients for {secs} s each way");
        let sock = daemon.socket.clone();
        let (unix_rate, unix_times) = throughput(&|| Client::new(&sock), clients, secs)?;
        let (tls_rate, tls_times) = throughput(&|| Client::at(endpoint.clone()), clients, secs)?;
        report.row(
            &format!("exec true under {clients} clients, Unix socket"),
            unix_times,
        );
        report.row(
            &format!("exec true under {clients} clients, TLS"),
            tls_times,
        );
        report.sections.push((
            format!("Throughput, {clients} clients each with its sandbox, {secs} s"),
            vec![
                ("Unix socket, execs/s".into(), format!("{unix_rate:.0}")),
                ("TLS, execs/s".into(), format!("{tls_rate:.0}")),
                ("TLS / Unix".into(), format!("{:.2}", tls_rate / unix_rate)),
            ],
        ));
        Ok(())
    })();
    if measured.is_err() {
        eprintln!("daemon log (last lines):\n{}", daemon.log_tail(15));
    }
    let _ = daemon.stop();
    let _ = std::fs::remove_dir_all(&pki_dir);
    measured?;

    let p50 = |r: &str| report.p50(r).unwrap_or(0) as f64;
    let mut notes = vec![];
    for (what, a, b) in [
        (
            "exec",
            "exec true, TLS (kept-alive connection)",
            "exec true, Unix socket",
        ),
        (
            "create -> first exec",
            "create -> first exec, TLS",
            "create -> first exec, Unix socket",
        ),
    ] {
        let d = (p50(a) - p50(b)) / 1000.0;
        notes.push((
            format!("{what}: TLS - Unix at the median (goal: within 1 ms)"),
            format!("{d:.3} ms"),
        ));
    }
    if podman.is_some() {
        notes.push((
            "forkd CLI over TLS / podman --url exec, median".into(),
            format!(
                "{:.3}",
                p50("forkd exec true (CLI, TLS)")
                    / p50("podman --url tcp:// exec true (its remote API, plain TCP)")
            ),
        ));
    }
    report
        .sections
        .push(("Against the goal and the peer".into(), notes));
    let run = common::RunInfo::at_end(&date, &load_start);
    let header = run.header(
        json!({ "samples": samples, "clients": clients, "secs": secs, "image": IMAGE, "tls": "rustls, P-256" }),
        ("peer", json!(podman.as_ref().map(|p| json!({"engine": "podman", "version": p.version})))),
    );
    let title = run.title(&format!(
        "peer: {}",
        podman
            .as_ref()
            .map(|p| format!("podman {} remote API", p.version))
            .unwrap_or_else(|| "skipped".into())
    ));
    let (json_path, md_path, md) = report.write(&header, &title)?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}
