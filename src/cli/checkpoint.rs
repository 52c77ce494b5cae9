//! `forkd checkpoint SANDBOX`, `forkd checkpoint ls|inspect|rm`, and `forkd fork`.

use super::Ctx;
use crate::api::{CheckpointInfo, ForkResult};
use clap::{Args, Subcommand};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct CheckpointArgs {
    #[command(subcommand)]
    pub cmd: Option<CheckpointCmd>,
    /// Also dump the live process tree (CRIU)
    #[arg(long)]
    pub live: bool,
    /// Stop the sandbox after the checkpoint
    #[arg(long)]
    pub stop: bool,
    /// Labels (KEY=VALUE)
    #[arg(short, long = "label")]
    pub labels: Vec<String>,
    /// The sandbox to checkpoint
    #[arg(required = true)]
    pub sandbox: Option<String>,
}

#[derive(Subcommand)]
pub enum CheckpointCmd {
    /// List checkpoints
    Ls {
        #[arg(short, long)]
        quiet: bool,
    },
    /// Show checkpoints' details (JSON)
    Inspect { checkpoints: Vec<String> },
    /// Write a checkpoint to one portable file (tar + zstd, verified on import)
    Export {
        checkpoint: String,
        file: std::path::PathBuf,
        /// Name the store's layers (images, runtime) instead of writing them: for a
        /// daemon that holds the same images
        #[arg(long)]
        thin: bool,
    },
    /// Import a checkpoint archive; prints the new checkpoint's id
    Import { file: std::path::PathBuf },
    /// Remove checkpoints (refused while branches use them, unless forced)
    Rm {
        /// Also remove the sandboxes and checkpoints that depend on it
        #[arg(short, long)]
        force: bool,
        #[arg(required = true)]
        checkpoints: Vec<String>,
    },
}

#[derive(Args)]
pub struct ForkArgs {
    pub checkpoint: String,
    /// Number of branches
    #[arg(short = 'n', long = "count", default_value_t = 1)]
    pub count: usize,
    /// Restore memory lazily (userfaultfd)
    #[arg(long)]
    pub lazy: bool,
    #[arg(short, long = "label")]
    pub labels: Vec<String>,
    /// The branches' network (none, egress, allowlist=HOST,...); by default the
    /// checkpointed sandbox's, each branch with an address of its own
    #[arg(long, value_parser = clap::value_parser!(crate::api::Network))]
    pub network: Option<crate::api::Network>,
    /// Share identical memory pages between the branches (KSM, copy-on-write); by
    /// default the daemon's FORKD_KSM decides (ask: not unless asked)
    #[arg(long, conflicts_with = "no_share_memory")]
    pub share_memory: bool,
    /// Keep every branch's memory its own even where FORKD_KSM=on
    #[arg(long)]
    pub no_share_memory: bool,
    /// Each branch's disk limit (what the branch itself writes, e.g. 1g); by default
    /// the checkpointed sandbox's
    #[arg(long)]
    pub disk: Option<String>,
}

/// `KEY=VALUE` flags as a request's labels.
pub fn labels(list: &[String]) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let mut out = std::collections::BTreeMap::new();
    for l in list {
        let (k, v) = l
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("label {l:?} is not KEY=VALUE"))?;
        out.insert(k.into(), v.into());
    }
    Ok(out)
}

