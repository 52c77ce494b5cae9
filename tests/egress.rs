//! Sandbox egress against test hosts in a network namespace each test makes itself (a
//! "remote" answering HTTP on 198.18.N.1 and .2, the benchmarking range): allowed hosts
//! answer, others refuse at once, the host's addresses and sibling sandboxes refuse,
//! forks get addresses of their own, sockets that leave the sandbox stop a live
//! checkpoint, and no rule or link outlives its sandbox, even across a daemon kill -9.

#![forbid(unsafe_code)]

mod common;

use common::*;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A network namespace with two addresses, 198.18.N.1 and .2, serving `remote-N` over
/// HTTP on port 8080, linked to the host by a veth whose host end is 198.18.N.254.
struct Remote {
    ns: String,
    link: String,
    net: u8,
    server: Child,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Remote {
    fn start(tag: &str, net: u8) -> Remote {
        let pid = std::process::id() % 100_000;
        let ns = format!("fkt-{tag}-{pid}");
        let link = format!("fkt{tag}{pid}");
        let _ = Command::new("ip")
            .args(["netns", "del", &ns])
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", &link])
            .stderr(Stdio::null())
            .status();
        ip(&["netns", "add", &ns]);
        ip(&[
            "link", "add", &link, "type", "veth", "peer", "name", "r0", "netns", &ns,
        ]);
        ip(&["addr", "add", &format!("198.18.{net}.254/24"), "dev", &link]);
        ip(&["link", "set", &link, "up"]);
        for a in [1, 2] {
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("198.18.{net}.{a}/24"),
                "dev",
                "r0",
            ]);
        }
        ip(&["-n", &ns, "link", "set", "r0", "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        ip(&[
            "-n",
            &ns,
            "route",
            "add",
            "default",
            "via",
            &format!("198.18.{net}.254"),
        ]);
        let www = std::env::temp_dir().join(format!("{ns}-www"));
        std::fs::create_dir_all(&www).unwrap();
        std::fs::write(www.join("index.html"), format!("remote-{net}\n")).unwrap();
        let server = Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns,
                "python3",
                "-m",
                "http.server",
                "--bind",
                "0.0.0.0",
                "8080",
                "--directory",
            ])
            .arg(&www)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the remote's HTTP server");
        let r = Remote {
            ns,
            link,
            net,
            server,
        };
        let t = Instant::now();
        while std::net::TcpStream::connect(format!("198.18.{net}.1:8080")).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the remote's server did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    }

    fn addr(&self, host: u8) -> String {
        format!("198.18.{}.{host}", self.net)
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .stderr(Stdio::null())
            .status();
    }
}

fn can_run_egress(name: &str) -> bool {
    if !can_run(name) {
        return false;
    }
    let missing = if Command::new("ip").arg("-V").output().is_err() {
        Some("needs iproute2's ip (for the test's remote namespace)".to_string())
    } else if Command::new("python3").arg("-V").output().is_err() {
        Some("needs python3 (the remote's HTTP server)".to_string())
    } else {
        common::nft().err()
    };
    require(name, missing.is_none(), missing.as_deref().unwrap_or(""))
}

