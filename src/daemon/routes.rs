//! Request dispatch: match a route to an [`Operation`], admit its caller, run its
//! handler on the blocking pool, answer as the operation's [`api::OpSpec`] says (status, content type), log one
//! line with the request id and latency. Handlers return a [`Reply`]: what they answer,
//! never how; the match over operations is exhaustive.

use super::http::{self, Request, Response};
use super::server::access::{self, Who};
use super::server::conn::{Caller, Peer};
use super::{log, Daemon};
use crate::api::{self, Answer, ApiError, ExecBody, Operation, VersionInfo, EXEC_UPGRADE};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Matches `path` against the operations' routes; returns the operation and parameters.
pub fn match_route(
    method: &str,
    path: &str,
) -> Result<(Operation, HashMap<&'static str, String>), ApiError> {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let mut path_matched = false;
    for op in Operation::ALL {
        let spec = op.spec();
        let pat: Vec<&str> = spec.path.split('/').collect();
        if pat.len() != segs.len() {
            continue;
        }
        let mut params = HashMap::new();
        let ok = pat.iter().zip(&segs).all(|(p, s)| {
            if let Some(name) = p.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                match crate::api::url::decode(s) {
                    Ok(v) if !v.is_empty() => {
                        params.insert(name, v);
                        true
                    }
                    _ => false,
                }
            } else {
                p == s
            }
        });
        if ok {
            path_matched = true;
            if spec.method == method {
                return Ok((op, params));
            }
        }
    }
    if path_matched {
        Err(ApiError::bad_request(format!(
            "method {method} is not allowed on {path}"
        )))
    } else {
        Err(ApiError::not_found(format!(
            "no such endpoint: {method} {path}"
        )))
    }
}

/// What the audit log says of a request: its operation, and the id it named or made.
#[derive(Default)]
struct Noted {
    op: Option<Operation>,
    id: Option<String>,
}

