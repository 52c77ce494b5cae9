//! Commands run in a sandbox (`POST /v1/sandboxes/{id}/exec`), through its init: to
//! completion with the output captured and capped, detached with a log, or with the
//! connection upgraded to the frame protocol for streamed output; errors of the init's
//! relay mapped to the API's.

use super::http::{self, Request, Response};
use super::{log, Daemon};
use crate::api::{self, ApiError, ExecResult, EXEC_UPGRADE};
use forkd_sandbox::host;
use forkd_sandbox::proto::{self, ExecRequest, Kind};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

impl Daemon {
    /// Runs a command to completion inside the sandbox, through its init.
    pub fn exec(
        &self,
        sb: &Arc<super::Sandbox>,
        req: &ExecRequest,
        stdin: Option<&[u8]>,
        output_limit: usize,
    ) -> Result<ExecResult, ApiError> {
        req.validate()
            .map_err(|e| ApiError::bad_request(format!("exec: {e}")))?;
        if req.detach {
            let (_session, pid) = sb.begin_exec()?;
            let rootfs = super::sandboxes::init_root(pid);
            let t0 = SystemTime::now();
            let (_, started) = host::start_exec(&rootfs, req).map_err(|e| exec_error(sb, e))?;
            let v = serde_json::to_value(api::DetachedExec {
                pid: started.pid,
                log: started.log_path.clone(),
            })
            .expect("records serialise");
            self.log_exec(sb, req, t0, &v);
            return Ok(ExecResult {
                pid: started.pid,
                exit: proto::ExecExit {
                    exit_code: 0,
                    signal: None,
                    timed_out: false,
                    duration_us: 0,
                },
                stdout_b64: String::new(),
                stderr_b64: String::new(),
                output_b64: String::new(),
                output_bytes: 0,
                truncated: false,
            });
        }
        let out = self.exec_output(sb, req, stdin, output_limit)?;
        let stdout_b64 = api::b64::encode(&out.stdout);
        let stderr_b64 = api::b64::encode(&out.stderr);
        // With one stream empty (always so with merge_stderr) the merged form is the other.
        let output_b64 = if out.stderr.is_empty() {
            stdout_b64.clone()
        } else if out.stdout.is_empty() {
            stderr_b64.clone()
        } else {
            api::b64::encode(&out.merged())
        };
        Ok(ExecResult {
            pid: out.pid,
            exit: out.exit,
            stdout_b64,
            stderr_b64,
            output_b64,
            output_bytes: out.total_bytes,
            truncated: out.truncated,
        })
    }

    /// Runs a command to completion and returns its output as read (at most
    /// `output_limit` bytes kept), logged in the sandbox's trajectory.
    pub fn exec_output(
        &self,
        sb: &Arc<super::Sandbox>,
        req: &ExecRequest,
        stdin: Option<&[u8]>,
        output_limit: usize,
    ) -> Result<host::ExecOutput, ApiError> {
        req.validate()
            .map_err(|e| ApiError::bad_request(format!("exec: {e}")))?;
        let (_session, pid) = sb.begin_exec()?;
        let rootfs = super::sandboxes::init_root(pid);
        let t0 = SystemTime::now();
        let out = host::exec(&rootfs, req, stdin, output_limit).map_err(|e| exec_error(sb, e))?;
        self.log_exec(
            sb,
            req,
            t0,
            &serde_json::to_value(&out.exit).unwrap_or_default(),
        );
        Ok(out)
    }
}

fn exec_error(sb: &super::Sandbox, e: host::HostError) -> ApiError {
    match e {
        // The command itself could not start (not found, bad user, ...): the caller's problem.
        host::HostError::Exec(m) => {
            ApiError::bad_request(format!("exec in sandbox {}: {m}", sb.id))
        }
        other => ApiError::from_chain(&format!("exec in sandbox {}", sb.id), &other),
    }
}

