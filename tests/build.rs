//! `forkd image build` against a real daemon: steps in sandboxes, the step cache
//! (asserted from the step records), the image config in execs, multi-stage builds,
//! and failures that name their line and leave nothing behind.

#![forbid(unsafe_code)]

mod common;

use common::*;
use forkd::api::{BuildResult, BuildStatus, ImageInfo};
use std::path::{Path, PathBuf};
use std::process::Command;

const DOCKERFILE: &str = r#"# A two-stage build over busybox.
ARG GREETING=hi
FROM busybox AS builder
ARG GREETING
WORKDIR /src
COPY app/ ./
RUN echo "$GREETING from $(pwd)" > built.txt \
    # a comment inside the continuation
    && rm data.txt

FROM busybox
ENV APP_HOME=/opt/app MODE="a b"
COPY --from=builder /src $APP_HOME
ADD bundle.tar.gz /opt/
COPY --chown=nobody --chmod=600 app/data.txt /opt/app/secret
RUN rm /bin/vi
USER nobody
WORKDIR $APP_HOME
EXPOSE 8080
LABEL org.example.task="demo task"
ENTRYPOINT ["/bin/sh", "/opt/app/main.sh"]
CMD ["serve"]
RUN id -u > /tmp/ran-as
RUN ["/bin/sh", "-c", "echo exec form > /tmp/exec-form"]
"#;

fn context(base: &Path) -> PathBuf {
    let ctx = base.join("ctx");
    let _ = std::fs::remove_dir_all(&ctx);
    std::fs::create_dir_all(ctx.join("app")).unwrap();
    std::fs::create_dir_all(ctx.join("pkg")).unwrap();
    std::fs::write(ctx.join("app/main.sh"), "echo main \"$@\"\n").unwrap();
    std::fs::write(ctx.join("app/data.txt"), "data\n").unwrap();
    std::fs::write(ctx.join("app/skip.tmp"), "never copied\n").unwrap();
    std::fs::write(ctx.join(".dockerignore"), "**/*.tmp\npkg\n").unwrap();
    std::fs::write(ctx.join("pkg/readme"), "from the tarball\n").unwrap();
    let st = Command::new("tar")
        .args(["czf", "bundle.tar.gz", "pkg"])
        .current_dir(&ctx)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::write(ctx.join("Dockerfile"), DOCKERFILE).unwrap();
    ctx
}

fn build(d: &TestDaemon, body: serde_json::Value) -> Result<BuildResult, String> {
    d.client
        .call("POST", "/v1/images/build", Some(&body))
        .map_err(|e| e.to_string())
}

/// (line, cache) of every step, in order.
fn caches(r: &BuildResult) -> Vec<(usize, String)> {
    r.steps.iter().map(|s| (s.line, s.cache.clone())).collect()
}

fn cache_at(r: &BuildResult, line: usize) -> &str {
    &r.steps
        .iter()
        .find(|s| s.line == line)
        .unwrap_or_else(|| panic!("no step at line {line}"))
        .cache
}

