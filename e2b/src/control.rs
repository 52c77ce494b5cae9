//! E2B's control plane: sandboxes made, listed, described and killed, as calls of
//! forkd's API made with the caller's key (`X-API-KEY`). A sandbox made here is a forkd
//! sandbox whose labels hold what E2B says of it: its template, access token, end time,
//! metadata and environment (`labels`); one without them is not E2B's, and is not
//! seen here.

use crate::wire::{self, NewSandbox};
use crate::{blocking, empty, failure, json, labels, query, rest_error, Body, Forkd, Gateway};
use forkd_api::client::Client;
use forkd_api::{CreateSandboxRequest, Network, SandboxInfo, SandboxStatus};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The default lifetime of a sandbox, seconds (E2B's).
const DEFAULT_TIMEOUT: u64 = 300;
/// `endAt` of a sandbox that does not expire: the last second RFC 3339 can write.
const NEVER: u64 = 253_402_300_799;
/// The longest a list page may be.
const MAX_PAGE: usize = 100;

pub fn is_control_path(path: &str) -> bool {
    let p = path.strip_prefix("/v2").unwrap_or(path);
    p == "/sandboxes"
        || p.starts_with("/sandboxes/")
        || p == "/snapshots"
        || path.starts_with("/templates/")
}

type Answer = hyper::Response<Body>;

pub async fn serve(
    gw: Arc<Gateway>,
    forkd: Arc<dyn Forkd>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Answer {
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
    let route = path.strip_prefix("/v2").unwrap_or(&path).to_string();
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
            ("POST", ["sandboxes", id, "connect"]) => connect(&client, &body, id),
            ("POST", ["sandboxes", id, "timeout"]) => set_timeout(&client, &body, id),
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

type Outcome = Result<Answer, (u16, String)>;

fn create(client: &Client, body: &[u8]) -> Outcome {
    let req: NewSandbox = serde_json::from_slice(if body.is_empty() { b"{}" } else { body })
        .map_err(|e| (400, format!("the request body is not a new sandbox: {e}")))?;
    if req.template_id.trim().is_empty() {
        return Err((400, "templateID is required".into()));
    }
    let image = template_image(client, &req.template_id)?;
    let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let token = crate::random_hex(16);
    let mut l = BTreeMap::new();
    l.insert(labels::TEMPLATE.to_string(), req.template_id.clone());
    l.insert(labels::TOKEN.to_string(), token.clone());
    for (k, v) in req.metadata.iter().flatten() {
        l.insert(format!("{}{k}", labels::META), v.clone());
    }
    for (k, v) in req.env_vars.iter().flatten() {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err((400, format!("envVars: {k:?} is not a variable's name")));
        }
        l.insert(format!("{}{k}", labels::ENV), v.clone());
    }
    let create = CreateSandboxRequest {
        image,
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
    Ok(json(201, &sandbox(&sb, &token)))
}

/// The forkd image a template names: the image of that name, else `e2b-<name>` (the
/// set-up's `e2b-base` answers E2B's `base`).
fn template_image(client: &Client, template: &str) -> Result<String, (u16, String)> {
    let tried = [template.to_string(), format!("e2b-{template}")];
    for name in &tried {
        let path = format!("/v1/images/{}", forkd_api::url::encode(name));
        match client.call::<Value>("GET", &path, None) {
            Ok(_) => return Ok(name.clone()),
            Err(e) if failure(&e).0 == 404 => continue,
            Err(e) => return Err(failure(&e)),
        }
    }
    Err((
        404,
        format!(
            "template {template:?} not found: no forkd image {:?} or {:?} (forkd images, forkd pull)",
            tried[0], tried[1]
        ),
    ))
}

/// The network E2B's settings ask for, in forkd's terms: the internet through NAT
/// (E2B's default), nothing, or only the hosts `allowOut` names when everything else is
/// denied.
fn network(req: &NewSandbox) -> Result<Network, (u16, String)> {
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

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// E2B's `Sandbox`: what create and connect answer.
fn sandbox(sb: &SandboxInfo, token: &str) -> Value {
    json!({
        "templateID": template_of(sb),
        "sandboxID": sb.id,
        "clientID": "forkd",
        "envdVersion": crate::ENVD_VERSION,
        "envdAccessToken": token,
        "alias": template_of(sb),
    })
}

fn template_of(sb: &SandboxInfo) -> String {
    sb.labels
        .get(labels::TEMPLATE)
        .cloned()
        .unwrap_or_else(|| sb.image.clone())
}

fn metadata_of(sb: &SandboxInfo) -> BTreeMap<String, String> {
    sb.labels
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(labels::META)?.to_string(), v.clone())))
        .collect()
}

/// E2B's `SandboxDetail` and `ListedSandbox` (the same required fields).
fn detail(sb: &SandboxInfo) -> Value {
    // A sandbox without an expiry (made through forkd's own API) lasts until removed.
    let end_at = sb.expires_at.unwrap_or(NEVER);
    json!({
        "templateID": template_of(sb),
        "alias": template_of(sb),
        "sandboxID": sb.id,
        "clientID": "forkd",
        "startedAt": wire::rfc3339(sb.created),
        "endAt": wire::rfc3339(end_at),
        "envdVersion": crate::ENVD_VERSION,
        "cpuCount": sb.limits.cpu_millis.map_or(0, |m| m.div_ceil(1000)),
        "memoryMB": sb.limits.memory_bytes.map_or(0, |b| b >> 20),
        "diskSizeMB": sb.limits.disk_bytes.map_or(0, |b| b >> 20),
        "state": "running",
        "metadata": metadata_of(sb),
    })
}

/// The E2B sandbox `id`, as the caller sees it: 404 if it is not one (not made here).
fn e2b_sandbox(client: &Client, id: &str) -> Result<SandboxInfo, (u16, String)> {
    let path = format!("/v1/sandboxes/{}", forkd_api::url::encode(id));
    let sb: SandboxInfo = client.call("GET", &path, None).map_err(|e| {
        let (status, message) = failure(&e);
        (status, format!("sandbox {id}: {message}"))
    })?;
    if !sb.labels.contains_key(labels::TOKEN) || sb.status != SandboxStatus::Running {
        return Err((404, format!("sandbox {id} not found")));
    }
    Ok(sb)
}

fn info(client: &Client, id: &str) -> Outcome {
    let sb = e2b_sandbox(client, id)?;
    let mut d = detail(&sb);
    if let Some(t) = sb.labels.get(labels::TOKEN) {
        d["envdAccessToken"] = json!(t);
    }
    Ok(json(200, &d))
}

/// `{"timeout": seconds}`, the body of connect and set-timeout.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct Timeout {
    timeout: Option<u64>,
}

