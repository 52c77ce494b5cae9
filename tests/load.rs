//! Load: 64 clients at once against one daemon, each creating a sandbox, running
//! commands in it, checkpointing it (live and filesystem, in turn), forking the
//! checkpoint, using the branch and removing everything again, for a bounded time
//! (`FORKD_LOAD_SECS`, default 20; 120 for a full run). No request may fail,
//! nothing may be left, and the latency of each operation is reported (p50/p99).

#![forbid(unsafe_code)]

mod common;

use common::*;
use forkd::api::{CheckpointInfo, ForkResult, SandboxInfo};
use forkd::client::Client;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const CLIENTS: usize = 64;

fn pct(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

#[test]
fn sixty_four_clients_create_exec_checkpoint_fork_and_remove() {
    let name = "sixty_four_clients_create_exec_checkpoint_fork_and_remove";
    if !can_run_criu(name) {
        return;
    }
    let secs: u64 = std::env::var("FORKD_LOAD_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let d = TestDaemon::start("load");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let times: Mutex<BTreeMap<&'static str, Vec<u64>>> = Mutex::new(BTreeMap::new());
    let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let seen: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for client in 0..CLIENTS {
            let (socket, times, errors, seen) = (&d.socket, &times, &errors, &seen);
            scope.spawn(move || {
                let c = Client::new(socket);
                let timed = |op: &'static str, f: &mut dyn FnMut() -> Result<(), String>| {
                    let t = Instant::now();
                    let r = f();
                    let us = t.elapsed().as_micros() as u64;
                    times.lock().unwrap().entry(op).or_default().push(us);
                    if let Err(e) = &r {
                        errors
                            .lock()
                            .unwrap()
                            .push(format!("client {client} {op}: {e}"));
                    }
                    r
                };
                let mut round = 0usize;
                while Instant::now() < deadline {
                    round += 1;
                    let mut sb = None;
                    let ok = timed("create", &mut || {
                        let s: SandboxInfo = c
                            .call(
                                "POST",
                                "/v1/sandboxes",
                                Some(&serde_json::json!({ "image": "busybox" })),
                            )
                            .map_err(|e| e.to_string())?;
                        seen.lock().unwrap().push(s.id.clone());
                        sb = Some(s.id);
                        Ok(())
                    });
                    let Some(sb) = sb.filter(|_| ok.is_ok()) else {
                        break;
                    };
                    let exec = |id: &str, line: &str| -> Result<String, String> {
                        let r: forkd::api::ExecResult = c
                            .call(
                                "POST",
                                &format!("/v1/sandboxes/{id}/exec"),
                                Some(&serde_json::json!({ "shell": line })),
                            )
                            .map_err(|e| e.to_string())?;
                        if r.exit.exit_code != 0 {
                            return Err(format!("{line:?} exited {}", r.exit.exit_code));
                        }
                        Ok(String::from_utf8_lossy(&decode(&r.stdout_b64)).to_string())
                    };
                    let mark = format!("{client}-{round}");
                    let _ = timed("exec", &mut || {
                        exec(&sb, &format!("echo {mark} > /mark")).map(drop)
                    });
                    let live = round % 2 == 0;
                    let mut ck = None;
                    let _ = timed(
                        if live {
                            "checkpoint_live"
                        } else {
                            "checkpoint_fs"
                        },
                        &mut || {
                            let info: CheckpointInfo = c
                                .call(
                                    "POST",
                                    &format!("/v1/sandboxes/{sb}/checkpoint"),
                                    Some(&serde_json::json!({ "live": live })),
                                )
                                .map_err(|e| e.to_string())?;
                            ck = Some(info.id);
                            Ok(())
                        },
                    );
                    if let Some(ck) = &ck {
                        let mut branch = None;
                        let _ = timed("fork", &mut || {
                            let f: ForkResult = c
                                .call(
                                    "POST",
                                    &format!("/v1/checkpoints/{ck}/fork"),
                                    Some(&serde_json::json!({ "count": 1 })),
                                )
                                .map_err(|e| e.to_string())?;
                            seen.lock().unwrap().push(f.branches[0].id.clone());
                            branch = Some(f.branches[0].id.clone());
                            Ok(())
                        });
                        if let Some(b) = &branch {
                            let _ = timed("exec", &mut || {
                                let got = exec(b, "cat /mark")?;
                                (got.trim() == mark)
                                    .then_some(())
                                    .ok_or(format!("branch {b} read {got:?}, not {mark}"))
                            });
                            let _ = timed("rm", &mut || {
                                c.call::<serde_json::Value>(
                                    "DELETE",
                                    &format!("/v1/sandboxes/{b}?force=true"),
                                    None,
                                )
                                .map(drop)
                                .map_err(|e| e.to_string())
                            });
                        }
                        let _ = timed("rm_checkpoint", &mut || {
                            c.call::<serde_json::Value>(
                                "DELETE",
                                &format!("/v1/checkpoints/{ck}"),
                                None,
                            )
                            .map(drop)
                            .map_err(|e| e.to_string())
                        });
                    }
                    let _ = timed("list", &mut || {
                        c.call::<Vec<SandboxInfo>>("GET", "/v1/sandboxes", None)
                            .map(drop)
                            .map_err(|e| e.to_string())
                    });
                    let _ = timed("rm", &mut || {
                        c.call::<serde_json::Value>(
                            "DELETE",
                            &format!("/v1/sandboxes/{sb}?force=true"),
                            None,
                        )
                        .map(drop)
                        .map_err(|e| e.to_string())
                    });
                }
            });
        }
    });
    let mut times = times.into_inner().unwrap();
    let total: usize = times.values().map(Vec::len).sum();
    println!("load: {CLIENTS} clients, {secs} s, {total} requests");
    println!(
        "{:<16} {:>7} {:>10} {:>10}",
        "operation", "count", "p50 ms", "p99 ms"
    );
    for (op, v) in times.iter_mut() {
        let n = v.len();
        let (p50, p99) = (pct(v, 0.5), pct(v, 0.99));
        println!(
            "{op:<16} {n:>7} {:>10.1} {:>10.1}",
            p50 as f64 / 1e3,
            p99 as f64 / 1e3
        );
    }
    let errors = errors.into_inner().unwrap();
    assert!(
        errors.is_empty(),
        "{} errors, first: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    assert!(
        times["create"].len() >= CLIENTS,
        "every client got through a round"
    );
    let left: Vec<SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    assert!(left.is_empty(), "sandboxes left: {}", left.len());
    let cks: Vec<CheckpointInfo> = d.client.call("GET", "/v1/checkpoints", None).unwrap();
    assert!(cks.is_empty(), "checkpoints left: {}", cks.len());
    let seen = seen.into_inner().unwrap();
    for id in &seen {
        assert!(!cgroup_exists(id), "cgroup {id} left");
    }
    let dirs = std::fs::read_dir(d.data().join("sandboxes"))
        .unwrap()
        .count();
    assert_eq!(dirs, 0, "sandbox directories left");
    assert!(d.sandbox_mounts().is_empty());
}
