//! `forkd image pull` from a real registry (Debian's docker-registry, the CNCF
//! distribution registry) on loopback: an OCI index with several platforms and an
//! attestation, gzip and zstd layers, a short name resolved through registries.conf,
//! one manifest HEAD for an unchanged image, shared layers fetched once, errors that
//! name the reference, and a corrupt blob that leaves nothing behind.

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

/// The `Authorization` a push needs on an htpasswd registry that provisioned its own user.
fn htpasswd_push_auth(log: &str) -> Option<String> {
    let password = log.split("password=").nth(1)?.split_whitespace().next()?;
    Some(format!(
        "Basic {}",
        forkd::api::b64::encode(format!("docker:{password}").as_bytes())
    ))
}

#[test]
fn credentials_come_from_the_users_files_and_forkd_login() {
    let name = "credentials_come_from_the_users_files_and_forkd_login";
    if !can_run(name) {
        return;
    }
    let dir = Path::new("/tmp/forkd-test-registry-creds");
    let extra = format!(
        "auth:\n  htpasswd:\n    realm: forkd-test\n    path: {}/htpasswd\n",
        dir.display()
    );
    let Some(reg) = Registry::start_with(dir, &extra, Some(htpasswd_push_auth)) else {
        return;
    };
    let password = reg
        .push_auth
        .as_deref()
        .and_then(|a| forkd::api::b64::decode(a.trim_start_matches("Basic ")).ok())
        .map(|b| {
            String::from_utf8(b)
                .unwrap()
                .trim_start_matches("docker:")
                .to_string()
        })
        .unwrap();
    push_image(
        &reg,
        "forkd/app",
        "1",
        &[base_layer(), top_layer("secret\n")],
        "A=1",
    );
    // A credential helper of Docker's protocol, found on the daemon's PATH.
    let helpers = reg.dir.join("helpers");
    std::fs::create_dir_all(&helpers).unwrap();
    let helper = helpers.join("docker-credential-forkdtest");
    std::fs::write(
        &helper,
        format!(
            "#!/bin/sh\nread server\necho \"$server\" >> {0}/helper.log\nprintf '{{\"ServerURL\":\"%s\",\"Username\":\"docker\",\"Secret\":\"%s\"}}' \"$server\" '{password}'\n",
            helpers.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        helpers.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let d = daemon_with_registry_env("registry-creds", &reg, &[("PATH", &path)]);
    let reference = format!("{}/forkd/app:1", reg.host());

    let (ok, _, err) = pull(&d, &[&reference]);
    assert!(!ok);
    assert!(
        err.contains(&format!("401 on {reference}")) && err.contains("none were found"),
        "{err}"
    );

    // Docker's config with a wrong password: the error names the file.
    let docker = reg.dir.join("config.json");
    let b64 = |s: &str| forkd::api::b64::encode(s.as_bytes());
    std::fs::write(
        &docker,
        serde_json::json!({"auths": {reg.host(): {"auth": b64("docker:wrong")}}}).to_string(),
    )
    .unwrap();
    let (ok, _, err) = pull(&d, &[&reference]);
    assert!(!ok);
    assert!(
        err.contains(&format!("bad credentials from {}", docker.display())),
        "{err}"
    );

    // forkd login checks before it stores: a wrong password stores nothing.
    let authfile = reg.dir.join("auth.json");
    let login = |pw: &str| {
        let mut child = std::process::Command::new(BIN)
            .args(["login", "-u", "docker", "--password-stdin", "--authfile"])
            .arg(&authfile)
            .arg(reg.host())
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("{pw}\n").as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let out = login("wrong");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bad credentials"),
        "{out:?}"
    );
    assert!(!authfile.exists(), "nothing stored");
    let out = login(&password);
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&authfile).unwrap();
    assert!(
        text.contains(&reg.host()) && !text.contains(&password),
        "stored as base64: {text}"
    );

    // The containers auth file comes before Docker's config.
    let (ok, _, err) = pull(&d, &[&reference]);
    assert!(ok, "{err}");

    let out = d.cli(&[
        "logout",
        "--authfile",
        authfile.to_str().unwrap(),
        &reg.host(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let (ok, _, err) = pull(&d, &[&reference]);
    assert!(
        !ok,
        "after logout the wrong password of Docker's config is used again"
    );
    assert!(err.contains("bad credentials"), "{err}");
}

#[test]
fn bearer_tokens_and_redirects_carry_credentials_only_to_their_hosts() {
    let name = "bearer_tokens_and_redirects_carry_credentials_only_to_their_hosts";
    if !can_run(name) {
        return;
    }
    let dir = Path::new("/tmp/forkd-test-registry-bearer");
    let hosts = Path::new("/tmp/forkd-test-registry-bearer-hosts");
    let _ = std::fs::remove_dir_all(hosts);
    std::fs::create_dir_all(hosts).unwrap();
    // The token server also serves the registry's storage: the redirect's target.
    let token = Host::start(
        hosts,
        "token",
        &["token", dir.join("data").to_str().unwrap()],
    );
    let extra = format!(
        "auth:\n  silly:\n    realm: http://127.0.0.1:{0}/token\n    service: forkd-test\nmiddleware:\n  storage:\n    - name: redirect\n      options:\n        baseurl: http://127.0.0.1:{0}/\n",
        token.port
    );
    let Some(reg) = Registry::start_with(dir, &extra, Some(|_| Some("Bearer push".to_string())))
    else {
        return;
    };
    push_image(
        &reg,
        "forkd/app",
        "1",
        &[base_layer(), top_layer("via a token\n")],
        "A=1",
    );
    std::fs::write(
        reg.dir.join("config.json"),
        serde_json::json!({"auths": {reg.host(): {"auth": forkd::api::b64::encode(b"user:pass")}}})
            .to_string(),
    )
    .unwrap();
    let d = daemon_with_registry("registry-bearer", &reg);
    let (ok, out, err) = pull(&d, &["forkd/app:1"]);
    assert!(ok, "{err}");
    let sb = d.create(serde_json::json!({ "image": out }));
    assert_eq!(d.sh(&sb.id, "cat /etc/pulled").1, "via a token\n");

    let seen = token.requests();
    let tokens: Vec<_> = seen
        .iter()
        .filter(|r| r["path"].as_str().unwrap().starts_with("/token"))
        .collect();
    assert!(!tokens.is_empty(), "{seen:?}");
    for t in &tokens {
        let path = t["path"].as_str().unwrap();
        assert!(
            path.contains("service=forkd-test")
                && path.contains("scope=repository%3Aforkd%2Fapp%3Apull"),
            "{path}"
        );
        assert_eq!(
            t["auth"].as_str(),
            Some(format!("Basic {}", forkd::api::b64::encode(b"user:pass")).as_str())
        );
    }
    let files: Vec<_> = seen
        .iter()
        .filter(|r| r["path"].as_str().unwrap().contains("/blobs/"))
        .collect();
    assert_eq!(
        files.len(),
        3,
        "the two layers and the config came from the redirect's target: {seen:?}"
    );
    assert!(
        files.iter().all(|r| r["auth"].is_null()),
        "no credentials went to another host: {files:?}"
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
fn a_tls_registry_is_verified_with_the_cas_of_certs_d() {
    let name = "a_tls_registry_is_verified_with_the_cas_of_certs_d";
    if !can_run(name)
        || !require(
            name,
            Path::new("/usr/bin/openssl").exists(),
            "openssl missing (run fixtures/setup.sh packages)",
        )
    {
        return;
    }
    // Pushed over plain HTTP to one registry; served over TLS by another from the same storage.
    let Some(plain) = Registry::start(Path::new("/tmp/forkd-test-registry-tls-plain")) else {
        return;
    };
    push_image(
        &plain,
        "forkd/app",
        "1",
        &[base_layer(), top_layer("over tls\n")],
        "A=1",
    );
    let pki = plain.dir.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("/usr/bin/openssl")
            .args(args)
            .current_dir(&pki)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=forkd test CA",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(pki.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
    // A client certificate too: the registry wants one signed by the same CA.
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
        "-subj",
        "/CN=forkd-client",
    ]);
    std::fs::write(pki.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "client.cert",
        "-days",
        "2",
        "-extfile",
        "client.ext",
    ]);
    let extra = format!(
        "  tls:\n    certificate: {0}/server.crt\n    key: {0}/server.key\n    clientcas:\n      - {0}/ca.crt\n",
        pki.display()
    );
    let Some(tls) = Registry::start_on(
        Path::new("/tmp/forkd-test-registry-tls"),
        &plain.dir.join("data"),
        &extra,
        None,
    ) else {
        return;
    };
    // certs.d as containers-certs.d(5) has it: the CA, and the client's pair.
    let certs = plain.dir.join("certs.d");
    std::fs::create_dir_all(certs.join(tls.host())).unwrap();
    for f in ["ca.crt", "client.cert", "client.key"] {
        std::fs::copy(pki.join(f), certs.join(tls.host()).join(f)).unwrap();
    }
    let ca_only = plain.dir.join("ca-only.d");
    std::fs::create_dir_all(ca_only.join(tls.host())).unwrap();
    std::fs::copy(pki.join("ca.crt"), ca_only.join(tls.host()).join("ca.crt")).unwrap();
    let empty = plain.dir.join("no-certs.d");
    std::fs::create_dir_all(&empty).unwrap();
    // A loopback registry is verified when registries.conf says it is not insecure.
    let conf = plain.dir.join("registries.conf");
    std::fs::write(
        &conf,
        format!(
            "[[registry]]\nlocation = \"{}\"\ninsecure = false\n",
            tls.host()
        ),
    )
    .unwrap();
    let reference = format!("{}/forkd/app:1", tls.host());
    for (i, (certs_dir, works)) in [(&certs, true), (&ca_only, false), (&empty, false)]
        .into_iter()
        .enumerate()
    {
        let d = TestDaemon::start_with_env(
            &format!("registry-tls-{i}"),
            &[
                ("FORKD_REGISTRIES_CONF", conf.to_str().unwrap()),
                ("FORKD_CERTS_DIRS", certs_dir.to_str().unwrap()),
                (
                    "REGISTRY_AUTH_FILE",
                    plain.dir.join("none.json").to_str().unwrap(),
                ),
                ("DOCKER_CONFIG", plain.dir.to_str().unwrap()),
            ],
        );
        let (ok, _, err) = pull(&d, &[&reference]);
        assert_eq!(ok, works, "{err}");
        if works {
            let sb = d.create(serde_json::json!({ "image": reference }));
            assert_eq!(d.sh(&sb.id, "cat /etc/pulled").1, "over tls\n");
        } else {
            // Without the CA the server is not trusted; without the pair, the client not.
            let why = if i == 1 {
                "BadCertificate"
            } else {
                "UnknownIssuer"
            };
            assert!(err.contains(why), "{err}");
        }
    }
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

/// registries.conf as podman users write it: a short name found through a search
/// registry served by its mirror (the registry itself never reached), an alias, a
/// blocked namespace; `forkd run` pulls an image that is not here, and a short name
/// finds an image pulled under its full name.
#[test]
fn mirrors_aliases_and_blocked_registries_follow_registries_conf() {
    let name = "mirrors_aliases_and_blocked_registries_follow_registries_conf";
    if !can_run(name) {
        return;
    }
    let Some(reg) = Registry::start(Path::new("/tmp/forkd-test-registry-mirror")) else {
        return;
    };
    // The mirror keeps Docker Hub-like repositories under /hub.
    push_image(
        &reg,
        "hub/forkd/app",
        "1",
        &[base_layer(), top_layer("from the mirror\n")],
        "A=1",
    );
    let conf = reg.dir.join("mirrors.conf");
    std::fs::write(
        &conf,
        format!(
            "unqualified-search-registries = [\"mirrored.invalid\"]\n\
             [[registry]]\nprefix = \"mirrored.invalid\"\nlocation = \"mirrored.invalid\"\n\
             [[registry.mirror]]\nlocation = \"{0}/hub\"\n\
             [[registry]]\nprefix = \"{0}/secret\"\nblocked = true\n\
             [aliases]\n\"tool\" = \"mirrored.invalid/forkd/app\"\n",
            reg.host()
        ),
    )
    .unwrap();
    let d = TestDaemon::start_with_env(
        "registry-mirror",
        &[
            ("FORKD_REGISTRIES_CONF", conf.to_str().unwrap()),
            (
                "REGISTRY_AUTH_FILE",
                reg.dir.join("none.json").to_str().unwrap(),
            ),
            ("DOCKER_CONFIG", reg.dir.to_str().unwrap()),
        ],
    );
    // `forkd run` of an image that is not here pulls it first.
    let out = d.cli(&["run", "--rm", "forkd/app:1", "--", "cat", "/etc/pulled"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from the mirror\n");
    let images: Vec<ImageInfo> = d.client.call("GET", "/v1/images", None).unwrap();
    let img = images
        .iter()
        .find(|i| i.name == "mirrored.invalid/forkd/app:1")
        .expect("named as asked, not as mirrored");
    assert_eq!(img.source, "registry:mirrored.invalid/forkd/app:1");
    // The alias names the same image, which is here now: no request at all.
    let before = reg.requests().len();
    let out = d.cli(&["run", "--rm", "tool:1", "--", "cat", "/etc/pulled"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from the mirror\n");
    assert_eq!(reg.requests().len(), before);
    let out = d.cli(&[
        "run",
        "--rm",
        "--pull",
        "never",
        "forkd/missing:1",
        "--",
        "true",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("forkd image pull"),
        "{out:?}"
    );
    // A blocked namespace is refused before any request.
    let before = reg.requests().len();
    let (ok, _, err) = pull(&d, &[&format!("{}/secret/x:1", reg.host())]);
    assert!(!ok);
    assert!(
        err.contains("blocked") && err.contains(conf.to_str().unwrap()),
        "{err}"
    );
    assert_eq!(reg.requests().len(), before);
}
