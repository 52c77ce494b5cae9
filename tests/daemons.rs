//! Debian's real servers, started the way their packages start them (each daemonizes:
//! `redis-server --daemonize yes`, `pg_ctl start`, nginx's master and workers), with
//! clients connected over TCP across a live checkpoint, forked into 4 branches: each
//! branch answers, keeps the data written before the checkpoint, keeps its clients'
//! connections, and diverges from the others.

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
fn postgres_is_refused_with_the_reason_it_cannot_be_checkpointed() {
    let name = "postgres_is_refused_with_the_reason_it_cannot_be_checkpointed";
    let Some(d) = daemon_with_debian(name, "postgres") else {
        return;
    };
    let sb = d.create(
        serde_json::json!({ "image": "debian", "command": { "argv": ["sleep", "infinity"] } }),
    );
    let bin = sh_ok(&d, &sb.id, "ls -d /usr/lib/postgresql/*/bin | tail -n1");
    let bin = bin.trim();
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
    // PostgreSQL will not run as root, and CRIU cannot read a non-root process's
    // resource limits without CAP_SYS_RESOURCE, which this machine withholds: the live
    // checkpoint is refused, naming the process and the reason, and nothing is lost.
    let err = d
        .client
        .call::<forkd::api::CheckpointInfo>(
            "POST",
            &format!("/v1/sandboxes/{}/checkpoint", sb.id),
            Some(&serde_json::json!({ "live": true })),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("postgres") && err.contains("CAP_SYS_RESOURCE"),
        "{err}"
    );
    let cks: Vec<serde_json::Value> = d.client.call("GET", "/v1/checkpoints", None).unwrap();
    assert!(cks.is_empty(), "{cks:?}");
    // The server and the open session go on.
    sh_ok(
        &d,
        &sb.id,
        "echo 'SELECT 1000 + count(*) FROM t;' > /tmp/psql-in",
    );
    d.wait_for(&sb.id, "cat /tmp/psql-out", "1100");
    // A filesystem checkpoint of the same state works, and a branch of it starts the
    // server again on the data written before (the session is gone, as on a reboot).
    let ck = d.checkpoint(&sb.id, false);
    let fork = d.fork(&ck.id, 1, false);
    let b = &fork.branches[0].id;
    sh_ok(
        &d,
        b,
        &format!(
            "rm -f /srv/pg/data/postmaster.pid && su postgres -s /bin/sh -c \"{bin}/pg_ctl -D /srv/pg/data -l /srv/pg/log -o '-c listen_addresses=127.0.0.1 -k /tmp' -w start\""
        ),
    );
    assert_eq!(
        sh_ok(&d, b, &format!("{psql} -c 'SELECT count(*) FROM t'")).trim(),
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
    // Workers as root: CRIU cannot read another user's resource limits here (see
    // postgres_is_refused_with_the_reason_it_cannot_be_checkpointed).
    sh_ok(
        &d,
        &sb.id,
        "sed -i 's/^user .*;/user root;/' /etc/nginx/nginx.conf && \
         echo before > /var/www/html/index.html && nginx",
    );
    d.wait_for(&sb.id, get, "before");
    // The master daemonized itself (its parent is the init) and forked its workers.
    let ps = sh_ok(&d, &sb.id, "ps -o ppid=,args= -C nginx");
    assert!(ps.lines().count() >= 3, "a master and its workers: {ps}");
    assert!(
        ps.lines().any(|l| l.trim().starts_with("1 nginx: master")),
        "{ps}"
    );
    let ck = d.checkpoint(&sb.id, true);
    d.remove(&sb.id);
    let fork = d.fork(&ck.id, BRANCHES, false);
    for (i, b) in fork.branches.iter().enumerate() {
        assert_eq!(sh_ok(&d, &b.id, get), "before\n");
        sh_ok(
            &d,
            &b.id,
            &format!("echo branch-{i} > /var/www/html/index.html"),
        );
        assert_eq!(sh_ok(&d, &b.id, get), format!("branch-{i}\n"));
    }
}
