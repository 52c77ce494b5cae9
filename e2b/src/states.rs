//! E2B's operations on a sandbox's state, each built on forkd's live checkpoints:
//!
//! - a pause is a live checkpoint that stops the sandbox (labelled `PAUSE_OF`); the
//!   sandbox stays, stopped, which is E2B's `paused`, and does not expire meanwhile;
//! - a resume (`connect` to a paused sandbox, or the older `resume`) is forkd's resume:
//!   the checkpoint's processes restored in place, under the same id;
//! - a snapshot is a live checkpoint of a running sandbox (labelled `SNAPSHOT`), and a
//!   sandbox made from one (its id as the template) is a branch of it;
//! - a fork with count N is a live checkpoint (labelled `FORK_OF`) and a fork of it
//!   into N branches, which share a new secret (each its own access token) and the
//!   source's metadata and environment.
//!
//! Before each checkpoint the layer lets go of the commands it runs in the sandbox
//! (they are kept commands: they run on, and the checkpoint takes them), and attaches
//! to them again afterwards, or in the resumed sandbox. The checkpoints pauses and
//! forks make are removed once nothing needs them ([`collect`]).

use crate::sandboxes::{
    self as control, e2b_sandbox, expire_in, metadata_of, sandbox, timeout_of, Outcome,
};
use crate::{empty, failure, json, labels, Gateway};
use forkd_api::client::Client;
use forkd_api::{
    CheckpointInfo, CheckpointRequest, ForkRequest, ForkResult, Network, ResumeRequest,
    SandboxInfo, SandboxStatus,
};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a checkpoint waits for the exec sessions the layer let go of to close.
const SESSIONS_CLOSE: Duration = Duration::from_secs(10);
/// The most sandboxes one fork makes (E2B's bound).
const MAX_FORKS: usize = 20;
/// A fork's checkpoint younger than this is not collected: its fork may be starting.
const FORK_GRACE_SECS: u64 = 60;

/// `connect`: a running sandbox's (its timeout extended, never shortened), or a paused
/// one's resume.
pub fn connect(gw: &Arc<Gateway>, client: &Client, body: &[u8], id: &str) -> Outcome {
    let sb = e2b_sandbox(client, id)?;
    let timeout = timeout_of(body)?;
    if sb.status == SandboxStatus::Stopped {
        let sb = resume_in_place(gw, client, &sb, timeout)?;
        return Ok(json(201, &sandbox(&sb)));
    }
    let mut sb = sb;
    if let Some(t) = timeout {
        if sb.expires_at.is_some_and(|at| at < control::now() + t) {
            sb = expire_in(client, &sb.id, Some(t))?;
        }
    }
    Ok(json(200, &sandbox(&sb)))
}

/// The older `resume`: a paused sandbox's only.
pub fn resume(gw: &Arc<Gateway>, client: &Client, body: &[u8], id: &str) -> Outcome {
    let sb = e2b_sandbox(client, id)?;
    if sb.status != SandboxStatus::Stopped {
        return Err((409, format!("sandbox {id} is already running")));
    }
    let sb = resume_in_place(gw, client, &sb, timeout_of(body)?)?;
    Ok(json(201, &sandbox(&sb)))
}

fn resume_in_place(
    gw: &Arc<Gateway>,
    client: &Client,
    sb: &SandboxInfo,
    timeout: Option<u64>,
) -> Result<SandboxInfo, (u16, String)> {
    let path = format!("/v1/sandboxes/{}/resume", forkd_api::url::encode(&sb.id));
    let req = ResumeRequest {
        checkpoint: None,
        expires_in_secs: Some(timeout.unwrap_or(control::DEFAULT_TIMEOUT)),
    };
    let resumed: SandboxInfo = client.send("POST", &path, &req).map_err(|e| failure(&e))?;
    gw.processes.reattach(client, &resumed.id);
    Ok(resumed)
}

/// `pause`: a live checkpoint that stops the sandbox, which then does not expire.
pub fn pause(gw: &Arc<Gateway>, client: &Client, id: &str) -> Outcome {
    let sb = e2b_sandbox(client, id)?;
    if sb.status == SandboxStatus::Stopped {
        return Err((409, format!("sandbox {id} is already paused")));
    }
    let mut l = BTreeMap::new();
    l.insert(labels::PAUSE_OF.to_string(), sb.id.clone());
    live_checkpoint(gw, client, &sb.id, true, l)?;
    expire_in(client, &sb.id, None)?;
    Ok(empty(204))
}

