//! The evaluator's view of forkd: a thin layer over the API client. Every failure here
//! is an infrastructure failure (the daemon, a sandbox, a fork), never the agent's.

use forkd_api::client::Client;
use forkd_api::ExecRequest;
use forkd_api::{b64, CheckpointInfo, ExecResult, ForkResult, SandboxInfo};
use std::path::Path;

/// An infrastructure failure: retried, never counted against an agent.
#[derive(Debug, Clone, thiserror::Error)]
#[error("infrastructure: {0}")]
pub struct Infra(pub String);

pub type InfraResult<T> = Result<T, Infra>;

fn infra(step: &str) -> impl FnOnce(forkd_api::client::ClientError) -> Infra + '_ {
    move |e| Infra(format!("{step}: {e}"))
}

/// Output of a command run in a sandbox.
pub struct Ran {
    pub code: i32,
    pub timed_out: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Ran {
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

pub struct Session {
    pub client: Client,
    pub socket: std::path::PathBuf,
    /// Whether the daemon holds disk limits, once asked.
    disk_limits: std::sync::OnceLock<bool>,
}

impl Session {
    pub fn new(socket: &Path) -> Session {
        Session {
            client: Client::new(socket),
            socket: socket.to_path_buf(),
            disk_limits: std::sync::OnceLock::new(),
        }
    }

    /// Creates a sandbox of `image` with `network` (the task file's form; `None`: none),
    /// the task's system-call filter and disk limit.
    pub fn create(
        &self,
        image: &str,
        labels: &[(&str, &str)],
        env: &crate::task_toml::EnvSection,
    ) -> InfraResult<String> {
        let network = env.network.as_deref();
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        // Checked when the task was loaded.
        let network: forkd_api::Network = network
            .map(|n| n.parse().unwrap_or_default())
            .unwrap_or_default();
        let mut body = serde_json::json!({ "image": image, "labels": labels, "network": network });
        if let Some(s) = &env.seccomp {
            body["seccomp"] = s.as_str().into();
        }
        if let Some(mb) = env.disk_mb {
            if self.disk_limits()? {
                body["limits"] = serde_json::json!({ "disk_bytes": mb << 20 });
            }
        }
        let sb: SandboxInfo = self
            .client
            .call("POST", "/v1/sandboxes", Some(&body))
            .map_err(infra("create sandbox"))?;
        Ok(sb.id)
    }

    /// Whether the daemon holds disk limits; said once on stderr where it does not.
    fn disk_limits(&self) -> InfraResult<bool> {
        if let Some(ok) = self.disk_limits.get() {
            return Ok(*ok);
        }
        let h: forkd_api::Health = self
            .client
            .call("GET", "/v1/health", None)
            .map_err(infra("ask the daemon's health"))?;
        if !h.disk_limits.ok {
            eprintln!(
                "forkd eval: tasks' disk_mb is not enforced: {}",
                h.disk_limits.detail
            );
        }
        Ok(*self.disk_limits.get_or_init(|| h.disk_limits.ok))
    }

    pub fn exec(&self, id: &str, req: &ExecRequest, stdin: Option<&[u8]>) -> InfraResult<Ran> {
        let mut body = serde_json::to_value(req).expect("json");
        if let Some(s) = stdin {
            body["stdin_b64"] = b64::encode(s).into();
        }
        let r: ExecResult = self
            .client
            .call("POST", &format!("/v1/sandboxes/{id}/exec"), Some(&body))
            .map_err(infra("exec"))?;
        Ok(Ran {
            code: r.exit.exit_code,
            timed_out: r.exit.timed_out,
            stdout: b64::decode(&r.stdout_b64).unwrap_or_default(),
            stderr: b64::decode(&r.stderr_b64).unwrap_or_default(),
        })
    }

    /// Runs a shell line in `cwd`.
    pub fn sh(
        &self,
        id: &str,
        line: &str,
        cwd: &str,
        timeout_secs: Option<u64>,
    ) -> InfraResult<Ran> {
        let req = ExecRequest {
            shell: Some(line.to_string()),
            cwd: Some(cwd.to_string()),
            timeout_ms: timeout_secs.map(|s| s * 1000),
            ..Default::default()
        };
        self.exec(id, &req, None)
    }

    /// Copies the contents of a host directory into `dest` inside the sandbox.
    pub fn put_dir(&self, id: &str, src: &Path, dest: &str) -> InfraResult<()> {
        let r = self.sh(
            id,
            &format!("mkdir -p '{}'", dest.replace('\'', "'\\''")),
            "/",
            Some(60),
        )?;
        if r.code != 0 {
            return Err(Infra(format!("mkdir {dest} in {id}: {}", r.err())));
        }
        let mut b = tar::Builder::new(Vec::new());
        b.follow_symlinks(false);
        b.append_dir_all(".", src)
            .map_err(|e| Infra(format!("pack {}: {e}", src.display())))?;
        let body = b
            .into_inner()
            .map_err(|e| Infra(format!("pack {}: {e}", src.display())))?;
        let resp = self
            .client
            .raw(
                "PUT",
                &format!(
                    "/v1/sandboxes/{id}/files?path={}",
                    forkd_api::url::encode(dest)
                ),
                &body,
            )
            .map_err(infra("copy into sandbox"))?;
        if resp.status >= 400 {
            return Err(Infra(format!(
                "copy {} into {id}:{dest}: {}",
                src.display(),
                Client::api_error(&resp)
            )));
        }
        Ok(())
    }

    pub fn checkpoint(
        &self,
        id: &str,
        live: bool,
        labels: &[(&str, &str)],
    ) -> InfraResult<CheckpointInfo> {
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        let body = serde_json::json!({ "live": live, "labels": labels });
        self.client
            .call(
                "POST",
                &format!("/v1/sandboxes/{id}/checkpoint"),
                Some(&body),
            )
            .map_err(infra("checkpoint"))
    }

    /// One branch of `checkpoint`; `fresh` starts a new init over its files instead of
    /// restoring its processes (for states whose processes do not matter).
    pub fn fork(&self, checkpoint: &str, fresh: bool) -> InfraResult<String> {
        let body = serde_json::json!({ "count": 1, "fresh": fresh });
        let r: ForkResult = self
            .client
            .call(
                "POST",
                &format!("/v1/checkpoints/{checkpoint}/fork"),
                Some(&body),
            )
            .map_err(infra("fork"))?;
        r.branches
            .into_iter()
            .next()
            .map(|b| b.id)
            .ok_or_else(|| Infra("fork returned no branch".into()))
    }

    /// Removes a sandbox in the background (off the trial's critical path); see [`drain`].
    pub fn remove(&self, id: &str) {
        cleanup(&self.socket, format!("/v1/sandboxes/{id}?force=true"));
    }

    /// Removes a checkpoint (and whatever still depends on it) in the background.
    pub fn remove_checkpoint(&self, id: &str) {
        cleanup(&self.socket, format!("/v1/checkpoints/{id}?force=true"));
    }

    pub fn checkpoints(&self) -> InfraResult<Vec<CheckpointInfo>> {
        self.client
            .call("GET", "/v1/checkpoints", None)
            .map_err(infra("list checkpoints"))
    }

    /// The checkpoint's own layer (its change against what it was forked from), as a tar.
    pub fn delta(&self, checkpoint: &str) -> InfraResult<Vec<u8>> {
        let resp = self
            .client
            .raw("GET", &format!("/v1/checkpoints/{checkpoint}/delta"), &[])
            .map_err(infra("delta"))?;
        if resp.status >= 400 {
            return Err(Infra(format!(
                "delta of {checkpoint}: {}",
                Client::api_error(&resp)
            )));
        }
        Ok(resp.body)
    }

    /// The sandbox's execs, in order (its trajectory).
    pub fn execs(&self, id: &str) -> InfraResult<Vec<serde_json::Value>> {
        let resp = self
            .client
            .raw("GET", &format!("/v1/sandboxes/{id}/execs"), &[])
            .map_err(infra("execs"))?;
        if resp.status >= 400 {
            return Err(Infra(format!(
                "execs of {id}: {}",
                Client::api_error(&resp)
            )));
        }
        Ok(String::from_utf8_lossy(&resp.body)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect())
    }

    /// Makes sure image `name` exists, importing it from `source` if not.
    pub fn ensure_image(&self, name: &str, source: &Path) -> InfraResult<()> {
        if self
            .client
            .call::<serde_json::Value>(
                "GET",
                &format!("/v1/images/{}", forkd_api::url::encode_segment(name)),
                None,
            )
            .is_ok()
        {
            return Ok(());
        }
        let body = serde_json::json!({ "source": source, "name": name });
        self.client
            .call::<serde_json::Value>("POST", "/v1/images", Some(&body))
            .map_err(infra("import image"))?;
        Ok(())
    }
}

/// Removals run by one background worker, in the order they were asked for.
struct Cleaner {
    tx: std::sync::Mutex<std::sync::mpsc::Sender<(std::path::PathBuf, String)>>,
    pending: std::sync::Mutex<usize>,
    done: std::sync::Condvar,
}

fn cleaner() -> &'static Cleaner {
    static CLEANER: std::sync::OnceLock<Cleaner> = std::sync::OnceLock::new();
    CLEANER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<(std::path::PathBuf, String)>();
        std::thread::spawn(move || {
            for (socket, path) in rx {
                let _ = Client::new(&socket).call::<serde_json::Value>("DELETE", &path, None);
                let c = cleaner();
                *c.pending.lock().unwrap() -= 1;
                c.done.notify_all();
            }
        });
        Cleaner {
            tx: std::sync::Mutex::new(tx),
            pending: std::sync::Mutex::new(0),
            done: std::sync::Condvar::new(),
        }
    })
}

fn cleanup(socket: &Path, path: String) {
    let c = cleaner();
    *c.pending.lock().unwrap() += 1;
    if c.tx
        .lock()
        .unwrap()
        .send((socket.to_path_buf(), path))
        .is_err()
    {
        *c.pending.lock().unwrap() -= 1;
    }
}

/// Waits until every background removal has been carried out.
pub fn drain() {
    let c = cleaner();
    let mut n = c.pending.lock().unwrap();
    while *n > 0 {
        n = c.done.wait(n).unwrap();
    }
}
