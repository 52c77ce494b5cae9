//! `forkd demo`: the main job on built-in defaults. Starts a private daemon (its state root
//! persists, so a second run reuses its images and cached clean states), shows what a
//! sandbox, a checkpoint and a fork cost here, then runs each evaluator suite end to end
//! (validate, residual states from the scripted predecessors, the clean and residual
//! conditions with the scripted agents, the report) and prints where the results are.

use crate::api::{ExecResult, ForkResult, SandboxInfo};
use crate::client::Client;
use crate::private_daemon::{Options, PrivateDaemon};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct DemoArgs {
    /// Evaluator suites to run (directories of tasks)
    #[arg(long = "suite")]
    pub suites: Vec<PathBuf>,
    /// Where to write the runs and reports
    #[arg(long, default_value = "forkd-results")]
    pub out: PathBuf,
    /// The private daemon's state root
    #[arg(long, default_value = "/var/lib/forkd-demo")]
    pub root: PathBuf,
    /// Replicates per cell
    #[arg(short = 'k', long, default_value_t = 2)]
    pub replicates: u32,
    /// Conditions to run
    #[arg(
        long,
        default_value = "clean,residual,rescue_notice,rescue_note,pristine_control"
    )]
    pub conditions: String,
}

fn step(what: &str, t: Instant) {
    println!(
        "  {:<60} {:>9.1} ms",
        what,
        t.elapsed().as_secs_f64() * 1000.0
    );
}

fn tour(c: &Client) -> anyhow::Result<()> {
    let exec = |id: &str, line: &str| -> anyhow::Result<String> {
        let r: ExecResult = c.send(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            &crate::api::ExecRequest {
                shell: Some(line.to_string()),
                ..Default::default()
            },
        )?;
        Ok(
            String::from_utf8_lossy(&crate::api::b64::decode(&r.stdout_b64).unwrap_or_default())
                .into_owned(),
        )
    };
    let t = Instant::now();
    let counter = "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done";
    let sb: SandboxInfo = c.send(
        "POST",
        "/v1/sandboxes",
        &crate::api::CreateSandboxRequest {
            image: "busybox".into(),
            command: Some(crate::api::ExecRequest {
                shell: Some(counter.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    )?;
    step(&format!("create a sandbox ({})", &sb.id[..12]), t);
    let t = Instant::now();
    exec(&sb.id, "true")?;
    step("exec round trip", t);
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let ck: crate::api::CheckpointInfo = c.send(
        "POST",
        &format!("/v1/sandboxes/{}/checkpoint", sb.id),
        &crate::api::CheckpointRequest {
            live: true,
            ..Default::default()
        },
    )?;
    step("live checkpoint (files + process tree)", t);
    let t = Instant::now();
    let fork: ForkResult = c.send(
        "POST",
        &format!("/v1/checkpoints/{}/fork", ck.id),
        &crate::api::ForkRequest {
            count: Some(4),
            ..Default::default()
        },
    )?;
    step("fork 4 branches (process trees restored)", t);
    std::thread::sleep(Duration::from_millis(300));
    let counters: Vec<String> = fork
        .branches
        .iter()
        .map(|b| exec(&b.id, "cat /tmp/counter").map(|s| s.trim().to_string()))
        .collect::<Result<_, _>>()?;
    println!(
        "  counters in the branches, resumed from the checkpoint: {}",
        counters.join(", ")
    );
    let _ = c.call::<serde_json::Value>(
        "DELETE",
        &format!("/v1/checkpoints/{}?force=true", ck.id),
        None,
    );
    let _ = c.call::<serde_json::Value>(
        "DELETE",
        &format!("/v1/sandboxes/{}?force=true", sb.id),
        None,
    );
    Ok(())
}

pub fn run(args: DemoArgs) -> anyhow::Result<i32> {
    let busybox = crate::api::defaults::cache().join("images/busybox.tar");
    anyhow::ensure!(
        busybox.exists(),
        "fixture {} is missing: run fixtures/setup.sh busybox",
        busybox.display()
    );
    let t = Instant::now();
    let mut opts = Options::new("/proc/self/exe", &args.root);
    opts.root = Some(args.root.clone());
    // The demo's root is kept: images and states stay cached for the next run.
    opts.keep_state = true;
    let daemon = PrivateDaemon::start(opts, || Ok(())).map_err(|e| anyhow::anyhow!(e))?;
    let socket = daemon.socket.clone();
    let c = &daemon.client();
    println!(
        "forkd main job (daemon state root {}):",
        args.root.display()
    );
    step("start a private daemon", t);
    let t = Instant::now();
    crate::eval::session::Session::new(&socket).ensure_image("busybox", &busybox)?;
    step("import the busybox image (cached after the first run)", t);
    tour(c)?;

    std::fs::create_dir_all(&args.out)?;
    let out = std::fs::canonicalize(&args.out)?;
    let stamp = forkd_sys::clock::now_secs();
    let mut runs = Vec::new();
    for suite in &args.suites {
        if !suite.join(".").is_dir() {
            println!(
                "  suite {} is missing; skipped (fixtures/setup.sh suite builds the bundled one)",
                suite.display()
            );
            continue;
        }
        let name = suite
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_else(|| "suite".into());
        println!("\nsuite {name} ({}):", suite.display());
        let said = crate::eval::validate(&socket, suite)?;
        print!("{}", said.text);
        anyhow::ensure!(said.code == 0, "suite {} did not validate", suite.display());
        let run_dir = out.join(format!("{name}-{stamp}"));
        let opts = crate::eval::RunOptions {
            suite: suite.clone(),
            out: run_dir.clone(),
            agents: vec!["oracle".into(), "noop".into()],
            predecessors: Vec::new(),
            conditions: args
                .conditions
                .split(',')
                .map(crate::eval::parse_condition)
                .collect::<anyhow::Result<_>>()?,
            replicates: args.replicates,
            parallel: 2,
            retries: 2,
            states_only: false,
            reconstruct: None,
            review: Default::default(),
            shard: None,
        };
        print!("{}", crate::eval::execute(&socket, &opts, false)?.text);
        let ds = forkd_analysis::load_runs(std::slice::from_ref(&run_dir))?;
        let analysis = forkd_analysis::analyze(&ds, &forkd_analysis::Options::default());
        forkd_analysis::write_report(
            &analysis,
            &run_dir.join("report"),
            forkd_analysis::Format::Report,
        )?;
        runs.push(run_dir);
    }
    drop(daemon);
    println!();
    if runs.is_empty() {
        println!("no suite ran (pass --suite DIR)");
    }
    for r in &runs {
        println!("results: {}", r.display());
        println!(
            "report:  {}",
            Path::new(r).join("report/report.html").display()
        );
    }
    Ok(0)
}
