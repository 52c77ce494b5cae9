//! envd's `process.Process` service: commands and PTYs, each a kept command of forkd's
//! API (a streamed exec with `keep`) that this layer stays attached to for as long as
//! the command runs, so a command outlives the SDK connection that started it, as on
//! E2B. A thread per command reads its frames and turns them into envd's events: to the
//! stream that started it (with back-pressure, like a pipe) and to any that connect to
//! it later (`Connect`, which may miss output if it reads too slowly).
//!
//! Before a live checkpoint of the sandbox (a pause, a snapshot, a fork) the layer lets
//! go of its commands ([`Table::detach`]): they run on in the sandbox, holding nothing
//! open to the host, so the checkpoint takes them; afterwards (or in the resumed
//! sandbox) it attaches to them again by pid ([`Table::reattach`]).

use crate::connect::{self, Code, Error};
use crate::rpc::{rpc_error, stream_error, unary_error, Target};
use crate::wire::{field, number};
use crate::{blocking, failure, json, Body, Gateway};
use bytes::Bytes;
use forkd_api::client::Client;
use forkd_api::proto::{self, ExecExit, ExecRequest, ExecStarted, Kind};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

type Answer = hyper::Response<Body>;

/// Events a command's late viewers may fall behind by before they miss some.
const VIEWER_BACKLOG: usize = 4096;
/// Events the starting stream may fall behind by before the command waits for it.
const PRIMARY_BACKLOG: usize = 64;

/// The commands this layer runs, by sandbox and pid.
#[derive(Default)]
pub struct Table {
    procs: Mutex<HashMap<String, HashMap<u32, Arc<Proc>>>>,
}

impl Table {
    fn insert(&self, sandbox: &str, p: Arc<Proc>) {
        self.procs
            .lock()
            .unwrap()
            .entry(sandbox.to_string())
            .or_default()
            .insert(p.pid, p);
    }

    fn remove(&self, sandbox: &str, pid: u32) {
        let mut all = self.procs.lock().unwrap();
        if let Some(m) = all.get_mut(sandbox) {
            m.remove(&pid);
            if m.is_empty() {
                all.remove(sandbox);
            }
        }
    }

