//! E2B's control plane: sandboxes made, listed, described, timed and killed, as calls
//! of forkd's API made with the caller's key (`X-API-KEY`); pauses, resumes, snapshots
//! and forks are `states.rs`. A sandbox made here is a forkd sandbox whose labels hold
//! what E2B says of it (`labels`): its template, the secret its access token is derived
//! from, its metadata and environment; its end is the sandbox's expiry. One without
//! them is not E2B's, and is not seen here. A running sandbox is E2B's `running`, a
//! stopped one (a pause) `paused`.

use crate::sandboxes::{
    detail, e2b_sandbox, expire_in, is_e2b, page, sandbox, start_command, state_of, timeout_of,
    token_of, with_next, Answer, Outcome, DEFAULT_TIMEOUT,
};
use crate::wire::{self, NewSandbox};
use crate::{blocking, empty, failure, json, labels, query, rest_error, Forkd, Gateway};
use crate::{states, templates};
use forkd_api::client::Client;
use forkd_api::{CreateSandboxRequest, Network, SandboxInfo, SandboxStatus};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

pub fn is_control_path(path: &str) -> bool {
    let p = unversioned(path);
    p == "/sandboxes"
        || p.starts_with("/sandboxes/")
        || p == "/snapshots"
        || p == "/templates"
        || p.starts_with("/templates/")
}

/// A control-plane path without its version prefix (`/v2`, `/v3`): the versions differ
/// in their bodies, which the handlers read alike.
fn unversioned(path: &str) -> &str {
    path.strip_prefix("/v2")
        .or_else(|| path.strip_prefix("/v3"))
        .unwrap_or(path)
}

