//! Operations that take time hold a sandbox in a passing state, never a lock: other
//! requests are answered meanwhile, and conflicting ones are refused with a 409 naming
//! the state. Records that must not lose data: a checkpoint in use by a fork is not
//! removed under it, and `gc` keeps every layer a checkpoint directory names. Request
//! bodies and copies have limits.

#![forbid(unsafe_code)]

mod common;

use common::*;
use forkd::api::{CheckpointInfo, SandboxInfo, SandboxStatus};
use forkd::client::ClientError;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn conflict(r: Result<serde_json::Value, ClientError>) -> String {
    match r {
        Err(ClientError::Api(e)) => {
            assert_eq!(e.status(), 409, "{}", e.message);
            e.message
        }
        other => panic!("expected a 409, got {other:?}"),
    }
}

fn inspect(d: &TestDaemon, id: &str) -> SandboxInfo {
    d.client
        .call("GET", &format!("/v1/sandboxes/{id}"), None)
        .expect("inspect")
}

/// A stop whose sandbox ignores SIGTERM waits out its whole grace period (10 s); the
/// listing, an inspect and refused requests all answer before the stop returns.
#[test]
fn requests_are_answered_while_a_stop_waits_out_its_grace_period() {
    let name = "requests_are_answered_while_a_stop_waits_out_its_grace_period";
    if !can_run(name) {
        return;
    }
    let d = TestDaemon::start(name);
    let sb = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "shell": "trap '' TERM; while :; do sleep 1; done" }
    }));
    let other = d.busybox();
    let stopper = d.call_in_background::<SandboxInfo>(
        "POST",
        format!("/v1/sandboxes/{}/stop", sb.id),
        serde_json::json!({ "grace_secs": 10 }),
    );
    assert!(
        wait_until(Duration::from_secs(5), || inspect(&d, &sb.id).status
            == SandboxStatus::Stopping),
        "the sandbox never showed as stopping"
    );
    let t = Instant::now();
    let list: Vec<SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    let list_us = t.elapsed().as_micros();
    let mine = list.iter().find(|s| s.id == sb.id).expect("listed");
    assert_eq!(mine.status, SandboxStatus::Stopping);
    let msg = conflict(
        d.exec(&sb.id, serde_json::json!({ "argv": ["true"] }))
            .map(|_| serde_json::Value::Null),
    );
    assert!(msg.contains("is stopping") && msg.contains("exec"), "{msg}");
    let msg = conflict(d.client.call(
        "POST",
        &format!("/v1/sandboxes/{}/checkpoint", sb.id),
        Some(&serde_json::json!({})),
    ));
    assert!(msg.contains("is stopping"), "{msg}");
    let msg = conflict(d.client.call(
        "DELETE",
        &format!("/v1/sandboxes/{}?force=true", sb.id),
        None,
    ));
    assert!(msg.contains("is stopping"), "{msg}");
    let msg = conflict(d.client.call(
        "POST",
        &format!("/v1/sandboxes/{}/stop", sb.id),
        Some(&serde_json::json!({})),
    ));
    assert!(msg.contains("is stopping"), "{msg}");
    // Another sandbox is served as usual.
    let (code, out, _) = d.sh(&other.id, "echo beside");
    assert_eq!((code, out.trim()), (0, "beside"));
    assert!(
        !stopper.is_finished(),
        "the stop returned before the requests made during its grace period"
    );
    println!("list during a stop: {list_us} us");
    let info = stopper.join().unwrap().expect("stop");
    // Found by the API fuzzer: a grace period past what a clock can add is a wait until
    // the processes exit, not a panic.
    let quick = d.busybox();
    let r: SandboxInfo = d
        .client
        .call(
            "POST",
            &format!("/v1/sandboxes/{}/stop", quick.id),
            Some(&serde_json::json!({ "grace_secs": u64::MAX })),
        )
        .expect("stop with the largest grace period");
    assert_eq!(r.status, SandboxStatus::Stopped);
    assert_eq!(info.status, SandboxStatus::Stopped);
    assert_eq!(inspect(&d, &sb.id).status, SandboxStatus::Stopped);
    // Settled: a removal goes through now.
    let _: serde_json::Value = d
        .client
        .call("DELETE", &format!("/v1/sandboxes/{}", sb.id), None)
        .expect("rm of the stopped sandbox");
}