    /// Lets go of the sandbox's commands: their streams end (viewers are told the
    /// sandbox is being checkpointed) and the exec connections close; the commands run
    /// on, kept, and stay listed here.
    pub fn detach(&self, sandbox: &str) {
        for p in self.list(sandbox) {
            p.detaching.store(true, Ordering::SeqCst);
            if let Some(c) = p.control.lock().unwrap().take() {
                let _ = c.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// Attaches again to the sandbox's commands (after a checkpoint, or in the sandbox
    /// resumed from one); a command that has ended meanwhile is forgotten.
    pub fn reattach(self: &Arc<Self>, client: &Client, sandbox: &str) {
        for p in self.list(sandbox) {
            match attach_to(client, sandbox, p.pid) {
                Ok(conn) => {
                    let control = match conn.try_clone() {
                        Ok(c) => c,
                        Err(_) => {
                            self.remove(sandbox, p.pid);
                            continue;
                        }
                    };
                    *p.control.lock().unwrap() = Some(control);
                    p.detaching.store(false, Ordering::SeqCst);
                    spawn_pump(self.clone(), sandbox.to_string(), p, conn, None);
                }
                Err(_) => self.remove(sandbox, p.pid),
            }
        }
    }

    fn list(&self, sandbox: &str) -> Vec<Arc<Proc>> {
        let mut v: Vec<_> = self
            .procs
            .lock()
            .unwrap()
            .get(sandbox)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        v.sort_by_key(|p| p.pid);
        v
    }

    /// The command a `ProcessSelector` (`{pid}` or `{tag}`) names.
    fn find(&self, sandbox: &str, selector: Option<&Value>) -> Result<Arc<Proc>, Error> {
        let sel = selector
            .ok_or_else(|| Error::new(Code::InvalidArgument, "the request names no process"))?;
        let all = self.list(sandbox);
        let found = if let Some(pid) = number(sel.get("pid")) {
            all.into_iter().find(|p| u64::from(p.pid) == pid)
        } else if let Some(tag) = sel.get("tag").and_then(Value::as_str) {
            all.into_iter().find(|p| p.tag.as_deref() == Some(tag))
        } else {
            return Err(Error::new(
                Code::InvalidArgument,
                "a process selector has a pid or a tag",
            ));
        };
        found.ok_or_else(|| {
            Error::new(
                Code::NotFound,
                format!("process {sel} not found in sandbox {sandbox}"),
            )
        })
    }
}

/// A command this layer runs.
struct Proc {
    pid: u32,
    tag: Option<String>,
    /// Its `ProcessConfig`, as `List` answers it.
    config: Value,
    tty: bool,
    /// The exec connection's sending half: stdin, signals, terminal sizes. None while
    /// the layer has let go of the command (a checkpoint of its sandbox).
    control: Mutex<Option<UnixStream>>,
    /// Set while the layer lets go of it: its reader ends without forgetting it.
    detaching: AtomicBool,
    /// Its events (envelopes), for viewers that connect after it started.
    events: broadcast::Sender<Bytes>,
}

impl Proc {
    fn send(&self, kind: Kind, payload: &[u8]) -> Result<(), Error> {
        let mut c = self.control.lock().unwrap();
        let Some(c) = c.as_mut() else {
            return Err(Error::new(
                Code::Unavailable,
                format!("process {}: its sandbox is being checkpointed", self.pid),
            ));
        };
        proto::write_frame(c, kind, payload).map_err(|e| {
            Error::new(
                Code::NotFound,
                format!("process {} has ended: {e}", self.pid),
            )
        })
    }
}

/// An exec connection attached to kept command `pid`, past its `Started` frame.
fn attach_to(client: &Client, sandbox: &str, pid: u32) -> Result<UnixStream, Error> {
    let req = ExecRequest {
        attach: Some(pid as i32),
        ..Default::default()
    };
    let mut conn = client.exec_stream(sandbox, &req).map_err(|e| {
        let (status, message) = failure(&e);
        rpc_error(status, message)
    })?;
    match proto::read_frame(&mut conn) {
        Ok(Some((Kind::Started, _))) => Ok(conn),
        _ => Err(Error::new(
            Code::NotFound,
            format!("process {pid} is no longer running"),
        )),
    }
}

/// Starts the thread that reads a command's frames.
fn spawn_pump(
    table: Arc<Table>,
    sandbox: String,
    p: Arc<Proc>,
    conn: UnixStream,
    primary: Option<mpsc::Sender<Bytes>>,
) -> bool {
    let pid = p.pid;
    std::thread::Builder::new()
        .name(format!("e2b-{pid}"))
        .spawn(move || {
            let tty = p.tty;
            let detached = Pump {
                primary,
                proc_: p.clone(),
            }
            .run(conn, tty);
            if !detached {
                table.remove(&sandbox, pid);
            }
        })
        .is_ok()
}

pub async fn serve(
    gw: Arc<Gateway>,
    t: Target,
    basic: Option<String>,
    method: &str,
    req: hyper::Request<hyper::body::Incoming>,
) -> Answer {
    let headers = req.headers().clone();
    let body = match crate::read_body(req.into_body(), connect::MAX_MESSAGE).await {
        Ok(b) => b,
        Err(e) => return unary_error(&Error::new(Code::InvalidArgument, e)),
    };
    match method {
        "Start" | "Connect" => {
            let msg = match connect::request_message(&body).and_then(parse) {
                Ok(m) => m,
                Err(e) => return stream_error(&e),
            };
            let keepalive = headers
                .get("keepalive-ping-interval")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|s| *s > 0)
                .map(Duration::from_secs);
            if method == "Start" {
                let lifetime = headers
                    .get("connect-timeout-ms")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .filter(|ms| *ms > 0);
                start(gw, t, basic, msg, lifetime, keepalive).await
            } else {
                attach(&gw, &t, &msg, keepalive)
            }
        }
        _ => {
            let msg = match parse(if body.is_empty() { b"{}" } else { &body }) {
                Ok(m) => m,
                Err(e) => return unary_error(&e),
            };
            let gw2 = gw.clone();
            let m = method.to_string();
            match blocking(move || unary(&gw2, &t, &m, &msg)).await {
                Ok(Ok(v)) => json(200, &v),
                Ok(Err(e)) => unary_error(&e),
                Err(e) => unary_error(&Error::new(Code::Internal, e)),
            }
        }
    }
}

fn parse(b: &[u8]) -> Result<Value, Error> {
    serde_json::from_slice(b).map_err(|e| {
        Error::new(
            Code::InvalidArgument,
            format!("the message is not JSON: {e}"),
        )
    })
}

/// The unary calls: `List`, `SendInput`, `SendSignal`, `CloseStdin`, `Update`.
fn unary(gw: &Gateway, t: &Target, method: &str, msg: &Value) -> Result<Value, Error> {
    let table = &gw.processes;
    let selector = field(msg, "process", "process");
    match method {
        "List" => {
            let processes: Vec<Value> = table
                .list(&t.id)
                .iter()
                .map(|p| {
                    let mut v = json!({ "config": p.config, "pid": p.pid });
                    if let Some(tag) = &p.tag {
                        v["tag"] = json!(tag);
                    }
                    v
                })
                .collect();
            Ok(json!({ "processes": processes }))
        }
        "SendInput" => {
            let p = table.find(&t.id, selector)?;
            let input = field(msg, "input", "input").cloned().unwrap_or_default();
            let data = input
                .get("stdin")
                .or_else(|| input.get("pty"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let bytes = forkd_api::b64::decode(data)
                .map_err(|e| Error::new(Code::InvalidArgument, format!("input: {e}")))?;
            p.send(Kind::Stdin, &bytes)?;
            Ok(json!({}))
        }
        "SendSignal" => {
            let p = table.find(&t.id, selector)?;
            let signal = match field(msg, "signal", "signal") {
                Some(Value::String(s)) if s == "SIGNAL_SIGKILL" => 9u8,
                Some(Value::String(s)) if s == "SIGNAL_SIGTERM" => 15,
                Some(Value::Number(n)) if n.as_u64() == Some(9) || n.as_u64() == Some(15) => {
                    n.as_u64().unwrap_or(9) as u8
                }
                other => {
                    return Err(Error::new(
                        Code::InvalidArgument,
                        format!("signal {other:?}: SIGNAL_SIGKILL or SIGNAL_SIGTERM"),
                    ))
                }
            };
            p.send(Kind::Signal, &[signal])?;
            Ok(json!({}))
        }
        "CloseStdin" => {
            let p = table.find(&t.id, selector)?;
            p.send(Kind::StdinEof, &[])?;
            Ok(json!({}))
        }
        "Update" => {
            let p = table.find(&t.id, selector)?;
            if let Some((cols, rows)) = pty_size(field(msg, "pty", "pty")) {
                p.send(Kind::Resize, &resize(cols, rows))?;
            }
            Ok(json!({}))
        }
        "StreamInput" => Err(Error::new(
            Code::Unimplemented,
            "StreamInput (a client stream) is not served: send input with SendInput",
        )),
        other => Err(Error::new(
            Code::Unimplemented,
            format!("process.Process has no method {other}"),
        )),
    }
}

/// A PTY's `{size: {cols, rows}}`.
fn pty_size(pty: Option<&Value>) -> Option<(u16, u16)> {
    let size = pty?.get("size")?;
    let cols = number(size.get("cols"))?.min(u64::from(u16::MAX)) as u16;
    let rows = number(size.get("rows"))?.min(u64::from(u16::MAX)) as u16;
    Some((cols, rows))
}

fn resize(cols: u16, rows: u16) -> [u8; 4] {
    let (r, c) = (rows.to_be_bytes(), cols.to_be_bytes());
    [r[0], r[1], c[0], c[1]]
}

/// What a `StartRequest` asks for: the exec, its `ProcessConfig` (for `List`), and its
/// terminal's size.
type Launch = (ExecRequest, Value, Option<(u16, u16)>);

/// The exec a `StartRequest` asks for.
fn exec_request(
    t: &Target,
    basic: Option<&str>,
    msg: &Value,
    lifetime: Option<u64>,
) -> Result<Launch, Error> {
    let bad = |m: String| Error::new(Code::InvalidArgument, m);
    let cfg = field(msg, "process", "process")
        .cloned()
        .ok_or_else(|| bad("StartRequest.process is required".into()))?;
    let cmd = cfg
        .get("cmd")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| bad("process.cmd is required".into()))?;
    let mut argv = vec![cmd.to_string()];
    for a in cfg
        .get("args")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        argv.push(
            a.as_str()
                .ok_or_else(|| bad("process.args are strings".into()))?
                .into(),
        );
    }
    let user = t.user(basic).to_string();
    let mut env: Vec<String> = t
        .facts
        .envs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if let Some(envs) = cfg.get("envs").and_then(Value::as_object) {
        for (k, v) in envs {
            let v = v
                .as_str()
                .ok_or_else(|| bad(format!("envs.{k} is a string")))?;
            env.push(format!("{k}={v}"));
        }
    }
    let cwd = match cfg
        .get("cwd")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
    {
        Some(c) => t.path(&user, c),
        None => t.path(&user, "."),
    };
    let pty = field(msg, "pty", "pty");
    let size = pty_size(pty);
    let tty = pty.is_some();
    let stdin = tty
        || field(msg, "stdin", "stdin")
            .and_then(Value::as_bool)
            .unwrap_or(true);
    let req = ExecRequest {
        argv,
        env,
        cwd: Some(cwd),
        user: Some(user),
        timeout_ms: lifetime,
        tty,
        stdin,
        // It outlives this layer's connection to it (see `Table::detach`).
        keep: true,
        ..Default::default()
    };
    req.validate().map_err(bad)?;
    Ok((req, cfg, size))
}

/// `Start`: runs the command and streams its events, first `start {pid}`.
async fn start(
    gw: Arc<Gateway>,
    t: Target,
    basic: Option<String>,
    msg: Value,
    lifetime: Option<u64>,
    keepalive: Option<Duration>,
) -> Answer {
    let (req, config, size) = match exec_request(&t, basic.as_deref(), &msg, lifetime) {
        Ok(x) => x,
        Err(e) => return stream_error(&e),
    };
    let tag = field(&msg, "tag", "tag")
        .and_then(Value::as_str)
        .map(str::to_string);
    let launched = blocking(move || launch(&gw, &t, &req, config, tag, size)).await;
    match launched {
        Ok(Ok((pid, rx))) => stream(Some(start_event(pid)), Source::Primary(rx), keepalive),
        Ok(Err(e)) => stream_error(&e),
        Err(e) => stream_error(&Error::new(Code::Internal, e)),
    }
}

/// Starts the exec, waits for the command to run, and leaves a thread reading it.
fn launch(
    gw: &Arc<Gateway>,
    t: &Target,
    req: &ExecRequest,
    config: Value,
    tag: Option<String>,
    size: Option<(u16, u16)>,
) -> Result<(u32, mpsc::Receiver<Bytes>), Error> {
    let mut conn = t.client.exec_stream(&t.id, req).map_err(|e| {
        let (status, message) = failure(&e);
        rpc_error(status, message)
    })?;
    let pid = loop {
        match proto::read_frame(&mut conn) {
            Ok(Some((Kind::Started, body))) => {
                let s: ExecStarted = serde_json::from_slice(&body)
                    .map_err(|e| Error::new(Code::Internal, format!("the Started frame: {e}")))?;
                break s.pid as u32;
            }
            Ok(Some((Kind::Error, body))) => {
                let message = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v["message"].as_str().map(str::to_string))
                    .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
                let code = if message.contains("not found") {
                    Code::NotFound
                } else {
                    Code::InvalidArgument
                };
                return Err(Error::new(code, message));
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                return Err(Error::new(
                    Code::Unavailable,
                    format!("sandbox {}: the command's stream ended before it ran", t.id),
                ))
            }
        }
    };
    let control = conn
        .try_clone()
        .map_err(|e| Error::new(Code::Internal, format!("exec connection: {e}")))?;
    let (events, _) = broadcast::channel(VIEWER_BACKLOG);
    let p = Arc::new(Proc {
        pid,
        tag,
        config,
        tty: req.tty,
        control: Mutex::new(Some(control)),
        detaching: AtomicBool::new(false),
        events,
    });
    if let Some((cols, rows)) = size {
        let _ = p.send(Kind::Resize, &resize(cols, rows));
    }
    gw.processes.insert(&t.id, p.clone());
    let (tx, rx) = mpsc::channel(PRIMARY_BACKLOG);
    if !spawn_pump(gw.processes.clone(), t.id.clone(), p, conn, Some(tx)) {
        gw.processes.remove(&t.id, pid);
        return Err(Error::new(
            Code::ResourceExhausted,
            "no thread for the command's reader",
        ));
    }
    Ok((pid, rx))
}

/// A command's reader: frames in, envelopes out.
struct Pump {
    primary: Option<mpsc::Sender<Bytes>>,
    proc_: Arc<Proc>,
}

impl Pump {
    fn emit(&mut self, envelope: Vec<u8>) {
        let b = Bytes::from(envelope);
        if let Some(p) = &self.primary {
            // The starting stream has gone: the command runs on, for later viewers.
            if p.blocking_send(b.clone()).is_err() {
                self.primary = None;
            }
        }
        let _ = self.proc_.events.send(b);
    }