pub fn run(ctx: &Ctx, args: CheckpointArgs) -> anyhow::Result<i32> {
    match args.cmd {
        None => {
            let id = args.sandbox.expect("required by clap");
            let body = crate::api::CheckpointRequest {
                live: args.live,
                stop: args.stop,
                labels: labels(&args.labels)?,
            };
            let c: CheckpointInfo =
                ctx.client
                    .send("POST", &format!("/v1/sandboxes/{id}/checkpoint"), &body)?;
            if ctx.json {
                ctx.print_json(&c);
            } else {
                let phases: Vec<String> = c
                    .phases_us
                    .iter()
                    .map(|(k, v)| format!("{k} {:.1}ms", *v as f64 / 1000.0))
                    .collect();
                eprintln!(
                    "checkpoint of {id} ({}): {}",
                    if c.live { "live" } else { "filesystem" },
                    phases.join(", ")
                );
                println!("{}", c.id);
            }
        }
        Some(CheckpointCmd::Ls { quiet }) => {
            let list: Vec<CheckpointInfo> = ctx.client.call("GET", "/v1/checkpoints", None)?;
            if ctx.json {
                ctx.print_json(&list);
            } else if quiet {
                list.iter().for_each(|c| println!("{}", c.id));
            } else {
                println!(
                    "{:<16}  {:<16}  {:<5} {:>6} {:>8}  {:<16}  IMAGE",
                    "ID", "SANDBOX", "LIVE", "LAYERS", "BRANCHES", "PARENT"
                );
                for c in list {
                    println!(
                        "{:<16}  {:<16}  {:<5} {:>6} {:>8}  {:<16}  {}",
                        c.id,
                        c.sandbox,
                        if c.live { "yes" } else { "no" },
                        c.layers.len(),
                        c.branches.len(),
                        c.parent.as_deref().unwrap_or("-"),
                        c.image
                    );
                }
            }
        }
        Some(CheckpointCmd::Inspect { checkpoints }) => {
            let mut out = Vec::new();
            for id in checkpoints {
                out.push(ctx.client.call::<serde_json::Value>(
                    "GET",
                    &format!("/v1/checkpoints/{id}"),
                    None,
                )?);
            }
            ctx.print_json(&out);
        }
        Some(CheckpointCmd::Export {
            checkpoint,
            file,
            thin,
        }) => {
            let path = absolute(&file)?;
            eprintln!("exporting {checkpoint} to {} ...", path.display());
            let r: crate::api::ExportResult = ctx.client.send(
                "POST",
                &format!("/v1/checkpoints/{checkpoint}/export"),
                &crate::api::ExportRequest {
                    path: super::utf8_path(&path)?,
                    thin,
                },
            )?;
            if ctx.json {
                ctx.print_json(&r);
            } else {
                eprintln!(
                    "wrote {} bytes, {} files, in {:.2}s (tree hash {})",
                    r.bytes,
                    r.files,
                    r.duration_us as f64 / 1e6,
                    r.tree_hash
                );
                println!("{}", path.display());
            }
        }
        Some(CheckpointCmd::Import { file }) => {
            let path = absolute(&file)?;
            eprintln!("importing and verifying {} ...", path.display());
            let c: CheckpointInfo = ctx.client.send(
                "POST",
                "/v1/checkpoints/import",
                &crate::api::ArchivePath {
                    path: super::utf8_path(&path)?,
                },
            )?;
            if ctx.json {
                ctx.print_json(&c);
            } else {
                println!("{}", c.id);
            }
        }
        Some(CheckpointCmd::Rm { force, checkpoints }) => {
            for id in checkpoints {
                let _: serde_json::Value = ctx.client.call(
                    "DELETE",
                    &format!("/v1/checkpoints/{id}?force={force}"),
                    None,
                )?;
                println!("{id}");
            }
        }
    }
    Ok(0)
}

pub fn fork(ctx: &Ctx, args: ForkArgs) -> anyhow::Result<i32> {
    let body = crate::api::ForkRequest {
        count: Some(args.count),
        lazy: args.lazy,
        labels: labels(&args.labels)?,
        network: args.network.clone(),
        share_memory: match (args.share_memory, args.no_share_memory) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
        disk_bytes: super::parse_size_opt(args.disk.as_deref())?,
        ..Default::default()
    };
    if !ctx.json {
        eprintln!(
            "forking {} branch(es) from {} ...",
            args.count, args.checkpoint
        );
    }
    let r: ForkResult = ctx.client.send(
        "POST",
        &format!("/v1/checkpoints/{}/fork", args.checkpoint),
        &body,
    )?;
    if ctx.json {
        ctx.print_json(&r);
    } else {
        for b in &r.branches {
            let phases: Vec<String> = b
                .phases_us
                .iter()
                .map(|(k, v)| format!("{k} {:.1}ms", *v as f64 / 1000.0))
                .collect();
            eprintln!("  {} {}: {}", b.id, b.mode, phases.join(", "));
            println!("{}", b.id);
        }
    }
    Ok(0)
}

fn absolute(p: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    })
}
