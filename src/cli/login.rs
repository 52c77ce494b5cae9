//! `forkd login` and `forkd logout`: credentials in the containers auth file, written as
//! podman writes them, which the daemon reads at every pull.

use std::io::BufRead as _;
use std::path::PathBuf;

use forkd_registry::auth::{self, Credential};
use forkd_registry::{Client, ClientConfig};

#[derive(clap::Args)]
pub struct LoginArgs {
    /// The registry (HOST[:PORT]), or a namespace on it (HOST/NAMESPACE)
    registry: String,
    #[arg(short = 'u', long)]
    username: Option<String>,
    /// The password (visible to other users in the process list: prefer --password-stdin)
    #[arg(short = 'p', long)]
    password: Option<String>,
    /// Read the password from standard input
    #[arg(long)]
    password_stdin: bool,
    /// The auth file to write (default: REGISTRY_AUTH_FILE, else
    /// $XDG_RUNTIME_DIR/containers/auth.json, else /run/containers/UID/auth.json)
    #[arg(long)]
    authfile: Option<PathBuf>,
    /// Store the credentials without asking the registry whether they are good
    #[arg(long)]
    no_check: bool,
}

#[derive(clap::Args)]
pub struct LogoutArgs {
    /// The registry (or HOST/NAMESPACE) given to login
    registry: String,
    #[arg(long)]
    authfile: Option<PathBuf>,
}

/// A URL such as `https://host/v1/`, and Docker Hub's other names, as the key podman
/// writes.
fn key_of(registry: &str) -> anyhow::Result<String> {
    let r = registry
        .strip_prefix("https://")
        .or_else(|| registry.strip_prefix("http://"))
        .unwrap_or(registry)
        .trim_end_matches('/');
    let r = match r {
        r if r == forkd_registry::reference::DOCKER_HUB_LEGACY
            || r == forkd_registry::reference::DOCKER_HUB_API =>
        {
            forkd_registry::reference::DOCKER_HUB
        }
        r => r,
    };
    let host = r.split('/').next().unwrap_or(r);
    if host.is_empty() || r.contains(char::is_whitespace) {
        anyhow::bail!("{registry:?} is not a registry (HOST[:PORT] or HOST/NAMESPACE)");
    }
    Ok(r.to_owned())
}

pub fn login(args: LoginArgs) -> anyhow::Result<i32> {
    let key = key_of(&args.registry)?;
    let host = key.split('/').next().unwrap_or(&key).to_owned();
    let username = match args.username {
        Some(u) => u,
        None => {
            eprint!("Username: ");
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line)?;
            line.trim().to_owned()
        }
    };
    let password = match (args.password, args.password_stdin) {
        (Some(_), true) => anyhow::bail!("give --password or --password-stdin, not both"),
        (Some(p), false) => p,
        (None, _) => {
            if !args.password_stdin {
                eprint!("Password: ");
            }
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line)?;
            line.trim_end_matches(['\n', '\r']).to_owned()
        }
    };
    if username.is_empty() || password.is_empty() {
        anyhow::bail!("a user name and a password are needed");
    }
    let file = args.authfile.unwrap_or_else(auth::login_file);
    if !args.no_check {
        let client = Client::new(ClientConfig::from_env()?);
        let cred = Credential {
            username: username.clone(),
            secret: password.clone(),
            identity_token: false,
            from: "the command line".into(),
        };
        client.check_login(&host, &cred)?;
    }
    auth::store_login(&file, &key, &username, &password)?;
    eprintln!("Login Succeeded ({key} in {})", file.display());
    Ok(0)
}

pub fn logout(args: LogoutArgs) -> anyhow::Result<i32> {
    let key = key_of(&args.registry)?;
    let file = args.authfile.unwrap_or_else(auth::login_file);
    if auth::remove_login(&file, &key)? {
        eprintln!(
            "Removed login credentials for {key} from {}",
            file.display()
        );
        Ok(0)
    } else {
        anyhow::bail!("not logged in to {key} ({})", file.display())
    }
}
