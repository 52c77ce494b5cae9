//! envd's `filesystem.Filesystem` service: `Stat`, `MakeDir`, `Move`, `ListDir` and
//! `Remove` as forkd's file operations (`POST /v1/sandboxes/{id}/fs`), carried out as
//! the request's user; watching (`WatchDir` and the polled watcher calls) with forkd's
//! watch tool ([`Watchers`]).

use crate::connect::{self, Code, Error};
use crate::rpc::{rpc_error, stream_error, unary_error, Target};
use crate::wire::{entry_info, field, number};
use crate::{blocking, failure, json, Body, Gateway};
use bytes::Bytes;
use forkd_api::proto::{self, ExecExit, ExecRequest, Kind, Tool};
use forkd_api::{FsAnswer, FsOp, FsRequest};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

type Answer = hyper::Response<Body>;

pub async fn serve(
    gw: Arc<Gateway>,
    t: Target,
    basic: Option<String>,
    method: &str,
    req: hyper::Request<hyper::body::Incoming>,
) -> Answer {
    let body = match crate::read_body(req.into_body(), connect::MAX_MESSAGE).await {
        Ok(b) => b,
        Err(e) => return unary_error(&Error::new(Code::InvalidArgument, e)),
    };
    if method == "WatchDir" {
        return watch_dir(t, basic, body).await;
    }
    let msg: Value = match serde_json::from_slice(if body.is_empty() { b"{}" } else { &body }) {
        Ok(m) => m,
        Err(e) => {
            return unary_error(&Error::new(
                Code::InvalidArgument,
                format!("the message is not JSON: {e}"),
            ))
        }
    };
    let method = method.to_string();
    match blocking(move || call(&gw, &t, basic.as_deref(), &method, &msg)).await {
        Ok(Ok(v)) => json(200, &v),
        Ok(Err(e)) => unary_error(&e),
        Err(e) => unary_error(&Error::new(Code::Internal, e)),
    }
}

fn call(
    gw: &Gateway,
    t: &Target,
    basic: Option<&str>,
    method: &str,
    msg: &Value,
) -> Result<Value, Error> {
    let user = t.user(basic).to_string();
    let path = |camel: &str| -> Result<String, Error> {
        let p = field(msg, camel, camel)
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| Error::new(Code::InvalidArgument, format!("{camel} is required")))?;
        Ok(t.path(&user, p))
    };
    let one = |a: FsAnswer| -> Result<Value, Error> {
        let entry = a.entries.first().and_then(entry_info).unwrap_or(json!({}));
        Ok(json!({ "entry": entry }))
    };
    match method {
        "Stat" => one(op(
            t,
            FsOp::Stat {
                path: path("path")?,
            },
        )?),
        "MakeDir" => {
            let p = path("path")?;
            let made = FsOp::MakeDir {
                path: p.clone(),
                owner: Some(user.clone()),
            };
            let a = op(t, made)?;
            if a.created == Some(false) {
                return Err(Error::new(
                    Code::AlreadyExists,
                    format!("directory {p} already exists"),
                ));
            }
            one(a)
        }
        "Move" => one(op(
            t,
            FsOp::Move {
                from: path("source")?,
                to: path("destination")?,
            },
        )?),
        "ListDir" => {
            let depth = number(field(msg, "depth", "depth"))
                .unwrap_or(1)
                .clamp(1, 64) as u32;
            let a = op(
                t,
                FsOp::List {
                    path: path("path")?,
                    depth,
                },
            )?;
            let entries: Vec<Value> = a.entries.iter().filter_map(entry_info).collect();
            Ok(json!({ "entries": entries }))
        }
        "Remove" => {
            op(
                t,
                FsOp::Remove {
                    path: path("path")?,
                },
            )?;
            Ok(json!({}))
        }
        "CreateWatcher" => create_watcher(gw, t, &user, msg),
        "GetWatcherEvents" => {
            let (_, w) = watcher(gw, t, msg)?;
            let events: Vec<Value> = w.events.lock().unwrap().drain(..).collect();
            Ok(json!({ "events": events }))
        }
        "RemoveWatcher" => {
            let (id, w) = watcher(gw, t, msg)?;
            w.stop();
            gw.watchers.all.lock().unwrap().remove(&id);
            Ok(json!({}))
        }
        other => Err(Error::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem has no method {other}"),
        )),
    }
}

/// A file operation, as root (E2B's envd runs as root: what it makes for a user, it gives
/// to the user, as `MakeDir` does here).
fn op(t: &Target, op: FsOp) -> Result<FsAnswer, Error> {
    let body = FsRequest { op, user: None };
    let path = format!("/v1/sandboxes/{}/fs", forkd_api::url::encode(&t.id));
    t.client.send("POST", &path, &body).map_err(|e| {
        let (status, message) = failure(&e);
        rpc_error(status, message)
    })
}