fn nft_has_table(table: &str) -> bool {
    let nft = common::nft().unwrap();
    Command::new(nft)
        .args(["list", "table", "inet", table])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// SIGKILL to `pid`, then waits until it is gone.
fn kill_and_wait(pid: i32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let t = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "process {pid} outlived SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn link_exists(link: &str) -> bool {
    Path::new(&format!("/sys/class/net/{link}")).exists()
}

use std::path::Path;

/// `GET /` of `addr`:8080 from inside sandbox `id` with busybox nc.
fn http_get(d: &TestDaemon, id: &str, addr: &str) -> (i32, String, String) {
    d.sh(
        id,
        &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {addr} 8080"),
    )
}

fn network(d: &TestDaemon, id: &str) -> forkd::api::NetworkInfo {
    let info: forkd::api::SandboxInfo = d
        .client
        .call("GET", &format!("/v1/sandboxes/{id}"), None)
        .unwrap();
    info.network.expect("the sandbox has a network")
}

#[test]
fn egress_reaches_the_remote_but_never_the_host_or_a_sibling() {
    if !can_run_egress("egress_reaches_the_remote_but_never_the_host_or_a_sibling") {
        return;
    }
    let remote = Remote::start("a", 61);
    let d = TestDaemon::start("egress-basic");
    let a = d.create(serde_json::json!({ "image": "busybox", "network": { "mode": "egress" } }));
    let b = d.create(serde_json::json!({
        "image": "busybox",
        "network": { "mode": "egress" },
        "command": { "argv": ["sh", "-c", "while true; do echo sibling | nc -l -p 9000; done"] },
    }));
    let (na, nb) = (network(&d, &a.id), network(&d, &b.id));
    assert_ne!(na.address, nb.address);
    assert!(link_exists(&na.link) && nft_has_table(&na.table));

    let (code, out, err) = http_get(&d, &a.id, &remote.addr(1));
    assert_eq!(code, 0, "egress to the remote: {err}");
    assert!(out.contains("remote-61"), "{out}");
    // The remote sees the host's address (NAT), not the sandbox's.
    // The host: its end of the veth (the gateway) and its other addresses refuse.
    for host in [na.gateway.clone(), remote.addr(254)] {
        let (code, _, err) = d.sh(&a.id, &format!("nc -w 5 {host} 8080 </dev/null"));
        assert_ne!(code, 0, "the host at {host} must not be reachable");
        assert!(err.contains("refused"), "the host at {host}: {err}");
    }
    // The sibling listens on its wildcard address: it answers itself, not a.
    d.wait_for(&b.id, "nc -w 2 127.0.0.1 9000 </dev/null", "sibling");
    let (code, out, err) = d.sh(&a.id, &format!("nc -w 5 {} 9000 </dev/null", nb.address));
    assert!(
        code != 0 && !out.contains("sibling"),
        "sibling reached: {out} {err}"
    );
    assert!(err.contains("refused"), "{err}");
    // A sandbox without egress has no route at all.
    let c = d.busybox();
    let (code, _, err) = d.sh(
        &c.id,
        &format!("nc -w 5 {} 8080 </dev/null", remote.addr(1)),
    );
    assert_ne!(code, 0);
    assert!(err.contains("unreachable"), "{err}");

    // Name service: the host's name servers (never a loopback one); the hostname maps to
    // the sandbox's address.
    let (_, resolv, _) = d.sh(&a.id, "cat /etc/resolv.conf");
    assert!(!resolv.contains("nameserver 127."), "{resolv}");
    for ns in &na.nameservers {
        assert!(resolv.contains(&format!("nameserver {ns}")), "{resolv}");
    }
    let (_, hosts, _) = d.sh(&a.id, "cat /etc/hosts; hostname");
    assert!(
        hosts.contains(&format!("{}\t{}", na.address, a.hostname)),
        "{hosts}"
    );
    let (code, _, _) = d.sh(&a.id, "echo x > /etc/hosts");
    assert_ne!(code, 0, "the name files are read-only");

    d.remove(&a.id);
    assert!(!link_exists(&na.link), "{} outlived its sandbox", na.link);
    assert!(nft_has_table(&nb.table), "b still holds a lease");
    d.remove(&b.id);
    assert!(!link_exists(&nb.link));
    assert!(
        !nft_has_table(&nb.table),
        "the table outlived the last sandbox with egress"
    );
}

#[test]
fn allowlist_lets_through_only_what_it_lists() {
    if !can_run_egress("allowlist_lets_through_only_what_it_lists") {
        return;
    }
    let remote = Remote::start("b", 62);
    let d = TestDaemon::start("egress-allow");
    let allowed = remote.addr(1);
    let out = d.cli(&[
        "run",
        "-d",
        "--network",
        &format!("allowlist={allowed}"),
        "busybox",
        "--",
        "sleep",
        "1000",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let net = network(&d, &id);
    assert_eq!(net.allowed, vec![format!("{allowed}/32")]);

    let (code, out, err) = http_get(&d, &id, &allowed);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("remote-62"));
    // Not listed: refused at once, not left to time out.
    let t = Instant::now();
    let (code, _, err) = http_get(&d, &id, &remote.addr(2));
    assert_ne!(code, 0);
    assert!(err.contains("refused"), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "a refused host took {:?}",
        t.elapsed()
    );
    let (_, resolv, _) = d.sh(&id, "cat /etc/resolv.conf");
    assert!(
        !resolv.contains("nameserver"),
        "allowlist sandboxes get no name server: {resolv}"
    );
    d.remove(&id);
    assert!(!link_exists(&net.link));
}

#[test]
fn bad_network_input_is_refused_and_makes_nothing() {
    if !can_run_egress("bad_network_input_is_refused_and_makes_nothing") {
        return;
    }
    let d = TestDaemon::start("egress-bad");
    for (body, want) in [
        (
            serde_json::json!({ "mode": "allowlist", "hosts": ["a..b"] }),
            "nor a valid DNS name",
        ),
        (
            serde_json::json!({ "mode": "allowlist", "hosts": [] }),
            "at least one host",
        ),
        (
            serde_json::json!({ "mode": "allowlist", "hosts": ["10.0.0.1/40"] }),
            "prefix length",
        ),
        (
            serde_json::json!({ "mode": "allowlist", "hosts": ["nosuchhost.invalid"] }),
            "does not resolve",
        ),
        (serde_json::json!({ "mode": "bridge" }), "bridge"),
    ] {
        let err = d
            .client
            .call::<forkd::api::SandboxInfo>(
                "POST",
                "/v1/sandboxes",
                Some(&serde_json::json!({ "image": "busybox", "network": body })),
            )
            .expect_err("a bad network must be refused");
        assert!(err.to_string().contains(want), "{body}: {err}");
    }
    for arg in ["allowlist=", "allowlist=1.2.3.4:80", "bridged"] {
        let out = d.cli(&["run", "--network", arg, "busybox", "--", "true"]);
        assert!(!out.status.success(), "--network {arg} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("network") || err.contains("allowlist"),
            "--network {arg}: {err}"
        );
    }
    let list: Vec<forkd::api::SandboxInfo> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    assert!(list.is_empty(), "bad input left sandboxes: {list:?}");
    assert!(d.sandbox_mounts().is_empty());
}

#[test]
fn forks_get_their_own_address_and_outside_sockets_stop_a_checkpoint() {
    if !can_run_egress("forks_get_their_own_address_and_outside_sockets_stop_a_checkpoint")
        || !can_run_criu("forks_get_their_own_address_and_outside_sockets_stop_a_checkpoint")
    {
        return;
    }
    let remote = Remote::start("c", 63);
    let d = TestDaemon::start("egress-fork");
    let src = d.create(serde_json::json!({
        "image": "busybox",
        "network": { "mode": "egress" },
        "command": { "argv": ["sh", "-c", "while true; do echo listener | nc -l -p 9000; done"] },
    }));
    let ns = network(&d, &src.id);
    d.wait_for(&src.id, "nc -w 2 127.0.0.1 9000 </dev/null", "listener");

    // A connection to the remote, held open: the checkpoint is refused, naming it, and
    // leaves nothing behind; the sandbox runs on.
    d.sh(
        &src.id,
        &format!(
            "(sleep 1000 | nc {} 8080 >/dev/null 2>&1 &)",
            remote.addr(1)
        ),
    );
    d.wait_for(
        &src.id,
        "cat /proc/net/tcp",
        &format!("{:08X}:1F90", u32::from_ne_bytes([198, 18, 63, 1])),
    );
    let err = d
        .client
        .call::<forkd::api::CheckpointInfo>(
            "POST",
            &format!("/v1/sandboxes/{}/checkpoint", src.id),
            Some(&serde_json::json!({ "live": true })),
        )
        .expect_err("a connection to outside the sandbox must stop a live checkpoint");
    let msg = err.to_string();
    assert!(
        msg.contains("(nc)") && msg.contains(&format!("{}:8080", remote.addr(1))),
        "{msg}"
    );
    let cks: Vec<forkd::api::CheckpointInfo> =
        d.client.call("GET", "/v1/checkpoints", None).unwrap();
    assert!(cks.is_empty(), "a refused checkpoint left {cks:?}");
    d.wait_for(&src.id, "nc -w 2 127.0.0.1 9000 </dev/null", "listener");
    let held = format!(
        "echo n=$(awk '$3 ~ /^{:08X}:1F90/ && $10 != 0' /proc/net/tcp | wc -l)",
        u32::from_ne_bytes([198, 18, 63, 1])
    );
    d.sh(
        &src.id,
        "pkill -f 'sleep 1000'; for p in $(pidof nc); do kill $p; done; true",
    );
    d.wait_for(&src.id, &held, "n=0");
    d.wait_for(&src.id, "nc -w 2 127.0.0.1 9000 </dev/null", "listener");

    let ck = d.checkpoint(&src.id, true);
    let forked = d.fork(&ck.id, 2, false);
    let mut seen = vec![ns.address.clone()];
    for b in &forked.branches {
        let nb = network(&d, &b.id);
        assert!(
            !seen.contains(&nb.address),
            "branch {} reuses {}",
            b.id,
            nb.address
        );
        seen.push(nb.address.clone());
        assert_eq!(nb.mode, forkd::api::Network::egress());
        // What the branch's processes see: eth0 with the branch's own address, and the
        // hosts file saying so; the restored listener (on the wildcard) still answers.
        let (_, addr, _) = d.sh(&b.id, "ip -4 addr show eth0");
        assert!(addr.contains(&format!("{}/30", nb.address)), "{addr}");
        let (_, hosts, _) = d.sh(&b.id, "cat /etc/hosts");
        assert!(
            hosts.contains(&nb.address) && !hosts.contains(&ns.address),
            "{hosts}"
        );
        d.wait_for(&b.id, "nc -w 2 127.0.0.1 9000 </dev/null", "listener");
        let (code, out, err) = http_get(&d, &b.id, &remote.addr(1));
        assert_eq!(code, 0, "branch {} egress: {err}", b.id);
        assert!(out.contains("remote-63"));
    }
    let (code, out, _) = http_get(&d, &src.id, &remote.addr(1));
    assert!(
        code == 0 && out.contains("remote-63"),
        "the source lost its egress"
    );
    // A branch without egress, asked for: loopback only.
    let r: forkd::api::ForkResult = d
        .client
        .call(
            "POST",
            &format!("/v1/checkpoints/{}/fork", ck.id),
            Some(&serde_json::json!({ "network": { "mode": "none" } })),
        )
        .unwrap();
    let info: forkd::api::SandboxInfo = d
        .client
        .call("GET", &format!("/v1/sandboxes/{}", r.branches[0].id), None)
        .unwrap();
    assert!(info.network.is_none());
    d.wait_for(
        &r.branches[0].id,
        "nc -w 2 127.0.0.1 9000 </dev/null",
        "listener",
    );
    let (code, _, _) = http_get(&d, &r.branches[0].id, &remote.addr(1));
    assert_ne!(code, 0);
}

#[test]
fn no_rule_or_link_outlives_a_daemon_kill() {
    if !can_run_egress("no_rule_or_link_outlives_a_daemon_kill") {
        return;
    }
    let remote = Remote::start("d", 64);
    let mut d = TestDaemon::start("egress-kill");
    let keep = d.create(serde_json::json!({ "image": "busybox", "network": { "mode": "egress" }, "command": { "argv": ["sleep", "1000"] } }));
    let lose = d.create(serde_json::json!({ "image": "busybox", "network": { "mode": "egress" }, "command": { "argv": ["sleep", "1000"] } }));
    let (nk, nl) = (network(&d, &keep.id), network(&d, &lose.id));
    d.kill9();
    // While no daemon watches, one sandbox dies.
    let pid = lose.init_pid.unwrap();
    kill_and_wait(pid);
    d.spawn();
    // The survivor keeps its network and rules; the dead one's are gone.
    let (code, out, err) = http_get(&d, &keep.id, &remote.addr(1));
    assert_eq!(code, 0, "egress after the restart: {err}");
    assert!(out.contains("remote-64"));
    assert!(!link_exists(&nl.link));
    let nft = common::nft().unwrap();
    let rules = Command::new(&nft)
        .args(["list", "table", "inet", &nk.table])
        .output()
        .unwrap();
    let rules = String::from_utf8_lossy(&rules.stdout);
    assert!(rules.contains(&format!("sb_{}", nk.link)), "{rules}");
    assert!(
        !rules.contains(&format!("sb_{}", nl.link)),
        "a dead sandbox's chain survived: {rules}"
    );
    let info: forkd::api::SandboxInfo = d
        .client
        .call("GET", &format!("/v1/sandboxes/{}", lose.id), None)
        .unwrap();
    assert!(info.network.is_none());

    // Both go while the daemon is down: after a restart, nothing is left.
    d.kill9();
    let pid = keep.init_pid.unwrap();
    kill_and_wait(pid);
    d.spawn();
    assert!(!link_exists(&nk.link));
    assert!(
        !nft_has_table(&nk.table),
        "the table outlived every sandbox"
    );
    d.remove(&keep.id);
    d.remove(&lose.id);
}

#[test]
fn a_build_with_network_reaches_a_remote_in_its_run_steps() {
    let name = "a_build_with_network_reaches_a_remote_in_its_run_steps";
    if !can_run_egress(name) {
        return;
    }
    let remote = Remote::start("bld", 61);
    let d = TestDaemon::start("egress-build");
    let ctx = std::env::temp_dir().join(format!("forkd-egress-build-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ctx);
    std::fs::create_dir_all(&ctx).unwrap();
    let url = format!("http://{}:8080/index.html", remote.addr(1));
    std::fs::write(
        ctx.join("Dockerfile"),
        format!(
            "FROM busybox\nRUN wget -q -O /fetched {url}\nRUN --network=none wget -q -T 3 -O /offline {url} || echo none > /offline\n"
        ),
    )
    .unwrap();
    let build =
        |network: bool, tag: &str| -> Result<forkd::api::BuildResult, forkd::client::ClientError> {
            let body = serde_json::json!({
                "context": ctx, "name": tag, "network": network, "no_cache": true,
            });
            d.client.call("POST", "/v1/images/build", Some(&body))
        };
    let built = build(true, "net:1").expect("a build with network");
    assert_eq!(built.steps.iter().filter(|s| s.cache == "miss").count(), 2);
    let sb = d.create(serde_json::json!({ "image": "net:1" }));
    assert_eq!(d.sh(&sb.id, "cat /fetched /offline").1, "remote-61\nnone\n");
    // Without network the first RUN cannot fetch, and the build fails at its line.
    let e = build(false, "net:2").unwrap_err().to_string();
    assert!(e.contains("line 2"), "{e}");
    let _ = std::fs::remove_dir_all(&ctx);
}