/// Answers one request from `caller`: authenticates a TCP caller's key (before anything
/// else: without one nothing runs, not even routing), then [`dispatch`]es it, and writes
/// what a key changed, or was refused, to the audit log.
pub async fn answer(
    daemon: Arc<Daemon>,
    caller: Caller,
    peer: Peer,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<http::Body> {
    let started = Instant::now();
    let rid = daemon.node.request_id();
    // A request that may change something, until its answer is made (a stream or an
    // upgraded connection it hands on is not counted): work made ahead waits for a
    // moment without any. Reads are left out: a commit does not hold them up, and a
    // client polling the daemon must not keep it from ever being quiet.
    let activity = daemon.node.activity.clone();
    let reads_only = matches!(*req.method(), hyper::Method::GET | hyper::Method::HEAD);
    let _answering = (!reads_only).then(|| activity.answering());
    let (addr, acting) = match &caller {
        Caller::Remote(a) => (*a, None),
        Caller::Acting { key, peer } => (*peer, Some((**key).clone())),
        Caller::Node => return dispatch(daemon, Who::Node, peer, req, rid, started).await.0,
        Caller::Grant(g) => {
            let who = Who::Grant(g.clone());
            return dispatch(daemon, who, peer, req, rid, started).await.0;
        }
    };
    // E2B's protocol, beside the API on the same listeners: its own crate translates
    // it into requests of this API, which come back here as the key they act for.
    if acting.is_none() && daemon.e2b.gateway.claims(req.uri().path(), req.headers()) {
        let forkd = Arc::new(super::e2b::Acting {
            daemon: daemon.clone(),
            peer: addr,
        });
        let (method, path) = (
            req.method().as_str().to_string(),
            req.uri().path().to_string(),
        );
        let resp = daemon.e2b.gateway.clone().serve(forkd, req).await;
        // What the translation did is audited as the key's own requests; a refusal of
        // the caller itself (a wrong key or access token) is written here.
        let status = resp.status().as_u16();
        if status == 401 || status == 403 {
            daemon.node.audit.write(super::server::audit::Entry {
                t_ms: super::server::audit::now_ms(),
                key: None,
                key_id: None,
                peer: addr.to_string(),
                method: &method,
                path: &path,
                op: None,
                id: None,
                status,
                request_id: &rid,
                suppressed: None,
            });
        }
        return resp;
    }
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let authenticated = match acting {
        Some(key) => Ok(key),
        None => authenticate(&daemon, req.headers()),
    };
    let (resp, noted, key) = match authenticated {
        Ok(key) => {
            let who = (key.name.clone(), key.id.clone());
            let (resp, noted) = dispatch(
                daemon.clone(),
                Who::Key(key),
                peer,
                req,
                rid.clone(),
                started,
            )
            .await;
            (resp, noted, Some(who))
        }
        Err(mut e) => {
            e.request_id = rid.clone();
            log::info(&format!(
                "{rid} {method} {path} -> {} from {addr} ({})",
                e.status(),
                e.message
            ));
            let mut resp = Response::error(&e).into_hyper(&rid);
            resp.headers_mut().insert(
                hyper::header::WWW_AUTHENTICATE,
                hyper::header::HeaderValue::from_static("Bearer"),
            );
            (resp, Noted::default(), None)
        }
    };
    let status = resp.status().as_u16();
    if method != "GET" || status == 401 || status == 403 {
        daemon.node.audit.write(super::server::audit::Entry {
            t_ms: super::server::audit::now_ms(),
            key: key.as_ref().map(|(name, _)| name.as_str()),
            key_id: key.as_ref().map(|(_, id)| id.as_str()),
            peer: addr.to_string(),
            method: &method,
            path: &path,
            op: noted.op.map(|o| o.id()),
            id: noted.id,
            status,
            request_id: &rid,
            suppressed: None,
        });
    }
    resp
}

/// The key an `Authorization: Bearer KEY` header carries, if the daemon holds it.
fn authenticate(d: &Daemon, headers: &hyper::HeaderMap) -> Result<forkd_keys::Key, ApiError> {
    let bearer = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let Some(secret) = bearer else {
        return Err(ApiError::unauthorized(
            "an API key is required here: send Authorization: Bearer KEY (forkd key create makes one)",
        ));
    };
    match d.node.keys.verify(secret) {
        Ok(Some(k)) => Ok(k),
        Ok(None) => Err(ApiError::unauthorized(
            "the API key is not one this daemon holds",
        )),
        Err(e) => {
            log::warn(&format!("keys: {e}"));
            Err(ApiError::internal(format!(
                "the daemon cannot read its keys: {e}"
            )))
        }
    }
}

/// Routes a request, admits it for `who`, reads its body within its bound, runs its
/// handler on the blocking pool, and logs one line with the request id and latency.
async fn dispatch(
    daemon: Arc<Daemon>,
    who: Who,
    peer: Peer,
    mut req: hyper::Request<hyper::body::Incoming>,
    rid: String,
    started: Instant,
) -> (hyper::Response<http::Body>, Noted) {
    let mut noted = Noted::default();
    let refuse = |mut e: ApiError, method: &str, path: &str, who: &str| {
        e.request_id = rid.clone();
        log::info(&format!(
            "{rid} {method} {path} -> {}{who} ({})",
            e.status(),
            e.message
        ));
        Response::error(&e).into_hyper(&rid)
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let (parts, body) = req.into_parts();
    let (method, path, query) = match http::target(&parts) {
        Ok(t) => t,
        Err(e) => {
            return (
                refuse(e, parts.method.as_str(), parts.uri.path(), ""),
                noted,
            )
        }
    };
    let (op, mut params) = match match_route(&method, &path) {
        Ok(x) => x,
        Err(e) => return (refuse(e, &method, &path, ""), noted),
    };
    noted.op = Some(op);
    noted.id = ["id", "name", "grant"]
        .iter()
        .find_map(|k| params.get(k).cloned());
    let admitted = match &who {
        Who::Node => Ok(()),
        Who::Grant(g) => g
            .admit(&daemon, &method, &path, op, &params)
            .map_err(|e| (e, format!(" grant {}", g.id))),
        Who::Key(k) => access::admit_key(&daemon, k, op, &mut params)
            .map_err(|e| (e, format!(" key {}", k.name))),
    };
    if let Err((e, by)) = admitted {
        return (refuse(e, &method, &path, &by), noted);
    }
    let limit = http::body_limit(&method, &path, daemon.config.max_copy_bytes);
    let body = match http::read_body(&parts, body, limit).await {
        Ok(b) => b,
        Err(e) => return (refuse(e, &method, &path, ""), noted),
    };
    let upgrade = op == Operation::ExecInSandbox
        && parts
            .headers
            .get(hyper::header::UPGRADE)
            .is_some_and(|v| v.as_bytes() == EXEC_UPGRADE.as_bytes());
    let registry_config = parts
        .headers
        .get(crate::api::registry_auth::HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let req = Request {
        method,
        path,
        query,
        registry_config,
        body,
    };
    if upgrade {
        let resp = super::exec::exec_upgraded(daemon, req, params, on_upgrade, rid, started, peer);
        return (resp, noted);
    }
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    // The handler and its record run on their own, so a client that goes away midway
    // still leaves its log line and metrics.
    let mut task = tokio::spawn(async move {
        let d = daemon.clone();
        let (method, path) = (req.method.clone(), req.path.clone());
        let joined =
            tokio::task::spawn_blocking(move || handle(&d, &who, op, &params, &req, &flag)).await;
        let result =
            joined.unwrap_or_else(|e| Err(ApiError::internal(format!("handler panicked: {e}"))));
        let us = started.elapsed().as_micros() as u64;
        daemon.node.metrics.record(op.id(), us, result.is_ok());
        match result.and_then(|reply| reply.into_response(op)) {
            Ok(r) => {
                log::info(&format!("{rid} {method} {path} -> {} {us}us", r.status));
                // What a create or a checkpoint made is named in its answer.
                let made = matches!(op, Operation::CreateSandbox | Operation::CheckpointSandbox)
                    .then(|| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
                    .flatten()
                    .and_then(|v| v["id"].as_str().map(str::to_string));
                (r.into_hyper(&rid), made)
            }
            Err(mut e) => {
                e.request_id = rid.clone();
                log::info(&format!(
                    "{rid} {method} {path} -> {} {us}us ({})",
                    e.status(),
                    e.message
                ));
                (Response::error(&e).into_hyper(&rid), None)
            }
        }
    });
    // A pull whose client has gone (a Ctrl-C, a killed client) is cancelled, as
    // `docker pull` is: it then leaves no image.
    let joined = if op == Operation::PullImage {
        tokio::select! {
            r = &mut task => r,
            () = peer.gone() => {
                cancel.store(true, Ordering::Relaxed);
                task.await
            }
        }
    } else {
        task.await
    };
    let (resp, made) = joined.unwrap_or_else(|e| {
        (
            Response::error(&ApiError::internal(format!("request task: {e}"))).into_hyper(""),
            None,
        )
    });
    if made.is_some() {
        noted.id = made;
    }
    (resp, noted)
}

/// What a handler answers; the status and content type come from the operation's spec.
pub enum Reply {
    Json(Vec<u8>),
    Bytes(Vec<u8>),
}

impl Reply {
    fn json<T: serde::Serialize>(value: &T) -> Reply {
        Reply::Json(serde_json::to_vec(value).expect("answers serialise"))
    }

    fn into_response(self, op: Operation) -> Result<Response, ApiError> {
        let spec = op.spec();
        let (body, content_type) = match (self, spec.answer) {
            (Reply::Json(b), Answer::Json(_)) => (b, "application/json"),
            (Reply::Bytes(b), Answer::Bytes(t)) => (b, t),
            _ => {
                return Err(ApiError::internal(format!(
                    "{}: the handler's answer is not the kind its spec names",
                    spec.id
                )))
            }
        };
        Ok(Response {
            status: spec.status,
            content_type,
            body,
        })
    }
}

/// A query parameter of `op`'s request. Only the parameters its spec declares may be
/// read; a required one that is missing is a bad request.
fn query<'r>(op: Operation, req: &'r Request, name: &str) -> Result<Option<&'r str>, ApiError> {
    let Some(&(_, required)) = op.spec().query.iter().find(|(n, _)| *n == name) else {
        return Err(ApiError::internal(format!(
            "{}: query parameter {name} is not in its spec",
            op.id()
        )));
    };
    match req.query.get(name) {
        Some(v) => Ok(Some(v.as_str())),
        None if required => Err(ApiError::bad_request(format!(
            "missing query parameter {name}"
        ))),
        None => Ok(None),
    }
}

fn flag(op: Operation, req: &Request, name: &str) -> Result<bool, ApiError> {
    Ok(matches!(query(op, req, name)?, Some("1" | "true" | "yes")))
}

/// Runs one (non-upgraded) operation. Blocking. `cancel` turns true when the client has
/// gone; the operations that can stop midway (pulls) watch it.
fn handle(
    d: &Arc<Daemon>,
    who: &Who,
    op: Operation,
    params: &HashMap<&str, String>,
    req: &Request,
    cancel: &AtomicBool,
) -> Result<Reply, ApiError> {
    let param = |k: &str| params.get(k).cloned().unwrap_or_default();
    use Operation as O;
    match op {
        O::Version => Ok(Reply::json(&VersionInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            api: api::API_VERSION.into(),
            root: d.node.root.display().to_string(),
            cgroup_version: d.sandboxes.hierarchy.version(),
        })),
        O::Health => {
            // A branch of the checkpoint asked about, or a sandbox of two tasks.
            let tasks = match (query(op, req, "checkpoint")?, who.sees_only()) {
                (Some(id), None) => d.checkpoints.get(id)?.tasks(),
                (Some(id), Some(owner)) => access::own_checkpoint(d, owner, id)?.tasks(),
                (None, _) => 2,
            };
            Ok(Reply::json(&d.health(tasks)))
        }
        O::Metrics => Ok(Reply::json(&d.node.metrics.snapshot())),
        O::PrometheusMetrics => Ok(Reply::Bytes(d.prometheus().into_bytes())),
        O::ListImages => {
            let mut images = d.list_images()?;
            for i in &mut images {
                access::own_users(d, who.sees_only(), &mut i.used_by);
            }
            Ok(Reply::json(&images))
        }
        O::ImportImage => Ok(Reply::json(&d.import_image(req.json()?)?)),
        O::BuildImage => {
            let given = super::edge::registry_given(req.registry_config.as_deref())?;
            Ok(Reply::json(&d.build_image(req.json()?, given)?))
        }
        O::BuildImageUpload => {
            let mut given = super::edge::registry_given(req.registry_config.as_deref())?;
            if who.is_confined() {
                // The caller's credentials for its FROM images, or none: never the node's.
                given.get_or_insert_with(Default::default);
            }
            let name = query(op, req, "name")?.unwrap_or_default().to_string();
            if who.is_confined() && d.image_info(&name).is_ok() {
                return Err(ApiError::forbidden(format!(
                    "image {name} exists: a key of scope own builds new images only (another name could replace an image others use)"
                )));
            }
            let build_args = match query(op, req, "build_args")? {
                None => Default::default(),
                Some(j) => serde_json::from_str(j).map_err(|e| {
                    ApiError::bad_request(format!(
                        "build_args must be a JSON object of strings: {e}"
                    ))
                })?,
            };
            let step_timeout_secs = query(op, req, "step_timeout_secs")?
                .map(|v| {
                    v.parse::<u64>().map_err(|_| {
                        ApiError::bad_request(format!("step_timeout_secs {v:?} is not a number"))
                    })
                })
                .transpose()?;
            let build = api::BuildRequest {
                context: String::new(),
                dockerfile: query(op, req, "dockerfile")?.map(str::to_string),
                name,
                build_args,
                target: query(op, req, "target")?.map(str::to_string),
                no_cache: flag(op, req, "no_cache")?,
                network: flag(op, req, "network")?,
                limits: Default::default(),
                step_timeout_secs,
            };
            Ok(Reply::json(&d.build_uploaded(build, &req.body, given)?))
        }
        O::ListBuilds => Ok(Reply::json(&d.images.builds.list())),
        O::PullImage => {
            let mut given = super::edge::registry_given(req.registry_config.as_deref())?;
            let body: api::PullRequest = req.json()?;
            if who.is_confined() {
                if body.name.is_some() {
                    return Err(ApiError::forbidden(
                        "a key of scope own pulls an image under its own reference: it may not name it (another name could replace an image others use)",
                    ));
                }
                // The caller's credentials, or none: never the node's.
                given.get_or_insert_with(Default::default);
            }
            let mut info = d.pull_image(body, given, cancel)?;
            access::own_users(d, who.sees_only(), &mut info.used_by);
            Ok(Reply::json(&info))
        }
        O::ListPulls => Ok(Reply::json(&d.images.pulls.list())),
        O::InspectImage => {
            let mut info = d.image_info(&param("name"))?;
            access::own_users(d, who.sees_only(), &mut info.used_by);
            Ok(Reply::json(&info))
        }
        O::RemoveImage => {
            d.remove_image(&param("name"))?;
            Ok(Reply::json(&api::Removed {
                removed: param("name"),
            }))
        }
        O::ListSandboxes => {
            let stats = match query(op, req, "stats")? {
                None | Some("false") => false,
                Some("true") => true,
                Some(other) => {
                    return Err(ApiError::bad_request(format!(
                        "query parameter stats must be true or false, not {other:?}"
                    )))
                }
            };
            if !stats {
                return Ok(Reply::Json(d.list_sandboxes_body(who.sees_only())));
            }
            let list = d.list_sandboxes_with_stats(who.sees_only());
            // A description is some 400 bytes: sized once, the buffer of a list of
            // thousands is not copied over and over as it grows.
            let mut body = Vec::with_capacity(2 + list.len() * 512);
            serde_json::to_writer(&mut body, &list).expect("answers serialise");
            Ok(Reply::Json(body))
        }
        O::CreateSandbox => {
            let sb = d.create_sandbox(req.json()?, who.owner())?;
            Ok(Reply::json(&d.info(&sb)))
        }
        O::InspectSandbox => Ok(Reply::json(&d.info(&*d.sandboxes.get(&param("id"))?))),
        O::RemoveSandbox => {
            let sb = d.sandboxes.get(&param("id"))?;
            d.remove_sandbox(&sb, flag(op, req, "force")?)?;
            Ok(Reply::json(&api::Removed {
                removed: sb.id.to_string(),
            }))
        }
        O::StopSandbox => {
            let sb = d.sandboxes.get(&param("id"))?;
            let body: api::StopRequest = req.json()?;
            d.stop_sandbox(&sb, Duration::from_secs(body.grace_secs.unwrap_or(10)))?;
            Ok(Reply::json(&d.info(&sb)))
        }
        O::ExecInSandbox => {
            let sb = d.sandboxes.get(&param("id"))?;
            let mut body: ExecBody = req.json()?;
            d.apply_image_defaults(&sb, &mut body.request);
            let stdin = body
                .stdin_b64
                .as_deref()
                .map(api::b64::decode)
                .transpose()
                .map_err(ApiError::bad_request)?;
            let limit = body.output_limit()?;
            Ok(Reply::json(&d.exec(
                &sb,
                &body.request,
                stdin.as_deref(),
                limit,
            )?))
        }
        O::SandboxLogs => {
            let sb = d.sandboxes.get(&param("id"))?;
            let name = query(op, req, "name")?.unwrap_or("main");
            Ok(Reply::Bytes(d.logs(&sb, name)?))
        }
        O::CopyFromSandbox => {
            let sb = d.sandboxes.get(&param("id"))?;
            let path = query(op, req, "path")?.unwrap_or_default();
            Ok(Reply::Bytes(d.copy_out(&sb, path)?))
        }
        O::CopyToSandbox => {
            let sb = d.sandboxes.get(&param("id"))?;
            let path = query(op, req, "path")?.unwrap_or_default();
            let entries = d.copy_in(&sb, path, &req.body)?;
            Ok(Reply::json(&api::CopyResult { entries }))
        }
        O::FileOperation => {
            let sb = d.sandboxes.get(&param("id"))?;
            let body: api::FsRequest = req.json()?;
            if matches!(body.op, api::FsOp::Read { .. } | api::FsOp::Write { .. }) {
                return Err(ApiError::bad_request(
                    "read and write carry bytes: use GET or PUT /v1/sandboxes/{id}/file",
                ));
            }
            Ok(Reply::json(&d.file_answer(
                &sb,
                &body.op,
                body.user.as_deref(),
                None,
            )?))
        }
        O::ReadFile => {
            let sb = d.sandboxes.get(&param("id"))?;
            let op = api::FsOp::Read {
                path: query(op, req, "path")?.unwrap_or_default().to_string(),
            };
            Ok(Reply::Bytes(d.file_op(
                &sb,
                &op,
                query(O::ReadFile, req, "user")?,
                None,
            )?))
        }
        O::WriteFile => {
            let sb = d.sandboxes.get(&param("id"))?;
            let op = api::FsOp::Write {
                path: query(op, req, "path")?.unwrap_or_default().to_string(),
                owner: query(op, req, "owner")?.map(str::to_string),
            };
            let user = query(O::WriteFile, req, "user")?;
            Ok(Reply::json(&d.file_answer(
                &sb,
                &op,
                user,
                Some(&req.body),
            )?))
        }
        O::SetSandboxExpiry => {
            let sb = d.sandboxes.get(&param("id"))?;
            let body: api::ExpiryRequest = req.json()?;
            d.set_expiry(&sb, body.expires_in_secs)?;
            Ok(Reply::json(&d.info(&sb)))
        }
        O::ResumeSandbox => {
            let sb = d.sandboxes.get(&param("id"))?;
            let body: api::ResumeRequest = req.json()?;
            let c = match (&body.checkpoint, who.sees_only()) {
                (None, _) => d.latest_live_checkpoint(&sb)?,
                (Some(id), None) => d.checkpoints.get(id)?,
                (Some(id), Some(owner)) => access::own_checkpoint(d, owner, id)?,
            };
            d.resume_sandbox(&sb, &c, body.expires_in_secs)?;
            Ok(Reply::json(&d.info(&*d.sandboxes.get(sb.id.as_str())?)))
        }
        O::CheckpointSandbox => {
            let sb = d.sandboxes.get(&param("id"))?;
            let body: api::CheckpointRequest = req.json()?;
            let c = d.checkpoint_sandbox(&sb, &body)?;
            Ok(Reply::json(&d.checkpoint_info(&c)))
        }
        O::ListCheckpoints => Ok(Reply::json(&d.list_checkpoints(who.sees_only()))),
        O::InspectCheckpoint => Ok(Reply::json(
            &d.checkpoint_info(&*d.checkpoints.get(&param("id"))?),
        )),
        O::RemoveCheckpoint => {
            let c = d.checkpoints.get(&param("id"))?;
            d.remove_checkpoint(&c, flag(op, req, "force")?)?;
            Ok(Reply::json(&api::Removed {
                removed: c.id.to_string(),
            }))
        }
        O::ForkCheckpoint => {
            let c = d.checkpoints.get(&param("id"))?;
            let body: api::ForkRequest = req.json()?;
            Ok(Reply::json(&d.fork_checkpoint(&c, &body, who.owner())?))
        }
        O::ExportCheckpoint => {
            let c = d.checkpoints.get(&param("id"))?;
            let body: api::ExportRequest = req.json()?;
            Ok(Reply::json(&d.export_checkpoint(
                &c,
                std::path::Path::new(&body.path),
                body.thin,
            )?))
        }
        O::ImportCheckpoint => {
            let body: api::ArchivePath = req.json()?;
            let c = d.import_checkpoint(std::path::Path::new(&body.path))?;
            Ok(Reply::json(&d.checkpoint_info(&c)))
        }
        O::Gc => Ok(Reply::json(&d.gc()?)),
        O::SandboxExecs => {
            let sb = d.sandboxes.get(&param("id"))?;
            let path = sb.dir.join("execs.jsonl");
            match std::fs::read(&path) {
                Ok(b) => Ok(Reply::Bytes(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Reply::Bytes(Vec::new())),
                Err(e) => Err(ApiError::internal(format!("read {}: {e}", path.display()))),
            }
        }
        O::CheckpointDelta => {
            let c = d.checkpoints.get(&param("id"))?;
            Ok(Reply::Bytes(d.checkpoint_delta(&c)?))
        }
        O::GrantSandbox => {
            let sb = d.sandboxes.get(&param("id"))?;
            let body: api::GrantRequest = req.json()?;
            Ok(Reply::json(&d.sandboxes.grants.grant(&sb, &body)?))
        }
        O::InspectGrant => Ok(Reply::json(
            &d.sandboxes.grants.get(&param("grant"))?.info(),
        )),
        O::RevokeGrant => Ok(Reply::json(&d.sandboxes.grants.revoke(&param("grant"))?)),
    }
}
