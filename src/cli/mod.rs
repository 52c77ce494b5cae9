//! The `forkd` command line. Subcommands follow podman/docker habits where they fit;
//! `--json` gives machine-readable output. Each subcommand talks to the daemon through
//! [`crate::client::Client`]; `daemon` and `doctor` run locally.

mod checkpoint;
mod demo;
mod doctor;
mod eval;
mod exec;
mod image;
mod key;
mod login;
mod sandbox;

use crate::client::{Client, ClientError};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "forkd",
    version,
    about = "Sandboxes, checkpoints and copy-on-write forks of whole machine states"
)]
pub struct Cli {
    /// The daemon's socket [env: FORKD_SOCKET; default /run/forkd/forkd.sock]
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    /// A remote daemon: tcp://HOST:PORT (TLS; FORKD_API_KEY, FORKD_CA_CERT) or unix:///PATH [env: FORKD_HOST]
    #[arg(long, global = true)]
    host: Option<String>,
    /// Machine-readable JSON output
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon (foreground)
    Daemon {
        /// State root [env: FORKD_ROOT; default /var/lib/forkd]
        #[arg(long)]
        root: Option<PathBuf>,
    },
    /// Check that this machine can run and checkpoint sandboxes
    Doctor {
        /// CRIU executable to check [env: FORKD_CRIU]
        #[arg(long)]
        criu: Option<PathBuf>,
    },
    /// Manage images
    #[command(subcommand)]
    Image(image::ImageCmd),
    /// Create and start a sandbox, optionally running a command in it
    Run(sandbox::RunArgs),
    /// Run a command in a running sandbox
    Exec(exec::ExecArgs),
    /// Copy files between the host and a sandbox (SANDBOX:/path on one side)
    Cp { src: String, dest: String },
    /// List sandboxes
    Ps {
        /// Only print ids
        #[arg(short, long)]
        quiet: bool,
        /// Include stopped sandboxes
        #[arg(short, long)]
        all: bool,
        /// Read each sandbox's memory use (two cgroup reads a sandbox)
        #[arg(short, long)]
        stats: bool,
    },
    /// Show a sandbox's details (JSON)
    Inspect { sandboxes: Vec<String> },
    /// Print the output of a sandbox's detached command
    Logs {
        sandbox: String,
        /// Which log: `main` (the command given to run -d) or a detached exec's name
        #[arg(long, default_value = "main")]
        name: String,
    },
    /// Stop sandboxes (SIGTERM, then SIGKILL after the grace period)
    Stop {
        #[arg(short = 't', long = "time", default_value_t = 10)]
        grace_secs: u64,
        #[arg(required = true)]
        sandboxes: Vec<String>,
    },
    /// Remove sandboxes
    Rm {
        /// Stop running sandboxes first
        #[arg(short, long)]
        force: bool,
        #[arg(required = true)]
        sandboxes: Vec<String>,
    },
    /// Checkpoint a sandbox (files, and with --live its processes); or ls|inspect|rm
    Checkpoint(checkpoint::CheckpointArgs),
    /// Start branch sandboxes from a checkpoint; prints their ids, one a line
    Fork(checkpoint::ForkArgs),
    /// Remove layers that no image, sandbox or checkpoint uses
    Gc,
    /// Store credentials for a registry (checked against it first), as podman does
    Login(login::LoginArgs),
    /// Remove stored credentials for a registry
    Logout(login::LogoutArgs),
    /// Show per-operation latency recorded by the daemon
    Metrics,
    /// API keys for TCP callers: create, ls, rm (on the daemon's node)
    #[command(subcommand)]
    Key(key::KeyCmd),
    /// The evaluator: experiments on clean and inherited start states, and their report
    #[command(subcommand)]
    Eval(eval::EvalCmd),
    /// The main job on built-in defaults: a private daemon, a tour, and the evaluator suites end to end
    Demo(demo::DemoArgs),
}

/// Runs the CLI; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("forkd: {e:#}");
            match e.downcast_ref::<ClientError>() {
                Some(ClientError::NoDaemon { .. }) => 3,
                _ => 1,
            }
        }
    }
}