fn timeout_of(body: &[u8]) -> Result<Option<u64>, (u16, String)> {
    if body.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice::<Timeout>(body)
        .map(|t| t.timeout)
        .map_err(|e| (400, format!("the request body is not a timeout: {e}")))
}

/// Sets sandbox `id` to expire `seconds` from now.
fn expire_in(client: &Client, id: &str, seconds: u64) -> Result<SandboxInfo, (u16, String)> {
    let path = format!("/v1/sandboxes/{}/expiry", forkd_api::url::encode(id));
    let body = forkd_api::ExpiryRequest {
        expires_in_secs: Some(seconds),
    };
    client.send("PUT", &path, &body).map_err(|e| failure(&e))
}

/// A running sandbox's connect: its timeout, when given, is extended (never shortened).
fn connect(client: &Client, body: &[u8], id: &str) -> Outcome {
    let mut sb = e2b_sandbox(client, id)?;
    if let Some(t) = timeout_of(body)? {
        if sb.expires_at.is_some_and(|at| at < now() + t) {
            sb = expire_in(client, &sb.id, t)?;
        }
    }
    let token = sb.labels.get(labels::TOKEN).cloned().unwrap_or_default();
    Ok(json(200, &sandbox(&sb, &token)))
}

fn set_timeout(client: &Client, body: &[u8], id: &str) -> Outcome {
    let t = timeout_of(body)?.ok_or((400, "timeout is required".to_string()))?;
    let sb = e2b_sandbox(client, id)?;
    expire_in(client, &sb.id, t)?;
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
    Ok(empty(204))
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
        .filter(|sb| sb.labels.contains_key(labels::TOKEN) && sb.status == SandboxStatus::Running)
        .filter(|_| states.contains(&"running"))
        .filter(|sb| {
            want.iter()
                .all(|(k, v)| sb.labels.get(&format!("{}{k}", labels::META)) == Some(v))
        })
        .collect();
    rows.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
    if let Some(after) = q.get("nextToken").filter(|t| !t.is_empty()) {
        match rows.iter().position(|sb| &sb.id == after) {
            Some(i) => rows.drain(..=i),
            None => {
                return Err((
                    400,
                    format!("nextToken {after:?} is not one this list gave"),
                ))
            }
        };
    }
    let limit = match q.get("limit") {
        None => MAX_PAGE,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| (400, format!("limit {l:?} must be from 1 to {MAX_PAGE}")))?,
    };
    let more = rows.len() > limit;
    rows.truncate(limit);
    let body: Vec<Value> = rows.iter().map(|sb| detail(sb)).collect();
    let mut answer = json(200, &Value::Array(body));
    if more {
        if let Some(last) = rows.last() {
            if let Ok(v) = hyper::header::HeaderValue::from_str(&last.id) {
                answer.headers_mut().insert("x-next-token", v);
            }
        }
    }
    Ok(answer)
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
