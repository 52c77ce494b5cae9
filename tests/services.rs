//! Network services in live checkpoints: TCP listeners, TCP connections between a
//! sandbox's own processes (with data in flight), UDP sockets, IPv4 and IPv6 loopback,
//! each restored in every branch's own network namespace.

#![forbid(unsafe_code)]

mod common;

use common::*;
use std::time::{Duration, Instant};

#[test]
fn busybox_httpd_answers_in_every_branch() {
    if !can_run_criu("busybox_httpd_answers_in_every_branch") {
        return;
    }
    let d = TestDaemon::start("svc-httpd");
    let sb = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "shell": "mkdir -p /www && echo served > /www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /www" }
    }));
    d.wait_for(&sb.id, "wget -qO- http://127.0.0.1:8080/", "served");
    let ck = d.checkpoint(&sb.id, true);
    let fork = d.fork(&ck.id, 3, false);
    assert_eq!(fork.branches.len(), 3);
    for (i, b) in fork.branches.iter().enumerate() {
        // Each branch serves from its own files, on the same port in its own namespace.
        let (code, _, err) = d.sh(&b.id, &format!("echo branch-{i} > /www/index.html"));
        assert_eq!(code, 0, "{err}");
        let (code, out, err) = d.sh(&b.id, "wget -qO- http://127.0.0.1:8080/");
        assert_eq!(
            (code, out.as_str()),
            (0, format!("branch-{i}\n").as_str()),
            "{err}"
        );
    }
}

/// Three kinds of traffic in one process tree, each writing a counter: a TCP connection
/// over 127.0.0.1 whose server holds unread data at the checkpoint, UDP over 127.0.0.1
/// (bound server, connected client), and TCP over ::1.
const SERVICES: &str = r#"
import os, socket, sys, threading, time

def put(path, value):
    with open(path + ".t", "wb") as f:
        f.write(value)
    os.rename(path + ".t", path)

def tcp(fam, host, port, out):
    srv = socket.socket(fam)
    srv.bind((host, port)); srv.listen(1)
    def serve():
        c, _ = srv.accept()
        n = 0
        for line in c.makefile("rb"):
            n += 1
            c.sendall(b"%d\n" % n)
    threading.Thread(target=serve, daemon=True).start()
    cl = socket.create_connection((host, port))
    r = cl.makefile("rb")
    while True:
        cl.sendall(b"ping\n")
        put(out, r.readline().strip())
        time.sleep(0.05)

def udp(out):
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 7001))
    def serve():
        n = 0
        while True:
            _, a = srv.recvfrom(64)
            n += 1
            srv.sendto(b"%d" % n, a)
    threading.Thread(target=serve, daemon=True).start()
    cl = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    cl.connect(("127.0.0.1", 7001)); cl.settimeout(5)
    while True:
        cl.send(b"x")
        put(out, cl.recv(64))
        time.sleep(0.05)

def in_flight():
    # The server does not read until /tmp/go exists: what the client sent before the
    # checkpoint sits in the connection's receive queue when it is dumped.
    srv = socket.socket(); srv.bind(("127.0.0.1", 7002)); srv.listen(1)
    cl = socket.create_connection(("127.0.0.1", 7002))
    c, _ = srv.accept()
    cl.sendall(b"sent before the checkpoint\n")
    put("/tmp/in-flight-sent", b"1")
    while not os.path.exists("/tmp/go"):
        time.sleep(0.05)
    put("/tmp/got", c.makefile("rb").readline())

for target, args in [(tcp, (socket.AF_INET, "127.0.0.1", 7000, "/tmp/tcp4")),
                     (tcp, (socket.AF_INET6, "::1", 7003, "/tmp/tcp6")),
                     (udp, ("/tmp/udp4",)), (in_flight, ())]:
    threading.Thread(target=target, args=args, daemon=True).start()
while True:
    time.sleep(1)
"#;

