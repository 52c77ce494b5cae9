//! `forkd image pull` from a real registry (Debian's docker-registry, the CNCF
//! distribution registry) on loopback: an OCI index with several platforms and an
//! attestation, gzip, zstd and plain layers, a short name resolved through
//! registries.conf, one manifest HEAD for an unchanged image, shared layers fetched once,
//! errors that name the reference, a corrupt blob that leaves nothing behind, resumes and
//! rate limits, concurrent, cancelled and killed pulls, builds that pull their bases and
//! `forkd eval` pulling a Harbor task's image. Credentials, TLS and registries.conf's
//! routing are in tests/registry_auth.rs.

#![forbid(unsafe_code)]

mod common;

use common::registry::*;
use common::*;
use forkd::api::ImageInfo;
use std::path::Path;
use std::time::Duration;

#[test]
fn a_pushed_image_is_pulled_run_and_pulled_again_with_one_head() {
    let name = "a_pushed_image_is_pulled_run_and_pulled_again_with_one_head";
    if !can_run(name) {
        return;
    }
    let Some(reg) = Registry::start(Path::new("/tmp/forkd-test-registry-pull")) else {
        return;
    };
    let pushed = push_image(
        &reg,
        "forkd/app",
        "1",
        &[base_layer(), top_layer("layer two\n")],
        "FROM_CONFIG=yes",
    );
    let d = daemon_with_registry("registry-pull", &reg);

    // A short name, resolved on the search registry; the index's amd64 entry.
    let (ok, out, err) = pull(&d, &["forkd/app:1"]);
    assert!(ok, "pull failed: {err}");
    let full = format!("{}/forkd/app:1", reg.host());
    assert_eq!(out, full);
    let img: ImageInfo = d
        .client
        .call(
            "GET",
            &format!("/v1/images/{}", forkd::api::url::encode_segment(&full)),
            None,
        )
        .unwrap();
    assert_eq!(img.digest.as_deref(), Some(pushed.index.as_str()));
    assert_eq!(img.source, format!("registry:{full}"));
    assert_eq!(img.layers.len(), 2);
    let blobs = |reqs: &[(String, String)]| {
        reqs.iter()
            .filter(|(m, p)| m == "GET" && p.contains("/blobs/"))
            .count()
    };
    let first = reg.requests();
    assert_eq!(
        blobs(&first),
        3,
        "two layers and the config, once each: {first:?}"
    );

    // The image runs: both layers, the whiteout, the config's env and working directory.
    let sb = d.create(serde_json::json!({ "image": full }));
    let (code, out, _) = d.sh(&sb.id, "cat /etc/pulled; pwd; echo $FROM_CONFIG; test -e /bin/vi || echo no-vi; /bin/busybox true && echo busybox");
    assert_eq!(code, 0);
    assert_eq!(out, "layer two\n/etc\nyes\nno-vi\nbusybox\n");
    d.remove(&sb.id);

    // Pulled again: one manifest HEAD and nothing else.
    let (ok, _, err) = pull(&d, &["forkd/app:1"]);
    assert!(ok, "{err}");
    let again: Vec<_> = reg.requests()[first.len()..].to_vec();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].0, "HEAD");
    assert!(again[0].1.ends_with("/manifests/1"), "{again:?}");

    // By the platform manifest's digest, under a name of its own: the layers are in the
    // store, so only the manifest and the config are read.
    let before = reg.requests().len();
    let by_digest = format!("{}/forkd/app@{}", reg.host(), pushed.manifest);
    let (ok, out, err) = pull(&d, &[&by_digest]);
    assert!(ok, "{err}");
    assert_eq!(out, by_digest, "a digest reference names the image");
    let now = reg.requests()[before..].to_vec();
    assert_eq!(blobs(&now), 1, "only the config: {now:?}");

    // A second image over the same base: only its own layer is fetched.
    // Docker's media types this time, over the same base, and an uncompressed layer.
    let plain_top = tar_of(&[("etc/pulled", b"other\n")]);
    let second = push_image_as(
        &reg,
        "forkd/other",
        "2",
        &[
            (
                "application/vnd.docker.image.rootfs.diff.tar.gzip",
                base_layer().1,
                base_layer().2,
            ),
            (
                "application/vnd.docker.image.rootfs.diff.tar",
                plain_top.clone(),
                plain_top,
            ),
        ],
        "FROM_CONFIG=two",
        true,
    );
    let before = reg.requests().len();
    let (ok, _, err) = pull(&d, &[&format!("{}/forkd/other:2", reg.host())]);
    assert!(ok, "{err}");
    let now = reg.requests()[before..].to_vec();
    let fetched: Vec<_> = now
        .iter()
        .filter(|(m, p)| m == "GET" && p.contains("/blobs/"))
        .map(|(_, p)| p.clone())
        .collect();
    assert_eq!(
        fetched.len(),
        2,
        "the config and the new layer: {fetched:?}"
    );
    assert!(fetched.iter().any(|p| p.ends_with(&second.layers[1])));
    assert!(
        !fetched.iter().any(|p| p.ends_with(&pushed.layers[0])),
        "the shared base is not fetched again"
    );
    let other = format!("{}/forkd/other:2", reg.host());
    let sb = d.create(serde_json::json!({ "image": other }));
    assert_eq!(
        d.sh(&sb.id, "cat /etc/pulled; echo $FROM_CONFIG").1,
        "other\ntwo\n"
    );
    d.remove(&sb.id);

    // Errors name the reference and the step.
    let (ok, _, err) = pull(&d, &["forkd/app:nope"]);
    assert!(!ok);
    assert!(
        err.contains("manifest unknown") && err.contains("forkd/app:nope"),
        "{err}"
    );
    let (ok, _, err) = pull(&d, &["--platform", "linux/s390x", "forkd/app:1"]);
    assert!(!ok);
    assert!(
        err.contains("no linux/s390x in the index") && err.contains("linux/arm64/v8"),
        "{err}"
    );
    let (ok, _, err) = pull(&d, &["Bad//Ref"]);
    assert!(!ok);
    assert!(err.contains("bad image reference"), "{err}");
    let images: Vec<ImageInfo> = d.client.call("GET", "/v1/images", None).unwrap();
    assert!(!images
        .iter()
        .any(|i| i.name.contains("nope") || i.name.contains("s390x")));

    // `image ls` shows the digest and the source.
    let ls = String::from_utf8_lossy(&d.cli(&["image", "ls"]).stdout).into_owned();
    let line = ls
        .lines()
        .find(|l| l.starts_with(&full))
        .unwrap_or_else(|| panic!("{ls}"));
    assert!(
        line.contains(&pushed.index[..19]) && line.contains("registry:"),
        "{line}"
    );
}

