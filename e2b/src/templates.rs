//! E2B's template builds, as forkd builds of an uploaded context
//! (`POST /v1/images/build/upload`): the SDK's `Template().from_image(...)` and
//! `.from_dockerfile(...)` with `AsyncTemplate.build`, what Harbor's E2B backend does per
//! task, and `alias_exists`.
//!
//! The SDK asks for a build (`POST /v3/templates`, a name), uploads each COPY's files
//! (`GET /templates/{id}/files/{hash}` answers an upload URL of this layer's, which takes
//! the archive with a single-use token in place of a key), then starts it with its steps
//! (`POST /v2/templates/{id}/builds/{build}`: a base image, RUN, COPY, ENV, WORKDIR, USER)
//! and polls its status and logs. This layer writes the steps as a Dockerfile over a
//! context holding the uploads (`files/<hash>/...`), builds it with forkd as the caller's
//! key into the image the template names (its name: `Sandbox.create(template=name)` then
//! finds it), and reports forkd's build steps as the build's logs. E2B's images all have
//! the user `user`: the Dockerfile makes it first where the base lacks it. A start
//! command (and its ready check) become labels of the image, which a sandbox made from
//! it runs (`control.rs`).

use crate::{empty, failure, json, rest_error, Body, Gateway};
use forkd_api::client::Client;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type Answer = hyper::Response<Body>;
type Outcome = Result<Answer, (u16, String)>;

/// Labels a template's start command and ready check travel in (the image's config).
pub const START_CMD: &str = "e2b.start-cmd";
pub const READY_CMD: &str = "e2b.ready-cmd";
/// On a checkpoint: the template whose started state it is.
pub const STATE_OF: &str = "e2b.template-state";
/// On an image: the template it was built for.
const TEMPLATE_LABEL: &str = "e2b.template";

/// The most bytes the uploads of one build may hold together.
const MAX_UPLOADS: usize = 1 << 30;
/// The most bytes the uploads of every build under way may hold together.
const MAX_ALL_UPLOADS: usize = 2 << 30;
/// Builds kept (their status and logs) at most.
const MAX_BUILDS: usize = 1024;
/// How long a build that never starts keeps its uploads.
const UNSTARTED: std::time::Duration = std::time::Duration::from_secs(3600);

/// The builds this layer was asked for, and the upload URLs it handed out.
#[derive(Default)]
pub struct Builds {
    all: Mutex<HashMap<String, Arc<Build>>>,
    /// Upload token -> (build id, files hash).
    uploads: Mutex<HashMap<String, (String, String)>>,
}

struct Build {
    template: String,
    /// When it was asked for: a build never started is forgotten after [`UNSTARTED`].
    asked: std::time::Instant,
    /// The key that asked (the id of its forkd key is not known here: its client is).
    client: Client,
    files: Mutex<HashMap<String, Vec<u8>>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// `waiting` (files may come), `building`, `ready`, `error`.
    status: &'static str,
    logs: Vec<(u64, &'static str, String)>,
    reason: Option<String>,
}

impl Build {
    fn log(&self, level: &'static str, message: impl Into<String>) {
        self.state
            .lock()
            .unwrap()
            .logs
            .push((crate::sandboxes::now(), level, message.into()));
    }
}

/// The template name a request names, as a forkd image name: letters, digits and
/// `._-`, lowercase.
fn image_name(name: &str) -> Result<String, (u16, String)> {
    let n = name.trim().to_ascii_lowercase();
    let ok = !n.is_empty()
        && n.len() <= 128
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && n.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(n)
    } else {
        Err((
            400,
            format!("template name {name:?}: letters, digits, '.', '_' and '-' only"),
        ))
    }
}