#[test]
fn tcp_and_udp_sockets_survive_live_checkpoints_and_forks() {
    let name = "tcp_and_udp_sockets_survive_live_checkpoints_and_forks";
    if !can_run_criu(name) {
        return;
    }
    let Some(debian) = fixture(name, "images/debian.tar.zst", "debian") else {
        return;
    };
    let d = TestDaemon::start("svc-sockets");
    d.import(&debian, "debian");
    let sb = d.create(
        serde_json::json!({ "image": "debian", "command": { "argv": ["sleep", "infinity"] } }),
    );
    d.put_file(&sb.id, "/services.py", SERVICES.as_bytes());
    d.exec(
        &sb.id,
        serde_json::json!({ "argv": ["python3", "/services.py"], "detach": true, "log": "svc" }),
    )
    .unwrap();
    let counters = ["/tmp/tcp4", "/tmp/tcp6", "/tmp/udp4"];
    for c in counters {
        d.wait_for(&sb.id, &format!("cat {c}"), "");
        let n = d.read_number(&sb.id, c);
        assert!(n >= 1, "{c}: {n}");
    }
    d.wait_for(&sb.id, "cat /tmp/in-flight-sent", "1");
    let before: Vec<u64> = counters.iter().map(|c| d.read_number(&sb.id, c)).collect();
    let ck = d.checkpoint(&sb.id, true);
    d.remove(&sb.id);
    let fork = d.fork(&ck.id, 3, false);
    assert_eq!(fork.branches.len(), 3);
    for b in &fork.branches {
        for (c, was) in counters.iter().zip(&before) {
            // The connection goes on where it was: the counters continue past the
            // checkpoint's values (not from 1, which a new connection would give).
            let t = Instant::now();
            let mut now = d.read_number(&b.id, c);
            while now <= *was + 5 && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(50));
                now = d.read_number(&b.id, c);
            }
            assert!(
                now > *was + 5,
                "branch {}: {c} went from {was} to {now}",
                b.id
            );
        }
    }
    // The data in flight is delivered, in the branch that lets its server read it only.
    let (first, rest) = fork.branches.split_first().unwrap();
    let (code, _, err) = d.sh(&first.id, "touch /tmp/go");
    assert_eq!(code, 0, "{err}");
    let got = d.wait_for(&first.id, "cat /tmp/got", "sent");
    assert_eq!(got, "sent before the checkpoint\n");
    for b in rest {
        let (code, _, _) = d.sh(&b.id, "test -e /tmp/got");
        assert_ne!(code, 0, "branch {} read data it was never let read", b.id);
    }
}

