//! `forkd key`: the API keys TCP callers present. They are kept in the state root's
//! `keys.json` (digests only), which the daemon reads again whenever it changes, so this
//! works on the node whether the daemon runs or not, and a removed key is refused from
//! the next request on.

use clap::Subcommand;
use forkd_keys::{Keys, Scope};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum KeyCmd {
    /// Make a key; it is printed once, and only its digest is kept
    Create {
        name: String,
        /// own (the default): images, and only the sandboxes and checkpoints this key
        /// makes (a harness host's); full: every operation, host paths included (the
        /// node's operator's)
        #[arg(long, default_value = "own")]
        scope: String,
        /// State root [env: FORKD_ROOT; default /var/lib/forkd]
        #[arg(long)]
        root: Option<PathBuf>,
    },
    /// List keys: names, scopes, when made
    Ls {
        #[arg(long)]
        root: Option<PathBuf>,
    },
    /// Remove a key: requests with it are refused from the next on
    Rm {
        name: String,
        #[arg(long)]
        root: Option<PathBuf>,
    },
}

fn store(root: Option<PathBuf>) -> Keys {
    Keys::at(&root.unwrap_or_else(crate::api::defaults::root))
}

pub fn run(cmd: KeyCmd, json: bool) -> anyhow::Result<i32> {
    match cmd {
        KeyCmd::Create { name, scope, root } => {
            let scope: Scope = scope.parse()?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            let (secret, key) = store(root).create(&name, scope, now)?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"name": key.name, "id": key.id, "scope": key.scope, "created": key.created, "key": secret})
                );
            } else {
                println!("{secret}");
                eprintln!(
                    "key {:?} (scope {}): shown this once; send it as FORKD_API_KEY",
                    key.name, key.scope
                );
            }
        }
        KeyCmd::Ls { root } => {
            let keys = store(root).current()?;
            if json {
                let shown: Vec<_> = keys
                    .iter()
                    .map(|k| serde_json::json!({"name": k.name, "id": k.id, "scope": k.scope, "created": k.created}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&shown)?);
            } else {
                println!("{:<32} {:<16} {:<6} CREATED", "NAME", "ID", "SCOPE");
                for k in keys.iter() {
                    println!("{:<32} {:<16} {:<6} {}", k.name, k.id, k.scope, k.created);
                }
            }
        }
        KeyCmd::Rm { name, root } => {
            let k = store(root).remove(&name)?;
            if json {
                println!("{}", serde_json::json!({"removed": k.name}));
            } else {
                println!("{}", k.name);
            }
        }
    }
    Ok(0)
}