    /// Reads the command's frames to its end; true when it ended because the layer
    /// let go of the command (which runs on).
    fn run(mut self, mut conn: UnixStream, tty: bool) -> bool {
        loop {
            match proto::read_frame(&mut conn) {
                Ok(Some((Kind::Stdout, d))) => {
                    self.emit(data_event(if tty { "pty" } else { "stdout" }, &d))
                }
                Ok(Some((Kind::Stderr, d))) => self.emit(data_event("stderr", &d)),
                Ok(Some((Kind::Exit, body))) => {
                    match serde_json::from_slice::<ExecExit>(&body) {
                        Ok(exit) => {
                            self.emit(end_event(&exit));
                            let late = exit.timed_out.then(|| {
                                Error::new(
                                    Code::DeadlineExceeded,
                                    "the command ran past its timeout and was killed",
                                )
                            });
                            self.emit(connect::end_of_stream(late.as_ref()));
                        }
                        Err(e) => self.emit(connect::end_of_stream(Some(&Error::new(
                            Code::Internal,
                            format!("the Exit frame: {e}"),
                        )))),
                    }
                    return false;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    let detached = self.proc_.detaching.load(Ordering::SeqCst);
                    let why = if detached {
                        "the sandbox was paused or checkpointed: the command runs on; connect to it again"
                    } else {
                        "the command's stream ended without its exit (the sandbox was stopped?)"
                    };
                    self.emit(connect::end_of_stream(Some(&Error::new(
                        Code::Unavailable,
                        why,
                    ))));
                    return detached;
                }
            }
        }
    }
}

fn envelope(v: &Value) -> Vec<u8> {
    connect::envelope(0, v.to_string().as_bytes())
}

fn start_event(pid: u32) -> Bytes {
    Bytes::from(envelope(&json!({ "event": { "start": { "pid": pid } } })))
}

fn data_event(stream: &str, data: &[u8]) -> Vec<u8> {
    envelope(&json!({ "event": { "data": { stream: forkd_api::b64::encode(data) } } }))
}

fn keepalive_event() -> Bytes {
    Bytes::from(envelope(&json!({ "event": { "keepalive": {} } })))
}

/// `end {exitCode, exited, status}` as Go's envd reports a process state: killed by a
/// signal, exit code -1 and not `exited`.
fn end_event(exit: &ExecExit) -> Vec<u8> {
    let mut end = serde_json::Map::new();
    match exit.signal {
        Some(sig) => {
            end.insert("exitCode".into(), json!(-1));
            end.insert(
                "status".into(),
                json!(format!("signal: {}", signal_name(sig))),
            );
        }
        None => {
            if exit.exit_code != 0 {
                end.insert("exitCode".into(), json!(exit.exit_code));
            }
            end.insert("exited".into(), json!(true));
            end.insert(
                "status".into(),
                json!(format!("exit status {}", exit.exit_code)),
            );
        }
    }
    envelope(&json!({ "event": { "end": end } }))
}

/// A signal as Go's `syscall.Signal.String()` names it.
fn signal_name(sig: i32) -> String {
    match sig {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        3 => "quit".into(),
        6 => "aborted".into(),
        9 => "killed".into(),
        13 => "broken pipe".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

/// `Connect`: a stream of a running command's events from now on, first `start`.
fn attach(gw: &Gateway, t: &Target, msg: &Value, keepalive: Option<Duration>) -> Answer {
    match gw.processes.find(&t.id, field(msg, "process", "process")) {
        Ok(p) => stream(
            Some(start_event(p.pid)),
            Source::Viewer(p.events.subscribe()),
            keepalive,
        ),
        Err(e) => stream_error(&e),
    }
}

/// Where a stream's envelopes come from.
enum Source {
    Primary(mpsc::Receiver<Bytes>),
    Viewer(broadcast::Receiver<Bytes>),
}

impl Source {
    async fn recv(&mut self) -> Option<Bytes> {
        match self {
            Source::Primary(rx) => rx.recv().await,
            Source::Viewer(rx) => loop {
                match rx.recv().await {
                    Ok(b) => return Some(b),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            },
        }
    }
}

/// A server stream's answer: `first`, then `source`'s envelopes to the end of the
/// stream, with `keepalive` events in any silence that long.
fn stream(first: Option<Bytes>, mut source: Source, keepalive: Option<Duration>) -> Answer {
    use http_body_util::BodyExt;
    let (mut tx, body) = http_body_util::channel::Channel::<Bytes>::new(8);
    tokio::spawn(async move {
        if let Some(f) = first {
            if tx.send_data(f).await.is_err() {
                return;
            }
        }
        loop {
            let next = match keepalive {
                Some(k) => match tokio::time::timeout(k, source.recv()).await {
                    Ok(n) => n,
                    Err(_) => Some(keepalive_event()),
                },
                None => source.recv().await,
            };
            let Some(b) = next else {
                let _ = tx
                    .send_data(Bytes::from(connect::end_of_stream(Some(&Error::new(
                        Code::Internal,
                        "the command's events ended without its end",
                    )))))
                    .await;
                return;
            };
            let end = b.first() == Some(&connect::END_STREAM);
            if tx.send_data(b).await.is_err() || end {
                return;
            }
        }
    });
    let mut r = hyper::Response::new(body.boxed());
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(connect::STREAM_CONTENT_TYPE),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(envelope: &[u8]) -> Value {
        serde_json::from_slice(&envelope[connect::HEADER..]).unwrap()
    }

    #[test]
    fn ends_read_as_go_reports_them() {
        let e = |exit_code, signal| ExecExit {
            exit_code,
            signal,
            timed_out: false,
            duration_us: 1,
        };
        assert_eq!(
            message(&end_event(&e(0, None))),
            json!({"event": {"end": {"exited": true, "status": "exit status 0"}}})
        );
        assert_eq!(
            message(&end_event(&e(3, None)))["event"]["end"]["exitCode"],
            3
        );
        assert_eq!(
            message(&end_event(&e(137, Some(9)))),
            json!({"event": {"end": {"exitCode": -1, "status": "signal: killed"}}})
        );
        assert_eq!(
            message(&data_event("stdout", b"hi")),
            json!({"event": {"data": {"stdout": "aGk="}}})
        );
        assert_eq!(resize(80, 24), [0, 24, 0, 80]);
        assert_eq!(
            pty_size(Some(&json!({"size": {"cols": 80, "rows": 24}}))),
            Some((80, 24))
        );
    }
}