/// `POST /v3/templates` (and `/v2/templates`): a build of the named template.
pub fn request(gw: &Gateway, client: &Client, body: &[u8]) -> Outcome {
    let v: Value =
        serde_json::from_slice(if body.is_empty() { b"{}" } else { body }).map_err(|e| {
            (
                400,
                format!("the request body is not a template build: {e}"),
            )
        })?;
    let name = v["name"]
        .as_str()
        .or_else(|| v["alias"].as_str())
        .ok_or((400, "name is required".to_string()))?;
    let template = image_name(name)?;
    let build_id = crate::random_hex(8);
    let b = Arc::new(Build {
        template: template.clone(),
        asked: std::time::Instant::now(),
        client: client.clone(),
        files: Mutex::default(),
        state: Mutex::new(State {
            status: "waiting",
            ..Default::default()
        }),
    });
    b.log(
        "info",
        format!("build {build_id} of template {template} requested"),
    );
    let mut all = gw.builds.all.lock().unwrap();
    all.retain(|_, b| b.asked.elapsed() < UNSTARTED || b.state.lock().unwrap().status != "waiting");
    if all.len() >= MAX_BUILDS {
        // The oldest finished ones go first.
        let done: Vec<String> = all
            .iter()
            .filter(|(_, b)| matches!(b.state.lock().unwrap().status, "ready" | "error"))
            .map(|(k, _)| k.clone())
            .collect();
        for k in done {
            all.remove(&k);
        }
    }
    all.insert(build_id.clone(), b);
    Ok(json(
        202,
        &json!({
            "templateID": template,
            "buildID": build_id,
            "public": false,
            "names": [template],
            "aliases": [template],
            "tags": [],
        }),
    ))
}

fn build_of(
    gw: &Gateway,
    template: &str,
    build: Option<&str>,
) -> Result<(String, Arc<Build>), (u16, String)> {
    let all = gw.builds.all.lock().unwrap();
    let found = match build {
        Some(id) => all.get(id).map(|b| (id.to_string(), b.clone())),
        // The newest waiting build of the template (the file calls name none).
        None => all
            .iter()
            .filter(|(_, b)| b.template == template && b.state.lock().unwrap().status == "waiting")
            .map(|(k, b)| (k.clone(), b.clone()))
            .last(),
    };
    match found {
        Some((id, b)) if b.template == template => Ok((id, b)),
        _ => Err((404, format!("no build of template {template} is under way"))),
    }
}

/// `GET /templates/{id}/files/{hash}`: where to upload a COPY's files.
pub fn upload_link(gw: &Gateway, base_url: &str, template: &str, hash: &str) -> Outcome {
    if hash.is_empty() || hash.len() > 128 || !hash.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err((400, format!("files hash {hash:?} is not a hash")));
    }
    let (build_id, b) = build_of(gw, template, None)?;
    if b.files.lock().unwrap().contains_key(hash) {
        return Ok(json(201, &json!({ "present": true })));
    }
    let token = crate::random_hex(16);
    gw.builds
        .uploads
        .lock()
        .unwrap()
        .insert(token.clone(), (build_id, hash.to_string()));
    Ok(json(
        201,
        &json!({ "present": false, "url": format!("{base_url}/templates/uploads/{token}") }),
    ))
}

/// `PUT /templates/uploads/{token}`: a COPY's files, as the SDK packs them (a tar, maybe
/// gzip'd), for the build the token was handed out for.
pub fn upload(gw: &Gateway, token: &str, body: Vec<u8>) -> Answer {
    let Some((build_id, hash)) = gw.builds.uploads.lock().unwrap().remove(token) else {
        return rest_error(
            404,
            "no upload is expected at this URL (used, or never handed out)",
        );
    };
    let Some(b) = gw.builds.all.lock().unwrap().get(&build_id).cloned() else {
        return rest_error(404, format!("build {build_id} is gone"));
    };
    let all: usize = gw
        .builds
        .all
        .lock()
        .unwrap()
        .values()
        .filter(|o| !Arc::ptr_eq(o, &b))
        .map(|o| {
            o.files
                .lock()
                .unwrap()
                .values()
                .map(Vec::len)
                .sum::<usize>()
        })
        .sum();
    let mut files = b.files.lock().unwrap();
    let held: usize = files.values().map(Vec::len).sum();
    if held + body.len() > MAX_UPLOADS {
        return rest_error(
            400,
            format!("the build's uploads are over {MAX_UPLOADS} bytes"),
        );
    }
    if all + held + body.len() > MAX_ALL_UPLOADS {
        return rest_error(
            503,
            format!("uploads of builds under way hold {MAX_ALL_UPLOADS} bytes: try again later"),
        );
    }
    let n = body.len();
    files.insert(hash.clone(), body);
    drop(files);
    b.log("info", format!("received files {hash} ({n} bytes)"));
    empty(200)
}