/// The bundled terminal task whose service speaks TCP (kvd with its control on
/// 127.0.0.1:7300 and a monitor connected to it), through `forkd eval`: the clean state is
/// a live checkpoint holding the listener and the monitor's connection, the oracle solves
/// it from the clean state and from each predecessor's residual state, and a branch of the
/// clean state still has the monitor's connection, which kvd's next change reaches.
#[test]
fn terminal_task_with_a_tcp_service_runs_through_forkd_eval() {
    let name = "terminal_task_with_a_tcp_service_runs_through_forkd_eval";
    if !can_run_criu(name) {
        return;
    }
    let Some(task_src) = fixture(name, "suite/kvd-tcp-reconfig", "suite") else {
        return;
    };
    let Some(debian) = fixture(name, "images/debian.tar.zst", "debian") else {
        return;
    };
    let d = TestDaemon::start("svc-kvd-tcp");
    d.import(&debian, "debian");
    let work = d.root.parent().unwrap().to_path_buf();
    let suite = work.join("suite");
    copy_dir(&task_src, &suite.join("kvd-tcp-reconfig"));
    let run = work.join("run");
    let out = d.cli(&[
        "eval",
        "run",
        suite.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--agents",
        "oracle,noop",
        "--conditions",
        "clean,residual",
        "-k",
        "1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = results(&run);
    let pick = |agent: &str, cond: forkd_analysis::Condition| {
        rows.iter()
            .filter(|r| r.agent == agent && r.condition == cond)
            .collect::<Vec<_>>()
    };
    use forkd_analysis::{Condition, Outcome};
    let clean = pick("oracle", Condition::Clean);
    assert_eq!(clean.len(), 1);
    assert_eq!(clean[0].outcome, Outcome::Pass, "{:?}", clean[0]);
    assert!(pick("noop", Condition::Clean)
        .iter()
        .all(|r| r.outcome == Outcome::Fail));
    let residual = pick("oracle", Condition::Residual);
    assert_eq!(
        residual.len(),
        2,
        "both predecessors leave a residual state: {rows:?}"
    );
    assert!(
        residual.iter().all(|r| r.outcome == Outcome::Pass),
        "{residual:?}"
    );
    assert!(!rows.iter().any(|r| r.is_infra_error()), "{rows:?}");

    // The clean state, forked: kvd answers on its port and the monitor's connection,
    // restored established, carries kvd's next change notice.
    let cks: Vec<forkd::api::CheckpointInfo> =
        d.client.call("GET", "/v1/checkpoints", None).unwrap();
    let clean = cks
        .iter()
        .find(|c| c.labels.contains_key("forkd.eval.clean"))
        .unwrap_or_else(|| panic!("no clean state among {cks:?}"));
    assert!(clean.live);
    let b = &d.fork(&clean.id, 1, false).branches[0];
    // 7300 is 1C84; an established (01) connection to it, held by the monitor.
    let (_, tcp, _) = d.sh(&b.id, "cat /proc/net/tcp");
    assert!(
        tcp.lines().any(|l| l
            .split_whitespace()
            .nth(2)
            .is_some_and(|r| r.ends_with(":1C84"))
            && l.split_whitespace().nth(3) == Some("01")),
        "no established connection to kvd's port in the branch:\n{tcp}"
    );
    let (code, _, err) = d.sh(&b.id, "kvdctl set probe 1");
    assert_eq!(code, 0, "{err}");
    d.wait_for(&b.id, "cat /var/log/kvd-watch.log", "changed");
}

/// `python3 -m http.server` (Debian), live-checkpointed and forked into 4 branches: each
/// answers with the checkpointed file, then serves its own.
#[test]
fn python_http_server_answers_and_diverges_in_four_branches() {
    let name = "python_http_server_answers_and_diverges_in_four_branches";
    if !can_run_criu(name) {
        return;
    }
    let Some(debian) = fixture(name, "images/debian.tar.zst", "debian") else {
        return;
    };
    let d = TestDaemon::start("svc-pyhttp");
    d.import(&debian, "debian");
    let sb = d.create(serde_json::json!({
        "image": "debian",
        "command": { "shell": "mkdir -p /www && echo before > /www/index.html && exec python3 -m http.server --bind 127.0.0.1 --directory /www 8000" },
    }));
    let get = "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/').read().decode(), end='')\"";
    d.wait_for(&sb.id, get, "before");
    let ck = d.checkpoint(&sb.id, true);
    d.remove(&sb.id);
    let fork = d.fork(&ck.id, 4, false);
    assert_eq!(fork.branches.len(), 4);
    for b in &fork.branches {
        assert_eq!(d.wait_for(&b.id, get, "before"), "before\n");
    }
    for (i, b) in fork.branches.iter().enumerate() {
        d.put_file(&b.id, "/www/index.html", format!("branch-{i}\n").as_bytes());
    }
    for (i, b) in fork.branches.iter().enumerate() {
        assert_eq!(d.wait_for(&b.id, get, "branch"), format!("branch-{i}\n"));
    }
}

/// busybox `nc` pairs (no Debian image): a connection whose receiving end is stopped
/// (SIGSTOP) holds the sent line in its queue at the checkpoint; in each branch the
/// receiver is continued and gets it, and only that branch's receiver writes it. A
/// stopped process in the tree is also the case the cgroup freezer cannot take (the
/// dump would hang seizing it): the checkpoint goes without it.
#[test]
fn busybox_nc_pair_keeps_data_in_flight() {
    let name = "busybox_nc_pair_keeps_data_in_flight";
    if !can_run_criu(name) {
        return;
    }
    let d = TestDaemon::start("svc-nc");
    let sb = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "shell": "sleep 1000000 | nc -l -p 9000 > /tmp/got & echo $! > /tmp/receiver; exec sleep 1000000" },
    }));
    d.wait_for(&sb.id, "netstat -ltn", ":9000");
    // The sender connects (the receiver accepts), waits for /tmp/send, then sends a line.
    let (code, _, err) = d.sh(
        &sb.id,
        "(sh -c 'while [ ! -e /tmp/send ]; do sleep 0.05; done; echo in-flight; exec sleep 1000000' | nc 127.0.0.1 9000 >/dev/null 2>&1 &) ; true",
    );
    assert_eq!(code, 0, "{err}");
    d.wait_for(
        &sb.id,
        "netstat -tn | awk '$4 ~ /:9000$/ { print $6 }'",
        "ESTABLISHED",
    );
    // Accepted: now the receiver stops, and the line sent then stays in its queue
    // (Recv-Q of the socket on port 9000).
    let (code, _, err) = d.sh(&sb.id, "kill -STOP $(cat /tmp/receiver) && touch /tmp/send");
    assert_eq!(code, 0, "{err}");
    d.wait_for(
        &sb.id,
        "netstat -tn | awk '$4 ~ /:9000$/ && $2 > 0 { print \"queued\" }'",
        "queued",
    );
    let (_, got, _) = d.sh(&sb.id, "cat /tmp/got");
    assert_eq!(got, "", "the stopped receiver wrote nothing");
    let ck = d.checkpoint(&sb.id, true);
    d.remove(&sb.id);
    let fork = d.fork(&ck.id, 2, false);
    let (first, second) = (&fork.branches[0].id, &fork.branches[1].id);
    let (code, _, err) = d.sh(first, "kill -CONT $(cat /tmp/receiver)");
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        d.wait_for(first, "cat /tmp/got", "in-flight"),
        "in-flight\n"
    );
    let (_, other, _) = d.sh(second, "cat /tmp/got");
    assert_eq!(other, "", "the other branch's receiver is still stopped");
    let (code, _, err) = d.sh(second, "kill -CONT $(cat /tmp/receiver)");
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        d.wait_for(second, "cat /tmp/got", "in-flight"),
        "in-flight\n"
    );
}