pub struct Ctx {
    pub client: Client,
    pub json: bool,
}

impl Ctx {
    pub fn print_json<T: serde::Serialize>(&self, v: &T) {
        println!("{}", serde_json::to_string_pretty(v).expect("json"));
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    let socket = cli.socket.clone().unwrap_or_else(Client::default_socket);
    let endpoint =
        crate::api::transport::Endpoint::choose(cli.host.as_deref(), cli.socket.as_deref(), &|k| {
            std::env::var(k).ok()
        })
        .map_err(|e| anyhow::anyhow!(e))?;
    let ctx = Ctx {
        client: Client::at(endpoint),
        json: cli.json,
    };
    match cli.command {
        Command::Daemon { root } => {
            let root = root.unwrap_or_else(crate::api::defaults::root);
            crate::daemon::run(crate::daemon::DaemonConfig { root, socket })?;
            Ok(0)
        }
        Command::Doctor { criu } => doctor::run(&doctor::DoctorOptions {
            criu,
            json: cli.json,
        }),
        Command::Image(cmd) => image::run(&ctx, cmd),
        Command::Run(args) => sandbox::run(&ctx, args),
        Command::Exec(args) => exec::run(&ctx, args),
        Command::Cp { src, dest } => sandbox::cp(&ctx, &src, &dest),
        Command::Ps { quiet, all, stats } => sandbox::ps(&ctx, quiet, all, stats),
        Command::Inspect { sandboxes } => sandbox::inspect(&ctx, &sandboxes),
        Command::Logs { sandbox, name } => sandbox::logs(&ctx, &sandbox, &name),
        Command::Stop {
            grace_secs,
            sandboxes,
        } => sandbox::stop(&ctx, grace_secs, &sandboxes),
        Command::Rm { force, sandboxes } => sandbox::rm(&ctx, force, &sandboxes),
        Command::Eval(cmd) => eval::run(&socket, cmd, cli.json),
        Command::Key(cmd) => key::run(cmd, cli.json),
        Command::Checkpoint(args) => checkpoint::run(&ctx, args),
        Command::Gc => {
            let r: crate::api::GcResult = ctx.client.call("POST", "/v1/gc", None)?;
            if ctx.json {
                ctx.print_json(&r);
            } else {
                println!(
                    "removed {} layers, freed {} bytes",
                    r.removed_layers.len(),
                    r.freed_bytes
                );
            }
            Ok(0)
        }
        Command::Fork(args) => checkpoint::fork(&ctx, args),
        Command::Login(args) => login::login(args),
        Command::Logout(args) => login::logout(args),
        Command::Demo(args) => demo::run(args),
        Command::Metrics => {
            let m: serde_json::Value = ctx.client.call("GET", "/v1/metrics", None)?;
            if ctx.json {
                ctx.print_json(&m);
            } else {
                println!(
                    "{:<20} {:>8} {:>6} {:>10} {:>10} {:>10}",
                    "OPERATION", "COUNT", "ERRORS", "P50", "P90", "P99"
                );
                for (op, s) in m.as_object().into_iter().flatten() {
                    let us =
                        |k: &str| format!("{:.2}ms", s[k].as_u64().unwrap_or(0) as f64 / 1000.0);
                    println!(
                        "{:<20} {:>8} {:>6} {:>10} {:>10} {:>10}",
                        op,
                        s["count"],
                        s["errors"],
                        us("p50_us"),
                        us("p90_us"),
                        us("p99_us")
                    );
                }
            }
            Ok(0)
        }
    }
}

/// `path` as the API's string: a path that is not UTF-8 is refused, not mangled.
pub fn utf8_path(path: &std::path::Path) -> anyhow::Result<String> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("path {} is not UTF-8", path.display()))
}

/// [`forkd_api::parse_size`] of an optional flag's value.
pub fn parse_size_opt(s: Option<&str>) -> anyhow::Result<Option<u64>> {
    s.map(forkd_api::parse_size)
        .transpose()
        .map_err(anyhow::Error::msg)
}
