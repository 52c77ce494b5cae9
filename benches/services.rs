//! Service states through a live checkpoint and a fork: forkd next to podman
//! (`podman container checkpoint --tcp-established --export` and `restore
//! --tcp-established --import`, runc and the same CRIU), in the same run. The part of the
//! checkpoint benchmark about network services (benches/checkpoint/ has the rest).
//!
//! 1. **redis with a client.** A Debian sandbox (or container) runs `redis-server` on
//!    127.0.0.1:6379 with 100 000 keys written before the checkpoint (`DEBUG POPULATE`,
//!    and `probe` = `before`) and a Python client holding one TCP connection that sends
//!    `INCR` every 100 ms. Per sample: a fresh state, a live checkpoint, then a fork of
//!    N = 1 and of N = 8 branches. forkd forks N branches from one checkpoint in one
//!    request; podman restores one copy per `restore --import` (it refuses `--name`
//!    with `--tcp-established`, so copies of one export cannot run side by side: each is
//!    restored, checked and removed before the next). A copy counts only if redis
//!    answers with the checkpointed data (`probe`, the key count) and the client's
//!    connection, restored established, is still carrying requests. podman runs its
//!    containers on its default bridge network here: with `--network none` its restore
//!    of a loopback connection fails (`Can't connect inet socket back: Network is
//!    unreachable`: the restored namespace's loopback is down).
//! 2. **What a connection costs the dump.** The same state with C = 0, 16, 64, 256 open
//!    client connections: live checkpoint time against C, and the slope per connection
//!    (least squares over the p50s), for both tools.
//! 3. **PostgreSQL**: `postgres` started by hand as its own user on a data directory, a
//!    table of 1000 rows, a `psql` session open on a FIFO; measured as in part 1. A copy
//!    is whole when the restored session answers a query over those rows. CRIU reads
//!    the resource limits of postgres's processes through the bundle's rlimit shim
//!    (fixtures/criu/rlimit-shim.c), which podman's runc uses too (the same `criu`).
//!
//! Output: target/bench/services.json and .md. Environment: FORKD_BENCH_SERVICES_SAMPLES
//! (default 5), FORKD_BENCH_PODMAN=0 (forkd only), FORKD_CACHE (the Debian fixture).

#![forbid(unsafe_code)]

mod common;
mod peers;

use anyhow::{bail, Context, Result};
use common::{DaemonGuard, Report};
use peers::podman::{Podman, PodmanContainer, PODMAN_TCP_FLAGS};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const PODMAN_IMAGE: &str = "localhost/forkd-bench-debian";
const KEYS: usize = 100_000;
const CONNECTIONS: &[usize] = &[0, 16, 64, 256];

/// The redis state with `conns` client connections, as one bash line (it ends running
/// `sleep infinity`, the main process).
fn redis_script(conns: usize) -> String {
    let client = format!(
        "import os, socket, time\n\
         socks = [socket.create_connection(('127.0.0.1', 6379)) for _ in range({conns})]\n\
         n = 0\n\
         while True:\n\
         \x20   for s in socks:\n\
         \x20       s.sendall(b'INCR requests\\r\\n'); s.recv(64); n += 1\n\
         \x20   open('/tmp/clients.tmp', 'w').write(str(n)); os.replace('/tmp/clients.tmp', '/tmp/clients')\n\
         \x20   time.sleep(0.1)\n"
    );
    let mut s = format!(
        "redis-server --bind 127.0.0.1 --save '' --appendonly no --enable-debug-command local >/tmp/redis.log 2>&1 & \
         until redis-cli ping >/dev/null 2>&1; do sleep 0.1; done; \
         redis-cli debug populate {KEYS} >/dev/null && redis-cli set probe before >/dev/null && "
    );
    if conns > 0 {
        s.push_str(&format!(
            "(python3 -c \"{}\" </dev/null >/tmp/client.log 2>&1 &) && ",
            client.replace('"', "\\\"")
        ));
    }
    s.push_str("touch /tmp/state-ready; exec sleep infinity");
    s
}

