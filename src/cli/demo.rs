//! `forkd demo`: the main job on built-in defaults. Starts a private daemon on a
//! temporary state root, imports the fixture images, and walks through what forkd does,
//! printing each step and its latency. Leaves nothing behind.

use crate::api::{ExecResult, SandboxInfo};
use crate::client::Client;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn cache() -> PathBuf {
    std::env::var_os("FORKD_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/forkd"))
}

struct PrivateDaemon {
    child: std::process::Child,
    base: PathBuf,
}

impl Drop for PrivateDaemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::SIGTERM,
        );
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn step(what: &str, t: Instant) {
    println!(
        "  {:<58} {:>9.1} ms",
        what,
        t.elapsed().as_secs_f64() * 1000.0
    );
}

pub fn run() -> anyhow::Result<i32> {
    let busybox = cache().join("images/busybox.tar");
    anyhow::ensure!(
        busybox.exists(),
        "fixture {} is missing: run fixtures/setup.sh busybox",
        busybox.display()
    );
    let base = std::env::temp_dir().join(format!("forkd-demo-{}", std::process::id()));
    std::fs::create_dir_all(&base)?;
    let socket = base.join("forkd.sock");
    let log = std::fs::File::create(base.join("daemon.log"))?;
    let child = std::process::Command::new("/proc/self/exe")
        .arg("daemon")
        .env("FORKD_ROOT", base.join("root"))
        .env("FORKD_SOCKET", &socket)
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let guard = PrivateDaemon {
        child,
        base: base.clone(),
    };
    let c = Client::new(&socket);
    let t = Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(30),
            "the daemon did not start; see {}",
            base.join("daemon.log").display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("forkd demo (state root {}):", base.join("root").display());
    step("start a private daemon", t);

    let mut images = vec![("busybox", busybox)];
    let debian = cache().join("images/debian.tar.zst");
    if debian.exists() {
        images.push(("debian", debian));
    }
    for (name, src) in &images {
        let t = Instant::now();
        let _: serde_json::Value = c.call(
            "POST",
            "/v1/images",
            Some(&serde_json::json!({ "source": src, "name": name })),
        )?;
        step(&format!("import image {name}"), t);
    }

    let t = Instant::now();
    let sb: SandboxInfo = c.call("POST", "/v1/sandboxes", Some(&serde_json::json!({ "image": "busybox", "limits": { "pids": 256, "memory_bytes": 268435456u64 } })))?;
    step(&format!("create sandbox {}", sb.id), t);
    let exec = |id: &str, line: &str| -> anyhow::Result<(i32, String)> {
        let r: ExecResult = c.call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&serde_json::json!({ "shell": line })),
        )?;
        Ok((
            r.exit.exit_code,
            String::from_utf8_lossy(&crate::api::b64::decode(&r.stdout_b64).unwrap_or_default())
                .into_owned(),
        ))
    };
    let t = Instant::now();
    let (_, out) = exec(&sb.id, "true")?;
    step("first exec", t);
    let _ = out;
    let mut samples = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        exec(&sb.id, "true")?;
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "  {:<58} {:>9.2} ms",
        "exec round trip, p50 of 50", samples[25]
    );
    let (_, ps) = exec(&sb.id, "ps -o pid,args")?;
    println!("  processes seen inside the sandbox:");
    for l in ps.lines() {
        println!("      {l}");
    }
    let (code, _) = exec(&sb.id, "echo hi | nc -w 1 127.0.0.1 22")?;
    println!(
        "  host network reachable from the sandbox: {}",
        if code == 0 { "YES (unexpected)" } else { "no" }
    );
    let (code, _) = exec(&sb.id, "mount -t tmpfs none /mnt 2>/dev/null")?;
    println!(
        "  mount allowed inside the sandbox: {}",
        if code == 0 { "YES (unexpected)" } else { "no" }
    );
    if images.iter().any(|(n, _)| *n == "debian") {
        let t = Instant::now();
        let deb: SandboxInfo = c.call(
            "POST",
            "/v1/sandboxes",
            Some(&serde_json::json!({ "image": "debian" })),
        )?;
        let (_, v) = exec(&deb.id, "python3 --version; git --version; tmux -V")?;
        step("create a Debian sandbox and run python3/git/tmux", t);
        for l in v.lines() {
            println!("      {l}");
        }
    }
    let t = Instant::now();
    let list: Vec<SandboxInfo> = c.call("GET", "/v1/sandboxes", None)?;
    for s in &list {
        let _: serde_json::Value = c.call(
            "DELETE",
            &format!("/v1/sandboxes/{}?force=true", s.id),
            None,
        )?;
    }
    step(&format!("remove {} sandboxes", list.len()), t);
    drop(guard);
    println!("done; nothing left behind.");
    Ok(0)
}
