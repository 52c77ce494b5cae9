//! File identity: no two different files in a sandbox share (st_dev, st_ino), in a
//! sandbox after thousands of writes, in a live branch of it after more, in a branch of a
//! small (copied) checkpoint, in a build step, in branches of checkpoints made the way
//! older daemons made them and of imported archives; and a library whose dependency is
//! found by identity loads. Each check is `fixtures/identity/check.sh` run in the
//! sandbox: a walk of the whole root, `test -ef` and Python's `samefile` on pairs of
//! distinct files, and `cp` between them. See docs/DESIGN.md, "File identity".

#![forbid(unsafe_code)]

mod common;

use common::*;
use std::path::Path;

const CHECK: &str = include_str!("../fixtures/identity/check.sh");

/// Writes `files` small files spread over `dirs` directories under `dir`.
fn write_files(d: &TestDaemon, id: &str, dir: &str, dirs: usize, files: usize) {
    let line = format!(
        "set -e; i=0; while [ $i -lt {files} ]; do mkdir -p {dir}/d$((i % {dirs})); \
         echo \"file $i\" > {dir}/d$((i % {dirs}))/f$i; i=$((i + 1)); done"
    );
    let (code, _, err) = d.sh(id, &line);
    assert_eq!(code, 0, "write {files} files under {dir} in {id}: {err}");
}

/// Runs the three checks in sandbox `id` over the files written under `written`; panics
/// with their report unless all pass.
fn check_identity(d: &TestDaemon, id: &str, written: &str) -> String {
    d.put_file(id, "/tmp/identity-check.sh", CHECK.as_bytes());
    let (code, out, err) = d.sh(id, &format!("sh /tmp/identity-check.sh {written} 200"));
    assert_eq!(code, 0, "identity in {id}:\n{out}\n{err}");
    assert!(out.contains(" 0 (st_dev, st_ino) pairs shared"), "{out}");
    assert!(out.contains("cp worked for 200 of 200 pairs"), "{out}");
    out
}

#[test]
fn a_debian_sandbox_and_its_live_branch_have_unique_file_identity() {
    let name = "a_debian_sandbox_and_its_live_branch_have_unique_file_identity";
    if !can_run_criu(name) {
        return;
    }
    let Some(debian) = fixture(name, "images/debian.tar.zst", "debian") else {
        return;
    };
    let d = TestDaemon::start("identity-debian");
    d.import(&debian, "debian");
    let sb = d.create(
        serde_json::json!({ "image": "debian", "command": { "argv": ["sleep", "infinity"] } }),
    );
    write_files(&d, &sb.id, "/root/w", 100, 3000);
    let out = check_identity(&d, &sb.id, "/root/w");
    assert!(
        out.contains("os.path.samefile false for 200 of 200"),
        "{out}"
    );
    // The files a sandbox wrote keep their numbers in a branch of its live checkpoint
    // (the branch's layer is a snapshot of the checkpoint's), and what the branch writes
    // after is numbered apart from all of them.
    let (_, before, _) = d.sh(
        &sb.id,
        "stat -c '%i %n' /root/w/d7/f7 /etc/hostname /usr/bin/env",
    );
    let ck = d.checkpoint(&sb.id, true);
    let fork = d.fork(&ck.id, 1, false);
    let b = &fork.branches[0].id;
    let (_, after, _) = d.sh(
        b,
        "stat -c '%i %n' /root/w/d7/f7 /etc/hostname /usr/bin/env",
    );
    assert_eq!(before, after, "inode numbers across the live checkpoint");
    write_files(&d, b, "/root/w2", 50, 1000);
    check_identity(&d, b, "/root/w2");
    // The sandbox itself still holds its own.
    check_identity(&d, &sb.id, "/root/w");
}