/// A value in a Dockerfile, JSON-quoted (which forkd's front end reads as an exec form
/// or a quoted word alike).
fn quoted(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// The Dockerfile the steps make, and the COPY hashes it reads from `files/`.
fn dockerfile(start: &Value) -> Result<(String, Vec<String>), String> {
    let base = start["fromImage"]
        .as_str()
        .or_else(|| start["fromTemplate"].as_str())
        .filter(|b| !b.is_empty())
        .ok_or("the build names no base: fromImage or fromTemplate")?;
    let mut out = format!("FROM {base}\nUSER root\n");
    // Which template the image is (a retried build reuses an image it already made).
    if let Some(name) = start["__template"].as_str() {
        out.push_str(&format!("LABEL {TEMPLATE_LABEL}={}\n", quoted(name)));
    }
    // E2B's images all have the user `user`, with its home.
    out.push_str(
        "RUN id -u user >/dev/null 2>&1 || useradd -m -s /bin/bash user 2>/dev/null || adduser -D user; mkdir -p /home/user && chown user /home/user\n",
    );
    let mut user = "root".to_string();
    let mut hashes = Vec::new();
    for (i, step) in start["steps"].as_array().into_iter().flatten().enumerate() {
        let args: Vec<String> = step["args"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| a.as_str().unwrap_or_default().to_string())
            .collect();
        let arg = |n: usize| args.get(n).map(String::as_str).unwrap_or("");
        let bad = |what: &str| format!("step {}: {what}", i + 1);
        if args
            .iter()
            .any(|a| a.contains('\n') && step["type"] != "RUN")
        {
            return Err(bad("an argument holds a line break"));
        }
        match step["type"].as_str().unwrap_or("") {
            "RUN" => {
                let cmd = arg(0);
                if cmd.is_empty() {
                    return Err(bad("RUN without a command"));
                }
                let as_user = arg(1);
                let line = format!("RUN [\"/bin/sh\", \"-c\", {}]\n", quoted(cmd));
                if !as_user.is_empty() && as_user != user {
                    out.push_str(&format!("USER {as_user}\n{line}USER {user}\n"));
                } else {
                    out.push_str(&line);
                }
            }
            "COPY" => {
                let hash = step["filesHash"]
                    .as_str()
                    .ok_or_else(|| bad("COPY without its files"))?;
                let (src, dest) = (arg(0).trim_start_matches("./"), arg(1));
                if src.is_empty() || dest.is_empty() || src.split('/').any(|c| c == "..") {
                    return Err(bad(
                        "COPY needs a source inside the context and a destination",
                    ));
                }
                let mut flags = String::new();
                if !arg(2).is_empty() {
                    flags.push_str(&format!("--chown={} ", arg(2)));
                }
                if !arg(3).is_empty() {
                    flags.push_str(&format!("--chmod={} ", arg(3)));
                }
                out.push_str(&format!(
                    "COPY {flags}[{}, {}]\n",
                    quoted(&format!("files/{hash}/{src}")),
                    quoted(dest)
                ));
                hashes.push(hash.to_string());
            }
            "ENV" => {
                for kv in args.chunks(2) {
                    if let [k, v] = kv {
                        out.push_str(&format!("ENV {k}={}\n", quoted(v)));
                    }
                }
            }
            "WORKDIR" => out.push_str(&format!("WORKDIR {}\n", arg(0))),
            "USER" => {
                user = arg(0).to_string();
                out.push_str(&format!("USER {user}\n"));
            }
            other => return Err(bad(&format!("step type {other:?} is not one forkd builds"))),
        }
    }
    for (label, key) in [(START_CMD, "startCmd"), (READY_CMD, "readyCmd")] {
        if let Some(c) = start[key].as_str().filter(|c| !c.is_empty()) {
            out.push_str(&format!("LABEL {label}={}\n", quoted(c)));
        }
    }
    Ok((out, hashes))
}

/// The build's context: the Dockerfile, and each upload's entries under `files/<hash>/`.
fn context(
    file: &str,
    uploads: &HashMap<String, Vec<u8>>,
    hashes: &[String],
) -> Result<Vec<u8>, String> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(file.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    tar.append_data(&mut h, "Dockerfile", file.as_bytes())
        .map_err(|e| e.to_string())?;
    // Every directory an entry is in comes before it (an upload may not list them).
    let mut dirs = std::collections::HashSet::new();
    let dir_entry = |tar: &mut tar::Builder<Vec<u8>>,
                     dirs: &mut std::collections::HashSet<std::path::PathBuf>,
                     path: &std::path::Path|
     -> Result<(), String> {
        let mut need = Vec::new();
        let mut p = path.parent();
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
            if dirs.contains(d) {
                break;
            }
            need.push(d.to_path_buf());
            p = d.parent();
        }
        for d in need.into_iter().rev() {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
            h.set_mode(0o755);
            h.set_cksum();
            tar.append_data(&mut h, &d, std::io::empty())
                .map_err(|e| e.to_string())?;
            dirs.insert(d);
        }
        Ok(())
    };
    for hash in hashes {
        let raw = uploads
            .get(hash)
            .ok_or_else(|| format!("the files of COPY {hash} were never uploaded"))?;
        let reader: Box<dyn std::io::Read> = if raw.starts_with(&[0x1f, 0x8b]) {
            Box::new(flate2::read::GzDecoder::new(&raw[..]))
        } else {
            Box::new(&raw[..])
        };
        let mut a = tar::Archive::new(reader);
        for entry in a.entries().map_err(|e| format!("files {hash}: {e}"))? {
            let mut entry = entry.map_err(|e| format!("files {hash}: {e}"))?;
            let path = entry.path().map_err(|e| e.to_string())?.into_owned();
            let mut header = entry.header().clone();
            let target = std::path::Path::new("files").join(hash).join(&path);
            dir_entry(&mut tar, &mut dirs, &target)?;
            if header.entry_type().is_dir() {
                dirs.insert(target.clone());
            }
            // Entries are checked again where forkd unpacks the context (no `..`, no
            // absolute names, nothing through a symlink).
            if header.entry_type().is_symlink() || header.entry_type().is_hard_link() {
                let link = entry
                    .link_name()
                    .map_err(|e| e.to_string())?
                    .unwrap_or_default()
                    .into_owned();
                tar.append_link(&mut header, &target, link)
                    .map_err(|e| e.to_string())?;
            } else {
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut data).map_err(|e| e.to_string())?;
                tar.append_data(&mut header, &target, &data[..])
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    tar.into_inner().map_err(|e| e.to_string())
}

/// `POST /v2/templates/{id}/builds/{build}`: the build starts, in the background.
pub fn start(gw: &Gateway, template: &str, build_id: &str, body: &[u8]) -> Outcome {
    let (_, b) = build_of(gw, template, Some(build_id))?;
    let mut start: Value = serde_json::from_slice(if body.is_empty() { b"{}" } else { body })
        .map_err(|e| (400, format!("the request body is not a build's steps: {e}")))?;
    if !start.is_object() {
        return Err((400, "the request body is not a build's steps".into()));
    }
    start["__template"] = json!(b.template);
    {
        let mut st = b.state.lock().unwrap();
        if st.status != "waiting" {
            return Err((409, format!("build {build_id} has started already")));
        }
        st.status = "building";
    }
    let (file, hashes) = match dockerfile(&start) {
        Ok(x) => x,
        Err(e) => {
            fail(&b, &e);
            return Err((400, e));
        }
    };
    let files = std::mem::take(&mut *b.files.lock().unwrap());
    let tar = match context(&file, &files, &hashes) {
        Ok(t) => t,
        Err(e) => {
            fail(&b, &e);
            return Err((400, e));
        }
    };
    b.log(
        "info",
        format!(
            "building {} over {} bytes of context",
            b.template,
            tar.len()
        ),
    );
    let b2 = b.clone();
    let spawned = std::thread::Builder::new()
        .name("e2b-build".into())
        .spawn(move || run(&b2, &tar));
    if spawned.is_err() {
        fail(&b, "no thread for the build");
        return Err((503, "no thread for the build".into()));
    }
    Ok(empty(202))
}

fn fail(b: &Build, why: &str) {
    b.log("error", why);
    let mut st = b.state.lock().unwrap();
    st.status = "error";
    st.reason = Some(why.to_string());
}

fn run(b: &Build, tar: &[u8]) {
    let path = format!(
        "/v1/images/build/upload?name={}",
        forkd_api::url::encode(&b.template)
    );
    let image = format!("/v1/images/{}", forkd_api::url::encode(&b.template));
    let built = match b.client.raw("POST", &path, tar) {
        Ok(r) if r.status == 201 => {
            match serde_json::from_slice::<forkd_api::BuildResult>(&r.body) {
                Ok(done) => {
                    for s in &done.steps {
                        b.log(
                            "info",
                            format!("step {} ({}): {}", s.line, s.cache, s.instruction),
                        );
                    }
                    Ok(done.image)
                }
                Err(e) => Err((500, format!("the build's answer: {e}"))),
            }
        }
        // A key of scope own cannot replace an image: one this template's build made
        // before (an attempt that failed after it) is taken as it is.
        Ok(r) if r.status == 403 => {
            match b.client.call::<forkd_api::ImageInfo>("GET", &image, None) {
                Ok(info)
                    if info.config.labels.get(TEMPLATE_LABEL).map(String::as_str)
                        == Some(b.template.as_str()) =>
                {
                    b.log(
                        "info",
                        format!("reusing the image built for {} before", b.template),
                    );
                    Ok(info)
                }
                _ => Err(failure(&Client::api_error(&r))),
            }
        }
        Ok(r) => Err(failure(&Client::api_error(&r))),
        Err(e) => Err(failure(&e)),
    };
    let image = match built {
        Ok(i) => i,
        Err((_, why)) => return fail(b, &why),
    };
    let labels = &image.config.labels;
    if let Some(cmd) = labels.get(START_CMD) {
        // As E2B does: the template is the state its start command reaches.
        let ready = labels.get(READY_CMD);
        b.log(
            "info",
            format!("starting {cmd:?} and waiting for {ready:?}"),
        );
        if let Err((_, why)) = started_state(&b.client, &b.template, cmd, ready) {
            return fail(b, &why);
        }
        b.log("info", "the started state is checkpointed");
    }
    b.log("info", format!("template {} is ready", b.template));
    b.state.lock().unwrap().status = "ready";
}

/// Makes the started state of template `name`: a sandbox of its image, its start command
/// run until its ready check passes, a live checkpoint of it (labelled `STATE_OF`), which
/// sandboxes of the template are then forks of. The state made before, if any, goes.
fn started_state(
    client: &Client,
    name: &str,
    cmd: &str,
    ready: Option<&String>,
) -> Result<(), (u16, String)> {
    let before: Vec<forkd_api::CheckpointInfo> = client
        .call("GET", "/v1/checkpoints", None)
        .map_err(|e| failure(&e))?;
    let create = json!({ "image": name, "setuid": true });
    let sb: forkd_api::SandboxInfo = client
        .call("POST", "/v1/sandboxes", Some(&create))
        .map_err(|e| failure(&e))?;
    let made = crate::sandboxes::start_command(client, &sb.id, cmd, ready).and_then(|()| {
        let path = format!(
            "/v1/sandboxes/{}/checkpoint",
            forkd_api::url::encode(&sb.id)
        );
        let req = json!({ "live": true, "labels": { STATE_OF: name } });
        client
            .call::<forkd_api::CheckpointInfo>("POST", &path, Some(&req))
            .map_err(|e| failure(&e))
    });
    let gone = format!(
        "/v1/sandboxes/{}?force=true",
        forkd_api::url::encode(&sb.id)
    );
    let _ = client.call::<Value>("DELETE", &gone, None);
    made?;
    for old in before
        .iter()
        .filter(|c| c.labels.get(STATE_OF).map(String::as_str) == Some(name))
    {
        let path = format!("/v1/checkpoints/{}", forkd_api::url::encode(&old.id));
        let _ = client.call::<Value>("DELETE", &path, None);
    }
    Ok(())
}

/// The started state of template `name`, if its build made one.
pub fn state_of(
    client: &Client,
    name: &str,
) -> Result<Option<forkd_api::CheckpointInfo>, (u16, String)> {
    let all: Vec<forkd_api::CheckpointInfo> = client
        .call("GET", "/v1/checkpoints", None)
        .map_err(|e| failure(&e))?;
    Ok(all
        .into_iter()
        .filter(|c| c.labels.get(STATE_OF).map(String::as_str) == Some(name))
        .max_by_key(|c| c.created))
}

/// `GET /templates/{id}/builds/{build}/status?logsOffset=`.
pub fn status(
    gw: &Gateway,
    template: &str,
    build_id: &str,
    q: &HashMap<String, String>,
) -> Outcome {
    let (_, b) = build_of(gw, template, Some(build_id))?;
    let offset: usize = q
        .get("logsOffset")
        .and_then(|o| o.parse().ok())
        .unwrap_or(0);
    let st = b.state.lock().unwrap();
    let entries: Vec<Value> = st
        .logs
        .iter()
        .skip(offset)
        .take(100)
        .map(|(t, level, m)| {
            json!({ "timestamp": crate::wire::rfc3339(*t), "level": level, "message": m })
        })
        .collect();
    let mut v = json!({
        "templateID": template,
        "buildID": build_id,
        "status": st.status,
        "logEntries": entries,
        "logs": [],
    });
    if let Some(r) = &st.reason {
        v["reason"] = json!({ "message": r });
    }
    Ok(json(200, &v))
}

/// `GET /templates/aliases/{alias}`: 200 when a forkd image of the name exists.
pub fn alias(client: &Client, alias: &str) -> Outcome {
    let name = image_name(alias)?;
    let path = format!("/v1/images/{}", forkd_api::url::encode(&name));
    match client.call::<Value>("GET", &path, None) {
        Ok(_) => Ok(json(200, &json!({ "templateID": name, "public": false }))),
        Err(e) => Err(failure(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_become_a_dockerfile() {
        let start = json!({
            "fromImage": "debian",
            "steps": [
                {"type": "USER", "args": ["root"]},
                {"type": "WORKDIR", "args": ["/app"]},
                {"type": "COPY", "args": ["greet.py", "/app/greet.py", "", ""], "filesHash": "abc"},
                {"type": "ENV", "args": ["A", "x \"y\"", "B", "2"]},
                {"type": "RUN", "args": ["echo hi > /tmp/x", "user"]},
                {"type": "USER", "args": ["user"]},
            ],
            "startCmd": "sleep infinity",
        });
        let (file, hashes) = dockerfile(&start).unwrap();
        assert_eq!(hashes, ["abc"]);
        assert!(
            file.starts_with("FROM debian\nUSER root\nRUN id -u user"),
            "{file}"
        );
        assert!(
            file.contains("COPY [\"files/abc/greet.py\", \"/app/greet.py\"]\n"),
            "{file}"
        );
        assert!(
            file.contains("ENV A=\"x \\\"y\\\"\"\nENV B=\"2\"\n"),
            "{file}"
        );
        assert!(
            file.contains(
                "USER user\nRUN [\"/bin/sh\", \"-c\", \"echo hi > /tmp/x\"]\nUSER root\n"
            ),
            "{file}"
        );
        assert!(
            file.contains("LABEL e2b.start-cmd=\"sleep infinity\""),
            "{file}"
        );
        let bad = dockerfile(
            &json!({"fromImage": "d", "steps": [{"type": "COPY", "args": ["../x", "/y"], "filesHash": "h"}]}),
        );
        assert!(bad.unwrap_err().contains("inside the context"));
        assert!(dockerfile(&json!({"steps": []})).is_err());
        assert!(image_name("Edit-Greeting__ab12").is_ok());
        assert!(image_name("../x").is_err());
    }
}
