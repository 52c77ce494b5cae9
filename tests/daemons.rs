//! Debian's real servers, started the way their packages start them (each daemonizes:
//! `redis-server --daemonize yes`, `pg_ctl start`, nginx's master and workers), with
//! clients connected over TCP across a live checkpoint, forked into 4 branches: each
//! branch answers, keeps the data written before the checkpoint, keeps its clients'
//! connections, and diverges from the others.

#![forbid(unsafe_code)]

mod common;

use common::*;
use std::time::{Duration, Instant};

const BRANCHES: usize = 4;

fn daemon_with_debian(name: &str, tag: &str) -> Option<TestDaemon> {
    if !can_run_criu(name) {
        return None;
    }
    let debian = fixture(name, "images/debian.tar.zst", "debian")?;
    let d = TestDaemon::start(tag);
    d.import(&debian, "debian");
    Some(d)
}

fn sh_ok(d: &TestDaemon, id: &str, line: &str) -> String {
    let (code, out, err) = d.sh(id, line);
    assert_eq!(code, 0, "{line:?} in {id}: {out}{err}");
    out
}

/// A client holding one TCP connection to redis across the checkpoint: `INCR n` every
/// 50 ms, the answer written to /tmp/c-redis.
const REDIS_CLIENT: &str = r#"
import os, socket, time
s = socket.create_connection(("127.0.0.1", 6379))
f = s.makefile("rb")
while True:
    s.sendall(b"INCR n\r\n")
    v = f.readline().strip().lstrip(b":")
    with open("/tmp/c-redis.t", "wb") as o:
        o.write(v)
    os.rename("/tmp/c-redis.t", "/tmp/c-redis")
    time.sleep(0.05)
"#;

