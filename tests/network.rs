//! forkd over TCP: a daemon listening on loopback with TLS from a CA the test makes, API
//! keys made with `forkd key`, and the CLI reaching it as a remote client would. A wrong,
//! missing or removed key runs nothing; a key of scope `own` sees and touches only what
//! it made; mutual TLS refuses a client without a certificate; plain TCP is refused off
//! loopback; what keys did is in the audit log, and no key is.

#![forbid(unsafe_code)]

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The CLI as a remote client: `FORKD_HOST`, the CA, and `key` if any.
struct Remote {
    host: String,
    ca: PathBuf,
}

impl Remote {
    fn cli(&self, key: Option<&str>, args: &[&str]) -> Output {
        let mut c = Command::new(BIN);
        c.args(args)
            .env_remove("FORKD_SOCKET")
            .env("FORKD_HOST", &self.host)
            .env("FORKD_CA_CERT", &self.ca);
        match key {
            Some(k) => c.env("FORKD_API_KEY", k),
            None => c.env_remove("FORKD_API_KEY"),
        };
        c.output().unwrap()
    }

    fn ok(&self, key: &str, args: &[&str]) -> String {
        let out = self.cli(Some(key), args);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    }
}

fn sandbox_count(d: &TestDaemon) -> usize {
    d.client
        .call::<Vec<serde_json::Value>>("GET", "/v1/sandboxes", None)
        .unwrap()
        .len()
}