#[test]
fn image_build_runs_steps_caches_them_and_applies_the_config() {
    if !can_run("image_build_runs_steps_caches_them_and_applies_the_config") {
        return;
    }
    let d = TestDaemon::start("build");
    let ctx = context(d.root.parent().unwrap());
    let req = serde_json::json!({ "context": ctx, "name": "demo:1" });

    let cold = build(&d, req.clone()).expect("cold build");
    let file_lines = [5, 6, 7, 13, 14, 15, 16, 18, 23, 24];
    for l in file_lines {
        assert_eq!(
            cache_at(&cold, l),
            "miss",
            "cold build, line {l}: {:?}",
            caches(&cold)
        );
    }
    for l in [3, 4, 11, 12, 17, 19, 20, 21, 22] {
        assert_eq!(
            cache_at(&cold, l),
            "config",
            "line {l}: {:?}",
            caches(&cold)
        );
    }
    // WORKDIR of a directory that exists writes nothing, so it makes no layer.
    assert!(cold
        .steps
        .iter()
        .find(|s| s.line == 18)
        .unwrap()
        .layer
        .is_none());
    let c = &cold.image.config;
    assert!(c.env.contains(&"APP_HOME=/opt/app".to_string()), "{c:?}");
    assert!(c.env.contains(&"MODE=a b".to_string()), "{c:?}");
    assert_eq!(c.working_dir.as_deref(), Some("/opt/app"));
    assert_eq!(c.user.as_deref(), Some("nobody"));
    assert_eq!(c.exposed_ports, vec!["8080/tcp"]);
    assert_eq!(c.labels["org.example.task"], "demo task");
    assert_eq!(c.entrypoint, vec!["/bin/sh", "/opt/app/main.sh"]);
    assert_eq!(c.cmd, vec!["serve"]);
    let inspected: ImageInfo = d.client.call("GET", "/v1/images/demo:1", None).unwrap();
    assert_eq!(inspected.layers, cold.image.layers);

    // A sandbox of the image: its execs start from the image's ENV, WORKDIR and USER.
    let sb = d.create(serde_json::json!({ "image": "demo:1" }));
    let (code, out, err) = d.sh(
        &sb.id,
        "pwd; id -u; echo $MODE; cat built.txt; ls; cat /opt/pkg/readme; \
         stat -c '%u %a' secret; test -e /bin/vi || echo vi-removed; sh main.sh x; \
         cat /tmp/ran-as /tmp/exec-form",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "/opt/app\n65534\na b\nhi from /src\nbuilt.txt\nmain.sh\nsecret\nfrom the tarball\n\
         65534 600\nvi-removed\nmain x\n65534\nexec form\n"
    );
    // A request's own values win over the image's.
    let r = d
        .exec(&sb.id, serde_json::json!({ "shell": "pwd; id -u; echo $MODE", "cwd": "/", "user": "0", "env": ["MODE=mine"] }))
        .unwrap();
    assert_eq!(
        String::from_utf8(decode(&r.stdout_b64)).unwrap(),
        "/\n0\nmine\n"
    );
    d.remove(&sb.id);

    // Nothing changed: every file step comes from the cache, the image is the same.
    let warm = build(&d, req.clone()).expect("warm build");
    for l in file_lines {
        assert_eq!(
            cache_at(&warm, l),
            "hit",
            "warm build, line {l}: {:?}",
            caches(&warm)
        );
    }
    assert_eq!(warm.image.layers, cold.image.layers);

    // A new modification time alone changes nothing either.
    let f = std::fs::File::options()
        .write(true)
        .open(ctx.join("app/main.sh"))
        .unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH).unwrap();
    drop(f);
    let touched = build(&d, req.clone()).unwrap();
    assert!(
        touched.steps.iter().all(|s| s.cache != "miss"),
        "{:?}",
        caches(&touched)
    );

    // A changed file: the steps before its COPY hit, the COPY and all after it run.
    std::fs::write(ctx.join("app/main.sh"), "echo changed\n").unwrap();
    let changed = build(&d, req.clone()).unwrap();
    assert_eq!(cache_at(&changed, 5), "hit");
    for l in [6, 7, 13, 14, 15, 16] {
        assert_eq!(
            cache_at(&changed, l),
            "miss",
            "line {l}: {:?}",
            caches(&changed)
        );
    }
    // An ignored file is not part of any digest.
    std::fs::write(ctx.join("app/skip.tmp"), "still never copied\n").unwrap();
    let ignored = build(&d, req.clone()).unwrap();
    assert!(
        ignored.steps.iter().all(|s| s.cache != "miss"),
        "{:?}",
        caches(&ignored)
    );

    // A build argument reaches the RUN that uses it, and misses from there.
    let mut with_arg = req.clone();
    with_arg["build_args"] = serde_json::json!({ "GREETING": "yo" });
    with_arg["name"] = "demo:arg".into();
    let argd = build(&d, with_arg).unwrap();
    assert_eq!(cache_at(&argd, 6), "hit", "{:?}", caches(&argd));
    assert_eq!(cache_at(&argd, 7), "miss", "{:?}", caches(&argd));
    let sb = d.create(serde_json::json!({ "image": "demo:arg" }));
    assert_eq!(d.sh(&sb.id, "cat built.txt").1, "yo from /src\n");
    d.remove(&sb.id);

    // --target builds one stage; the CLI shows every step and the cache.
    let out = d.cli(&[
        "image",
        "build",
        "--target",
        "builder",
        "-t",
        "demo:builder",
        ctx.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("line   6  COPY app/ ./  cached"),
        "{stderr}"
    );
    assert!(stderr.contains("0 steps run, 3 from cache"), "{stderr}");
    let b: ImageInfo = d
        .client
        .call("GET", "/v1/images/demo:builder", None)
        .unwrap();
    assert_eq!(b.config.working_dir.as_deref(), Some("/src"));
    let builds: Vec<BuildStatus> = d.client.call("GET", "/v1/builds", None).unwrap();
    assert!(builds.is_empty(), "{builds:?}");

    // FROM a file: a tarball (or OCI layout, docker-save archive) in the context is
    // imported once, then reused.
    std::fs::copy(busybox_tar(), ctx.join("base.tar")).unwrap();
    std::fs::write(
        ctx.join("Dockerfile.file"),
        "FROM ./base.tar\nRUN echo on-file-base > /f\n",
    )
    .unwrap();
    let req =
        serde_json::json!({ "context": ctx, "dockerfile": "Dockerfile.file", "name": "demo:file" });
    let first = build(&d, req.clone()).unwrap();
    assert_eq!(cache_at(&first, 2), "miss");
    let again = build(&d, req).unwrap();
    assert_eq!(cache_at(&again, 2), "hit");
    let sb = d.create(serde_json::json!({ "image": "demo:file" }));
    assert_eq!(d.sh(&sb.id, "cat /f").1, "on-file-base\n");
    d.remove(&sb.id);
}