#[test]
fn redis_with_a_connected_client_forks_into_branches() {
    let name = "redis_with_a_connected_client_forks_into_branches";
    let Some(d) = daemon_with_debian(name, "redis") else {
        return;
    };
    let sb = d.create(
        serde_json::json!({ "image": "debian", "command": { "argv": ["sleep", "infinity"] } }),
    );
    sh_ok(
        &d,
        &sb.id,
        "redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no",
    );
    d.wait_for(&sb.id, "redis-cli ping", "PONG");
    sh_ok(&d, &sb.id, "redis-cli set k before-the-checkpoint");
    d.put_file(&sb.id, "/client.py", REDIS_CLIENT.as_bytes());
    d.exec(
        &sb.id,
        serde_json::json!({ "argv": ["python3", "/client.py"], "detach": true, "log": "client" }),
    )
    .unwrap();
    d.wait_for(&sb.id, "cat /tmp/c-redis", "");
    let before = d.read_number(&sb.id, "/tmp/c-redis");
    let ck = d.checkpoint(&sb.id, true);
    d.remove(&sb.id);
    let fork = d.fork(&ck.id, BRANCHES, false);
    assert_eq!(fork.branches.len(), BRANCHES);
    for (i, b) in fork.branches.iter().enumerate() {
        assert_eq!(
            sh_ok(&d, &b.id, "redis-cli get k"),
            "before-the-checkpoint\n"
        );
        sh_ok(&d, &b.id, &format!("redis-cli set k branch-{i}"));
        // The client's connection goes on: its counter continues past the checkpoint's.
        let t = Instant::now();
        while d.read_number(&b.id, "/tmp/c-redis") <= before + 5 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "branch {i}: the client stopped"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for (i, b) in fork.branches.iter().enumerate() {
        assert_eq!(sh_ok(&d, &b.id, "redis-cli get k"), format!("branch-{i}\n"));
    }
}

#[test]
fn postgres_with_an_open_session_forks_into_branches_that_diverge() {
    let name = "postgres_with_an_open_session_forks_into_branches_that_diverge";
    let Some(d) = daemon_with_debian(name, "postgres") else {
        return;
    };
    let sb = d.create(
        serde_json::json!({ "image": "debian", "command": { "argv": ["sleep", "infinity"] } }),
    );
    let bin = sh_ok(&d, &sb.id, "ls -d /usr/lib/postgresql/*/bin | tail -n1");
    let bin = bin.trim();
    // postgres started by hand, as its own user (it will not run as root): CRIU reads
    // its resource limits through the bundle's rlimit shim (fixtures/criu/rlimit-shim.c)
    // on machines without CAP_SYS_RESOURCE.
    sh_ok(
        &d,
        &sb.id,
        &format!(
            "mkdir -p /srv/pg && chown postgres: /srv/pg && \
             su postgres -s /bin/sh -c '{bin}/initdb -D /srv/pg/data -A trust >/srv/pg/initdb.log' && \
             su postgres -s /bin/sh -c \"{bin}/pg_ctl -D /srv/pg/data -l /srv/pg/log -o '-c listen_addresses=127.0.0.1 -k /tmp' -w start\""
        ),
    );
    let psql = "psql -h 127.0.0.1 -U postgres -d postgres -qtA";
    sh_ok(
        &d,
        &sb.id,
        &format!(
            "{psql} -c 'CREATE TABLE t (v int); INSERT INTO t SELECT generate_series(1, 100)'"
        ),
    );
    // A psql session kept open across the checkpoint: it reads statements from a FIFO
    // (held open by a sleeper, so it never sees end of input) and writes to a file.
    sh_ok(
        &d,
        &sb.id,
        &format!(
            "mkfifo /tmp/psql-in && (sleep infinity > /tmp/psql-in &) && \
             ({psql} < /tmp/psql-in > /tmp/psql-out 2>&1 &) && \
             echo 'SELECT 41 + 1;' > /tmp/psql-in"
        ),
    );
    d.wait_for(&sb.id, "cat /tmp/psql-out", "42");
    let session = sh_ok(&d, &sb.id, "pgrep -x psql");
    let ck = d.checkpoint(&sb.id, true);
    let fork = d.fork(&ck.id, 4, false);
    assert_eq!(fork.branches.len(), 4);
    for (i, b) in fork.branches.iter().enumerate() {
        // The same session, restored with its connection: it sees the rows written
        // before the checkpoint, then writes this branch's own.
        assert_eq!(
            sh_ok(&d, &b.id, "pgrep -x psql"),
            session,
            "branch {i} has the session"
        );
        sh_ok(
            &d,
            &b.id,
            &format!("echo \"SELECT 'rows', count(*) FROM t; INSERT INTO t VALUES ({});\" > /tmp/psql-in", 1000 + i),
        );
        d.wait_for(&b.id, "cat /tmp/psql-out", "rows|100");
    }
    // Writes in one branch are invisible in the others (and in the source).
    for (i, b) in fork.branches.iter().enumerate() {
        let rows = sh_ok(
            &d,
            &b.id,
            &format!("{psql} -c 'SELECT v FROM t WHERE v >= 1000 ORDER BY v'"),
        );
        assert_eq!(rows.trim(), format!("{}", 1000 + i), "branch {i}");
    }
    assert_eq!(
        sh_ok(&d, &sb.id, &format!("{psql} -c 'SELECT count(*) FROM t'")).trim(),
        "100"
    );
}

#[test]
fn nginx_master_and_workers_serve_in_every_branch() {
    let name = "nginx_master_and_workers_serve_in_every_branch";
    let Some(d) = daemon_with_debian(name, "nginx") else {
        return;
    };
    let sb = d.create(
        serde_json::json!({ "image": "debian", "command": { "argv": ["sleep", "infinity"] } }),
    );
    let get = "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1/').read().decode(), end='')\"";
    // The workers run as www-data, as Debian configures them.
    sh_ok(
        &d,
        &sb.id,
        "echo before > /var/www/html/index.html && nginx",
    );
    d.wait_for(&sb.id, get, "before");
    // The master daemonized itself (its parent is the init) and forked its workers.
    let ps = sh_ok(&d, &sb.id, "ps -o ppid=,args= -C nginx");
    assert!(ps.lines().count() >= 3, "a master and its workers: {ps}");
    assert!(
        ps.lines().any(|l| l.trim().starts_with("1 nginx: master")),
        "{ps}"
    );
    let workers = sh_ok(&d, &sb.id, "ps -o user= -C nginx | sort | uniq -c");
    assert!(
        workers.contains("www-data"),
        "workers as www-data: {workers}"
    );
    let ck = d.checkpoint(&sb.id, true);
    d.remove(&sb.id);
    let fork = d.fork(&ck.id, BRANCHES, false);
    for (i, b) in fork.branches.iter().enumerate() {
        assert_eq!(sh_ok(&d, &b.id, get), "before\n");
        assert_eq!(
            sh_ok(&d, &b.id, "ps -o user= -C nginx | sort | uniq -c"),
            workers,
            "branch {i}"
        );
        sh_ok(
            &d,
            &b.id,
            &format!("echo branch-{i} > /var/www/html/index.html"),
        );
        assert_eq!(sh_ok(&d, &b.id, get), format!("branch-{i}\n"));
    }
}