#[test]
fn keys_over_tls_reach_their_own_and_nothing_else() {
    let name = "keys_over_tls_reach_their_own_and_nothing_else";
    if !can_run(name) {
        return;
    }
    let Some((d, tls)) = start_tls(name, &[]) else {
        return;
    };
    let (listen, pki) = (tls.host.clone(), tls.pki.clone());
    let remote = Remote {
        host: listen.clone(),
        ca: tls.ca.clone(),
    };
    let admin = make_key(&d.root, "admin", "full");
    let a = make_key(&d.root, "harness-a", "own");
    let b = make_key(&d.root, "harness-b", "own");
    assert!(admin.starts_with("e2b_") && admin.len() == 44, "{admin}");

    // Key a runs a sandbox and streams an exec in it, over TLS.
    let id = remote.ok(&a, &["run", "-d", "busybox"]).trim().to_string();
    assert!(!id.is_empty());
    let out = remote.ok(
        &a,
        &["exec", &id, "--", "sh", "-c", "echo over-tls; echo err >&2"],
    );
    assert_eq!(out, "over-tls\n");
    let listed = remote.ok(&a, &["ps", "-q"]);
    assert!(listed.contains(&id), "{listed}");

    // Key b (own scope too) sees none of it and cannot touch it: as if it did not exist.
    assert_eq!(remote.ok(&b, &["ps", "-q"]).trim(), "");
    let out = remote.cli(Some(&b), &["exec", &id, "--", "true"]);
    assert!(
        !out.status.success() && text(&out).contains("no such sandbox"),
        "{}",
        text(&out)
    );
    let out = remote.cli(Some(&b), &["rm", "-f", &id]);
    assert!(!out.status.success(), "{}", text(&out));
    // Not by a prefix either: b's prefix is looked up among b's own.
    let out = remote.cli(Some(&b), &["inspect", &id[..6]]);
    assert!(text(&out).contains("no such sandbox"), "{}", text(&out));
    // Nor the node's own: host paths and the whole store are the operator's; nor another
    // name for a pulled image (it could replace one others use).
    let out = remote.cli(Some(&a), &["gc"]);
    assert!(text(&out).contains("scope own"), "{}", text(&out));
    let out = remote.cli(
        Some(&a),
        &["image", "pull", "--name", "busybox", "127.0.0.1:9/x:1"],
    );
    assert!(text(&out).contains("may not name it"), "{}", text(&out));
    assert!(d
        .client
        .call::<serde_json::Value>("GET", "/v1/images/busybox", None)
        .is_ok());
    // The full key sees every sandbox.
    assert!(remote.ok(&admin, &["ps", "-q"]).contains(&id));

    // A checkpoint and its fork belong to the key too.
    let ck = remote.ok(&a, &["checkpoint", &id]).trim().to_string();
    assert!(!ck.is_empty());
    let out = remote.cli(Some(&b), &["fork", &ck]);
    assert!(text(&out).contains("no such checkpoint"), "{}", text(&out));
    let branch = remote.ok(&a, &["fork", &ck]).trim().to_string();
    assert!(remote.ok(&a, &["ps", "-q"]).contains(&branch));
    // Nor does the health of a branch of it answer b.
    let as_b = forkd::client::Client::at(
        forkd::api::transport::Endpoint::parse(&listen, &|k: &str| match k {
            "FORKD_CA_CERT" => Some(tls.ca.display().to_string()),
            "FORKD_API_KEY" => Some(b.clone()),
            _ => None,
        })
        .unwrap(),
    );
    let r = as_b
        .raw("GET", &format!("/v1/health?checkpoint={ck}"), b"")
        .unwrap();
    assert_eq!(r.status, 404, "{}", String::from_utf8_lossy(&r.body));

    // No key, a wrong one, a removed one: 401, and nothing runs.
    let before = sandbox_count(&d);
    let mut wrong = a.clone();
    wrong.replace_range(10..11, if &a[10..11] == "0" { "1" } else { "0" });
    let out = Command::new(BIN)
        .args(["key", "rm", "harness-b", "--root"])
        .arg(&d.root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for (what, k) in [
        ("no key", None),
        ("a wrong key", Some(wrong.as_str())),
        ("a removed key", Some(b.as_str())),
    ] {
        let out = remote.cli(k, &["run", "-d", "busybox"]);
        assert!(!out.status.success(), "{what}: {}", text(&out));
        assert!(text(&out).contains("API key"), "{what}: {}", text(&out));
    }
    assert_eq!(sandbox_count(&d), before, "a refused request ran nothing");

    // A client that does not trust the CA does not talk at all.
    let out = Command::new(BIN)
        .args(["ps"])
        .env("FORKD_HOST", &listen)
        .env("FORKD_API_KEY", &admin)
        .env("FORKD_CA_CERT", pki.join("server.crt"))
        .output()
        .unwrap();
    assert!(
        !out.status.success() && text(&out).contains("TLS"),
        "{}",
        text(&out)
    );

    // The Python clients, sync and asyncio, and mini-swe-agent, with the same settings.
    if let Some(py) = harness_python(name) {
        let script = r#"
import asyncio, sys
import forkd
from forkd.aio import AsyncClient

c = forkd.Client()
sb = c.create("busybox")
r = c.exec(sb.id, "echo py-over-tls")
assert r.text == "py-over-tls\n", r
assert any(s.id == sb.id for s in c.list_sandboxes())
c.write_file(sb.id, "/tmp/f", b"bytes over tls")
assert c.read_file(sb.id, "/tmp/f") == b"bytes over tls"

async def main():
    a = AsyncClient()
    r = await a.exec(sb.id, "echo async")
    assert r.text == "async\n", r
    assert (await a.inspect(sb.id)).id == sb.id

asyncio.run(main())
try:
    forkd.Client(api_key="e2b_" + "0" * 40).list_sandboxes()
except forkd.Unauthorized:
    pass
else:
    sys.exit("a wrong key was accepted")
c.remove(sb.id, force=True)

# /metrics, read by Prometheus's own parser.
from prometheus_client.parser import text_string_to_metric_families
families = {f.name: f for f in text_string_to_metric_families(c.prometheus_metrics())}
for name in ["forkd_requests", "forkd_request_duration_seconds", "forkd_sandboxes", "forkd_branches_running",
             "forkd_checkpoints", "forkd_checkpoint_image_bytes", "forkd_volume_bytes", "forkd_pulls_in_progress"]:
    assert name in families, (name, sorted(families))
created = [s for s in families["forkd_requests"].samples
           if s.labels.get("op") == "createSandbox" and s.labels.get("outcome") == "ok" and s.name == "forkd_requests_total"]
assert created and created[0].value >= 1, created
hist = families["forkd_request_duration_seconds"]
assert hist.type == "histogram"
assert any(s.name.endswith("_bucket") and s.labels.get("le") == "+Inf" and s.labels.get("op") == "execInSandbox" for s in hist.samples)
assert any(s.labels.get("status") == "running" and s.value >= 1 for s in families["forkd_sandboxes"].samples)
assert [s.value for s in families["forkd_volume_bytes"].samples if s.labels.get("kind") == "size"][0] > 0

# mini-swe-agent's own agent, with its deterministic model, on a ForkdEnvironment that
# finds the daemon by the same settings.
from minisweagent.agents.default import DefaultAgent
from minisweagent.models.test_models import DeterministicModel, make_output
from forkd.minisweagent import ForkdEnvironment

env = ForkdEnvironment(image="busybox", interpreter=["sh", "-c"], cwd="/root")
model = DeterministicModel(outputs=[make_output("submit", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo remote"}])])
agent = DefaultAgent(model, env, system_template="You act.", instance_template="Task: {{task}}", step_limit=5, cost_limit=0)
info = agent.run("say remote")
assert info["exit_status"] == "Submitted" and info["submission"] == "remote\n", info
env.cleanup()
print("python ok")
"#;
        let out = Command::new(&py)
            .args(["-c", script])
            .env_remove("FORKD_SOCKET")
            .env("FORKD_HOST", &listen)
            .env("FORKD_CA_CERT", pki.join("ca.crt"))
            .env("FORKD_API_KEY", &a)
            .env(
                "PYTHONPATH",
                Path::new(env!("CARGO_MANIFEST_DIR")).join("python/src"),
            )
            .env("MSWEA_SILENT_STARTUP", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success() && text(&out).contains("python ok"),
            "{}",
            text(&out)
        );
    } else {
        return;
    }

    // The audit log: who did what, refusals too, and no key in it.
    let audit = std::fs::read_to_string(d.root.join("audit.log")).unwrap();
    let lines: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines.iter().any(|l| l["key"] == "harness-a"
            && l["op"] == "createSandbox"
            && l["id"] == id.as_str()
            && l["status"] == 201),
        "{audit}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["key"].is_null() && l["status"] == 401),
        "{audit}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["key"] == "harness-b" && l["status"] == 404),
        "{audit}"
    );
    for k in [&admin, &a, &b] {
        assert!(!audit.contains(&k[4..]), "a key is in the audit log");
    }
    assert!(!d.log().contains(&a[4..]), "a key is in the daemon's log");
    assert!(lines
        .iter()
        .any(|l| l["key_id"].as_str().is_some_and(|i| i.len() == 16)));

    // A new key of a removed one's name owns nothing of the old one's.
    let out = Command::new(BIN)
        .args(["key", "rm", "harness-a", "--root"])
        .arg(&d.root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let again = make_key(&d.root, "harness-a", "own");
    assert_eq!(remote.ok(&again, &["ps", "-q"]).trim(), "");
    let _ = std::fs::remove_dir_all(&pki);
}

#[test]
fn mutual_tls_refuses_a_client_without_a_certificate() {
    let name = "mutual_tls_refuses_a_client_without_a_certificate";
    if !can_run(name) {
        return;
    }
    // The client CA is the test CA, made by start_tls before the daemon starts.
    let pki = PathBuf::from(format!("/tmp/forkd-test-{name}-pki-{}", std::process::id()));
    let ca = pki.join("ca.crt").display().to_string();
    let Some((d, tls)) = start_tls(name, &[("FORKD_TLS_CLIENT_CA", &ca)]) else {
        return;
    };
    let key = make_key(&d.root, "admin", "full");
    let remote = Remote {
        host: tls.host.clone(),
        ca: tls.ca.clone(),
    };
    let out = remote.cli(Some(&key), &["ps"]);
    assert!(!out.status.success(), "no certificate: {}", text(&out));
    let out = Command::new(BIN)
        .args(["ps", "-q"])
        .envs(tls.env(&key))
        .env("FORKD_CLIENT_CERT", pki.join("client.cert"))
        .env("FORKD_CLIENT_KEY", pki.join("client.key"))
        .output()
        .unwrap();
    assert!(out.status.success(), "with its certificate: {}", text(&out));
    let _ = std::fs::remove_dir_all(&pki);
}

#[test]
fn plain_tcp_off_loopback_stops_the_daemon_by_name() {
    let name = "plain_tcp_off_loopback_stops_the_daemon_by_name";
    if !can_run(name) {
        return;
    }
    let root = PathBuf::from(format!("/tmp/forkd-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let out = Command::new(BIN)
        .args(["daemon", "--root"])
        .arg(root.join("root"))
        .arg("--socket")
        .arg(root.join("s.sock"))
        .env("FORKD_LISTEN", "tcp://0.0.0.0:1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("FORKD_LISTEN") && err.contains("loopback only"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// The daemon's open descriptors.
fn fds(d: &TestDaemon) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", d.pid().unwrap()))
        .unwrap()
        .count()
}

/// Peers that are slow, hostile or many cost the daemon a bounded amount, are answered
/// where HTTP allows, and never stop it serving: a thousand idle connections, garbage
/// instead of TLS, a head of a megabyte, a body over its limit, a head sent a byte at a
/// time; afterwards the daemon holds the descriptors it held before.
#[test]
fn hostile_peers_are_bounded_and_the_daemon_keeps_serving() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let name = "hostile_peers_are_bounded_and_the_daemon_keeps_serving";
    if !can_run(name) {
        return;
    }
    let Some((d, tls)) = start_tls(name, &[("FORKD_MAX_CONNECTIONS", "256")]) else {
        return;
    };
    let key = make_key(&d.root, "admin", "full");
    let env: Vec<(&str, String)> = tls.env(&key);
    let endpoint = forkd::api::transport::Endpoint::parse(&tls.host, &|k: &str| {
        env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    })
    .unwrap();
    let client = forkd::client::Client::at(endpoint.clone());
    let serving = || {
        client
            .call::<serde_json::Value>("GET", "/v1/version", None)
            .is_ok()
    };
    assert!(serving());
    let before = fds(&d);
    let addr = tls.host.trim_start_matches("tcp://").to_string();

    // A thousand connections that never speak: past the 256 served at once the rest
    // wait in the backlog; each has 10 s to finish its handshake.
    let idle: Vec<std::net::TcpStream> = (0..1000)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    // Garbage where a TLS ClientHello belongs: closed.
    let mut junk = std::net::TcpStream::connect(&addr).unwrap();
    junk.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let _ = junk.write_all(&[0x16, 0x03, 0x01, 0xff, 0xff, 0xde, 0xad, 0xbe, 0xef].repeat(64));
    let mut sink = Vec::new();
    let _ = junk.read_to_end(&mut sink);
    // The idle ones are dropped by the server after the handshake's bound, and a real
    // client is served again.
    let t = Instant::now();
    assert!(
        wait_until(Duration::from_secs(40), serving),
        "not serving after idle connections"
    );
    eprintln!("served again {:?} after the idle connections", t.elapsed());
    let closed = idle
        .into_iter()
        .filter(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut b = [0u8; 1];
            matches!(s.read(&mut b), Ok(0) | Err(_))
        })
        .count();
    assert_eq!(
        closed, 1000,
        "every idle connection is closed by the daemon"
    );

    // Over TLS with a key: a head of a megabyte is refused (431) or the connection
    // closed; a body claiming 100 GB is a 400 before a byte of it is read.
    let mut s = endpoint.connect().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let huge = format!(
        "GET /v1/version HTTP/1.1\r\nHost: forkd\r\nAuthorization: Bearer {key}\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let _ = s.write_all(huge.as_bytes());
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 431"),
        "a huge head: {text}"
    );
    let mut s = endpoint.connect().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST /v1/sandboxes HTTP/1.1\r\nHost: forkd\r\nAuthorization: Bearer {key}\r\nConnection: close\r\nContent-Length: 100000000000\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("over the limit"),
        "{answer}"
    );
    // A head a byte a second: cut off at its bound (10 s), not held for ever.
    let mut s = endpoint.connect().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let t = Instant::now();
    let mut cut = false;
    for b in b"GET /v1/version HTTP/1.1\r\nHost: forkd\r\nX-Slow: "
        .iter()
        .cycle()
        .take(40)
    {
        if s.write_all(&[*b]).is_err() {
            cut = true;
            break;
        }
        let mut one = [0u8; 1];
        match s.read(&mut one) {
            Ok(0) => {
                cut = true;
                break;
            }
            Ok(_) => {
                cut = true;
                break;
            }
            Err(_) => {}
        }
    }
    assert!(cut, "a slow head is cut off");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert!(serving());
    // Nothing held for the peers that went.
    assert!(
        wait_until(Duration::from_secs(30), || fds(&d) <= before + 4),
        "descriptors: {} before, {} after",
        before,
        fds(&d)
    );
}