#[test]
fn a_corrupt_blob_fails_the_pull_and_leaves_nothing() {
    let name = "a_corrupt_blob_fails_the_pull_and_leaves_nothing";
    if !can_run(name) {
        return;
    }
    let Some(reg) = Registry::start(Path::new("/tmp/forkd-test-registry-corrupt")) else {
        return;
    };
    let pushed = push_image(
        &reg,
        "forkd/bad",
        "1",
        &[base_layer(), top_layer("bad\n")],
        "X=1",
    );
    // Damage the top layer's stored bytes (same length, other content).
    let hex = pushed.layers[1].trim_start_matches("sha256:");
    let data = reg.dir.join(format!(
        "data/docker/registry/v2/blobs/sha256/{}/{hex}/data",
        &hex[..2]
    ));
    let mut bytes = std::fs::read(&data).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    std::fs::write(&data, &bytes).unwrap();
    let d = daemon_with_registry("registry-corrupt", &reg);
    let (ok, _, err) = pull(&d, &["forkd/bad:1"]);
    assert!(!ok, "a corrupt blob was accepted");
    assert!(
        err.contains(&pushed.layers[1]),
        "the error names the layer: {err}"
    );
    let images: Vec<ImageInfo> = d.client.call("GET", "/v1/images", None).unwrap();
    assert!(
        !images.iter().any(|i| i.name.contains("forkd/bad")),
        "no image was written"
    );
    let tmp = d.data().join("layers/tmp");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "no half layer: {left:?}");

    // Repaired, the same pull completes, keeping the whole layer it had.
    bytes[n / 2] ^= 0xff;
    std::fs::write(&data, &bytes).unwrap();
    let before = reg.requests().len();
    let (ok, _, err) = pull(&d, &["forkd/bad:1"]);
    assert!(ok, "{err}");
    let now = reg.requests()[before..].to_vec();
    assert!(
        !now.iter().any(|(_, p)| p.ends_with(&pushed.layers[0])),
        "the base was kept: {now:?}"
    );
}

