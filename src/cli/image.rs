//! `forkd image import|ls|rm|inspect`.

use super::Ctx;
use crate::api::ImageInfo;
use crate::daemon::url_encode;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Import a rootfs directory, a tarball (plain, gzip, zstd), an OCI layout or a docker-save archive
    Import {
        source: String,
        #[arg(long)]
        name: String,
    },
    /// List images
    Ls {
        #[arg(short, long)]
        quiet: bool,
    },
    /// Remove images (refused while a sandbox uses them)
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Show an image's details
    Inspect { name: String },
}

pub fn run(ctx: &Ctx, cmd: ImageCmd) -> anyhow::Result<i32> {
    match cmd {
        ImageCmd::Import { source, name } => {
            let abs = std::fs::canonicalize(&source)
                .map_err(|e| anyhow::anyhow!("image source {source}: {e}"))?;
            eprintln!("importing {} as {name} ...", abs.display());
            let t = std::time::Instant::now();
            let body = serde_json::json!({ "source": abs, "name": name });
            let img: ImageInfo = ctx.client.call("POST", "/v1/images", Some(&body))?;
            if ctx.json {
                ctx.print_json(&img);
            } else {
                eprintln!(
                    "imported {} ({} layers) in {:.1}s",
                    img.name,
                    img.layers.len(),
                    t.elapsed().as_secs_f64()
                );
                println!("{}", img.name);
            }
        }
        ImageCmd::Ls { quiet } => {
            let imgs: Vec<ImageInfo> = ctx.client.call("GET", "/v1/images", None)?;
            if ctx.json {
                ctx.print_json(&imgs);
            } else if quiet {
                imgs.iter().for_each(|i| println!("{}", i.name));
            } else {
                println!("{:<32} {:>6} {:>9}  SOURCE", "NAME", "LAYERS", "SANDBOXES");
                for i in imgs {
                    println!(
                        "{:<32} {:>6} {:>9}  {}",
                        i.name,
                        i.layers.len(),
                        i.used_by.len(),
                        i.source
                    );
                }
            }
        }
        ImageCmd::Rm { names } => {
            for n in names {
                let _: serde_json::Value =
                    ctx.client
                        .call("DELETE", &format!("/v1/images/{}", url_encode(&n)), None)?;
                println!("{n}");
            }
        }
        ImageCmd::Inspect { name } => {
            let img: ImageInfo =
                ctx.client
                    .call("GET", &format!("/v1/images/{}", url_encode(&name)), None)?;
            ctx.print_json(&img);
        }
    }
    Ok(0)
}