/// Layer ids in the store.
fn layers(d: &TestDaemon) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d.data().join("layers"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "tmp")
        .collect();
    v.sort();
    v
}

fn cache_entries(d: &TestDaemon) -> usize {
    std::fs::read_dir(d.data().join("build-cache"))
        .map(|rd| rd.count())
        .unwrap_or(0)
}

#[test]
fn image_build_failures_name_the_line_and_leave_nothing_behind() {
    if !can_run("image_build_failures_name_the_line_and_leave_nothing_behind") {
        return;
    }
    let d = TestDaemon::start("buildfail");
    let base = d.root.parent().unwrap().to_path_buf();
    let ctx = base.join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(ctx.join("ok.txt"), "ok\n").unwrap();
    std::os::unix::fs::symlink("/etc", ctx.join("hostetc")).unwrap();
    std::fs::write(base.join("outside-secret"), "secret\n").unwrap();
    let cases: &[(&str, usize, &[&str])] = &[
        (
            "FROM busybox\nRUN echo made > /made\nCOPY ok.txt /ok.txt\nRUN echo failing-output; exit 7\n",
            4,
            &["exited with code 7", "failing-output"],
        ),
        ("FROM busybox\nRUN true\nFROBNICATE x\n", 3, &["FROBNICATE"]),
        ("FROM busybox\nRUN true\nCOPY ../outside-secret /x\n", 3, &["'..'", "leaves the build context"]),
        ("FROM busybox\nRUN true\nCOPY hostetc/passwd /x\n", 3, &["symlink", "not followed"]),
        ("FROM busybox\nCOPY /etc/passwd /x\n", 2, &["no such file or directory in the build context"]),
        ("FROM busybox\nRUN --network=host true\n", 2, &["default) or none"]),
        ("FROM busybox\nADD http://example.invalid/x /x\n", 2, &["URL"]),
        ("FROM no-such-image\n", 1, &["no such image"]),
        ("FROM busybox\nCOPY --from=nowhere /a /b\n", 2, &["no such stage", "no such image here"]),
    ];
    let images_before: Vec<ImageInfo> = d.client.call("GET", "/v1/images", None).unwrap();
    let layers_before = layers(&d);
    for (i, (text, line, words)) in cases.iter().enumerate() {
        let file = ctx.join(format!("Dockerfile.{i}"));
        std::fs::write(&file, text).unwrap();
        let err = build(
            &d,
            serde_json::json!({ "context": ctx, "dockerfile": format!("Dockerfile.{i}"), "name": format!("broken:{i}") }),
        )
        .unwrap_err();
        let want = format!("{} line {line}:", file.display());
        assert!(err.contains(&want), "case {i}: {err:?} lacks {want:?}");
        for w in *words {
            assert!(err.contains(w), "case {i}: {err:?} lacks {w:?}");
        }
        assert_eq!(layers(&d), layers_before, "case {i} left a layer");
        assert_eq!(cache_entries(&d), 0, "case {i} left a cache entry");
        let images: Vec<ImageInfo> = d.client.call("GET", "/v1/images", None).unwrap();
        assert_eq!(images.len(), images_before.len(), "case {i} left an image");
        let sandboxes: Vec<serde_json::Value> =
            d.client.call("GET", "/v1/sandboxes", None).unwrap();
        assert!(
            sandboxes.is_empty(),
            "case {i} left sandboxes: {sandboxes:?}"
        );
    }
    // The CLI says the same and exits non-zero.
    let out = d.cli(&[
        "image",
        "build",
        "-t",
        "broken:cli",
        "-f",
        ctx.join("Dockerfile.0").to_str().unwrap(),
        ctx.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("line 4:") && stderr.contains("failing-output"),
        "{stderr}"
    );
    // A RUN past its step timeout: its processes are killed and the build fails there.
    std::fs::write(
        ctx.join("Dockerfile.slow"),
        "FROM busybox\nRUN echo started; sleep 600\n",
    )
    .unwrap();
    let err = build(
        &d,
        serde_json::json!({ "context": ctx, "dockerfile": "Dockerfile.slow", "name": "slow", "step_timeout_secs": 1 }),
    )
    .unwrap_err();
    assert!(
        err.contains("line 2:") && err.contains("timed out after 1 s") && err.contains("started"),
        "{err}"
    );
    assert_eq!(layers(&d), layers_before);
    // Refusals before any work: a relative context.
    let err = build(&d, serde_json::json!({ "context": "rel/dir", "name": "x" })).unwrap_err();
    assert!(err.contains("absolute"), "{err}");
    assert_eq!(layers(&d), layers_before);
}

/// A build whose context comes in the request as a tar, from a key of scope own over
/// TCP: built, usable, and its context gone afterwards; a context that reaches out of
/// itself, or a name an image has, is refused by name and builds nothing.
#[test]
fn an_uploaded_context_builds_for_a_remote_key() {
    let name = "an_uploaded_context_builds_for_a_remote_key";
    if !can_run(name) {
        return;
    }
    let port = free_port();
    let host = format!("tcp://127.0.0.1:{port}");
    let d = TestDaemon::start_with_env(name, &[("FORKD_LISTEN", &host)]);
    let key = make_key(&d.root, "remote", "own");
    let env = [
        ("FORKD_TLS", "off".to_string()),
        ("FORKD_API_KEY", key.clone()),
    ];
    let endpoint = forkd::api::transport::Endpoint::parse(&host, &|k: &str| {
        env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    })
    .unwrap();
    let remote = forkd::client::Client::at(endpoint);
    let base = PathBuf::from(format!("/tmp/forkd-test-{name}-ctx-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(base.join("ctx/sub")).unwrap();
    std::fs::write(
        base.join("ctx/build.Dockerfile"),
        "FROM busybox\nARG WHO\nCOPY sub/ /opt/\nRUN echo \"$WHO\" > /opt/who\n",
    )
    .unwrap();
    std::fs::write(base.join("ctx/sub/data.txt"), "from the context\n").unwrap();
    let tar = |dir: &Path| {
        let out = Command::new("tar")
            .arg("-C")
            .arg(dir)
            .args(["-cf", "-", "."])
            .output()
            .unwrap();
        assert!(out.status.success());
        out.stdout
    };
    let path = |name: &str| {
        format!(
            "/v1/images/build/upload?name={name}&dockerfile=build.Dockerfile&build_args={}",
            forkd::api::url::encode(r#"{"WHO":"remote"}"#)
        )
    };
    let r = remote
        .raw("POST", &path("uploaded"), &tar(&base.join("ctx")))
        .unwrap();
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let sb = d.create(serde_json::json!({ "image": "uploaded" }));
    let (_, out, _) = d.sh(&sb.id, "cat /opt/data.txt /opt/who");
    assert_eq!(out, "from the context\nremote\n");
    let left: Vec<_> = std::fs::read_dir(d.data().join("build-contexts"))
        .map(|r| r.flatten().collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "the context went with the build: {left:?}");
    // Not over an image that exists, for a key of scope own.
    let again = remote
        .raw("POST", &path("uploaded"), &tar(&base.join("ctx")))
        .unwrap();
    assert_eq!(
        again.status,
        403,
        "{}",
        String::from_utf8_lossy(&again.body)
    );
    assert!(String::from_utf8_lossy(&again.body).contains("uploaded"));
    // An archive entry that leaves the context is refused, and nothing is built.
    let mut evil = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    evil.append_link(&mut h, "sub", "/etc").unwrap();
    let mut f = tar::Header::new_gnu();
    f.set_size(1);
    f.set_mode(0o644);
    evil.append_data(&mut f, "sub/x", &b"x"[..]).unwrap();
    let bad = remote
        .raw("POST", &path("evil"), &evil.into_inner().unwrap())
        .unwrap();
    assert_eq!(bad.status, 400, "{}", String::from_utf8_lossy(&bad.body));
    assert!(String::from_utf8_lossy(&bad.body).contains("symlink"));
    assert!(d
        .client
        .call::<serde_json::Value>("GET", "/v1/images/evil", None)
        .is_err());
    let _ = std::fs::remove_dir_all(&base);
}