/// Directory watchers: forkd's watch tool run in the sandbox as the request's user
/// (inotify, so any image), one exec each, its changes kept for the polled watcher
/// calls (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`) or streamed
/// (`WatchDir`). A watcher ends with its directory, its removal, or a checkpoint of its
/// sandbox (as E2B's do when a sandbox is paused).
#[derive(Default)]
pub struct Watchers {
    all: Mutex<HashMap<String, Arc<Watcher>>>,
}

/// Changes a polled watcher keeps at most between two calls (the oldest go first).
const KEPT_EVENTS: usize = 10_000;
/// Watchers kept at most, all sandboxes together.
const MAX_WATCHERS: usize = 4096;

struct Watcher {
    sandbox: String,
    /// The exec's connection: shut down to end the tool.
    control: Mutex<Option<UnixStream>>,
    events: Mutex<VecDeque<Value>>,
}

impl Watchers {
    /// Ends every watcher of `sandbox` (before a checkpoint of it).
    pub fn stop_sandbox(&self, sandbox: &str) {
        let mut all = self.all.lock().unwrap();
        all.retain(|_, w| {
            if w.sandbox == sandbox {
                w.stop();
                false
            } else {
                true
            }
        });
    }
}

impl Watcher {
    fn stop(&self) {
        if let Some(c) = self.control.lock().unwrap().take() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// envd's event type of the watch tool's.
fn event_type(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "create" => "EVENT_TYPE_CREATE",
        "write" => "EVENT_TYPE_WRITE",
        "remove" => "EVENT_TYPE_REMOVE",
        "rename" => "EVENT_TYPE_RENAME",
        "chmod" => "EVENT_TYPE_CHMOD",
        _ => return None,
    })
}

/// Starts the watch tool on `path` and waits until it watches; the exec's stream, for
/// [`read_changes`].
fn start_watch(t: &Target, user: &str, path: &str, recursive: bool) -> Result<UnixStream, Error> {
    let req = ExecRequest {
        tool: Some(Tool::Watch {
            path: path.to_string(),
            recursive,
        }),
        user: Some(user.to_string()),
        ..Default::default()
    };
    let mut conn = t.client.exec_stream(&t.id, &req).map_err(|e| {
        let (status, message) = failure(&e);
        rpc_error(status, message)
    })?;
    let mut line = Vec::new();
    let mut err = Vec::new();
    loop {
        match proto::read_frame(&mut conn) {
            Ok(Some((Kind::Stdout, d))) => {
                line.extend_from_slice(&d);
                if line.contains(&b'\n') {
                    return Ok(conn);
                }
            }
            Ok(Some((Kind::Stderr, d))) => err.extend_from_slice(&d),
            Ok(Some((Kind::Exit, body))) => {
                let exit: ExecExit = serde_json::from_slice(&body).map_err(|e| {
                    Error::new(Code::Internal, format!("the watch tool's exit: {e}"))
                })?;
                let message = String::from_utf8_lossy(&err).trim().to_string();
                let code = match exit.exit_code {
                    2 => Code::NotFound,
                    _ if message.contains("ermission denied") => Code::PermissionDenied,
                    _ => Code::InvalidArgument,
                };
                return Err(Error::new(code, message));
            }
            Ok(Some((Kind::Error, body))) => {
                return Err(Error::new(
                    Code::Internal,
                    String::from_utf8_lossy(&body).into_owned(),
                ))
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                return Err(Error::new(
                    Code::Unavailable,
                    format!("sandbox {}: the watch ended before it began", t.id),
                ))
            }
        }
    }
}

/// Reads the tool's changes until it ends, handing each (as envd's `FilesystemEvent`)
/// to `each`, which says whether to go on.
fn read_changes(mut conn: UnixStream, mut each: impl FnMut(Value) -> bool) {
    let mut pending = Vec::new();
    while let Ok(Some((kind, d))) = proto::read_frame(&mut conn) {
        if kind != Kind::Stdout {
            if kind == Kind::Exit || kind == Kind::Error {
                return;
            }
            continue;
        }
        pending.extend_from_slice(&d);
        while let Some(at) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=at).collect();
            let Ok(v) = serde_json::from_slice::<Value>(&line) else {
                continue;
            };
            let (Some(name), Some(kind)) =
                (v["name"].as_str(), v["type"].as_str().and_then(event_type))
            else {
                continue;
            };
            if !each(json!({ "name": name, "type": kind })) {
                return;
            }
        }
    }
}

