//! Where a pull goes and with what credentials, against a real registry (Debian's
//! docker-registry) on loopback: basic credentials from Docker's config, `forkd login`
//! and a credential helper; bearer tokens from the challenge's realm, with redirects that
//! carry no credentials; a TLS registry verified with the CA and client certificate of
//! certs.d; mirrors, aliases and blocked namespaces of registries.conf.

#![forbid(unsafe_code)]

mod common;

use common::registry::*;
use common::*;
use forkd::api::ImageInfo;
use std::path::Path;

/// The `Authorization` a push needs on an htpasswd registry that provisioned its own user.
fn htpasswd_push_auth(log: &str) -> Option<String> {
    let password = log.split("password=").nth(1)?.split_whitespace().next()?;
    Some(format!(
        "Basic {}",
        forkd::api::b64::encode(format!("docker:{password}").as_bytes())
    ))
}

/// A registry with htpasswd auth that made its own user, `docker`; and its password.
fn htpasswd_registry(dir: &Path) -> Option<(Registry, String)> {
    let extra = format!(
        "auth:\n  htpasswd:\n    realm: forkd-test\n    path: {}/htpasswd\n",
        dir.display()
    );
    let reg = Registry::start_with(dir, &extra, Some(htpasswd_push_auth))?;
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
    Some((reg, password))
}

#[test]
fn credentials_come_from_the_users_files_and_forkd_login() {
    let name = "credentials_come_from_the_users_files_and_forkd_login";
    if !can_run(name) {
        return;
    }
    let dir = Path::new("/tmp/forkd-test-registry-creds");
    let Some((reg, password)) = htpasswd_registry(dir) else {
        return;
    };
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
    make_pki(&pki);
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

/// The caller's credentials travel with its pull: a daemon with no credentials of its
/// own pulls from an htpasswd registry with those of `REGISTRY_AUTH_FILE` as the CLI and
/// the Python client find them; a wrong file is a 401 naming it; the credentials are in
/// no log.
#[test]
fn a_pull_carries_the_callers_credentials_to_a_daemon_with_none() {
    let name = "a_pull_carries_the_callers_credentials_to_a_daemon_with_none";
    if !can_run(name) {
        return;
    }
    let dir = Path::new("/tmp/forkd-test-registry-caller");
    let Some((reg, password)) = htpasswd_registry(dir) else {
        return;
    };
    push_image(
        &reg,
        "forkd/app",
        "1",
        &[base_layer(), top_layer("the caller's\n")],
        "A=1",
    );
    // The daemon's own credential files do not exist.
    let d = daemon_with_registry("registry-caller", &reg);
    let reference = format!("{}/forkd/app:1", reg.host());
    let caller = reg.dir.join("caller");
    std::fs::create_dir_all(&caller).unwrap();
    let b64 = |s: &str| forkd::api::b64::encode(s.as_bytes());
    let good = caller.join("auth.json");
    std::fs::write(
        &good,
        serde_json::json!({"auths": {reg.host(): {"auth": b64(&format!("docker:{password}"))}}})
            .to_string(),
    )
    .unwrap();
    let wrong = caller.join("wrong.json");
    std::fs::write(
        &wrong,
        serde_json::json!({"auths": {reg.host(): {"auth": b64("docker:wrong")}}}).to_string(),
    )
    .unwrap();
    // The CLI as the caller, with `file` as its credentials.
    let cli_as_caller = |file: &Path, args: &[&str]| {
        std::process::Command::new(BIN)
            .args(args)
            .env("FORKD_SOCKET", &d.socket)
            .env("REGISTRY_AUTH_FILE", file)
            .env("DOCKER_CONFIG", &caller)
            .output()
            .unwrap()
    };
    let cli_pull = |file: &Path| cli_as_caller(file, &["image", "pull", &reference]);
    let out = cli_pull(&wrong);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("401") && err.contains(&wrong.display().to_string()),
        "the 401 names the caller's file: {err}"
    );
    let out = cli_pull(&good);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sb = d.create(serde_json::json!({ "image": reference }));
    assert_eq!(d.sh(&sb.id, "cat /etc/pulled").1, "the caller's\n");
    d.remove(&sb.id);
    let _: serde_json::Value = d
        .client
        .call(
            "DELETE",
            &format!(
                "/v1/images/{}",
                forkd::api::url::encode(&reference).replace('/', "%2F")
            ),
            None,
        )
        .unwrap();

    // A build whose FROM is on that registry carries them too (the base is pulled again:
    // the image was removed above).
    let context = caller.join("context");
    std::fs::create_dir_all(&context).unwrap();
    std::fs::write(
        context.join("Dockerfile"),
        format!("FROM {reference} AS base\nENV BUILT=1\n"),
    )
    .unwrap();
    let context_arg = context.display().to_string();
    let cli_build = |file: &Path| {
        cli_as_caller(
            file,
            &[
                "image",
                "build",
                "-t",
                "built-with-callers-credentials",
                &context_arg,
            ],
        )
    };
    let out = cli_build(&wrong);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("401"), "{err}");
    let out = cli_build(&good);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for image in ["built-with-callers-credentials", reference.as_str()] {
        let _: serde_json::Value = d
            .client
            .call(
                "DELETE",
                &format!(
                    "/v1/images/{}",
                    forkd::api::url::encode(image).replace('/', "%2F")
                ),
                None,
            )
            .unwrap();
    }

    // The Python client, the same way.
    if let Some(py) = harness_python(name) {
        let out = std::process::Command::new(&py)
            .args([
                "-c",
                "import sys, forkd\nimg = forkd.Client().pull_image(sys.argv[1])\nprint(img.name)",
                &reference,
            ])
            .env("FORKD_SOCKET", &d.socket)
            .env("REGISTRY_AUTH_FILE", &good)
            .env("DOCKER_CONFIG", &caller)
            .env(
                "PYTHONPATH",
                Path::new(env!("CARGO_MANIFEST_DIR")).join("python/src"),
            )
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "python pull: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let log = d.log();
    assert!(
        !log.contains(&password),
        "the password is in the daemon's log"
    );
    assert!(
        !log.contains(&b64(&format!("docker:{password}"))),
        "the credentials are in the daemon's log"
    );
}