/// Is the copy whole? redis has the checkpointed data and, with clients, the restored
/// connections still carry requests.
const REDIS_CHECK: &str = "test \"$(redis-cli get probe)\" = before && \
     test \"$(redis-cli dbsize)\" -ge 100001 && \
     a=$(cat /tmp/clients) && sleep 0.5 && b=$(cat /tmp/clients) && test \"$b\" -gt \"$a\" && echo whole";
const REDIS_CHECK_NO_CLIENT: &str = "test \"$(redis-cli get probe)\" = before && \
     test \"$(redis-cli dbsize)\" -ge 100001 && echo whole";

fn check_for(conns: usize) -> &'static str {
    if conns > 0 {
        REDIS_CHECK
    } else {
        REDIS_CHECK_NO_CLIENT
    }
}

const READY: &str = "test -e /tmp/state-ready && echo ready";

/// The PostgreSQL state: a cluster initialised and started as user postgres, a table of
/// 1000 rows, and a psql session kept open on a FIFO.
const POSTGRES: &str = "bin=$(ls -d /usr/lib/postgresql/*/bin | tail -n1); mkdir -p /srv/pg && chown postgres: /srv/pg && \
    su postgres -s /bin/sh -c \"$bin/initdb -D /srv/pg/data -A trust >/srv/pg/initdb.log\" && \
    su postgres -s /bin/sh -c \"$bin/pg_ctl -D /srv/pg/data -l /srv/pg/log -o '-c listen_addresses=127.0.0.1 -k /tmp' -w start\" && \
    psql -h 127.0.0.1 -U postgres -qc 'create table t as select g from generate_series(1,1000) g' && \
    mkfifo /tmp/psql.in && (sleep infinity >/tmp/psql.in &) && (psql -h 127.0.0.1 -U postgres -qtA </tmp/psql.in >/tmp/psql.out 2>&1 &) && \
    sleep 0.5 && touch /tmp/state-ready; exec sleep infinity";

/// A whole PostgreSQL copy: the session restored with its connection answers a query
/// over the rows written before the checkpoint.
const POSTGRES_CHECK: &str = "echo \"SELECT 'rows', count(*) FROM t;\" >/tmp/psql.in && \
    for i in $(seq 50); do grep -q 'rows|1000' /tmp/psql.out && echo whole && exit 0; sleep 0.1; done; exit 1";

fn main() {
    common::install_interrupt_handler();
    if let Err(e) = run() {
        eprintln!("bench services: error: {e:#}");
        std::process::exit(1);
    }
}

fn first_line(e: &anyhow::Error) -> String {
    format!("{e:#}")
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}

/// One forkd state: a sandbox running `script`, ready.
fn forkd_state(d: &DaemonGuard, script: &str) -> Result<String> {
    let sb = d.create_with(
        &json!({ "image": "debian", "command": { "argv": ["bash", "-c", script] } }),
    )?;
    if !common::wait_until(Duration::from_secs(60), || {
        d.sh_ok(&sb.id, READY).is_ok_and(|o| o.contains("ready"))
    }) {
        let log = d
            .sh_ok(&sb.id, "cat /tmp/*.log /srv/pg/log 2>/dev/null | tail -n 5")
            .unwrap_or_default();
        let _ = d.remove(&sb.id);
        bail!("the state never came up in the sandbox: {log}");
    }
    Ok(sb.id)
}

struct ForkdSample {
    checkpoint_us: u64,
    dump_us: u64,
    /// Per branch (`phases_us.total`) of the N = 1 and N = 8 forks.
    one: Vec<u64>,
    eight: Vec<u64>,
    /// The N = 8 request's wall time.
    eight_wall_us: u64,
    whole: usize,
    copies: usize,
}

/// A service state: the script that makes it, the check a whole copy passes, and a
/// command that prints something once its clients have settled.
struct State {
    script: String,
    check: &'static str,
    settled: Option<&'static str>,
}

