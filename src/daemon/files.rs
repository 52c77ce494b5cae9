//! Logs and `cp`: file transfer in and out of a sandbox, done by forkd's own tar tool
//! run inside the sandbox (see `forkd_sandbox::files`), so paths resolve in the
//! sandbox's root and nothing on the host is ever touched.

use super::{Daemon, Sandbox};
use crate::api::ApiError;
use forkd_sandbox::proto::{valid_log_name, ExecRequest, FsAnswer, FsOp};
use std::sync::Arc;

impl Daemon {
    /// The output of a detached command (`main` is the one given at create time).
    pub fn logs(&self, sb: &Arc<Sandbox>, name: &str) -> Result<Vec<u8>, ApiError> {
        if !valid_log_name(name) {
            return Err(ApiError::bad_request(format!("invalid log name {name:?}")));
        }
        // Writes land in the upper layer, which outlives a stop.
        let path = sb.upper().join(".forkd/logs").join(format!("{name}.log"));
        match std::fs::read(&path) {
            Ok(b) => Ok(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(ApiError::internal(format!("read {}: {e}", path.display()))),
        }
    }

    pub(super) fn tool(
        &self,
        sb: &Arc<Sandbox>,
        verb: &str,
        path: &str,
        stdin: Option<&[u8]>,
    ) -> Result<Vec<u8>, ApiError> {
        if !path.starts_with('/') {
            return Err(ApiError::bad_request(format!(
                "path {path:?} in sandbox {} must be absolute",
                sb.id
            )));
        }
        let req = ExecRequest {
            argv: vec![
                forkd_sandbox::setup::INIT_PATH.into(),
                verb.into(),
                path.into(),
            ],
            ..Default::default()
        };
        // A copy's output is the archive itself: kept whole up to the copy limit, and
        // refused past it (never silently cut).
        let limit = self.config.max_copy_bytes;
        let out = self.exec_output(sb, &req, stdin, limit)?;
        if out.truncated {
            return Err(ApiError::bad_request(format!(
                "sandbox {}: the archive of {path} is over the copy limit of {limit} bytes (FORKD_MAX_COPY_BYTES on the daemon sets it)",
                sb.id
            )));
        }
        if out.exit.exit_code != 0 {
            let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(
                if msg.contains("No such file") || msg.contains("does not exist") {
                    ApiError::not_found(format!("sandbox {}: {msg}", sb.id))
                } else {
                    ApiError::bad_request(format!("sandbox {}: {msg}", sb.id))
                },
            );
        }
        let stdout = out.stdout;
        Ok(stdout)
    }

    /// A tar of `path` inside the sandbox.
    pub fn copy_out(&self, sb: &Arc<Sandbox>, path: &str) -> Result<Vec<u8>, ApiError> {
        self.tool(sb, "__tar", path, None)
    }

    /// Creates the directory `path` (and its parents) inside the sandbox, as root.
    pub fn make_dirs(&self, sb: &Arc<Sandbox>, path: &str) -> Result<(), ApiError> {
        self.tool(sb, "__mkdirs", path, None).map(|_| ())
    }

    /// Unpacks the tar `body` at `path` inside the sandbox; returns the entry count.
    pub fn copy_in(&self, sb: &Arc<Sandbox>, path: &str, body: &[u8]) -> Result<u64, ApiError> {
        let out = self.tool(sb, "__untar", path, Some(body))?;
        Ok(String::from_utf8_lossy(&out).trim().parse().unwrap_or(0))
    }

    /// Carries out one file operation inside the sandbox as `user` (default root), with
    /// forkd's own tool there (`forkd_sandbox::fsops`): the sandbox's permissions apply,
    /// and paths resolve in its root. `stdin` is a `write`'s content; `read` answers the
    /// file's bytes (up to the copy limit), every other operation an [`FsAnswer`] as JSON.
    pub fn file_op(
        &self,
        sb: &Arc<Sandbox>,
        op: &FsOp,
        user: Option<&str>,
        stdin: Option<&[u8]>,
    ) -> Result<Vec<u8>, ApiError> {
        op.validate()
            .map_err(|e| ApiError::bad_request(format!("sandbox {}: {e}", sb.id)))?;
        let json = serde_json::to_string(op).expect("requests serialise");
        let req = ExecRequest {
            argv: vec![forkd_sandbox::setup::INIT_PATH.into(), "__fs".into(), json],
            user: user.map(str::to_string),
            stdin: stdin.is_some(),
            ..Default::default()
        };
        let limit = self.config.max_copy_bytes;
        let out = self.exec_output(sb, &req, stdin, limit)?;
        if out.truncated {
            return Err(ApiError::bad_request(format!(
                "sandbox {}: {} is over the copy limit of {limit} bytes (FORKD_MAX_COPY_BYTES on the daemon sets it)",
                sb.id,
                op.paths()[0]
            )));
        }
        let msg = || {
            format!(
                "sandbox {}: {}",
                sb.id,
                String::from_utf8_lossy(&out.stderr).trim()
            )
        };
        match out.exit.exit_code {
            0 => Ok(out.stdout),
            2 => Err(ApiError::not_found(msg())),
            3 => Err(ApiError::conflict(msg())),
            4 => Err(ApiError::forbidden(msg())),
            _ => Err(ApiError::bad_request(msg())),
        }
    }

    /// [`Daemon::file_op`] for the operations that answer JSON.
    pub fn file_answer(
        &self,
        sb: &Arc<Sandbox>,
        op: &FsOp,
        user: Option<&str>,
        stdin: Option<&[u8]>,
    ) -> Result<FsAnswer, ApiError> {
        let out = self.file_op(sb, op, user, stdin)?;
        serde_json::from_slice(&out).map_err(|e| {
            ApiError::internal(format!(
                "sandbox {}: the file tool's answer is not JSON: {e}",
                sb.id
            ))
        })
    }
}