/// A checkpoint is not removed while a fork of it is still restoring branches; once the
/// fork returns, every branch it made works and the removal goes through.
#[test]
fn a_checkpoint_is_not_removed_under_a_fork_in_flight() {
    let name = "a_checkpoint_is_not_removed_under_a_fork_in_flight";
    if !can_run(name) {
        return;
    }
    let d = TestDaemon::start(name);
    let sb = d.busybox();
    let (code, _, err) = d.sh(&sb.id, "echo kept > /state");
    assert_eq!(code, 0, "{err}");
    let ck: CheckpointInfo = d
        .client
        .call(
            "POST",
            &format!("/v1/sandboxes/{}/checkpoint", sb.id),
            Some(&serde_json::json!({ "labels": { "fork-race": "yes" } })),
        )
        .unwrap();
    d.remove(&sb.id);
    let count = 30;
    let forker = d.call_in_background::<forkd::api::ForkResult>(
        "POST",
        format!("/v1/checkpoints/{}/fork", ck.id),
        serde_json::json!({ "count": count }),
    );
    // The fork is in flight once its first branch is listed.
    assert!(
        wait_until(Duration::from_secs(30), || {
            let list: Vec<SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
            !list.is_empty()
        }),
        "no branch appeared"
    );
    let refused: Result<serde_json::Value, _> = d.client.call(
        "DELETE",
        &format!("/v1/checkpoints/{}?force=true", ck.id),
        None,
    );
    let fork = forker
        .join()
        .unwrap()
        .expect("the fork in flight completes");
    match refused {
        Err(ClientError::Api(e)) => {
            assert_eq!(e.status(), 409, "{}", e.message);
            assert!(e.message.contains("in use by"), "{}", e.message);
        }
        Ok(v) => panic!(
            "removed under a fork in flight: {v} (the fork gave {} branches)",
            fork.branches.len()
        ),
        Err(e) => panic!("{e}"),
    }
    assert_eq!(fork.branches.len(), count);
    for b in fork.branches.iter().step_by(7) {
        let (code, out, err) = d.sh(&b.id, "cat /state");
        assert_eq!((code, out.trim()), (0, "kept"), "branch {}: {err}", b.id);
    }
    let _: serde_json::Value = d
        .client
        .call(
            "DELETE",
            &format!("/v1/checkpoints/{}?force=true", ck.id),
            None,
        )
        .expect("removal once the fork returned");
    let list: Vec<SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    assert!(list.is_empty(), "force removes the branches: {list:?}");
}