/// Connections in their closing states across a live checkpoint: one half-closed (the
/// client shut down its sending side; the server still sends, and reads end of file), and
/// a closed one in TIME_WAIT (the kernel's alone: it neither stops the dump nor blocks
/// the listener in a branch).
#[test]
fn half_closed_and_time_wait_connections_survive_a_fork() {
    let name = "half_closed_and_time_wait_connections_survive_a_fork";
    if !can_run_criu(name) {
        return;
    }
    let Some(debian) = fixture(name, "images/debian.tar.zst", "debian") else {
        return;
    };
    let d = TestDaemon::start("svc-closing");
    d.import(&debian, "debian");
    let sb = d.create(
        serde_json::json!({ "image": "debian", "command": { "argv": ["sleep", "infinity"] } }),
    );
    let script = r#"
import os, socket, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 7100)); srv.listen(4)
# TIME_WAIT: a connection closed by the client first.
a = socket.create_connection(("127.0.0.1", 7100)); sa, _ = srv.accept(); a.close(); sa.close()
# Half-closed: the client shuts down its sending side after one line.
cl = socket.create_connection(("127.0.0.1", 7100)); s, _ = srv.accept()
cl.sendall(b"question\n"); cl.shutdown(socket.SHUT_WR)
print(s.makefile("rb").readline().decode().strip(), flush=True)
while not os.path.exists("/tmp/answer"):
    time.sleep(0.05)
s.sendall(b"answer\n"); s.shutdown(socket.SHUT_WR)
print("client got", cl.makefile("rb").read().decode().strip(), flush=True)
print("server eof", repr(s.recv(16)), flush=True)
c2 = socket.create_connection(("127.0.0.1", 7100)); s2, _ = srv.accept()
print("listener accepts", flush=True)
time.sleep(10**6)
"#;
    d.put_file(&sb.id, "/closing.py", script.as_bytes());
    d.exec(
        &sb.id,
        serde_json::json!({ "shell": "python3 -u /closing.py > /tmp/out 2>&1", "detach": true, "log": "closing" }),
    )
    .unwrap();
    d.wait_for(&sb.id, "cat /tmp/out", "question");
    // Port 7100 is 1BBC. The half-closed pair is FIN_WAIT2 (05, the client) and
    // CLOSE_WAIT (08, the server); the closed connection is TIME_WAIT (06).
    // The client stays FIN_WAIT1 until its FIN is acknowledged, which under load can
    // come a moment after the server read the line: poll for the settled states.
    let has = |states: &str, st: &str| {
        states
            .lines()
            .any(|l| l.contains(":1BBC") && l.split_whitespace().nth(3) == Some(st))
    };
    let mut states = String::new();
    let settled = common::wait_until(Duration::from_secs(30), || {
        states = d.sh(&sb.id, "cat /proc/net/tcp").1;
        has(&states, "05") && has(&states, "08") && has(&states, "06")
    });
    assert!(
        settled,
        "half-closed pair (FIN_WAIT2, CLOSE_WAIT) and a TIME_WAIT entry:\n{states}"
    );
    let ck = d.checkpoint(&sb.id, true);
    d.remove(&sb.id);
    let fork = d.fork(&ck.id, 2, false);
    for b in &fork.branches {
        let (code, _, err) = d.sh(&b.id, "touch /tmp/answer");
        assert_eq!(code, 0, "{err}");
        let out = d.wait_for(&b.id, "cat /tmp/out", "listener accepts");
        assert!(out.contains("client got answer"), "{out}");
        assert!(out.contains("server eof b''"), "{out}");
    }
}