/// A live checkpoint of sandbox `id`, the layer's commands let go of meanwhile (and
/// attached again after, unless the checkpoint stops the sandbox).
fn live_checkpoint(
    gw: &Arc<Gateway>,
    client: &Client,
    id: &str,
    stop: bool,
    labels: BTreeMap<String, String>,
) -> Result<CheckpointInfo, (u16, String)> {
    gw.watchers.stop_sandbox(id);
    gw.processes.detach(id);
    let path = format!("/v1/sandboxes/{}/checkpoint", forkd_api::url::encode(id));
    let req = CheckpointRequest {
        live: true,
        stop,
        labels,
    };
    let started = Instant::now();
    let made = loop {
        match client.send::<_, CheckpointInfo>("POST", &path, &req) {
            Ok(c) => break Ok(c),
            // The daemon counts an exec session until its relay has closed: a moment.
            Err(e)
                if failure(&e).1.contains("exec session") && started.elapsed() < SESSIONS_CLOSE =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => break Err(failure(&e)),
        }
    };
    if made.is_err() || !stop {
        gw.processes.reattach(client, id);
    }
    made
}

/// The labels a sandbox's state carries into what is made from it: its template and
/// environment.
fn carried(sb: &SandboxInfo) -> BTreeMap<String, String> {
    sb.labels
        .iter()
        .filter(|(k, _)| k.starts_with(labels::ENV) || k.as_str() == labels::TEMPLATE)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct SnapshotBody {
    name: Option<String>,
}

/// `POST /sandboxes/{id}/snapshots`: a live checkpoint of the running sandbox.
pub fn snapshot(gw: &Arc<Gateway>, client: &Client, body: &[u8], id: &str) -> Outcome {
    let req: SnapshotBody = if body.is_empty() {
        SnapshotBody::default()
    } else {
        serde_json::from_slice(body)
            .map_err(|e| (400, format!("the request body is not a snapshot's: {e}")))?
    };
    let sb = e2b_sandbox(client, id)?;
    if sb.status != SandboxStatus::Running {
        return Err((409, format!("sandbox {id} is paused: resume it first")));
    }
    let mut l = carried(&sb);
    l.insert(
        labels::SNAPSHOT.to_string(),
        req.name.clone().unwrap_or_default(),
    );
    let c = live_checkpoint(gw, client, &sb.id, false, l)?;
    Ok(json(201, &snapshot_of(&c)))
}

/// E2B's `SnapshotInfo` of a checkpoint.
fn snapshot_of(c: &CheckpointInfo) -> Value {
    let mut names = vec![c.id.clone()];
    if let Some(n) = c.labels.get(labels::SNAPSHOT).filter(|n| !n.is_empty()) {
        names.insert(0, n.clone());
    }
    json!({ "snapshotID": c.id, "names": names })
}

fn snapshots(client: &Client) -> Result<Vec<CheckpointInfo>, (u16, String)> {
    let all: Vec<CheckpointInfo> = client
        .call("GET", "/v1/checkpoints", None)
        .map_err(|e| failure(&e))?;
    Ok(all
        .into_iter()
        .filter(|c| c.labels.contains_key(labels::SNAPSHOT))
        .collect())
}

/// The snapshot a template names (its id or its name), if it names one.
pub fn snapshot_named(
    client: &Client,
    template: &str,
) -> Result<Option<CheckpointInfo>, (u16, String)> {
    Ok(snapshots(client)?.into_iter().find(|c| {
        c.id == template
            || c.labels
                .get(labels::SNAPSHOT)
                .is_some_and(|n| !n.is_empty() && n == template)
    }))
}

/// A sandbox started from checkpoint `c`: a branch of it with `labels` (over the
/// checkpoint's), expiring after `timeout` seconds.
pub fn start_from(
    client: &Client,
    c: &CheckpointInfo,
    labels: BTreeMap<String, String>,
    timeout: u64,
    network: Option<Network>,
) -> Result<SandboxInfo, (u16, String)> {
    let branches = fork_of(client, c, 1, labels, timeout, network)?;
    branches.into_iter().next().ok_or((
        500,
        format!("the fork of checkpoint {} made no sandbox", c.id),
    ))
}

fn fork_of(
    client: &Client,
    c: &CheckpointInfo,
    count: usize,
    labels: BTreeMap<String, String>,
    timeout: u64,
    network: Option<Network>,
) -> Result<Vec<SandboxInfo>, (u16, String)> {
    let path = format!("/v1/checkpoints/{}/fork", forkd_api::url::encode(&c.id));
    let req = ForkRequest {
        count: Some(count),
        labels,
        network,
        expires_in_secs: Some(timeout),
        ..Default::default()
    };
    let made: ForkResult = client.send("POST", &path, &req).map_err(|e| failure(&e))?;
    made.branches
        .iter()
        .map(|b| {
            let path = format!("/v1/sandboxes/{}", forkd_api::url::encode(&b.id));
            client.call("GET", &path, None).map_err(|e| failure(&e))
        })
        .collect()
}

/// `GET /snapshots?sandboxID=&limit=&nextToken=`.
pub fn list_snapshots(client: &Client, q: &HashMap<String, String>) -> Outcome {
    let mut all = snapshots(client)?;
    if let Some(src) = q.get("sandboxID").filter(|s| !s.is_empty()) {
        all.retain(|c| &c.sandbox == src);
    }
    all.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
    let (page, next) = control::page(all, q, |c| c.id.clone())?;
    let body: Vec<Value> = page.iter().map(snapshot_of).collect();
    Ok(control::with_next(json(200, &Value::Array(body)), next))
}

/// `DELETE /templates/{id}`: a snapshot's removal (other templates are forkd's images,
/// which this API does not remove).
pub fn delete_snapshot(client: &Client, id: &str) -> Outcome {
    let Some(c) = snapshots(client)?.into_iter().find(|c| c.id == id) else {
        return Err((404, format!("snapshot {id} not found")));
    };
    let path = format!("/v1/checkpoints/{}", forkd_api::url::encode(&c.id));
    client
        .call::<Value>("DELETE", &path, None)
        .map_err(|e| failure(&e))?;
    Ok(empty(204))
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct ForkBody {
    timeout: Option<u64>,
    count: Option<usize>,
}

/// `POST /sandboxes/{id}/fork {timeout, count}`: N live branches of the sandbox as it
/// is now, one answer each (a sandbox, or the error that kept it from starting).
pub fn fork(gw: &Arc<Gateway>, client: &Client, body: &[u8], id: &str) -> Outcome {
    let req: ForkBody = if body.is_empty() {
        ForkBody::default()
    } else {
        serde_json::from_slice(body)
            .map_err(|e| (400, format!("the request body is not a fork's: {e}")))?
    };
    let count = req.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return Err((400, format!("count {count} must be from 1 to {MAX_FORKS}")));
    }
    let sb = e2b_sandbox(client, id)?;
    if sb.status != SandboxStatus::Running {
        return Err((409, format!("sandbox {id} is paused: resume it first")));
    }
    let mut l = carried(&sb);
    l.insert(labels::FORK_OF.to_string(), sb.id.clone());
    let c = live_checkpoint(gw, client, &sb.id, false, l)?;
    let mut own = BTreeMap::new();
    own.insert(labels::SECRET.to_string(), crate::random_hex(16));
    for (k, v) in metadata_of(&sb) {
        own.insert(format!("{}{k}", labels::META), v);
    }
    let timeout = req.timeout.unwrap_or(control::DEFAULT_TIMEOUT);
    let answers: Vec<Value> = match fork_of(client, &c, count, own, timeout, None) {
        Ok(branches) => branches
            .iter()
            .map(|b| json!({ "sandbox": sandbox(b) }))
            .collect(),
        // forkd's fork is all or nothing: every fork failed, for the same reason.
        Err((code, message)) => (0..count)
            .map(|_| json!({ "error": { "code": code, "message": message } }))
            .collect(),
    };
    Ok(json(201, &Value::Array(answers)))
}

/// Removes the checkpoints this layer's pauses and forks made that nothing needs any
/// more: a pause's once its sandbox is gone, a fork's once none of its branches is left
/// (and it is old enough that its fork is not still starting). Failures are left for
/// the next time.
pub fn collect(client: &Client) {
    let Ok(all) = client.call::<Vec<CheckpointInfo>>("GET", "/v1/checkpoints", None) else {
        return;
    };
    let now = control::now();
    for c in all.iter().filter(|c| c.branches.is_empty()) {
        let unneeded = if let Some(src) = c.labels.get(labels::PAUSE_OF) {
            let path = format!("/v1/sandboxes/{}", forkd_api::url::encode(src));
            matches!(client.call::<Value>("GET", &path, None), Err(e) if failure(&e).0 == 404)
        } else {
            c.labels.contains_key(labels::FORK_OF) && c.created + FORK_GRACE_SECS < now
        };
        if unneeded {
            let path = format!("/v1/checkpoints/{}", forkd_api::url::encode(&c.id));
            let _ = client.call::<Value>("DELETE", &path, None);
        }
    }
}