#[test]
fn dropped_connections_resume_and_rate_limits_are_waited_out() {
    let name = "dropped_connections_resume_and_rate_limits_are_waited_out";
    if !can_run(name) {
        return;
    }
    let Some(reg) = Registry::start(Path::new("/tmp/forkd-test-registry-faults")) else {
        return;
    };
    let hosts = reg.dir.join("hosts");
    std::fs::create_dir_all(&hosts).unwrap();
    push_image(
        &reg,
        "forkd/app",
        "1",
        &[base_layer(), top_layer("resumed\n")],
        "A=1",
    );
    for (faults, want_status) in [("cut,429", 206), ("cut,ignore-range", 200)] {
        let proxy = Host::start(&hosts, faults, &["proxy", &reg.port.to_string(), faults]);
        let d = TestDaemon::start_with_env(
            &format!("registry-faults-{want_status}"),
            &[
                (
                    "REGISTRY_AUTH_FILE",
                    hosts.join("none.json").to_str().unwrap(),
                ),
                ("DOCKER_CONFIG", hosts.to_str().unwrap()),
            ],
        );
        let reference = format!("127.0.0.1:{}/forkd/app:1", proxy.port);
        let (ok, _, err) = pull(&d, &[&reference]);
        assert!(ok, "{faults}: {err}");
        let sb = d.create(serde_json::json!({ "image": reference }));
        assert_eq!(
            d.sh(&sb.id, "cat /etc/pulled; /bin/busybox true && echo ok")
                .1,
            "resumed\nok\n"
        );
        let seen = proxy.requests();
        if faults.contains("429") {
            let first = seen
                .iter()
                .position(|r| r["fault"] == "429")
                .expect("a 429 was answered");
            assert!(
                seen[first + 1..].iter().any(|r| r["path"]
                    .as_str()
                    .unwrap()
                    .contains("/manifests/")
                    && r["status"] == 200),
                "the manifest was asked again: {seen:?}"
            );
        }
        let cuts: Vec<&str> = seen
            .iter()
            .filter(|r| r["fault"] == "cut")
            .map(|r| r["path"].as_str().unwrap())
            .collect();
        assert_eq!(cuts.len(), 3, "every blob was cut once: {seen:?}");
        for path in cuts {
            let resumed = seen
                .iter()
                .find(|r| r["path"] == path && !r["range"].is_null());
            let resumed =
                resumed.unwrap_or_else(|| panic!("{path} was not resumed with a Range: {seen:?}"));
            assert!(
                resumed["range"].as_str().unwrap().starts_with("bytes="),
                "{resumed}"
            );
            assert_eq!(resumed["status"], want_status, "{faults}: {resumed}");
        }
    }
}