#[test]
fn a_branch_of_a_small_copied_checkpoint_has_unique_file_identity() {
    let name = "a_branch_of_a_small_copied_checkpoint_has_unique_file_identity";
    if !can_run(name) {
        return;
    }
    let d = TestDaemon::start("identity-small");
    let sb = d.busybox();
    // A few files: the checkpoint copies the layer rather than snapshotting it.
    write_files(&d, &sb.id, "/root/w", 4, 40);
    let ck = d.checkpoint(&sb.id, false);
    assert!(
        ck.phases_us.contains_key("copy"),
        "a small layer is copied: {:?}",
        ck.phases_us
    );
    let fork = d.fork(&ck.id, 2, false);
    for b in &fork.branches {
        write_files(&d, &b.id, "/root/w2", 20, 600);
        let (code, out, err) = d.sh(&b.id, "cat /root/w/d3/f39");
        assert_eq!((code, out.as_str()), (0, "file 39\n"), "{err}");
        check_identity(&d, &b.id, "/root/w2");
    }
}

#[test]
fn a_build_step_has_unique_file_identity() {
    let name = "a_build_step_has_unique_file_identity";
    if !can_run(name) {
        return;
    }
    let Some(debian) = fixture(name, "images/debian.tar.zst", "debian") else {
        return;
    };
    let d = TestDaemon::start("identity-build");
    d.import(&debian, "debian");
    let ctx = d.data().join("identity-ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(ctx.join("check.sh"), CHECK).unwrap();
    std::fs::write(
        ctx.join("Dockerfile"),
        "FROM debian\n\
         RUN mkdir -p /opt/w && for i in $(seq 1 2000); do mkdir -p /opt/w/d$((i % 40)); echo $i > /opt/w/d$((i % 40))/f$i; done\n\
         COPY check.sh /check.sh\n\
         RUN sh /check.sh /opt/w 200 > /identity.txt 2>&1 || { cat /identity.txt; exit 1; }\n",
    )
    .unwrap();
    let out = d.cli(&[
        "image",
        "build",
        "-t",
        "identity:1",
        &ctx.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "build: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let sb = d.create(serde_json::json!({ "image": "identity:1" }));
    let (code, report, _) = d.sh(&sb.id, "cat /identity.txt");
    assert_eq!(code, 0);
    assert!(
        report.contains(" 0 (st_dev, st_ino) pairs shared"),
        "{report}"
    );
    assert!(report.contains("cp worked for 200 of 200"), "{report}");
    // And the image's sandbox, over the build's layers.
    write_files(&d, &sb.id, "/root/w", 30, 1500);
    check_identity(&d, &sb.id, "/root/w");
}

/// Checkpoints made before bases (no `base` in the record; the branch stacked the
/// checkpoint's layer over the image's layers) and imported archives fork into branches
/// over the base of their whole stack.
#[test]
fn old_checkpoints_and_imported_archives_fork_with_unique_identity() {
    let name = "old_checkpoints_and_imported_archives_fork_with_unique_identity";
    if !can_run_criu(name) {
        return;
    }
    let mut d = TestDaemon::start("identity-old");
    let sb = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "shell": "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done" }
    }));
    write_files(&d, &sb.id, "/root/w", 20, 800);
    let ck = d.checkpoint(&sb.id, true);
    let archive = d.data().join("old.forkd");
    let out = d.cli(&[
        "checkpoint",
        "export",
        &ck.id,
        &archive.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The record as an older daemon wrote it.
    let meta = d.data().join("checkpoints").join(&ck.id).join("meta.json");
    let mut rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    assert!(rec.get("base").is_some(), "{rec}");
    rec.as_object_mut().unwrap().remove("base");
    std::fs::write(&meta, serde_json::to_vec(&rec).unwrap()).unwrap();
    d.remove(&sb.id);
    d.kill9();
    d.spawn();
    let out = d.cli(&["checkpoint", "import", &archive.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let imported = String::from_utf8_lossy(&out.stdout).trim().to_string();
    for c in [ck.id.as_str(), imported.as_str()] {
        let fork = d.fork(c, 1, false);
        let b = &fork.branches[0].id;
        let n = d.read_number(b, "/tmp/n");
        assert!(n >= 1, "branch of {c}: the loop runs ({n})");
        let (code, out, _) = d.sh(b, "cat /root/w/d5/f785");
        assert_eq!((code, out.as_str()), (0, "file 785\n"));
        write_files(&d, b, "/root/w2", 20, 600);
        check_identity(&d, b, "/root/w2");
    }
}

/// The failure that showed the defect: glibc's loader takes an already loaded library
/// for the one a path names when the two share (st_dev, st_ino). A package with two
/// shared libraries, one needing a versioned symbol of the other (as numpy's bundled
/// libgfortran needs libquadmath's `QUADMATH_1.0`), is written where its files' inode
/// numbers run into those of the image's libraries: files are made until one is numbered
/// like a library Python has loaded (with overlapping numbering that happens; with
/// unique identity it cannot), then the package's files, and it must load.
#[test]
fn a_package_with_dependent_shared_libraries_loads() {
    let name = "a_package_with_dependent_shared_libraries_loads";
    if !can_run(name) {
        return;
    }
    let Some(debian) = fixture(name, "images/debian.tar.zst", "debian") else {
        return;
    };
    let d = TestDaemon::start("identity-libs");
    d.import(&debian, "debian");
    let sb = d.create(
        serde_json::json!({ "image": "debian", "command": { "argv": ["sleep", "infinity"] } }),
    );
    let build = r#"set -e
mkdir -p /src /pkg/libs && cd /src
cat > quad.c <<'C'
int quad_answer(void) { return 42; }
C
cat > quad.map <<'C'
QUADMATH_1.0 { global: quad_answer; local: *; };
C
cat > fort.c <<'C'
int quad_answer(void);
int fort_answer(void) { return quad_answer() + 1; }
C
gcc -shared -fPIC -o libquad.so.0 -Wl,-soname,libquad.so.0 -Wl,--version-script=quad.map quad.c
gcc -shared -fPIC -o libfort.so.5 -Wl,-soname,libfort.so.5 -Wl,-rpath,'$ORIGIN' fort.c -L. -l:libquad.so.0
objdump -T libfort.so.5 | grep -q QUADMATH_1.0
"#;
    let (code, out, err) = d.sh(&sb.id, build);
    assert_eq!(code, 0, "build the libraries: {out}{err}");
    // The inode number of a library the loader has loaded in a Python process, and files
    // made until the next one would take that number (or passed it).
    let place = r#"set -e
target=$(python3 -c 'import os
for l in open("/proc/self/maps"):
    p = l.split()[-1]
    if p.endswith(".so") or ".so." in p:
        print(os.stat(p).st_ino); break')
mkdir -p /fill; i=0
while :; do
    : > /fill/f$i; n=$(stat -c %i /fill/f$i)
    [ "$n" -ge $((target - 1)) ] && break
    i=$((i + 1)); [ $i -lt 200000 ] || break
done
cp /src/libquad.so.0 /pkg/libs/libquad.so.0
cp /src/libfort.so.5 /pkg/libs/libfort.so.5
echo "target $target placed $(stat -c %i /pkg/libs/libquad.so.0) after $i files"
"#;
    let (code, out, err) = d.sh(&sb.id, place);
    assert_eq!(code, 0, "place the libraries: {out}{err}");
    let load =
        "python3 -c 'import ctypes; print(ctypes.CDLL(\"/pkg/libs/libfort.so.5\").fort_answer())'";
    let (code, got, err) = d.sh(&sb.id, load);
    assert_eq!(code, 0, "{out}: load: {err}");
    assert_eq!(got.trim(), "43", "{out}");
}

/// Writes one task in Harbor's format under `suite`: Debian's image, a solution and a
/// verifier (`tests/test.sh`, which writes the reward), with `files` under `tests/`.
fn harbor_task(suite: &Path, name: &str, solve: &str, test: &str, files: &[(&str, &str)]) {
    let dir = suite.join(name);
    for sub in ["environment", "solution", "tests"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::fs::write(
        dir.join("task.toml"),
        "schema_version = \"1.4\"\n[agent]\ntimeout_sec = 300\n[verifier]\ntimeout_sec = 300\n\
         [environment]\nworkdir = \"/app\"\nallow_internet = false\n",
    )
    .unwrap();
    std::fs::write(dir.join("instruction.md"), format!("Task {name}.\n")).unwrap();
    std::fs::write(
        dir.join("environment/Dockerfile"),
        "FROM debian\nWORKDIR /app\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("solution/solve.sh"),
        format!("#!/bin/bash\nset -e\n{solve}\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("tests/test.sh"),
        format!(
            "#!/bin/bash\nmkdir -p /logs/verifier\nif {{ {test}\n}} >&2; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
        ),
    )
    .unwrap();
    for (f, text) in files {
        std::fs::write(dir.join("tests").join(f), text).unwrap();
    }
}

/// As a run of published tasks back to back found it: several tasks through the
/// evaluator in one daemon, then a task whose verifier, in its grading sandbox, loads a
/// library that needs a versioned symbol of another (after making files until the next
/// would be numbered like a library the loader has loaded) and runs the identity checks.
#[test]
fn the_evaluator_grades_a_library_loading_verifier_after_other_tasks() {
    let name = "the_evaluator_grades_a_library_loading_verifier_after_other_tasks";
    if !can_run(name) {
        return;
    }
    let Some(debian) = fixture(name, "images/debian.tar.zst", "debian") else {
        return;
    };
    let d = TestDaemon::start("identity-eval");
    d.import(&debian, "debian");
    let scratch = std::env::temp_dir().join(format!("forkd-identity-eval-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let suite = scratch.join("suite");
    for i in 0..3 {
        harbor_task(
            &suite,
            &format!("fill-{i}"),
            "for j in $(seq 1 1500); do mkdir -p /app/out/d$((j % 30)); echo $j > /app/out/d$((j % 30))/f$j; done",
            "[ \"$(find /app/out -type f | wc -l)\" = 1500 ]",
            &[],
        );
    }
    let libs = r#"mkdir -p /src /app/libs && cd /src
printf 'int quad_answer(void) { return 42; }\n' > quad.c
printf 'QUADMATH_1.0 { global: quad_answer; local: *; };\n' > quad.map
printf 'int quad_answer(void);\nint fort_answer(void) { return quad_answer() + 1; }\n' > fort.c
gcc -shared -fPIC -o /app/libs/libquad.so.0 -Wl,-soname,libquad.so.0 -Wl,--version-script=quad.map quad.c
gcc -shared -fPIC -o /app/libs/libfort.so.5 -Wl,-soname,libfort.so.5 -Wl,-rpath,'$ORIGIN' fort.c -L/app/libs -l:libquad.so.0"#;
    let verify = r#"target=$(python3 -c 'import os
for l in open("/proc/self/maps"):
    p = l.split()[-1]
    if ".so" in p:
        print(os.stat(p).st_ino); break')
mkdir -p /fill /pkg; for j in $(seq 1 300); do echo $j > /fill/w$j; done; i=0
while [ "$(: > /fill/f$i; stat -c %i /fill/f$i)" -lt $((target - 1)) ] && [ $i -lt 200000 ]; do i=$((i + 1)); done
cp /app/libs/libquad.so.0 /app/libs/libfort.so.5 /pkg/
[ "$(python3 -c 'import ctypes; print(ctypes.CDLL("/pkg/libfort.so.5").fort_answer())')" = 43 ] \
    && sh /tests/check.sh /fill 200"#;
    harbor_task(&suite, "zz-libs", libs, verify, &[("check.sh", CHECK)]);
    let run = scratch.join("run");
    d.eval_run_clean(&suite, &run, "oracle");
    let rows = results(&run);
    assert_eq!(rows.len(), 4, "{rows:#?}");
    for r in &rows {
        let trial = run.join("trials").join(&r.trial_id);
        let said = ["verifier.log", "infra_error.txt"]
            .map(|f| std::fs::read_to_string(trial.join(f)).unwrap_or_default())
            .join("\n");
        assert!(
            r.success(),
            "task {} was not solved: {r:#?}\n{said}",
            r.task
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
