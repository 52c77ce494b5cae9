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

/// 256 clients over TLS, each with an API key's connection kept alive, creating a
/// sandbox, running commands in it and removing it, over and over for a minute
/// (`FORKD_TLS_LOAD_SECS`, default 60): no request fails, nothing is left, and the
/// daemon ends with the descriptors it had and no more than a bounded growth of memory.
#[test]
fn two_hundred_fifty_six_tls_clients_create_exec_and_remove() {
    let name = "two_hundred_fifty_six_tls_clients_create_exec_and_remove";
    if !can_run(name) {
        return;
    }
    let secs: u64 = std::env::var("FORKD_TLS_LOAD_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let Some((d, tls)) = start_tls("load-tls", &[]) else {
        return;
    };
    let key = make_key(&d.root, "load", "own");
    let env = tls.env(&key);
    let endpoint = forkd::api::transport::Endpoint::parse(&tls.host, &|k: &str| {
        env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    })
    .unwrap();
    let pid = d.pid().unwrap();
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let rss_kib = || {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap()
    };
    let round = |c: &Client| -> Result<(), String> {
        let sb: SandboxInfo = c
            .call(
                "POST",
                "/v1/sandboxes",
                Some(&serde_json::json!({"image": "busybox"})),
            )
            .map_err(|e| format!("create: {e}"))?;
        for i in 0..3 {
            let r: forkd::api::ExecResult = c
                .call(
                    "POST",
                    &format!("/v1/sandboxes/{}/exec", sb.id),
                    Some(&serde_json::json!({"argv": ["sh", "-c", format!("echo {i}")]})),
                )
                .map_err(|e| format!("exec: {e}"))?;
            if r.exit.exit_code != 0 {
                return Err(format!("exec exited {}", r.exit.exit_code));
            }
        }
        let _: serde_json::Value = c
            .call(
                "DELETE",
                &format!("/v1/sandboxes/{}?force=true", sb.id),
                None,
            )
            .map_err(|e| format!("remove: {e}"))?;
        Ok(())
    };
    // A warm-up round from every client, so that what is measured after is growth.
    let clients: Vec<Client> = (0..256).map(|_| Client::at(endpoint.clone())).collect();
    std::thread::scope(|s| {
        for c in &clients {
            s.spawn(move || round(c).unwrap());
        }
    });
    let (fds_before, rss_before) = (fds(), rss_kib());
    let deadline = Instant::now() + Duration::from_secs(secs);
    let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let rounds = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for (i, c) in clients.iter().enumerate() {
            let (errors, rounds) = (&errors, &rounds);
            s.spawn(move || {
                while Instant::now() < deadline {
                    match round(c) {
                        Ok(()) => {
                            rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e) => {
                            errors.lock().unwrap().push(format!("client {i}: {e}"));
                            return;
                        }
                    }
                }
            });
        }
    });
    let errors = errors.into_inner().unwrap();
    let rounds = rounds.into_inner();
    println!(
        "256 TLS clients: {rounds} rounds (create, 3 execs, remove) in {secs} s; daemon fds {fds_before} -> {}, RSS {} -> {} MiB",
        fds(),
        rss_before >> 10,
        rss_kib() >> 10
    );
    assert!(
        errors.is_empty(),
        "{} failed: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    assert!(rounds >= 256, "{rounds} rounds");
    let left: Vec<SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    assert!(left.is_empty(), "{} sandboxes left", left.len());
    drop(clients);
    // The namespaces of removed sandboxes are torn down behind the removals (unmounts,
    // syncs, in bursts): they all go, and the time they lag is said.
    let held = || {
        let text = d.client.raw("GET", "/metrics", b"").unwrap().body;
        String::from_utf8(text)
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("forkd_namespaces_held "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap()
    };
    let t = Instant::now();
    let at_end = held();
    assert!(
        wait_until(Duration::from_secs(300), || held() == 0),
        "namespaces still held: {}",
        held()
    );
    println!(
        "tear-downs: {at_end} namespaces held when the load ended, all released {:?} later",
        t.elapsed()
    );
    assert!(
        wait_until(Duration::from_secs(30), || fds() <= fds_before + 8),
        "descriptors grew: {fds_before} -> {}",
        fds()
    );
    assert!(
        rss_kib() <= rss_before + (96 << 10),
        "memory grew: {rss_before} KiB -> {} KiB",
        rss_kib()
    );
}