fn redis(conns: usize) -> State {
    State {
        script: redis_script(conns),
        check: check_for(conns),
        settled: (conns > 0).then_some("cat /tmp/clients"),
    }
}

fn postgres() -> State {
    State {
        script: POSTGRES.to_string(),
        check: POSTGRES_CHECK,
        settled: None,
    }
}

fn forkd_round(d: &DaemonGuard, state: &State, forks: bool) -> Result<ForkdSample> {
    let id = forkd_state(d, &state.script)?;
    if let Some(cmd) = state.settled {
        let _ = common::wait_until(Duration::from_secs(10), || {
            d.sh_ok(&id, cmd).is_ok_and(|o| !o.trim().is_empty())
        });
    }
    let t = Instant::now();
    let ck = d.checkpoint(&id, true, false);
    let checkpoint_us = t.elapsed().as_micros() as u64;
    let _ = d.remove(&id);
    let ck = ck?;
    let dump_us = ck.phases_us.get("dump").copied().unwrap_or(0);
    let mut s = ForkdSample {
        checkpoint_us,
        dump_us,
        one: Vec::new(),
        eight: Vec::new(),
        eight_wall_us: 0,
        whole: 0,
        copies: 0,
    };
    if forks {
        for n in [1usize, 8] {
            let t = Instant::now();
            let f = d.fork(&ck.id, n, false);
            let wall = t.elapsed().as_micros() as u64;
            let f = match f {
                Ok(f) => f,
                Err(e) => {
                    let _ = d.remove_checkpoint(&ck.id);
                    return Err(e);
                }
            };
            let per: Vec<u64> = f
                .branches
                .iter()
                .filter_map(|b| b.phases_us.get("total").copied())
                .collect();
            for b in &f.branches {
                s.copies += 1;
                if d.sh_ok(&b.id, state.check)
                    .is_ok_and(|o| o.contains("whole"))
                {
                    s.whole += 1;
                }
                let _ = d.remove(&b.id);
            }
            if n == 1 {
                s.one = per;
            } else {
                s.eight = per;
                s.eight_wall_us = wall;
            }
        }
    }
    let _ = d.remove_checkpoint(&ck.id);
    Ok(s)
}

fn podman_sh(name: &str, line: &str) -> String {
    Command::new("podman")
        .args(["exec", name, "bash", "-c", line])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default()
}

struct PodmanSample {
    checkpoint_us: u64,
    restores: Vec<u64>,
    whole: usize,
    copies: usize,
    /// The first restore that failed, if one did.
    failed: Option<String>,
}

/// One podman state, exported; then `copies` restores one after another.
fn podman_round_of(
    p: &Podman,
    state: &State,
    copies: usize,
    n: usize,
    dir: &Path,
) -> Result<PodmanSample> {
    podman_round(p, &state.script, state.check, state.settled, copies, n, dir)
}

fn podman_round(
    p: &Podman,
    script: &str,
    check: &str,
    settled: Option<&str>,
    copies: usize,
    n: usize,
    dir: &Path,
) -> Result<PodmanSample> {
    let name = format!("forkd-bench-services-{n}");
    let c = PodmanContainer::start_with(
        p,
        &name,
        PODMAN_IMAGE,
        PODMAN_TCP_FLAGS,
        &["bash", "-c", script],
    )?;
    if !common::wait_until(Duration::from_secs(60), || {
        podman_sh(&c.name, READY).contains("ready")
    }) {
        bail!(
            "the state never came up in the container: {}",
            podman_sh(&c.name, "tail -n 5 /tmp/*.log /srv/pg/log 2>/dev/null")
        );
    }
    if let Some(cmd) = settled {
        let _ = common::wait_until(Duration::from_secs(10), || {
            !podman_sh(&c.name, cmd).trim().is_empty()
        });
    }
    let export = dir.join(format!("{name}.tar"));
    let _ = std::fs::remove_file(&export);
    let checkpoint_us =
        common::time_command(&mut p.checkpoint_export(&["--tcp-established"], &export, &c.name))?;
    drop(c);
    let mut s = PodmanSample {
        checkpoint_us,
        restores: Vec::new(),
        whole: 0,
        copies: 0,
        failed: None,
    };
    for _ in 0..copies {
        common::check_interrupted()?;
        let r = common::time_command(&mut p.restore_import(&["--tcp-established"], &export));
        let copy = PodmanContainer { name: name.clone() };
        s.copies += 1;
        match r {
            Ok(us) => {
                s.restores.push(us);
                if podman_sh(&copy.name, check).contains("whole") {
                    s.whole += 1;
                }
            }
            Err(e) => {
                s.failed.get_or_insert(first_line(&e));
            }
        }
        drop(copy);
    }
    let _ = std::fs::remove_file(&export);
    Ok(s)
}