#[test]
fn concurrent_pulls_fetch_a_shared_layer_once_and_a_killed_pull_leaves_no_half_layer() {
    let name = "concurrent_pulls_fetch_a_shared_layer_once_and_a_killed_pull_leaves_no_half_layer";
    if !can_run(name) {
        return;
    }
    let Some(reg) = Registry::start(Path::new("/tmp/forkd-test-registry-shared")) else {
        return;
    };
    let hosts = reg.dir.join("hosts");
    std::fs::create_dir_all(&hosts).unwrap();
    let a = push_image(
        &reg,
        "forkd/a",
        "1",
        &[base_layer(), top_layer("a\n")],
        "A=1",
    );
    push_image(
        &reg,
        "forkd/b",
        "1",
        &[base_layer(), top_layer("b\n")],
        "B=1",
    );
    let proxy = Host::start(&hosts, "slow", &["proxy", &reg.port.to_string(), "slow"]);
    let mut d = TestDaemon::start_with_env(
        "registry-shared",
        &[
            (
                "REGISTRY_AUTH_FILE",
                hosts.join("none.json").to_str().unwrap(),
            ),
            ("DOCKER_CONFIG", hosts.to_str().unwrap()),
        ],
    );
    let host = format!("127.0.0.1:{}", proxy.port);
    let pulls: Vec<_> = ["forkd/a:1", "forkd/b:1"]
        .iter()
        .map(|r| {
            let client = d.client.clone();
            let body = serde_json::json!({ "reference": format!("{host}/{r}") });
            std::thread::spawn(move || {
                client.call::<ImageInfo>("POST", "/v1/images/pull", Some(&body))
            })
        })
        .collect();
    for p in pulls {
        p.join().unwrap().expect("pull");
    }
    let base_gets = proxy
        .requests()
        .iter()
        .filter(|r| r["method"] == "GET" && r["path"].as_str().unwrap().ends_with(&a.layers[0]))
        .count();
    assert_eq!(
        base_gets, 1,
        "the shared base was fetched once for both pulls"
    );

    // A pull stopped midway, two ways. 4 MiB that do not compress: some 3 s through the slow proxy.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let noise: Vec<u8> = (0..4 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let big = tar_of(&[("big", &noise)]);
    let big_layer = (
        "application/vnd.oci.image.layer.v1.tar+gzip",
        big.clone(),
        gzip(&big),
    );
    push_image(
        &reg,
        "forkd/c",
        "1",
        &[base_layer(), big_layer, top_layer("c\n")],
        "C=1",
    );
    let fetching = |d: &TestDaemon| {
        d.client
            .call::<Vec<forkd::api::PullStatus>>("GET", "/v1/pulls", None)
            .map(|ps| {
                ps.iter()
                    .any(|p| p.layers.iter().any(|l| l.state == "fetching" && l.done > 0))
            })
            .unwrap_or(false)
    };
    // Cancelled: the client is killed mid-layer, so its connection closes.
    let mut cli = std::process::Command::new(BIN)
        .args(["image", "pull", &format!("{host}/forkd/c:1")])
        .env("FORKD_SOCKET", &d.socket)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || fetching(&d)),
        "the pull never got going"
    );
    cli.kill().unwrap();
    cli.wait().unwrap();
    let ended = wait_until(Duration::from_secs(20), || {
        d.client
            .call::<Vec<forkd::api::PullStatus>>("GET", "/v1/pulls", None)
            .is_ok_and(|ps| ps.is_empty())
    });
    assert!(ended, "the cancelled pull did not stop");
    let images: Vec<ImageInfo> = d.client.call("GET", "/v1/images", None).unwrap();
    assert!(
        !images.iter().any(|i| i.name.contains("forkd/c")),
        "a cancelled pull leaves no image"
    );
    let left: Vec<_> = std::fs::read_dir(d.data().join("layers/tmp"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "and no half layer: {left:?}");
    assert!(
        d.log().contains("cancelled (its client went away)"),
        "{}",
        d.log()
    );

    // Killed with the daemon, mid-layer.
    let client = d.client.clone();
    let body = serde_json::json!({ "reference": format!("{host}/forkd/c:1") });
    let bg = std::thread::spawn(move || {
        client.call::<ImageInfo>("POST", "/v1/images/pull", Some(&body))
    });
    assert!(
        wait_until(Duration::from_secs(30), || fetching(&d)),
        "the pull never got going"
    );
    d.kill9();
    let _ = bg.join();
    d.spawn();
    let tmp = d.data().join("layers/tmp");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "no half layer after the restart: {left:?}");
    let images: Vec<ImageInfo> = d.client.call("GET", "/v1/images", None).unwrap();
    assert!(
        !images.iter().any(|i| i.name.contains("forkd/c")),
        "no image"
    );
    let (ok, out, err) = pull(&d, &[&format!("{host}/forkd/c:1")]);
    assert!(ok, "{err}");
    let sb = d.create(serde_json::json!({ "image": out }));
    assert_eq!(
        d.sh(&sb.id, "cat /etc/pulled; wc -c < /big")
            .1
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["c", "4194304"]
    );
}