pub async fn serve(
    gw: Arc<Gateway>,
    forkd: Arc<dyn Forkd>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Answer {
    // A template build's upload carries a single-use token in its URL, not a key (the
    // SDK sends it where E2B's API hands out a storage URL).
    if req.method() == hyper::Method::PUT {
        if let Some(token) = req.uri().path().strip_prefix("/templates/uploads/") {
            let token = token.to_string();
            return match crate::read_body(req.into_body(), gw.settings.max_body).await {
                Ok(body) => templates::upload(&gw, &token, body),
                Err(e) => rest_error(400, e),
            };
        }
    }
    let base_url = format!(
        "{}://{}",
        if gw.settings.tls { "https" } else { "http" },
        req.headers()
            .get(hyper::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("localhost")
    );
    let key = req
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_string());
    let Some(key) = key else {
        return rest_error(
            401,
            "an API key is required: send X-API-KEY (forkd key create makes one)",
        );
    };
    let client = match forkd.as_key(&key) {
        Ok(c) => c,
        Err(e) => return rest_error(401, e),
    };
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let q = query(req.uri());
    let body = if method == "POST" {
        match crate::read_body(req.into_body(), 1 << 20).await {
            Ok(b) => b,
            Err(e) => return rest_error(400, e),
        }
    } else {
        Vec::new()
    };
    let route = unversioned(&path).to_string();
    let segs: Vec<String> = route
        .trim_matches('/')
        .split('/')
        .map(|s| forkd_api::url::decode(s).unwrap_or_else(|_| s.to_string()))
        .collect();
    let answer = blocking(move || {
        let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
        match (method.as_str(), segs.as_slice()) {
            ("POST", ["sandboxes"]) => create(&client, &body),
            ("GET", ["sandboxes"]) => list(&client, &q),
            ("GET", ["sandboxes", id]) => info(&client, id),
            ("DELETE", ["sandboxes", id]) => kill(&gw, &client, id),
            ("POST", ["sandboxes", id, "connect"]) => states::connect(&gw, &client, &body, id),
            ("POST", ["sandboxes", id, "resume"]) => states::resume(&gw, &client, &body, id),
            ("POST", ["sandboxes", id, "timeout"]) => set_timeout(&client, &body, id),
            ("POST", ["sandboxes", id, "pause"]) => states::pause(&gw, &client, id),
            ("POST", ["sandboxes", id, "snapshots"]) => states::snapshot(&gw, &client, &body, id),
            ("GET", ["snapshots"]) => states::list_snapshots(&client, &q),
            ("DELETE", ["templates", id]) => states::delete_snapshot(&client, id),
            ("POST", ["sandboxes", id, "fork"]) => states::fork(&gw, &client, &body, id),
            ("GET", ["sandboxes", id, "metrics"]) => metrics(&client, id),
            ("POST", ["templates"]) => templates::request(&gw, &client, &body),
            ("GET", ["templates", "aliases", alias]) => templates::alias(&client, alias),
            ("GET", ["templates", id, "files", hash]) => {
                templates::upload_link(&gw, &base_url, id, hash)
            }
            ("POST", ["templates", id, "builds", build]) => templates::start(&gw, id, build, &body),
            ("GET", ["templates", id, "builds", build, "status"]) => {
                templates::status(&gw, id, build, &q)
            }
            (m, _) => Err((
                501,
                format!("{m} {path}: this E2B operation is not served by forkd yet"),
            )),
        }
    })
    .await;
    match answer {
        Ok(Ok(a)) => a,
        Ok(Err((status, message))) => rest_error(status, message),
        Err(e) => rest_error(500, e),
    }
}

fn create(client: &Client, body: &[u8]) -> Outcome {
    let req: NewSandbox = serde_json::from_slice(if body.is_empty() { b"{}" } else { body })
        .map_err(|e| (400, format!("the request body is not a new sandbox: {e}")))?;
    if req.template_id.trim().is_empty() {
        return Err((400, "templateID is required".into()));
    }
    let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let mut l = BTreeMap::new();
    l.insert(labels::TEMPLATE.to_string(), req.template_id.clone());
    l.insert(labels::SECRET.to_string(), crate::random_hex(16));
    for (k, v) in req.metadata.iter().flatten() {
        l.insert(format!("{}{k}", labels::META), v.clone());
    }
    for (k, v) in req.env_vars.iter().flatten() {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err((400, format!("envVars: {k:?} is not a variable's name")));
        }
        l.insert(format!("{}{k}", labels::ENV), v.clone());
    }
    let image = match template_image(client, &req.template_id) {
        Ok(image) => image,
        // Not an image: a snapshot's id or name names the state to start from, a
        // branch of its checkpoint.
        Err((404, why)) => match states::snapshot_named(client, &req.template_id)? {
            Some(c) => {
                let sb = states::start_from(client, &c, l, timeout, Some(network(&req)?))?;
                return Ok(json(201, &sandbox(&sb)));
            }
            None => return Err((404, why)),
        },
        Err(e) => return Err(e),
    };
    let create = CreateSandboxRequest {
        image: image.name.clone(),
        command: None,
        hostname: None,
        limits: Default::default(),
        labels: l,
        network: network(&req)?,
        seccomp: Default::default(),
        // E2B's sandboxes let their user sudo.
        setuid: true,
        expires_in_secs: Some(timeout),
    };
    let sb: SandboxInfo = client
        .send("POST", "/v1/sandboxes", &create)
        .map_err(|e| failure(&e))?;
    let labels = &image.config.labels;
    if let Some(cmd) = labels.get(templates::START_CMD) {
        // Its started state, made when it was built, unless it was built elsewhere.
        if let Some(c) = templates::state_of(client, &image.name)? {
            let path = format!(
                "/v1/sandboxes/{}?force=true",
                forkd_api::url::encode(&sb.id)
            );
            let _ = client.call::<Value>("DELETE", &path, None);
            let sb = states::start_from(
                client,
                &c,
                create.labels.clone(),
                timeout,
                Some(create.network.clone()),
            )?;
            return Ok(json(201, &sandbox(&sb)));
        }
        if let Err(e) = start_command(client, &sb.id, cmd, labels.get(templates::READY_CMD)) {
            let path = format!(
                "/v1/sandboxes/{}?force=true",
                forkd_api::url::encode(&sb.id)
            );
            let _ = client.call::<Value>("DELETE", &path, None);
            return Err(e);
        }
    }
    Ok(json(201, &sandbox(&sb)))
}