/// Least-squares slope of y over x.
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// One service state through both tools: `samples` rounds of a fresh state, its live
/// checkpoint, forks of N = 1 and N = 8 (forkd) or 9 restores one by one (podman);
/// rows named `LABEL: ...`, and how many copies were whole.
#[allow(clippy::too_many_arguments)]
fn measure(
    d: &DaemonGuard,
    podman: Option<&Podman>,
    label: &str,
    state: &State,
    samples: usize,
    scratch: &Path,
    report: &mut Report,
    whole: &mut Vec<(String, String)>,
) -> Result<()> {
    eprintln!("{label}: {samples} samples per tool");
    let (mut ck, mut dump, mut one, mut eight, mut wall8) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut ok, mut copies) = (0, 0);
    for i in 0..samples {
        common::check_interrupted()?;
        let s = forkd_round(d, state, true).with_context(|| format!("forkd {label} sample {i}"))?;
        ck.push(s.checkpoint_us);
        dump.push(s.dump_us);
        one.extend(s.one);
        eight.extend(s.eight);
        wall8.push(s.eight_wall_us / 8);
        ok += s.whole;
        copies += s.copies;
    }
    report.row(&format!("{label}: forkd live checkpoint (API)"), ck);
    report.row(&format!("{label}: forkd dump phase"), dump);
    report.row(&format!("{label}: forkd fork N=1, per branch"), one);
    report.row(&format!("{label}: forkd fork N=8, per branch"), eight);
    report.row(&format!("{label}: forkd fork N=8, request wall / 8"), wall8);
    whole.push((
        format!("{label}: forkd"),
        format!("{ok} of {copies} copies whole"),
    ));
    let Some(p) = podman else {
        return Ok(());
    };
    let (mut ck, mut r1, mut r8) = (vec![], vec![], vec![]);
    let (mut ok, mut copies, mut failed) = (0, 0, None);
    for i in 0..samples {
        common::check_interrupted()?;
        match podman_round_of(p, state, 9, i, scratch) {
            Ok(s) => {
                ck.push(s.checkpoint_us);
                if let Some((first, rest)) = s.restores.split_first() {
                    r1.push(*first);
                    r8.extend_from_slice(rest);
                }
                ok += s.whole;
                copies += s.copies;
                if let Some(e) = s.failed {
                    failed.get_or_insert(e);
                }
            }
            Err(e) => failed = Some(first_line(&e)),
        }
    }
    report.row(&format!("{label}: podman checkpoint --export"), ck);
    report.row(&format!("{label}: podman restore --import, first copy"), r1);
    report.row(
        &format!("{label}: podman restore --import, copies 2-9 one by one"),
        r8,
    );
    whole.push((
        format!("{label}: podman"),
        match failed {
            None => format!("{ok} of {copies} copies whole"),
            Some(e) => format!("{ok} of {copies} copies whole; failed: {e}"),
        },
    ));
    Ok(())
}

