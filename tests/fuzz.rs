//! Fuzzing, bounded in time (`FORKD_FUZZ_SECS`, default 15 per target; the seed is
//! printed and `FORKD_FUZZ_SEED` repeats a run):
//! - the HTTP API, driven by `docs/openapi.json`: every operation with request bodies
//!   and parameters generated from its schemas (valid, out of range, of the wrong type,
//!   hostile ids), against a daemon on a temporary root. Every answer must be a status
//!   the operation documents, no handler may panic, and the daemon must answer
//!   throughout;
//! - the same daemon with raw request bytes mutated from valid requests;
//! - the exec frame decoder and the task-file loader with mutated input: errors, never
//!   a panic.
//! A case that failed once becomes a regression test in the module it concerns.

#![forbid(unsafe_code)]

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// xorshift64*: small, seedable, good enough to pick cases.
struct Rng(u64);

impl Rng {
    fn new(target: &str) -> Rng {
        let seed = std::env::var("FORKD_FUZZ_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        println!("fuzz {target}: seed {seed} (FORKD_FUZZ_SEED={seed} repeats it)");
        Rng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

fn budget() -> Duration {
    Duration::from_secs(
        std::env::var("FORKD_FUZZ_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(15),
    )
}

/// Values for strings: names that exist, paths only below the fuzz directory (an
/// import or export never reaches the rest of the host), and hostile text.
fn strings(scratch: &str) -> Vec<String> {
    vec![
        String::new(),
        "busybox".into(),
        "fuzz".into(),
        "..".into(),
        "../../etc/passwd".into(),
        format!("{scratch}/nothing-here"),
        format!("{scratch}/junk"),
        format!("{scratch}/out.tar"),
        "x".repeat(300),
        "é\u{1F980}".into(),
        "a\u{0}b".into(),
        "-1".into(),
        "echo hi".into(),
        "KEY=VALUE".into(),
        format!("{scratch}/../fuzz/nothing"),
    ]
}

const INTS: [i64; 8] = [0, 1, 2, -1, 3, 65_536, i64::MAX, 1 << 40];

struct Gen<'a> {
    doc: &'a Value,
    rng: Rng,
    strings: Vec<String>,
}

impl Gen<'_> {
    fn resolve(&self, v: &Value) -> Value {
        match v.get("$ref").and_then(Value::as_str) {
            Some(r) => {
                let mut cur = self.doc;
                for part in r.trim_start_matches("#/").split('/') {
                    cur = &cur[part];
                }
                cur.clone()
            }
            None => v.clone(),
        }
    }

    /// A value for `schema`: usually of its type and within its enum, sometimes not.
    fn value(&mut self, schema: &Value, depth: usize) -> Value {
        let schema = self.resolve(schema);
        if self.rng.chance(12) {
            // The wrong type altogether.
            return self
                .rng
                .pick(&[
                    json!(null),
                    json!(7),
                    json!("s"),
                    json!([]),
                    json!({}),
                    json!(true),
                ])
                .clone();
        }
        if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
            return all
                .first()
                .map(|s| self.value(s, depth))
                .unwrap_or(Value::Null);
        }
        if let Some(one) = schema
            .get("oneOf")
            .or_else(|| schema.get("anyOf"))
            .and_then(Value::as_array)
        {
            let s = self.rng.pick(one).clone();
            return self.value(&s, depth);
        }
        if let Some(e) = schema.get("enum").and_then(Value::as_array) {
            return self.rng.pick(e).clone();
        }
        match schema.get("type").and_then(Value::as_str) {
            Some("string") => json!(self.rng.pick(&self.strings).clone()),
            Some("integer") => json!(*self.rng.pick(&INTS)),
            Some("number") => json!(*self.rng.pick(&[0.0, -1.5, 1e300])),
            Some("boolean") => json!(self.rng.chance(2)),
            Some("array") if depth < 3 => {
                let items = schema.get("items").cloned().unwrap_or(json!({}));
                let n = self.rng.below(3);
                Value::Array((0..n).map(|_| self.value(&items, depth + 1)).collect())
            }
            Some("object") | None if depth < 3 => {
                let mut out = serde_json::Map::new();
                let required: Vec<String> = schema
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| {
                        r.iter()
                            .filter_map(|s| s.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                    for (k, s) in props {
                        if required.contains(k) || self.rng.chance(2) {
                            out.insert(k.clone(), self.value(s, depth + 1));
                        }
                    }
                }
                if self.rng.chance(10) {
                    out.insert("not_a_field".into(), json!(1));
                }
                Value::Object(out)
            }
            _ => Value::Null,
        }
    }
}

/// One request, raw, on the daemon's socket; the status and body, or None when the
/// daemon closed without answering.
fn send(socket: &std::path::Path, request: &[u8]) -> Option<(u16, String)> {
    let s = std::os::unix::net::UnixStream::connect(socket).expect("daemon answers");
    exchange(s, |s| s.shutdown(std::net::Shutdown::Write), request)
}

/// The same on a TCP listener.
fn send_tcp(addr: &str, request: &[u8]) -> Option<(u16, String)> {
    let s = std::net::TcpStream::connect(addr).expect("daemon answers");
    exchange(s, |s| s.shutdown(std::net::Shutdown::Write), request)
}

/// Writes `request`, shuts the sending half, and reads what comes back to the end.
fn exchange<S: Read + Write>(
    mut s: S,
    shut: impl FnOnce(&S) -> std::io::Result<()>,
    request: &[u8],
) -> Option<(u16, String)> {
    let _ = s.write_all(request);
    let _ = shut(&s);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

fn encode_segment(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
fn the_api_answers_every_generated_request_as_documented() {
    let name = "the_api_answers_every_generated_request_as_documented";
    if !can_run(name) {
        return;
    }
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string("docs/openapi.json").unwrap()).unwrap();
    let d = TestDaemon::start("fuzz-api");
    let scratch = d.root.parent().unwrap().join("fuzz");
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::write(scratch.join("junk"), b"not an archive").unwrap();
    let scratch_s = scratch.display().to_string();
    // Real ids among the hostile ones, so that operations reach their handlers' depths.
    let sb = d.busybox();
    let ck = d.checkpoint(&sb.id, false);
    let ids = vec![
        sb.id.clone(),
        sb.id[..6].to_string(),
        ck.id.clone(),
        "..".to_string(),
        "0000".to_string(),
        "busybox".to_string(),
        "x".repeat(200),
        "%".to_string(),
    ];
    let mut ops = Vec::new();
    for (path, methods) in doc["paths"].as_object().unwrap() {
        for (method, op) in methods.as_object().unwrap() {
            if op.get("operationId").is_some() {
                ops.push((path.clone(), method.to_uppercase(), op.clone()));
            }
        }
    }
    let mut g = Gen {
        doc: &doc,
        rng: Rng::new("api"),
        strings: strings(&scratch_s),
    };
    let (start, mut cases, mut problems) = (Instant::now(), 0usize, Vec::new());
    let mut seen_statuses =
        std::collections::BTreeMap::<String, std::collections::BTreeSet<u16>>::new();
    while start.elapsed() < budget() {
        let (path, method, op) = g.rng.pick(&ops).clone();
        let id = op["operationId"].as_str().unwrap().to_string();
        // Builds read Dockerfiles and run them: generated ones only ever fail early,
        // but a valid-looking one could pull in the network; they have tests of their own.
        if id == "buildImage" && !g.rng.chance(4) {
            continue;
        }
        let mut url = path.clone();
        for p in ["{id}", "{name}"] {
            let v = if p == "{name}" && g.rng.chance(2) {
                "busybox".to_string()
            } else {
                g.rng.pick(&ids).clone()
            };
            url = url.replace(p, &encode_segment(&v));
        }
        let mut query = Vec::new();
        for q in ["force", "stats", "path", "name"] {
            if g.rng.chance(3) {
                let v = g
                    .rng
                    .pick(&["true", "false", "yes", "/", "/etc", "main", "../x", ""]);
                query.push(format!("{q}={}", encode_segment(v)));
            }
        }
        if !query.is_empty() {
            url = format!("{url}?{}", query.join("&"));
        }
        let body: Vec<u8> = match op["requestBody"]["content"].as_object() {
            Some(c) if c.contains_key("application/json") => {
                let schema = c["application/json"]["schema"].clone();
                let v = g.value(&schema, 0);
                if g.rng.chance(15) {
                    b"{not json".to_vec()
                } else {
                    serde_json::to_vec(&v).unwrap()
                }
            }
            Some(_) => {
                // A tar: empty, junk, or a tiny real one.
                match g.rng.below(3) {
                    0 => Vec::new(),
                    1 => b"junk junk junk".to_vec(),
                    _ => {
                        let mut b = tar::Builder::new(Vec::new());
                        let mut h = tar::Header::new_gnu();
                        h.set_size(3);
                        h.set_mode(0o644);
                        h.set_cksum();
                        b.append_data(&mut h, "f", &b"abc"[..]).unwrap();
                        b.into_inner().unwrap()
                    }
                }
            }
            None => Vec::new(),
        };
        let mut req = format!(
            "{method} {url} HTTP/1.1\r\nHost: forkd\r\nContent-Length: {}\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(b"\r\n");
        req.extend_from_slice(&body);
        cases += 1;
        let Some((status, text)) = send(&d.socket, &req) else {
            problems.push(format!("{id} {method} {url}: no answer"));
            continue;
        };
        seen_statuses.entry(id.clone()).or_default().insert(status);
        let documented = op["responses"].as_object().unwrap();
        if !documented.contains_key(&status.to_string()) {
            problems.push(format!(
                "{id} {method} {url}: status {status} is not documented: {}",
                text.chars().take(300).collect::<String>()
            ));
        }
        if text.contains("panicked") {
            problems.push(format!("{id} {method} {url}: a handler panicked: {text}"));
        }
        // Generated input is the caller's doing: an internal error is a bug (a check
        // missing, or an error kind picked wrongly).
        if status == 500 {
            problems.push(format!(
                "{id} {method} {url}: internal error: {}",
                text.chars().take(300).collect::<String>()
            ));
        }
    }
    println!("fuzz api: {cases} requests in {:?}", start.elapsed());
    for (op, s) in &seen_statuses {
        println!("  {op}: {s:?}");
    }
    let v: Value = d
        .client
        .call("GET", "/v1/version", None)
        .expect("still answering");
    assert!(v["version"].is_string());
    problems.sort();
    problems.dedup();
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Sends mutations of `seeds` for the budget; returns how many. An answer never tells
/// of a panic.
fn mutate_requests(
    label: &str,
    seeds: &[Vec<u8>],
    mut send: impl FnMut(&[u8]) -> Option<(u16, String)>,
) -> usize {
    let mut rng = Rng::new(label);
    let (start, mut cases) = (Instant::now(), 0usize);
    while start.elapsed() < budget() {
        let mut req = rng.pick(seeds).clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(req.len());
            match rng.below(5) {
                0 => req[at] ^= 1 << rng.below(8),
                1 => req.insert(at, *rng.pick(b"\r\n:%?&= \0\xff{}")),
                2 => {
                    req.remove(at);
                }
                3 => req.truncate(at),
                _ => {
                    let extra = format!("Content-Length: {}\r\n", rng.pick(&INTS));
                    let p = req.windows(2).position(|w| w == b"\r\n").unwrap_or(0) + 2;
                    req.splice(p.min(req.len())..p.min(req.len()), extra.into_bytes());
                }
            }
            if req.is_empty() {
                req.push(b'G');
            }
        }
        cases += 1;
        if let Some((_, text)) = send(&req) {
            assert!(
                !text.contains("panicked"),
                "{:?}: {text}",
                String::from_utf8_lossy(&req)
            );
        }
    }
    println!("fuzz {label}: {cases} requests in {:?}", start.elapsed());
    cases
}

#[test]
fn mutated_request_bytes_get_an_answer_or_a_closed_connection_never_a_crash() {
    let name = "mutated_request_bytes_get_an_answer_or_a_closed_connection_never_a_crash";
    if !can_run(name) {
        return;
    }
    let d = TestDaemon::start("fuzz-bytes");
    let seeds: Vec<Vec<u8>> = vec![
        b"GET /v1/sandboxes HTTP/1.1\r\nHost: forkd\r\n\r\n".to_vec(),
        b"POST /v1/sandboxes HTTP/1.1\r\nContent-Length: 19\r\n\r\n{\"image\":\"nothing\"}".to_vec(),
        b"POST /v1/sandboxes/0000/exec HTTP/1.1\r\nUpgrade: forkd-exec\r\nConnection: Upgrade\r\nContent-Length: 17\r\n\r\n{\"argv\":[\"true\"]}".to_vec(),
        b"GET /v1/sandboxes?stats=true&x=%41 HTTP/1.1\r\nExpect: 100-continue\r\n\r\n".to_vec(),
        b"POST /v1/images/pull HTTP/1.1\r\nX-Registry-Config: e30\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"ref\r\n0\r\n\r\n".to_vec(),
    ];
    mutate_requests("bytes", &seeds, |req| send(&d.socket, req));
    let v: Value = d
        .client
        .call("GET", "/v1/version", None)
        .expect("still answering");
    assert!(v["version"].is_string());
}

/// The request parser over TCP, with a key (so that requests get past it) and without:
/// kept-alive connections with several requests in one write, chunked bodies, upgrades
/// and heads cut anywhere. The daemon answers or closes, never panics, and serves on.
#[test]
fn mutated_requests_over_tcp_with_and_without_a_key_never_crash() {
    let name = "mutated_requests_over_tcp_with_and_without_a_key_never_crash";
    if !can_run(name) {
        return;
    }
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let d = TestDaemon::start_with_env("fuzz-tcp", &[("FORKD_LISTEN", &format!("tcp://{addr}"))]);
    let key = make_key(&d.root, "fuzz", "own");
    let auth = format!("Authorization: Bearer {key}\r\n");
    let with_key = |head: &str, rest: &str| format!("{head}\r\n{auth}{rest}").into_bytes();
    let seeds: Vec<Vec<u8>> = vec![
        with_key("GET /v1/sandboxes HTTP/1.1", "Host: forkd\r\n\r\nGET /v1/version HTTP/1.1\r\n\r\n"),
        with_key("POST /v1/sandboxes HTTP/1.1", "Content-Length: 19\r\n\r\n{\"image\":\"nothing\"}"),
        with_key("POST /v1/sandboxes HTTP/1.1", "Transfer-Encoding: chunked\r\n\r\n13\r\n{\"image\":\"nothing\"}\r\n0\r\n\r\n"),
        with_key("POST /v1/sandboxes/0000/exec HTTP/1.1", "Upgrade: forkd-exec\r\nConnection: Upgrade\r\nContent-Length: 17\r\n\r\n{\"argv\":[\"true\"]}"),
        with_key("GET /metrics HTTP/1.1", "Connection: close\r\n\r\n"),
        b"GET /v1/sandboxes HTTP/1.1\r\nAuthorization: Bearer e2b_0000\r\n\r\n".to_vec(),
    ];
    let cases = mutate_requests("tcp", &seeds, |req| send_tcp(&addr, req));
    assert!(cases > 0);
    let (status, _) = send_tcp(
        &addr,
        &with_key("GET /v1/version HTTP/1.1", "Connection: close\r\n\r\n"),
    )
    .expect("still answering");
    assert_eq!(status, 200);
}

#[test]
fn mutated_frames_and_task_files_are_errors_not_panics() {
    let mut rng = Rng::new("frames-tasks");
    let mut good = Vec::new();
    forkd_sandbox::proto::write_frame(&mut good, forkd_sandbox::proto::Kind::Stdout, b"hello")
        .unwrap();
    forkd_sandbox::proto::write_frame(
        &mut good,
        forkd_sandbox::proto::Kind::Exit,
        b"{\"exit_code\":0}",
    )
    .unwrap();
    let suite = std::path::Path::new("fixtures/suites/mini");
    let task_dirs: Vec<std::path::PathBuf> = std::fs::read_dir(suite)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.join("task.toml").exists())
                .collect()
        })
        .unwrap_or_default();
    assert!(!task_dirs.is_empty(), "no task in {}", suite.display());
    let scratch = std::env::temp_dir().join(format!("forkd-fuzz-tasks-{}", std::process::id()));
    let (start, mut frames, mut tasks) = (Instant::now(), 0usize, 0usize);
    while start.elapsed() < budget() {
        let mut bytes = good.clone();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(bytes.len());
            bytes[at] = rng.next() as u8;
        }
        let mut r = &bytes[..];
        let result = std::panic::catch_unwind(move || {
            while let Ok(Some(_)) = forkd_sandbox::proto::read_frame(&mut r) {}
        });
        assert!(result.is_ok(), "read_frame panicked on {bytes:?}");
        frames += 1;
        if rng.chance(4) {
            let src = rng.pick(&task_dirs).clone();
            let _ = std::fs::remove_dir_all(&scratch);
            copy_dir(&src, &scratch);
            let mut text = std::fs::read(scratch.join("task.toml")).unwrap();
            for _ in 0..1 + rng.below(4) {
                if text.is_empty() {
                    text.push(b'[');
                }
                let at = rng.below(text.len());
                match rng.below(3) {
                    0 => text[at] = *rng.pick(b"=[]\"'\n#.0x"),
                    1 => text.truncate(at),
                    _ => text.insert(at, rng.next() as u8),
                }
            }
            std::fs::write(scratch.join("task.toml"), &text).unwrap();
            let dir = scratch.clone();
            let loaded =
                std::panic::catch_unwind(move || forkd::eval::task::Task::load(&dir).map(drop));
            assert!(
                loaded.is_ok(),
                "Task::load panicked on {:?}",
                String::from_utf8_lossy(&text)
            );
            tasks += 1;
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    println!(
        "fuzz: {frames} frame streams, {tasks} task files in {:?}",
        start.elapsed()
    );
}

/// Checkpoint archives and image tarballs with bytes flipped, cut or inserted: each
/// import either yields a checkpoint or image that verifies, or is refused with a 400
/// or 409; nothing half-made is left (no stage, no new checkpoint or image for a refused
/// import), nothing lands outside the daemon's root, and the daemon goes on.
#[test]
fn mutated_archives_are_refused_cleanly_or_import_whole() {
    let name = "mutated_archives_are_refused_cleanly_or_import_whole";
    if !can_run(name) {
        return;
    }
    let d = TestDaemon::start("fuzz-archives");
    let sb = d.busybox();
    let (code, _, err) = d.sh(
        &sb.id,
        "mkdir -p /data && echo payload > /data/f && ln -s /etc /data/l",
    );
    assert_eq!(code, 0, "{err}");
    let ck = d.checkpoint(&sb.id, false);
    let scratch = d.root.parent().unwrap().join("fuzz-archives");
    std::fs::create_dir_all(&scratch).unwrap();
    let good = scratch.join("good.forkd");
    let _: Value = d
        .client
        .call(
            "POST",
            &format!("/v1/checkpoints/{}/export", ck.id),
            Some(&json!({ "path": good })),
        )
        .expect("export");
    let archive = std::fs::read(&good).unwrap();
    let image = std::fs::read(busybox_tar()).unwrap();
    let outside_before: Vec<_> = std::fs::read_dir(d.root.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    // (checkpoints, images) the daemon lists.
    let counts = || {
        let n = |path| {
            d.client
                .call::<Vec<Value>>("GET", path, None)
                .unwrap()
                .len()
        };
        (n("/v1/checkpoints"), n("/v1/images"))
    };
    let mut rng = Rng::new("archives");
    let (start, mut cases, mut imported) = (Instant::now(), 0usize, 0usize);
    while start.elapsed() < budget() {
        let is_image = rng.chance(3);
        let mut bytes = if is_image {
            image.clone()
        } else {
            archive.clone()
        };
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(bytes.len());
            match rng.below(4) {
                0 => bytes[at] ^= 1 << rng.below(8),
                1 => bytes.truncate(at.max(1)),
                2 => bytes[at] = rng.next() as u8,
                _ => bytes.insert(at, rng.next() as u8),
            }
        }
        let file = scratch.join(if is_image { "m.tar" } else { "m.forkd" });
        std::fs::write(&file, &bytes).unwrap();
        cases += 1;
        let (before_ck, before_img) = counts();
        let (path, body) = if is_image {
            (
                "/v1/images",
                json!({ "source": file, "name": format!("m{cases}") }),
            )
        } else {
            ("/v1/checkpoints/import", json!({ "path": file }))
        };
        let r = d
            .client
            .raw("POST", path, &serde_json::to_vec(&body).unwrap())
            .unwrap();
        let text = String::from_utf8_lossy(&r.body).to_string();
        let (after_ck, after_img) = counts();
        match r.status {
            201 => {
                imported += 1;
                println!(
                    "  whole: {} ({} bytes)",
                    if is_image { "image" } else { "checkpoint" },
                    bytes.len()
                );
                assert_eq!(after_ck + after_img, before_ck + before_img + 1, "{text}");
            }
            400 | 409 => {
                assert_eq!(
                    (after_ck, after_img),
                    (before_ck, before_img),
                    "a refused import left something: {text}"
                );
            }
            other => panic!("import answered {other}: {text}"),
        }
        let stages: Vec<String> = std::fs::read_dir(d.data().join("checkpoints"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(stages.is_empty(), "stages left: {stages:?}");
    }
    let outside_after: Vec<_> = std::fs::read_dir(d.root.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        outside_before.len(),
        outside_after.len(),
        "something was written beside the root"
    );
    println!(
        "fuzz archives: {cases} imports ({imported} whole) in {:?}",
        start.elapsed()
    );
    // The archive itself, unharmed, still imports and forks.
    let ok: Value = d
        .client
        .call(
            "POST",
            "/v1/checkpoints/import",
            Some(&json!({ "path": good })),
        )
        .expect("the good archive imports");
    assert!(ok["id"].is_string());
}