#[test]
fn a_build_pulls_its_missing_base_and_copy_from_images() {
    let name = "a_build_pulls_its_missing_base_and_copy_from_images";
    if !can_run(name) {
        return;
    }
    let Some(reg) = Registry::start(Path::new("/tmp/forkd-test-registry-build")) else {
        return;
    };
    push_image(
        &reg,
        "forkd/base",
        "1",
        &[base_layer(), top_layer("base\n")],
        "FROM_BASE=1",
    );
    push_image(&reg, "forkd/tool", "2", &[top_layer("tool\n")], "T=1");
    let d = daemon_with_registry("registry-build", &reg);
    let ctx = reg.dir.join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(
        ctx.join("Dockerfile"),
        format!(
            "FROM forkd/base:1\nCOPY --from={}/forkd/tool:2 /etc/pulled /tool\nRUN echo $FROM_BASE > /env\n",
            reg.host()
        ),
    )
    .unwrap();
    let out = d.cli(&["image", "build", "-t", "app:1", ctx.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sb = d.create(serde_json::json!({ "image": "app:1" }));
    assert_eq!(
        d.sh(&sb.id, "cat /etc/pulled /tool /env").1,
        "base\ntool\n1\n"
    );
    let images: Vec<ImageInfo> = d.client.call("GET", "/v1/images", None).unwrap();
    let names: Vec<&str> = images.iter().map(|i| i.name.as_str()).collect();
    let base = format!("{}/forkd/base:1", reg.host());
    assert!(
        names.contains(&base.as_str()),
        "the base was pulled and kept: {names:?}"
    );
    d.remove(&sb.id);
    // Built again: the base is here now, so the registry sees nothing.
    let before = reg.requests().len();
    let out = d.cli(&["image", "build", "-t", "app:1", ctx.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        reg.requests().len(),
        before,
        "{:?}",
        &reg.requests()[before..]
    );
    // A base that is nowhere: the error says what was tried.
    std::fs::write(ctx.join("Dockerfile"), "FROM forkd/nowhere:1\n").unwrap();
    let out = d.cli(&["image", "build", "-t", "app:2", ctx.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("line 1") && err.contains("manifest unknown"),
        "{err}"
    );
}

/// `forkd eval` on a Harbor task whose `docker_image` is on a registry: the image is
/// pulled once, and the verifier's CTRF report gives per-test outcomes.
#[test]
fn forkd_eval_pulls_a_harbor_tasks_docker_image() {
    let name = "forkd_eval_pulls_a_harbor_tasks_docker_image";
    if !can_run_criu(name) {
        return;
    }
    let Some(reg) = Registry::start(Path::new("/tmp/forkd-test-registry-eval")) else {
        return;
    };
    // busybox, with `bash` as a shell script over its sh (Harbor runs `bash test.sh`).
    let top = tar_with_modes(&[
        ("bin/bash", b"#!/bin/sh\nexec /bin/sh \"$@\"\n", 0o755),
        ("app/answer.txt", b"wrong\n", 0o644),
    ]);
    let top_blob = gzip(&top);
    push_image(
        &reg,
        "forkd/task",
        "1",
        &[
            base_layer(),
            ("application/vnd.oci.image.layer.v1.tar+gzip", top, top_blob),
        ],
        "PATH=/bin",
    );
    let suite = reg.dir.join("suite");
    let task = suite.join("answer");
    for d in ["tests", "solution"] {
        std::fs::create_dir_all(task.join(d)).unwrap();
    }
    std::fs::write(
        task.join("task.toml"),
        format!(
            "schema_version = \"1.4\"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 60\n[environment]\ndocker_image = \"{}/forkd/task:1\"\nworkdir = \"/app\"\nallow_internet = false\n",
            reg.host()
        ),
    )
    .unwrap();
    std::fs::write(
        task.join("instruction.md"),
        "Write 42 into /app/answer.txt.\n",
    )
    .unwrap();
    std::fs::write(
        task.join("solution/solve.sh"),
        "#!/bin/bash\necho 42 > /app/answer.txt\n",
    )
    .unwrap();
    std::fs::write(
        task.join("tests/test.sh"),
        r#"#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt)" = 42 ]; then a=passed; echo 1 > /logs/verifier/reward.txt; else a=failed; echo 0 > /logs/verifier/reward.txt; fi
printf '{"results":{"tests":[{"name":"test_answer","status":"%s"},{"name":"test_file","status":"passed"}]}}' "$a" > /logs/verifier/ctrf.json
"#,
    )
    .unwrap();
    let d = daemon_with_registry("registry-eval", &reg);
    let run = reg.dir.join("run");
    let out = d.cli(&[
        "eval",
        "run",
        suite.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--agents",
        "oracle,noop",
        "--conditions",
        "clean",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("pull "),
        "the image was pulled"
    );
    let rows = results(&run);
    assert_eq!(rows.len(), 2);
    for r in &rows {
        let oracle = r.agent == "oracle";
        assert_eq!(r.outcome == forkd_analysis::Outcome::Pass, oracle, "{r:?}");
        assert_eq!(r.tests.len(), 3, "reward and the two CTRF tests: {r:?}");
        assert_eq!(
            r.tests["test_answer"] == forkd_analysis::TestResult::Pass,
            oracle,
            "{r:?}"
        );
        assert_eq!(r.tests["test_file"], forkd_analysis::TestResult::Pass);
    }
    let manifests = reg
        .requests()
        .iter()
        .filter(|(m, p)| m == "GET" && p.ends_with("/manifests/1"))
        .count();
    assert_eq!(manifests, 1, "pulled once for the whole run");
}