fn run() -> Result<()> {
    let Some(debian) = common::root_and_debian("bench services")? else {
        return Ok(());
    };
    let samples = common::env_usize("FORKD_BENCH_SERVICES_SAMPLES", 5)?;
    let podman = if std::env::var("FORKD_BENCH_PODMAN").as_deref() == Ok("0") {
        None
    } else {
        Podman::detect()?
    };
    let date = common::utc_now();
    let load_start = common::load_average();
    let d = DaemonGuard::start(&PathBuf::from(env!("CARGO_BIN_EXE_forkd")))?;
    d.import(&debian, "debian")?;
    if let Some(p) = &podman {
        p.import(&debian, PODMAN_IMAGE)?;
    }
    let scratch = common::unique_temp_dir("forkd-bench-services")?;
    let mut report = Report::new("services");
    let mut whole = Vec::new();

    // 1. The service states: checkpoint, fork N = 1 and N = 8, for both tools.
    for (label, state) in [("redis+client", redis(1)), ("postgres+session", postgres())] {
        measure(
            &d,
            podman.as_ref(),
            label,
            &state,
            samples,
            &scratch,
            &mut report,
            &mut whole,
        )?;
    }

    // 2. Dump time against open connections.
    let mut per_conn = Vec::new();
    for tool in ["forkd", "podman"] {
        if tool == "podman" && podman.is_none() {
            continue;
        }
        let mut points = Vec::new();
        for &c in CONNECTIONS {
            let mut times = Vec::new();
            for i in 0..samples.min(3) {
                common::check_interrupted()?;
                let t = match tool {
                    "forkd" => forkd_round(&d, &redis(c), false).map(|s| s.checkpoint_us),
                    _ => podman_round_of(podman.as_ref().unwrap(), &redis(c), 0, 100 + i, &scratch)
                        .map(|s| s.checkpoint_us),
                };
                match t {
                    Ok(t) => times.push(t),
                    Err(e) => eprintln!("  {tool} C={c}: {}", first_line(&e)),
                }
            }
            eprintln!("  {tool}: {c} connections: {times:?} us");
            if !times.is_empty() {
                let s = report.row(
                    &format!("redis, {c} connections: {tool} live checkpoint"),
                    times,
                );
                points.push((c as f64, s.p50 as f64));
            }
        }
        if let Some(k) = slope(&points) {
            per_conn.push((
                format!("{tool}: dump cost per open connection"),
                format!("{:.3} ms", k / 1000.0),
            ));
        }
    }
    report.sections.push((
        "What an open connection costs the dump (slope of the p50s)".into(),
        per_conn,
    ));

    report
        .sections
        .push(("Copies whole (data and connections kept)".into(), whole));

    // Ratios.
    let ratio =
        |a: &str, b: &str| -> Option<f64> { Some(report.p50(a)? as f64 / report.p50(b)? as f64) };
    let mut ratios = Vec::new();
    for label in ["redis+client", "postgres+session"] {
        for (what, a, b) in [
            (
                "live checkpoint, forkd / podman",
                "forkd live checkpoint (API)",
                "podman checkpoint --export",
            ),
            (
                "first copy, forkd N=1 / podman",
                "forkd fork N=1, per branch",
                "podman restore --import, first copy",
            ),
            (
                "per copy, forkd N=8 / podman one by one",
                "forkd fork N=8, request wall / 8",
                "podman restore --import, copies 2-9 one by one",
            ),
        ] {
            if let Some(r) = ratio(&format!("{label}: {a}"), &format!("{label}: {b}")) {
                ratios.push((format!("{label}: {what}"), format!("{r:.3}")));
            }
        }
    }
    report.sections.push(("Ratios (p50)".into(), ratios));

    let cleanup = d.stop();
    let _ = std::fs::remove_dir_all(&scratch);
    let run = common::RunInfo::at_end(&date, &load_start);
    let header = run.header(
        json!({ "samples": samples, "keys": KEYS, "connections": CONNECTIONS }),
        ("peers", json!({ "podman": podman.as_ref().map(|p| json!({"version": p.version, "runtime": p.runtime})) })),
    );
    let title =
        run.title("peer: podman checkpoint/restore --tcp-established (runc, the same CRIU)");
    let (json_path, md_path, md) = report.write(&header, &title).context("write the report")?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    drop(cleanup);
    Ok(())
}