/// `POST .../exec` with `Upgrade: forkd-exec`: answer 101, then (once hyper has handed
/// the connection over) relay frames between the client and the sandbox's init until the
/// command's exit frame. What refuses the exec is answered as any error.
pub(super) fn exec_upgraded(
    d: Arc<Daemon>,
    req: Request,
    params: HashMap<&'static str, String>,
    on_upgrade: hyper::upgrade::OnUpgrade,
    rid: String,
    started: Instant,
    // Held until the relay ends: the stream counts against its listener's connections.
    peer: super::server::conn::Peer,
) -> hyper::Response<http::Body> {
    let prepared = (|| {
        let sb = d
            .sandboxes
            .get(params.get("id").map(String::as_str).unwrap_or_default())?;
        let mut body: ExecRequest = req.json()?;
        body.validate()
            .map_err(|e| ApiError::bad_request(format!("exec: {e}")))?;
        d.apply_image_defaults(&sb, &mut body);
        // Counted from before the upgrade until the relay ends.
        let (session, pid) = sb.begin_exec()?;
        Ok::<_, ApiError>((sb, body, session, super::sandboxes::init_root(pid)))
    })();
    let (method, path) = (req.method, req.path);
    let (sb, body, session, rootfs) = match prepared {
        Ok(x) => x,
        Err(mut e) => {
            e.request_id = rid.clone();
            let us = started.elapsed().as_micros() as u64;
            d.node.metrics.record("exec_stream", us, false);
            log::info(&format!(
                "{rid} {method} {path} -> {} {us}us ({})",
                e.status(),
                e.message
            ));
            return Response::error(&e).into_hyper(&rid);
        }
    };
    let answer = http::upgrade(EXEC_UPGRADE, &rid);
    tokio::spawn(async move {
        let _peer = peer;
        let relayed = async {
            let upgraded = on_upgrade
                .await
                .map_err(|e| ApiError::internal(format!("upgrade: {e}")))?;
            let client = super::server::conn::into_std_stream(upgraded)
                .map_err(|e| ApiError::internal(format!("upgraded stream: {e}")))?;
            let d2 = d.clone();
            tokio::task::spawn_blocking(move || {
                let _session = session;
                relay_frames(&d2, &sb, &body, &rootfs, client)
            })
            .await
            .unwrap_or_else(|e| Err(ApiError::internal(format!("exec relay panicked: {e}"))))
        };
        let result = relayed.await;
        let us = started.elapsed().as_micros() as u64;
        d.node.metrics.record("exec_stream", us, result.is_ok());
        match result {
            Ok(()) => log::info(&format!("{rid} {method} {path} -> 101 {us}us")),
            Err(e) => log::info(&format!(
                "{rid} {method} {path} -> 101 {us}us ({})",
                e.message
            )),
        }
    });
    answer
}

fn relay_frames(
    d: &Daemon,
    sb: &super::Sandbox,
    req: &ExecRequest,
    rootfs: &std::path::Path,
    mut client: std::os::unix::net::UnixStream,
) -> Result<(), ApiError> {
    let t0 = SystemTime::now();
    let mut init =
        host::connect(rootfs).map_err(|e| ApiError::from_chain("connect to init", &e))?;
    let body = serde_json::to_vec(req).expect("serialisable");
    proto::write_frame(&mut init, Kind::Request, &body)
        .map_err(|e| ApiError::internal(format!("send request: {e}")))?;
    // Client -> init: stdin, EOF and resize frames, copied verbatim.
    let mut from_client = client
        .try_clone()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut to_init = init
        .try_clone()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let upstream = std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_client, &mut to_init);
        // The client closed its side: the relay sees the hang-up.
        let _ = to_init.shutdown(std::net::Shutdown::Write);
    });
    // Init -> client: frame by frame, noting the exit for the trajectory.
    let mut result = serde_json::Value::Null;
    loop {
        match proto::read_frame(&mut init) {
            Ok(Some((kind, payload))) => {
                if kind == Kind::Exit || kind == Kind::Error {
                    result = serde_json::from_slice(&payload).unwrap_or_default();
                }
                if proto::write_frame(&mut client, kind, &payload).is_err() {
                    break;
                }
                if kind == Kind::Exit || kind == Kind::Error {
                    // The session counts until the relay is gone (see host::wait_closed).
                    host::wait_closed(&mut init);
                    break;
                }
            }
            _ => break,
        }
    }
    let _ = client.shutdown(std::net::Shutdown::Both);
    let _ = init.shutdown(std::net::Shutdown::Both);
    let _ = upstream.join();
    if req.attach.is_none() {
        // An attach is recorded by the command it joins, not as a command of its own.
        d.log_exec(sb, req, t0, &result);
    }
    Ok(())
}
