//! E2B's protocol against a real daemon: E2B's own Python SDK, pinned, in the venvs the
//! set-up makes (fixtures/setup.sh e2b: the oldest version Harbor 0.25 accepts and the
//! newest on the index), drives forkd over loopback TCP exactly as a tool built on it
//! would (tests/e2b/sdk_check.py), against the set-up's `e2b-base` image (E2B's template
//! `base`).

#![forbid(unsafe_code)]

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

/// The SDK versions the set-up pins (python/requirements/e2b-VERSION.lock).
const SDKS: [&str; 2] = ["2.25", "2.63"];

/// The venv interpreter of SDK `version`, or `None` after a SKIP line.
fn sdk_python(name: &str, version: &str) -> Option<PathBuf> {
    let py = cache_dir().join(format!("e2b/{version}/venv/bin/python"));
    let ok = Command::new(&py)
        .args(["-c", "import e2b, httpx"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    let why = format!(
        "{} cannot import e2b (run fixtures/setup.sh e2b)",
        py.display()
    );
    require(name, ok, &why).then_some(py)
}

/// A daemon listening on a free loopback port (plain TCP: loopback only), with the
/// `e2b-base` image imported; its URL.
fn e2b_daemon(name: &str) -> Option<(TestDaemon, String)> {
    let base = fixture(name, "images/e2b-base.tar.zst", "e2b")?;
    let port = free_port();
    let listen = format!("tcp://127.0.0.1:{port}");
    let d = TestDaemon::start_with_env(name, &[("FORKD_LISTEN", &listen)]);
    d.import(&base, "e2b-base");
    Some((d, format!("http://127.0.0.1:{port}")))
}

#[test]
fn e2b_sdk_drives_forkd_unchanged() {
    let name = "e2b_sdk_drives_forkd_unchanged";
    if !can_run(name) {
        return;
    }
    let mut pythons = Vec::new();
    for v in SDKS {
        match sdk_python(name, v) {
            Some(py) => pythons.push((v, py)),
            None => return,
        }
    }
    let Some((d, url)) = e2b_daemon(name) else {
        return;
    };
    let key = make_key(&d.root, "harness", "own");
    let other = make_key(&d.root, "neighbour", "own");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/sdk_check.py");
    for (version, py) in pythons {
        let out = Command::new(&py)
            .arg(&script)
            .env("E2B_API_KEY", &key)
            .env("FORKD_OTHER_KEY", &other)
            .env("E2B_API_URL", &url)
            .env("E2B_SANDBOX_URL", &url)
            .env("E2B_DOMAIN", "forkd.invalid")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "SDK {version}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}\ndaemon log (tail):\n{}",
            out.status,
            d.log()
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .join("\n")
        );
        let last = stdout.lines().last().unwrap_or("");
        assert!(
            last.starts_with(&format!("ok {version}")),
            "SDK {version} did not finish its checks: {last:?}\n{stdout}"
        );
    }
    // What the SDK made, it removed: no sandbox is left, and every refusal the keys met
    // is in the audit log.
    let left: Vec<serde_json::Value> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    assert!(left.is_empty(), "sandboxes left: {left:?}");
    let audit = std::fs::read_to_string(d.root.join("audit.log")).unwrap();
    assert!(audit.contains("\"key\":\"harness\""), "{audit}");
}