/// The forkd image a template names: the image of that name, else `e2b-<name>` (the
/// set-up's `e2b-base` answers E2B's `base`).
fn template_image(client: &Client, template: &str) -> Result<forkd_api::ImageInfo, (u16, String)> {
    let tried = [template.to_string(), format!("e2b-{template}")];
    for name in &tried {
        let path = format!("/v1/images/{}", forkd_api::url::encode(name));
        match client.call::<forkd_api::ImageInfo>("GET", &path, None) {
            Ok(info) => return Ok(info),
            Err(e) if failure(&e).0 == 404 => continue,
            Err(e) => return Err(failure(&e)),
        }
    }
    Err((
        404,
        format!(
            "template {template:?} not found: no forkd image {:?} or {:?} (forkd image ls, forkd image pull), and no snapshot of that id or name",
            tried[0], tried[1]
        ),
    ))
}

/// The network E2B's settings ask for, in forkd's terms: the internet through NAT
/// (E2B's default), nothing, or only the hosts `allowOut` names when everything else is
/// denied.
pub(crate) fn network(req: &NewSandbox) -> Result<Network, (u16, String)> {
    let allow = req
        .network
        .as_ref()
        .and_then(|n| n.allow_out.clone())
        .unwrap_or_default();
    let deny = req
        .network
        .as_ref()
        .and_then(|n| n.deny_out.clone())
        .unwrap_or_default();
    let deny_all = deny.iter().any(|d| d == "0.0.0.0/0");
    if !deny.is_empty() && !deny_all {
        return Err((
            400,
            "network.denyOut: forkd denies everything or nothing; name the hosts to allow in allowOut with denyOut [\"0.0.0.0/0\"]".into(),
        ));
    }
    if req.allow_internet_access == Some(false) || (deny_all && allow.is_empty()) {
        return Ok(Network::none());
    }
    if !allow.is_empty() {
        if !deny_all {
            return Err((
                400,
                "network.allowOut narrows egress only with denyOut [\"0.0.0.0/0\"]".into(),
            ));
        }
        return Ok(Network::allowlist(allow));
    }
    Ok(Network::egress())
}

fn info(client: &Client, id: &str) -> Outcome {
    let sb = e2b_sandbox(client, id)?;
    let mut d = detail(&sb);
    d["envdAccessToken"] = json!(token_of(&sb));
    Ok(json(200, &d))
}

fn set_timeout(client: &Client, body: &[u8], id: &str) -> Outcome {
    let t = timeout_of(body)?.ok_or((400, "timeout is required".to_string()))?;
    let sb = e2b_sandbox(client, id)?;
    if sb.status != SandboxStatus::Running {
        return Err((409, format!("sandbox {id} is paused: resume it first")));
    }
    expire_in(client, &sb.id, Some(t))?;
    Ok(empty(204))
}

fn kill(gw: &Gateway, client: &Client, id: &str) -> Outcome {
    let sb = e2b_sandbox(client, id)?;
    let path = format!(
        "/v1/sandboxes/{}?force=true",
        forkd_api::url::encode(&sb.id)
    );
    client
        .call::<Value>("DELETE", &path, None)
        .map_err(|e| failure(&e))?;
    gw.sandboxes.forget(&sb.id);
    // The checkpoints its pauses and forks made go when nothing stands on them: looked
    // for after the answer.
    let client = client.clone();
    let _ = std::thread::Builder::new()
        .name("e2b-collect".into())
        .spawn(move || states::collect(&client));
    Ok(empty(204))
}