fn watch_args(msg: &Value) -> bool {
    field(msg, "recursive", "recursive")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// `CreateWatcher {path, recursive}`: a polled watcher's id.
fn create_watcher(gw: &Gateway, t: &Target, user: &str, msg: &Value) -> Result<Value, Error> {
    let path = field(msg, "path", "path")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| Error::new(Code::InvalidArgument, "path is required"))?;
    let path = t.path(user, path);
    if gw.watchers.all.lock().unwrap().len() >= MAX_WATCHERS {
        return Err(Error::new(
            Code::ResourceExhausted,
            format!("{MAX_WATCHERS} watchers are open: remove some"),
        ));
    }
    let conn = start_watch(t, "root", &path, watch_args(msg))?;
    let control = conn
        .try_clone()
        .map_err(|e| Error::new(Code::Internal, format!("watch connection: {e}")))?;
    let w = Arc::new(Watcher {
        sandbox: t.id.clone(),
        control: Mutex::new(Some(control)),
        events: Mutex::default(),
    });
    let id = crate::random_hex(8);
    gw.watchers
        .all
        .lock()
        .unwrap()
        .insert(id.clone(), w.clone());
    let spawned = std::thread::Builder::new()
        .name("e2b-watch".into())
        .spawn(move || {
            read_changes(conn, |e| {
                let mut q = w.events.lock().unwrap();
                if q.len() >= KEPT_EVENTS {
                    q.pop_front();
                }
                q.push_back(e);
                true
            })
        });
    if spawned.is_err() {
        if let Some(w) = gw.watchers.all.lock().unwrap().remove(&id) {
            w.stop();
        }
        return Err(Error::new(
            Code::ResourceExhausted,
            "no thread for the watcher",
        ));
    }
    Ok(json!({ "watcherId": id }))
}

fn watcher(gw: &Gateway, t: &Target, msg: &Value) -> Result<(String, Arc<Watcher>), Error> {
    let id = field(msg, "watcherId", "watcher_id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let w = gw.watchers.all.lock().unwrap().get(&id).cloned();
    match w {
        Some(w) if w.sandbox == t.id => Ok((id, w)),
        _ => Err(Error::new(
            Code::NotFound,
            format!("watcher {id:?} not found in sandbox {}", t.id),
        )),
    }
}

/// `WatchDir {path, recursive}`: the changes as a stream of `WatchDirResponse`s (the
/// event at the top, no wrapper), first `start`.
pub async fn watch_dir(t: Target, basic: Option<String>, body: Vec<u8>) -> Answer {
    use http_body_util::BodyExt;
    let msg = match connect::request_message(&body).and_then(|m| {
        serde_json::from_slice::<Value>(m).map_err(|e| {
            Error::new(
                Code::InvalidArgument,
                format!("the message is not JSON: {e}"),
            )
        })
    }) {
        Ok(m) => m,
        Err(e) => return stream_error(&e),
    };
    let user = t.user(basic.as_deref()).to_string();
    let Some(path) = field(&msg, "path", "path")
        .and_then(Value::as_str)
        .map(|p| t.path(&user, p))
    else {
        return stream_error(&Error::new(Code::InvalidArgument, "path is required"));
    };
    let recursive = watch_args(&msg);
    let started = blocking(move || start_watch(&t, "root", &path, recursive)).await;
    let conn = match started {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return stream_error(&e),
        Err(e) => return stream_error(&Error::new(Code::Internal, e)),
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    let control = conn.try_clone().ok();
    let _ = std::thread::Builder::new()
        .name("e2b-watch".into())
        .spawn(move || {
            read_changes(conn, |e| {
                let env = connect::envelope(0, json!({ "filesystem": e }).to_string().as_bytes());
                tx.blocking_send(Bytes::from(env)).is_ok()
            })
        });
    let (mut out, body) = http_body_util::channel::Channel::<Bytes>::new(8);
    tokio::spawn(async move {
        let start = connect::envelope(0, br#"{"start":{}}"#);
        if out.send_data(Bytes::from(start)).await.is_ok() {
            loop {
                let next = tokio::time::timeout(KEEPALIVE, rx.recv()).await;
                let b = match next {
                    Ok(Some(b)) => b,
                    Ok(None) => {
                        let _ = out
                            .send_data(Bytes::from(connect::end_of_stream(None)))
                            .await;
                        break;
                    }
                    Err(_) => Bytes::from(connect::envelope(0, br#"{"keepalive":{}}"#)),
                };
                if out.send_data(b).await.is_err() {
                    break;
                }
            }
        }
        // The client went (or the watch ended): the tool goes with the exec.
        if let Some(c) = control {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    });
    let mut r = hyper::Response::new(body.boxed());
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(connect::STREAM_CONTENT_TYPE),
    );
    r
}

/// How often a quiet watch stream says it is alive.
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(30);