/// `gc` keeps the layers of a checkpoint whose `meta.json` no longer loads, and removes
/// nothing at all while a checkpoint directory has no `meta.json` to read.
#[test]
fn gc_keeps_the_layers_of_checkpoints_whose_records_do_not_load() {
    let name = "gc_keeps_the_layers_of_checkpoints_whose_records_do_not_load";
    if !can_run(name) {
        return;
    }
    // An imported checkpoint's own layer is a layer of the store that only its record
    // names.
    let mut d = TestDaemon::start(name);
    let sb = d.busybox();
    d.sh(&sb.id, "echo only here > /root/only-here");
    let first = d.checkpoint(&sb.id, false);
    d.remove(&sb.id);
    let archive = d.data().join("gc-test.forkd");
    let out = d.cli(&[
        "checkpoint",
        "export",
        &first.id,
        &archive.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = d.cli(&["checkpoint", "import", &archive.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let imported = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = d.cli(&["checkpoint", "rm", &first.id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ck: CheckpointInfo = d
        .client
        .call("GET", &format!("/v1/checkpoints/{imported}"), None)
        .unwrap();
    let squashed: Vec<String> = ck
        .layers
        .iter()
        .take(1)
        .filter_map(|l| l.strip_prefix("layer:").map(str::to_string))
        .collect();
    assert_eq!(squashed.len(), 1, "its own layer: {:?}", ck.layers);
    let layer_dir = d.data().join("layers").join(&squashed[0]);
    assert!(layer_dir.exists(), "{} missing", layer_dir.display());
    // The record is written again once the checkpoint's hash is computed in the
    // background: that is waited for, so the damage below is the record's last change.
    assert!(
        wait_until(Duration::from_secs(30), || {
            let c: CheckpointInfo = d
                .client
                .call("GET", &format!("/v1/checkpoints/{}", ck.id), None)
                .unwrap();
            c.tree_hash.is_some()
        }),
        "the checkpoint's hash never came"
    );
    // A damaged record: cut in the middle, so it no longer parses.
    let meta = d.data().join("checkpoints").join(&ck.id).join("meta.json");
    let text = std::fs::read(&meta).unwrap();
    std::fs::write(&meta, &text[..text.len() / 2 + 40]).unwrap();
    assert!(
        String::from_utf8_lossy(&text[..text.len() / 2 + 40]).contains(&squashed[0]),
        "the cut record still names the layer"
    );
    d.kill9();
    d.spawn();
    let listed: Vec<CheckpointInfo> = d.client.call("GET", "/v1/checkpoints", None).unwrap();
    assert!(
        listed.is_empty(),
        "a record that does not load is not listed"
    );
    let gc: serde_json::Value = d.client.call("POST", "/v1/gc", None).expect("gc");
    let removed = gc["removed_layers"].as_array().unwrap();
    assert!(
        !removed.iter().any(|l| l.as_str() == Some(&squashed[0])),
        "gc removed a layer a damaged record names: {gc}"
    );
    assert!(layer_dir.exists());
    // No record at all: gc cannot tell, so it removes nothing and says why.
    std::fs::remove_file(&meta).unwrap();
    let msg = conflict(d.client.call("POST", "/v1/gc", None));
    assert!(msg.contains(&ck.id) && msg.contains("meta.json"), "{msg}");
    assert!(layer_dir.exists());
}

/// Sends a request head claiming `len` body bytes and nothing more; returns the answer.
fn claim_body(socket: &std::path::Path, method: &str, path: &str, len: u64) -> String {
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: forkd\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// A body over its limit is refused before it is read; `cp` in and out of a sandbox
/// stops at the copy limit with an error naming it, and the daemon goes on.
#[test]
fn bodies_and_copies_over_their_limits_are_refused() {
    let name = "bodies_and_copies_over_their_limits_are_refused";
    if !can_run(name) {
        return;
    }
    let d = TestDaemon::start_with_env(name, &[("FORKD_MAX_COPY_BYTES", "1048576")]);
    let sb = d.busybox();
    let answer = claim_body(&d.socket, "POST", "/v1/sandboxes", 100 << 20);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("over the limit"), "{answer}");
    let answer = claim_body(
        &d.socket,
        "PUT",
        &format!("/v1/sandboxes/{}/files?path=/tmp", sb.id),
        4 << 20,
    );
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("FORKD_MAX_COPY_BYTES"), "{answer}");
    // A body that ends early is an error, not a hang.
    let mut s = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    write!(
        s,
        "POST /v1/sandboxes HTTP/1.1\r\nContent-Length: 100\r\n\r\n{{\"image\""
    )
    .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.starts_with("HTTP/1.1 400") && out.contains("ended after"),
        "{out}"
    );
    // Copy out: 2 MiB of file is over the 1 MiB limit.
    let (code, _, err) = d.sh(
        &sb.id,
        "dd if=/dev/zero of=/big bs=1024 count=2048 2>/dev/null",
    );
    assert_eq!(code, 0, "{err}");
    let r = d
        .client
        .raw(
            "GET",
            &format!("/v1/sandboxes/{}/files?path=/big", sb.id),
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        String::from_utf8_lossy(&r.body).contains("over the copy limit"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let (code, _, _) = d.sh(
        &sb.id,
        "dd if=/dev/zero of=/small bs=1024 count=64 2>/dev/null",
    );
    assert_eq!(code, 0);
    let r = d
        .client
        .raw(
            "GET",
            &format!("/v1/sandboxes/{}/files?path=/small", sb.id),
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body.len() > 64 * 1024);
}
