//! Image build benchmark: `forkd image build` next to `podman build` on the same
//! Dockerfile and context, in the same run.
//!
//! The Dockerfile is a two-stage task environment (a generated word list copied out of a
//! build stage, a small Python app compiled, a user added) FROM the Debian fixture.
//! Three cases, each a fresh sample:
//! - cold: every step run (`--no-cache` for both);
//! - warm: nothing changed since the last build, so every step is a cache hit;
//! - one file changed: a file copied in the second stage changes, so that stage's
//!   COPY and everything after it runs again.
//!
//! Both are timed as the command a user types (`forkd image build`, `podman build`), and
//! forkd also at the API (`POST /v1/images/build`), which is what the Harbor backend and
//! `forkd eval` call. Writes target/bench/build.json and .md.

#![forbid(unsafe_code)]

mod common;
mod peers;

use anyhow::{Context, Result};
use common::{DaemonGuard, Report};
use peers::podman::Podman;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The Debian fixture as podman's base. `podman import` gives an image without
/// history, on which buildah's layer cache never hits; one LABEL step built over it gives
/// the history the cache needs, so podman's warm builds are warm.
const PODMAN_IMPORTED: &str = "localhost/forkd-bench-debian";
const PODMAN_BASE: &str = "localhost/forkd-bench-debian-base";

const DOCKERFILE: &str = r#"ARG BASE=debian
FROM ${BASE} AS words
WORKDIR /build
COPY gen.py .
RUN python3 gen.py 5000 > words.txt

FROM ${BASE}
WORKDIR /app
COPY lib/ /app/lib/
COPY main.py /app/
RUN python3 -m compileall -q /app && useradd -m agent
COPY --from=words /build/words.txt /app/words.txt
USER agent
ENV MODE=bench
CMD ["python3", "/app/main.py"]
"#;

fn main() {
    common::install_interrupt_handler();
    if let Err(e) = run() {
        eprintln!("bench build: error: {e:#}");
        std::process::exit(1);
    }
}

fn context(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir.join("lib"))?;
    std::fs::write(dir.join("Dockerfile"), DOCKERFILE)?;
    std::fs::write(
        dir.join("gen.py"),
        "import sys\nfor i in range(int(sys.argv[1])):\n    print('w%05d' % (i * 7919 % 100003))\n",
    )?;
    for i in 0..50 {
        std::fs::write(
            dir.join(format!("lib/mod{i:02}.py")),
            format!("def f{i}(x):\n    return x + {i}\n"),
        )?;
    }
    std::fs::write(dir.join("main.py"), "print('main 0')\n")?;
    Ok(())
}

fn time(cmd: &mut Command) -> Result<u64> {
    let t = Instant::now();
    let out = common::run_checked(cmd)?;
    let _ = out;
    Ok(t.elapsed().as_micros() as u64)
}

