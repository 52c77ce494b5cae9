//! What a forkd sandbox is to E2B: its `Sandbox` and `SandboxDetail` forms, its token,
//! template, metadata and state (a running sandbox is E2B's `running`, a stopped one (a
//! pause) `paused`), the E2B sandbox a caller names, timeouts as expiries, a template's
//! start command, and the pages of E2B's lists. Shared by the control plane's parts
//! (`control.rs`, `states.rs`, `templates.rs`).

use crate::{failure, labels, wire, Body};
use forkd_api::client::Client;
use forkd_api::{SandboxInfo, SandboxStatus};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The default lifetime of a sandbox, seconds (E2B's).
pub(crate) const DEFAULT_TIMEOUT: u64 = 300;
/// `endAt` of a sandbox that does not expire: the last second RFC 3339 can write.
pub(crate) const NEVER: u64 = 253_402_300_799;
/// The longest a list page may be.
pub(crate) const MAX_PAGE: usize = 100;

pub(crate) type Answer = hyper::Response<Body>;

pub(crate) type Outcome = Result<Answer, (u16, String)>;

/// How long a template's ready check may take to pass.
pub(crate) const READY_WITHIN: std::time::Duration = std::time::Duration::from_secs(120);

/// A template's start command, in the background (its output in the sandbox's log
/// `e2b-start`), and its ready check, run until it passes.
pub(crate) fn start_command(
    client: &Client,
    id: &str,
    cmd: &str,
    ready: Option<&String>,
) -> Result<(), (u16, String)> {
    let path = format!("/v1/sandboxes/{}/exec", forkd_api::url::encode(id));
    // As root: a service's start script may need to (E2B's templates run theirs so).
    let start = json!({ "shell": cmd, "detach": true, "log": "e2b-start", "user": "root" });
    client
        .call::<Value>("POST", &path, Some(&start))
        .map_err(|e| failure(&e))?;
    let Some(ready) = ready else {
        return Ok(());
    };
    let t = std::time::Instant::now();
    loop {
        // A check may itself take long (E2B's default for a Dockerfile's CMD is
        // `sleep 20`): it has what is left of the bound.
        let left = READY_WITHIN
            .saturating_sub(t.elapsed())
            .as_millis()
            .max(1000) as u64;
        let check = json!({ "shell": ready, "timeout_ms": left, "user": "root" });
        let r: forkd_api::ExecResult = client
            .call("POST", &path, Some(&check))
            .map_err(|e| failure(&e))?;
        if r.exit.exit_code == 0 {
            return Ok(());
        }
        if t.elapsed() > READY_WITHIN {
            return Err((
                500,
                format!("sandbox {id}: the template's ready check {ready:?} did not pass within {READY_WITHIN:?}"),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// E2B's `Sandbox`: what create, connect, resume and fork answer.
pub(crate) fn sandbox(sb: &SandboxInfo) -> Value {
    json!({
        "templateID": template_of(sb),
        "sandboxID": sb.id,
        "clientID": "forkd",
        "envdVersion": crate::ENVD_VERSION,
        "envdAccessToken": token_of(sb),
        "alias": template_of(sb),
    })
}

/// The sandbox's access token: derived from its secret and its id, so that the
/// sandboxes of one fork, which share a secret, each have their own.
pub(crate) fn token_of(sb: &SandboxInfo) -> String {
    crate::access_token(
        sb.labels
            .get(labels::SECRET)
            .map(String::as_str)
            .unwrap_or(""),
        &sb.id,
    )
}

pub(crate) fn template_of(sb: &SandboxInfo) -> String {
    sb.labels
        .get(labels::TEMPLATE)
        .cloned()
        .unwrap_or_else(|| sb.image.clone())
}

pub(crate) fn metadata_of(sb: &SandboxInfo) -> BTreeMap<String, String> {
    sb.labels
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(labels::META)?.to_string(), v.clone())))
        .collect()
}

/// E2B's `SandboxDetail` and `ListedSandbox` (the same required fields).
pub(crate) fn detail(sb: &SandboxInfo) -> Value {
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
        "state": state_of(sb),
        "metadata": metadata_of(sb),
    })
}

/// E2B's state of a sandbox: a stopped one is paused.
pub(crate) fn state_of(sb: &SandboxInfo) -> &'static str {
    if sb.status == SandboxStatus::Stopped {
        "paused"
    } else {
        "running"
    }
}

/// Whether the sandbox is E2B's (made through this layer).
pub(crate) fn is_e2b(sb: &SandboxInfo) -> bool {
    sb.labels.contains_key(labels::SECRET)
}

/// The E2B sandbox `id`, as the caller sees it, running or paused: 404 if it is not one
/// (not made here, or being removed).
pub(crate) fn e2b_sandbox(client: &Client, id: &str) -> Result<SandboxInfo, (u16, String)> {
    let path = format!("/v1/sandboxes/{}", forkd_api::url::encode(id));
    let sb: SandboxInfo = client.call("GET", &path, None).map_err(|e| {
        let (status, message) = failure(&e);
        (status, format!("sandbox {id}: {message}"))
    })?;
    let settled = matches!(sb.status, SandboxStatus::Running | SandboxStatus::Stopped);
    if !is_e2b(&sb) || !settled || sb.id != id {
        return Err((404, format!("sandbox {id} not found")));
    }
    Ok(sb)
}

/// `{"timeout": seconds}`, the body of connect and set-timeout.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(crate) struct Timeout {
    pub(crate) timeout: Option<u64>,
}

pub(crate) fn timeout_of(body: &[u8]) -> Result<Option<u64>, (u16, String)> {
    if body.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice::<Timeout>(body)
        .map(|t| t.timeout)
        .map_err(|e| (400, format!("the request body is not a timeout: {e}")))
}

/// Sets sandbox `id` to expire `seconds` from now, or never.
pub(crate) fn expire_in(
    client: &Client,
    id: &str,
    seconds: Option<u64>,
) -> Result<SandboxInfo, (u16, String)> {
    let path = format!("/v1/sandboxes/{}/expiry", forkd_api::url::encode(id));
    let body = forkd_api::ExpiryRequest {
        expires_in_secs: seconds,
    };
    client.send("PUT", &path, &body).map_err(|e| failure(&e))
}

/// One page of `rows` (in their order): at most `limit` of them, from after the row
/// whose key is `nextToken`; and the token of the next page, when one follows.
pub(crate) fn page<T>(
    mut rows: Vec<T>,
    q: &std::collections::HashMap<String, String>,
    key: impl Fn(&T) -> String,
) -> Result<(Vec<T>, Option<String>), (u16, String)> {
    if let Some(after) = q.get("nextToken").filter(|t| !t.is_empty()) {
        match rows.iter().position(|r| &key(r) == after) {
            Some(i) => drop(rows.drain(..=i)),
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
    let next = if more { rows.last().map(&key) } else { None };
    Ok((rows, next))
}

/// An answer with `X-Next-Token` when another page follows.
pub(crate) fn with_next(mut answer: Answer, next: Option<String>) -> Answer {
    if let Some(v) = next.and_then(|n| hyper::header::HeaderValue::from_str(&n).ok()) {
        answer.headers_mut().insert("x-next-token", v);
    }
    answer
}