/// `GET /sandboxes/{id}/metrics`: one sample, now. CPU use is the average since the
/// sandbox started over the CPUs it may use (its limit, else the machine's); memory
/// and disk totals are its limits (0: none); forkd does not report page cache apart
/// (`memCache` 0).
fn metrics(client: &Client, id: &str) -> Outcome {
    let sb = e2b_sandbox(client, id)?;
    if sb.status != SandboxStatus::Running {
        return Ok(json(200, &json!([])));
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    let cpus = sb.limits.cpu_millis.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
        |m| m.div_ceil(1000).max(1),
    );
    let lived_us = now_ms.saturating_sub(sb.created * 1000).max(1) * 1000;
    let pct = sb
        .cpu_usage_us
        .map_or(0.0, |u| u as f64 * 100.0 / (lived_us as f64 * cpus as f64));
    let sample = json!({
        "timestamp": wire::rfc3339(now_ms / 1000),
        "timestampUnix": now_ms / 1000,
        "cpuCount": cpus,
        "cpuUsedPct": (pct * 10_000.0).round() / 10_000.0,
        "memUsed": sb.memory_bytes.unwrap_or(0),
        "memTotal": sb.limits.memory_bytes.unwrap_or(0),
        "memCache": 0,
        "diskUsed": sb.disk_used_bytes.unwrap_or(0),
        "diskTotal": sb.limits.disk_bytes.unwrap_or(0),
    });
    Ok(json(200, &json!([sample])))
}

/// `GET /sandboxes` (all at once) and `GET /v2/sandboxes` (pages of `limit`, from after
/// `nextToken`, with `X-Next-Token` when more follow), filtered by `metadata` (itself a
/// form, `k=v&k2=v2`) and `state`.
fn list(client: &Client, q: &std::collections::HashMap<String, String>) -> Outcome {
    let all: Vec<SandboxInfo> = client
        .call("GET", "/v1/sandboxes", None)
        .map_err(|e| failure(&e))?;
    let want: Vec<(String, String)> = q
        .get("metadata")
        .map(|m| {
            m.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    let d = |s: &str| forkd_api::url::decode(s).unwrap_or_else(|_| s.to_string());
                    (d(k), d(v))
                })
                .collect()
        })
        .unwrap_or_default();
    let states: Vec<&str> = q
        .get("state")
        .map(|s| s.split(',').map(str::trim).collect())
        .unwrap_or_else(|| vec!["running", "paused"]);
    let mut rows: Vec<&SandboxInfo> = all
        .iter()
        .filter(|sb| {
            is_e2b(sb) && matches!(sb.status, SandboxStatus::Running | SandboxStatus::Stopped)
        })
        .filter(|sb| states.contains(&state_of(sb)))
        .filter(|sb| {
            want.iter()
                .all(|(k, v)| sb.labels.get(&format!("{}{k}", labels::META)) == Some(v))
        })
        .collect();
    rows.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
    let (page, next) = page(rows, q, |sb| sb.id.clone())?;
    let body: Vec<Value> = page.iter().map(|sb| detail(sb)).collect();
    Ok(with_next(json(200, &Value::Array(body)), next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(body: Value) -> NewSandbox {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn networks_map_onto_forkd_modes() {
        let n = |b| network(&new(b));
        assert_eq!(n(json!({"templateID": "base"})).unwrap(), Network::egress());
        assert_eq!(
            n(json!({"templateID": "base", "allow_internet_access": false})).unwrap(),
            Network::none()
        );
        assert_eq!(
            n(json!({"templateID": "b", "network": {"denyOut": ["0.0.0.0/0"]}})).unwrap(),
            Network::none()
        );
        assert_eq!(
            n(json!({"templateID": "b", "network": {"allowOut": ["10.0.0.1"], "denyOut": ["0.0.0.0/0"]}}))
                .unwrap(),
            Network::allowlist(vec!["10.0.0.1".into()])
        );
        assert!(n(json!({"templateID": "b", "network": {"denyOut": ["10.0.0.0/8"]}})).is_err());
        assert!(n(json!({"templateID": "b", "network": {"allowOut": ["10.0.0.1"]}})).is_err());
    }

    #[test]
    fn control_paths_are_told_apart_from_forkds() {
        assert!(is_control_path("/sandboxes"));
        assert!(is_control_path("/v2/sandboxes"));
        assert!(is_control_path("/v2/sandboxes/x/connect"));
        assert!(is_control_path("/snapshots"));
        assert!(is_control_path("/templates/abc"));
        assert!(!is_control_path("/v1/sandboxes"));
        assert!(!is_control_path("/sandboxesx"));
        assert!(!is_control_path("/metrics"));
    }
}