fn run() -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        return common::skip("bench build", "needs root (namespaces, mounts, cgroups)");
    }
    let debian = common::fixture_image("debian.tar.zst");
    if !debian.exists() {
        return common::skip(
            "bench build",
            &format!(
                "{} is missing (run fixtures/setup.sh debian)",
                debian.display()
            ),
        );
    }
    let n_cold = common::env_usize("FORKD_BENCH_BUILD_COLD", 5)?;
    let n_warm = common::env_usize("FORKD_BENCH_BUILD_WARM", 20)?;
    let n_change = common::env_usize("FORKD_BENCH_BUILD_CHANGE", 5)?;
    let podman = Podman::detect()?;
    let date = common::utc_now();
    let load_start = common::load_average();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_forkd"));
    let d = DaemonGuard::start(&bin)?;
    d.import(&debian, "debian")?;
    let scratch = common::unique_temp_dir("forkd-bench-build")?;
    if let Some(p) = &podman {
        p.import(&debian, PODMAN_IMPORTED)?;
        let base = scratch.join("podman-base");
        std::fs::create_dir_all(&base)?;
        std::fs::write(
            base.join("Dockerfile"),
            format!("FROM {PODMAN_IMPORTED}\nLABEL forkd.bench=base\n"),
        )?;
        common::run_checked(
            p.command()
                .args(["build", "-q", "--pull=never", "-t", PODMAN_BASE])
                .arg(&base),
        )?;
    }
    let ctx = scratch.join("ctx");
    context(&ctx)?;
    let forkd_cli = |no_cache: bool| {
        let mut c = Command::new(&bin);
        c.env("FORKD_SOCKET", &d.socket)
            .args(["image", "build", "-t", "bench:build"]);
        if no_cache {
            c.arg("--no-cache");
        }
        c.arg(&ctx);
        c
    };
    let podman_cmd = |no_cache: bool| {
        let mut c = Command::new("podman");
        c.args(["build", "-q", "--pull=never", "--network=none"])
            .args(["--build-arg", &format!("BASE={PODMAN_BASE}")])
            .args(["-t", "localhost/forkd-bench-build"]);
        if no_cache {
            c.arg("--no-cache");
        }
        c.arg(&ctx);
        c
    };
    let client = d.client();
    let api = |no_cache: bool| -> Result<u64> {
        let t = Instant::now();
        let body = json!({ "context": ctx, "name": "bench:build", "no_cache": no_cache });
        let r: forkd::api::BuildResult = client
            .call("POST", "/v1/images/build", Some(&body))
            .context("build through the API")?;
        anyhow::ensure!(!r.steps.is_empty());
        Ok(t.elapsed().as_micros() as u64)
    };
    let mut report = Report::new("build");
    let mut change = 0u32;
    let mut touch = || -> Result<()> {
        change += 1;
        std::fs::write(ctx.join("main.py"), format!("print('main {change}')\n"))?;
        Ok(())
    };

    report.row(
        "cold (every step run): forkd image build",
        common::sample("forkd cold", 1, n_cold, || time(&mut forkd_cli(true)))?,
    );
    report.row(
        "warm (nothing changed): forkd image build",
        common::sample("forkd warm", 1, n_warm, || time(&mut forkd_cli(false)))?,
    );
    report.row(
        "warm (nothing changed): forkd API",
        common::sample("forkd warm api", 1, n_warm, || api(false))?,
    );
    report.row(
        "one file changed: forkd image build",
        common::sample("forkd change", 0, n_change, || {
            touch()?;
            time(&mut forkd_cli(false))
        })?,
    );
    // Which steps a one-file change reran, from the step records.
    touch()?;
    let body = json!({ "context": ctx, "name": "bench:build" });
    let r: forkd::api::BuildResult = client.call("POST", "/v1/images/build", Some(&body))?;
    let reran: Vec<String> = r
        .steps
        .iter()
        .filter(|s| s.cache == "miss")
        .map(|s| format!("line {}", s.line))
        .collect();
    report.notes.push(format!(
        "a changed main.py reruns {} (the rest hit the cache)",
        reran.join(", ")
    ));
    if podman.is_some() {
        report.row(
            "cold (every step run): podman build",
            common::sample("podman cold", 1, n_cold, || time(&mut podman_cmd(true)))?,
        );
        report.row(
            "warm (nothing changed): podman build",
            common::sample("podman warm", 1, n_warm, || time(&mut podman_cmd(false)))?,
        );
        report.row(
            "one file changed: podman build",
            common::sample("podman change", 0, n_change, || {
                touch()?;
                time(&mut podman_cmd(false))
            })?,
        );
        let _ = Command::new("podman")
            .args(["rmi", "-f", "localhost/forkd-bench-build"])
            .output();
    }
    let mut ratios = Vec::new();
    for (what, ours, peer) in [
        (
            "cold p50: forkd / podman",
            "cold (every step run): forkd image build",
            "cold (every step run): podman build",
        ),
        (
            "warm p50: forkd / podman",
            "warm (nothing changed): forkd image build",
            "warm (nothing changed): podman build",
        ),
        (
            "warm p50: forkd API / podman",
            "warm (nothing changed): forkd API",
            "warm (nothing changed): podman build",
        ),
        (
            "one file changed p50: forkd / podman",
            "one file changed: forkd image build",
            "one file changed: podman build",
        ),
    ] {
        if let (Some(a), Some(b)) = (report.summary(ours), report.summary(peer)) {
            ratios.push((
                what.to_string(),
                format!("{:.3}", a.p50 as f64 / b.p50 as f64),
            ));
        }
    }
    report.sections.push(("Ratios".into(), ratios));
    let cleanup = d.stop();
    let _ = std::fs::remove_dir_all(&scratch);
    let run = common::RunInfo::at_end(&date, &load_start);
    let header = run.header(
        json!({ "cold": n_cold, "warm": n_warm, "change": n_change, "dockerfile": DOCKERFILE }),
        (
            "peers",
            json!({ "podman": podman.as_ref().map(|p| json!({"version": p.version, "runtime": p.runtime})) }),
        ),
    );
    let title = run.title("peer: podman build");
    let (json_path, md_path, md) = report.write(&header, &title)?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    drop(cleanup);
    Ok(())
}
