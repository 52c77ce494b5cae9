//! Harbor (the PyPI package, 0.25.0, on its own Python 3.13) running tasks in Harbor's
//! own format on forkd through `harbor run --env forkd.harbor:ForkdEnvironment`:
//! Harbor's oracle agent solves the fixture tasks (reward 1.0 in Harbor's result.json),
//! its nop agent does not (0.0), four attempts are one image build, one golden sandbox,
//! one checkpoint and forks of it (from the daemon's own records), a service started by
//! the image's ENTRYPOINT runs in every trial, a two-stage Dockerfile builds, and a trial
//! started from a live forkd checkpoint (`--ek checkpoint=ID`) inherits its state.

#![forbid(unsafe_code)]

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn harbor_python(name: &str) -> Option<PathBuf> {
    let py = std::env::var_os("FORKD_HARBOR_PY")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("harbor/venv/bin/python"));
    let ok = Command::new(&py)
        .args(["-c", "import harbor.environments.base, forkd.harbor"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    let why = format!(
        "{} cannot import harbor and forkd.harbor (run fixtures/setup.sh harbor)",
        py.display()
    );
    require(name, ok, &why).then_some(py)
}

/// A daemon with the Debian fixture imported as `debian`, and Harbor's Python; None
/// (after a SKIP line, or a failure under CI) when root, CRIU (if `criu`), Harbor or the
/// fixture is missing.
fn harbor_setup(name: &str, tag: &str, criu: bool) -> Option<(TestDaemon, PathBuf)> {
    let ok = if criu {
        can_run_criu(name)
    } else {
        can_run(name)
    };
    if !ok {
        return None;
    }
    let py = harbor_python(name)?;
    let debian = fixture(name, "images/debian.tar.zst", "debian")?;
    let d = TestDaemon::start(tag);
    d.import(&debian, "debian");
    Some((d, py))
}

fn task() -> PathBuf {
    task_named("edit-greeting")
}

fn task_named(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/harbor/tasks")
        .join(name)
}

/// `harbor run --env forkd.harbor:ForkdEnvironment -p TASK -o JOBS ARGS...`.
fn harbor_command(
    d: &TestDaemon,
    py: &Path,
    task: &Path,
    jobs: &Path,
    args: &[&str],
) -> std::process::Output {
    let socket = [("FORKD_SOCKET", d.socket.display().to_string())];
    harbor_command_via(py, task, jobs, args, &socket)
}

/// The same, reaching the daemon as `via` says (its socket, or a host and key).
fn harbor_command_via(
    py: &Path,
    task: &Path,
    jobs: &Path,
    args: &[&str],
    via: &[(&str, String)],
) -> std::process::Output {
    Command::new(py.parent().unwrap().join("harbor"))
        .args(["run", "--env", "forkd.harbor:ForkdEnvironment", "-p"])
        .arg(task)
        .arg("-o")
        .arg(jobs)
        .args(args)
        .env_remove("FORKD_SOCKET")
        .envs(via.iter().map(|(k, v)| (*k, v.as_str())))
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .output()
        .expect("run harbor")
}

/// `harbor run` with the forkd backend; returns the job's result.json.
fn harbor_run(d: &TestDaemon, py: &Path, jobs: &Path, args: &[&str]) -> serde_json::Value {
    harbor_run_task(d, py, &task(), jobs, args)
}

fn harbor_run_task(
    d: &TestDaemon,
    py: &Path,
    task: &Path,
    jobs: &Path,
    args: &[&str],
) -> serde_json::Value {
    harbor_result(harbor_command(d, py, task, jobs, args), jobs, args)
}

/// The result.json of the job `out` ran in `jobs`, set aside.
fn harbor_result(out: std::process::Output, jobs: &Path, args: &[&str]) -> serde_json::Value {
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "harbor run {args:?} failed:\n{log}");
    let mut results: Vec<PathBuf> = std::fs::read_dir(jobs)
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with("done-"))
        .map(|e| e.path().join("result.json"))
        .filter(|p| p.is_file())
        .collect();
    results.sort();
    let path = results
        .last()
        .unwrap_or_else(|| panic!("no result.json in {}:\n{log}", jobs.display()));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    // Set the job aside, so the next run's result is the only one left.
    let n = std::fs::read_dir(jobs).unwrap().count();
    std::fs::rename(path.parent().unwrap(), jobs.join(format!("done-{n}"))).unwrap();
    v
}

/// The one eval of a job: (trials, errors, mean reward).
fn summary(result: &serde_json::Value) -> (u64, u64, f64) {
    let evals = result["stats"]["evals"].as_object().unwrap();
    assert_eq!(evals.len(), 1, "{result}");
    let e = evals.values().next().unwrap();
    (
        e["n_trials"].as_u64().unwrap(),
        e["n_errors"].as_u64().unwrap(),
        e["metrics"][0]["mean"].as_f64().unwrap(),
    )
}

fn metric(d: &TestDaemon, op: &str) -> u64 {
    let m: serde_json::Value = d.client.call("GET", "/v1/metrics", None).unwrap();
    m[op]["count"].as_u64().unwrap_or(0)
}

#[test]
fn harbor_runs_tasks_on_forks_of_one_checkpoint() {
    let Some((d, py)) = harbor_setup(
        "harbor_runs_tasks_on_forks_of_one_checkpoint",
        "harbor",
        true,
    ) else {
        return;
    };
    let jobs = d.root.parent().unwrap().join("jobs");

    // Four attempts of nop, four at a time: one golden sandbox, one checkpoint, and
    // every trial a branch of it (no sandbox is created but the golden one).
    let r = harbor_run(&d, &py, &jobs, &["--agent", "nop", "-k", "4", "-n", "4"]);
    assert_eq!(summary(&r), (4, 0, 0.0), "{r}");
    assert_eq!(
        metric(&d, "buildImage"),
        1,
        "environment/Dockerfile built once"
    );
    assert_eq!(
        metric(&d, "createSandbox"),
        1,
        "only the golden sandbox is created"
    );
    assert_eq!(metric(&d, "checkpointSandbox"), 1, "one checkpoint");
    // The four starts all wait for the golden checkpoint, then go as one fork request.
    assert_eq!(
        metric(&d, "forkCheckpoint"),
        1,
        "4 concurrent starts coalesced"
    );
    let cks: Vec<forkd::api::CheckpointInfo> =
        d.client.call("GET", "/v1/checkpoints", None).unwrap();
    assert_eq!(cks.len(), 1);
    assert!(
        cks[0].live && cks[0].labels.contains_key("forkd.harbor.key"),
        "{:?}",
        cks[0]
    );
    let golden = cks[0].id.clone();

    // The oracle solves it, from the same checkpoint (reused, not rebuilt).
    let r = harbor_run(&d, &py, &jobs, &["--agent", "oracle"]);
    assert_eq!(summary(&r), (1, 0, 1.0), "{r}");
    assert_eq!(metric(&d, "createSandbox"), 1);
    assert_eq!(metric(&d, "checkpointSandbox"), 1);
    assert_eq!(
        metric(&d, "buildImage"),
        1,
        "the checkpoint was reused: no build"
    );

    // Inherited start: a live checkpoint of a state whose file is already fixed, with a
    // process still running; nop from it passes, so the trial began in that state.
    let branch: forkd::api::ForkResult = d
        .client
        .call(
            "POST",
            &format!("/v1/checkpoints/{golden}/fork"),
            Some(&serde_json::json!({})),
        )
        .unwrap();
    let sb = &branch.branches[0].id;
    let (code, _, err) = d.sh(
        sb,
        "sed -i 's/greeting(\"world\")/greeting(\"forkd\")/' /app/greet.py",
    );
    assert_eq!(code, 0, "{err}");
    // A service left running (detached: the relay stays its waiter, as a daemon's parent).
    d.exec(
        sb,
        serde_json::json!({ "argv": ["sleep", "100000"], "detach": true, "log": "svc" }),
    )
    .unwrap();
    let ck = d.checkpoint(sb, true);
    d.remove(sb);
    let r = harbor_run(
        &d,
        &py,
        &jobs,
        &["--agent", "nop", "--ek", &format!("checkpoint={}", ck.id)],
    );
    assert_eq!(summary(&r), (1, 0, 1.0), "{r}");
    // Every trial's sandbox is gone.
    let left: Vec<serde_json::Value> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// A service started by the image's ENTRYPOINT (a start-up script, then `exec "$@"`) is
/// in the live checkpoint and answers in every trial; a two-stage Dockerfile builds; a
/// server the solution starts is there for the verifier (serve-sum).
/// Harbor on a harness host: the forkd backend reaches the daemon over TLS with an API
/// key (`FORKD_HOST`, `FORKD_CA_CERT`, `FORKD_API_KEY`), builds, checkpoints and forks
/// there, and Harbor's own verifier passes the oracle; the audit log names the key.
#[test]
fn harbor_reaches_the_daemon_over_tls_with_a_key() {
    let name = "harbor_reaches_the_daemon_over_tls_with_a_key";
    if !can_run_criu(name) {
        return;
    }
    let Some(py) = harbor_python(name) else {
        return;
    };
    let Some(debian) = fixture(name, "images/debian.tar.zst", "debian") else {
        return;
    };
    let Some((d, tls)) = start_tls("harbor-tls", &[]) else {
        return;
    };
    d.import(&debian, "debian");
    let key = make_key(&d.root, "harness-host", "full");
    let jobs = d.root.parent().unwrap().join("jobs");
    let args = ["--agent", "oracle"];
    let out = harbor_command_via(&py, &task(), &jobs, &args, &tls.env(&key));
    let r = harbor_result(out, &jobs, &args);
    assert_eq!(summary(&r), (1, 0, 1.0), "{r}");
    let audit = std::fs::read_to_string(d.root.join("audit.log")).unwrap();
    for op in [
        "buildImage",
        "createSandbox",
        "checkpointSandbox",
        "forkCheckpoint",
    ] {
        assert!(
            audit
                .lines()
                .any(|l| l.contains("\"harness-host\"") && l.contains(op)),
            "{op} by the key is not in the audit log:\n{audit}"
        );
    }
    assert!(!audit.contains(&key[4..]), "the key is in the audit log");
    let _ = std::fs::remove_dir_all(&tls.pki);
}

#[test]
fn harbor_builds_service_and_multi_stage_tasks() {
    let Some((d, py)) = harbor_setup(
        "harbor_builds_service_and_multi_stage_tasks",
        "harbor-build",
        true,
    ) else {
        return;
    };
    let jobs = d.root.parent().unwrap().join("jobs");
    for (i, t) in ["service-status", "word-count", "serve-sum"]
        .iter()
        .enumerate()
    {
        let task = task_named(t);
        let r = harbor_run_task(
            &d,
            &py,
            &task,
            &jobs,
            &["--agent", "oracle", "-k", "2", "-n", "2"],
        );
        assert_eq!(summary(&r), (2, 0, 1.0), "{t}: {r}");
        let r = harbor_run_task(&d, &py, &task, &jobs, &["--agent", "nop"]);
        assert_eq!(summary(&r), (1, 0, 0.0), "{t}: {r}");
        assert_eq!(metric(&d, "buildImage"), i as u64 + 1, "{t}: one build");
        assert_eq!(
            metric(&d, "checkpointSandbox"),
            i as u64 + 1,
            "{t}: one checkpoint"
        );
    }
    let images: Vec<forkd::api::ImageInfo> = d.client.call("GET", "/v1/images", None).unwrap();
    let svc = images
        .iter()
        .find(|i| i.name.starts_with("harbor/service-status"))
        .unwrap_or_else(|| panic!("{images:?}"));
    assert_eq!(svc.config.entrypoint, vec!["/usr/local/bin/start-services"]);
    // The service in a trial is the golden sandbox's, restored: a branch of the task's
    // checkpoint answers without anything having been started in it.
    let cks: Vec<forkd::api::CheckpointInfo> =
        d.client.call("GET", "/v1/checkpoints", None).unwrap();
    let ck = cks
        .iter()
        .find(|c| {
            c.labels
                .get("forkd.harbor.task")
                .is_some_and(|t| t.contains("service-status"))
        })
        .unwrap_or_else(|| panic!("{cks:?}"));
    assert!(ck.live);
    let b = d.fork(&ck.id, 1, false);
    let (code, out, err) = d.sh(&b.branches[0].id, "python3 /usr/local/bin/status-client");
    assert_eq!((code, out.as_str()), (0, "starting\n"), "{err}");
    d.remove(&b.branches[0].id);
}

/// A copy of the fixture task `edit-greeting` under `work/name` whose `[environment]`
/// network line is `network`.
fn task_with_network(work: &Path, name: &str, network: &str) -> PathBuf {
    let t = work.join(name);
    std::fs::create_dir_all(&t).unwrap();
    for f in ["instruction.md", "tests", "solution", "environment"] {
        let _ = Command::new("cp")
            .arg("-r")
            .arg(task().join(f))
            .arg(&t)
            .status();
    }
    let toml = std::fs::read_to_string(task().join("task.toml")).unwrap();
    assert!(toml.contains("allow_internet = false"));
    std::fs::write(
        t.join("task.toml"),
        toml.replace("allow_internet = false", network),
    )
    .unwrap();
    t
}

#[test]
fn harbor_network_policies_become_sandbox_networks() {
    let name = "harbor_network_policies_become_sandbox_networks";
    let Some((d, py)) = harbor_setup(name, "harbor-net", true) else {
        return;
    };
    let work = d.root.parent().unwrap().to_path_buf();
    // Wildcard hostnames cannot be enforced by address: refused before anything starts.
    let t = task_with_network(
        &work,
        "wildcard",
        "network_mode = \"allowlist\"\nallowed_hosts = [\"*.example.org\"]",
    );
    let out = harbor_command(&d, &py, &t, &work.join("jobs-refused"), &["--agent", "nop"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let results = walk_text(&work.join("jobs-refused"));
    // Harbor's console wraps the message in a box: compare with the frame taken out.
    let flat = |s: &str| {
        s.split(|c: char| c.is_whitespace() || c == '│')
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let want = "network_mode='allowlist' with wildcard hostnames is not supported by forkd";
    assert!(
        flat(&text).contains(want) || flat(&results).contains(want),
        "{text}\n{results}"
    );
    assert_eq!(metric(&d, "createSandbox"), 0, "nothing was started");

    // Public internet: the golden sandbox and the trial run with egress, and the oracle
    // still solves the task.
    let t = task_with_network(&work, "online", "allow_internet = true");
    let r = harbor_run_task(&d, &py, &t, &work.join("jobs"), &["--agent", "oracle"]);
    assert_eq!(summary(&r), (1, 0, 1.0), "{r}");
    let log = d.log();
    assert!(
        log.matches(": egress on eth0").count() >= 2,
        "golden and trial with egress:\n{log}"
    );
}

/// Every text file under `dir`, concatenated (Harbor writes a trial's exception there).
fn walk_text(dir: &Path) -> String {
    let mut out = String::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.push_str(&walk_text(&p));
            } else if let Ok(t) = std::fs::read_to_string(&p) {
                out.push_str(&t);
            }
        }
    }
    out
}

/// Harbor's Terminus-2 agent, its model a scripted endpoint: two turns (edit the file in
/// the tmux pane, then declare the task complete) and the confirmation Terminus-2 asks.
#[test]
fn terminus_2_drives_tmux_in_a_forkd_sandbox() {
    let Some((d, py)) = harbor_setup(
        "terminus_2_drives_tmux_in_a_forkd_sandbox",
        "terminus",
        true,
    ) else {
        return;
    };
    let work = d.root.parent().unwrap().to_path_buf();
    let turn = |commands: serde_json::Value, done: bool| {
        serde_json::json!({ "content": serde_json::json!({
            "analysis": "scripted", "plan": "scripted", "commands": commands, "task_complete": done,
        }).to_string() })
    };
    let script = serde_json::json!({
        "steps": [
            turn(serde_json::json!([
                {"keystrokes": "sed -i 's/greeting(\"world\")/greeting(\"forkd\")/' /app/greet.py\n", "duration": 0.3},
                {"keystrokes": "python3 /app/greet.py\n", "duration": 0.3},
            ]), false),
            turn(serde_json::json!([]), true),
        ],
        "repeat_last": true,
    });
    let path = work.join("script.json");
    std::fs::write(&path, serde_json::to_vec(&script).unwrap()).unwrap();
    let e = endpoint("python3", &path);
    let api_base = format!("api_base=http://127.0.0.1:{}/v1", e.port);
    let jobs = work.join("jobs");
    let args = [
        "--agent",
        "terminus-2",
        "-m",
        "openai/scripted",
        "--ak",
        &api_base,
        "--ak",
        "record_terminal_session=false",
    ];
    let harbor = |extra: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend_from_slice(extra);
        std::env::set_var("OPENAI_API_KEY", "unused");
        harbor_run(&d, &py, &jobs, &all)
    };
    let r = harbor(&[]);
    assert_eq!(summary(&r), (1, 0, 1.0), "{r}");
    // What Terminus-2 typed ran in the sandbox's tmux pane.
    let pane = walk_text(&jobs);
    assert!(
        pane.contains("python3 /app/greet.py") && pane.contains("Hello, forkd"),
        "{pane}"
    );

    // The same from a live forkd checkpoint that holds a running service.
    let cks: Vec<forkd::api::CheckpointInfo> =
        d.client.call("GET", "/v1/checkpoints", None).unwrap();
    let branch: forkd::api::ForkResult = d
        .client
        .call(
            "POST",
            &format!("/v1/checkpoints/{}/fork", cks[0].id),
            Some(&serde_json::json!({})),
        )
        .unwrap();
    let sb = &branch.branches[0].id;
    d.exec(
        sb,
        serde_json::json!({ "argv": ["sleep", "100000"], "detach": true, "log": "svc" }),
    )
    .unwrap();
    let ck = d.checkpoint(sb, true);
    d.remove(sb);
    let r = harbor(&["--ek", &format!("checkpoint={}", ck.id)]);
    assert_eq!(summary(&r), (1, 0, 1.0), "{r}");
    let requests = std::fs::read_to_string(work.join("requests.jsonl")).unwrap();
    assert_eq!(
        requests.lines().count(),
        6,
        "three model turns a run: {requests}"
    );
    drop(e);
}

/// `forkd eval` on Harbor task directories as they are: validate, then the clean and
/// residual conditions (a scripted predecessor's state) with oracle and noop, graded on
/// pristine forks through Harbor's own verifier (tests/test.sh and its reward file).
#[test]
fn forkd_eval_runs_harbor_task_directories() {
    let name = "forkd_eval_runs_harbor_task_directories";
    if !can_run_criu(name) {
        return;
    }
    if fixture(name, "images/debian.tar.zst", "debian").is_none() {
        return;
    }
    let d = TestDaemon::start("harbor-eval");
    let suite = task().parent().unwrap().to_path_buf();
    let out = d.cli(&["eval", "validate", suite.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(" valid"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = d.root.parent().unwrap().join("run");
    let out = d.cli(&[
        "eval",
        "run",
        suite.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--agents",
        "oracle,noop",
        "--conditions",
        "clean,residual,rescue_note",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = results(&run);
    // Four tasks (one built with a service in its ENTRYPOINT, one in two stages, one
    // whose solution starts a server), two agents, three conditions.
    assert_eq!(rows.len(), 24);
    for r in &rows {
        let want = if r.agent == "oracle" {
            forkd_analysis::Outcome::Pass
        } else {
            forkd_analysis::Outcome::Fail
        };
        assert_eq!(r.outcome, want, "{r:?}");
        if r.task == "edit-greeting" {
            // Its test.sh writes a CTRF report too: each check is kept beside the reward.
            let names: Vec<&str> = r.tests.keys().map(String::as_str).collect();
            assert_eq!(
                names,
                [
                    "reward",
                    "test_outputs.py::test_defines_greeting",
                    "test_outputs.py::test_prints_the_greeting"
                ],
                "{r:?}"
            );
            let prints = &r.tests["test_outputs.py::test_prints_the_greeting"];
            assert_eq!(
                *prints == forkd_analysis::TestResult::Pass,
                r.agent == "oracle",
                "{r:?}"
            );
        } else {
            assert_eq!(r.tests.len(), 1, "the reward is the one result: {r:?}");
        }
    }
    let candidates = std::fs::read_to_string(run.join("states/candidates.jsonl")).unwrap();
    assert!(candidates.contains("\"kept\":true"), "{candidates}");
}

/// The task's healthcheck runs on the golden sandbox before it is checkpointed: one that
/// never passes fails the trial by name, and no checkpoint or sandbox is left behind.
#[test]
fn failing_healthcheck_leaves_no_checkpoint() {
    let Some((d, py)) = harbor_setup(
        "failing_healthcheck_leaves_no_checkpoint",
        "harbor-health",
        false,
    ) else {
        return;
    };
    let work = d.root.parent().unwrap().to_path_buf();
    let t = work.join("unhealthy");
    copy_dir(&task(), &t);
    let toml = std::fs::read_to_string(t.join("task.toml")).unwrap();
    let toml = toml
        .replace(
            "command = \"test -f /app/greet.py",
            "command = \"test -f /app/absent.py",
        )
        .replace("retries = 3", "retries = 1");
    assert!(toml.contains("absent.py"));
    std::fs::write(t.join("task.toml"), toml).unwrap();
    let out = harbor_command(&d, &py, &t, &work.join("jobs"), &["--agent", "nop"]);
    let text = walk_text(&work.join("jobs")) + &String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("HealthcheckError") || text.contains("Healthcheck failed"),
        "{text}"
    );
    assert_eq!(
        metric(&d, "createSandbox"),
        1,
        "the golden sandbox was started"
    );
    assert_eq!(metric(&d, "checkpointSandbox"), 0, "and never checkpointed");
    let left: Vec<serde_json::Value> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// `forkd eval` on a task in the shape of published Terminal-Bench tasks whose verifier
/// queries a server the agent leaves running (serve-sum: no ENTRYPOINT, nothing runs at
/// the start, the solution starts the server):
/// - it validates, graded in a live fork of the trial's final state, as Harbor grades in
///   the trial's machine; the same task declared files-only is invalid, its server gone;
/// - oracle passes and noop fails from every start;
/// - its residual state keeps the predecessor's server: a rescuer that only fixes the
///   file passes from it, and fails from the clean state;
/// - a final state CRIU cannot keep is an infrastructure failure naming the process,
///   never graded on its files.
#[test]
fn forkd_eval_grades_with_the_services_the_agent_left_running() {
    let name = "forkd_eval_grades_with_the_services_the_agent_left_running";
    if !can_run_criu(name) {
        return;
    }
    if fixture(name, "images/debian.tar.zst", "debian").is_none() {
        return;
    }
    let d = TestDaemon::start("harbor-live");
    let work = d.root.parent().unwrap().to_path_buf();
    let suite = work.join("suite");
    copy_dir(&task_named("serve-sum"), &suite.join("serve-sum"));
    let json = |args: &[&str]| -> (bool, serde_json::Value) {
        let mut all = vec!["--json", "eval"];
        all.extend_from_slice(args);
        let out = d.cli(&all);
        let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{args:?}: not JSON ({e}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.success(), v)
    };

    // Valid, graded live.
    let (ok, v) = json(&["validate", suite.to_str().unwrap()]);
    assert!(ok, "{v}");
    assert_eq!(v["tasks"][0]["task"], "serve-sum", "{v}");
    assert_eq!(
        (&v["tasks"][0]["live"], &v["tasks"][0]["valid"]),
        (&true.into(), &true.into()),
        "{v}"
    );
    // Declared files-only, the solution's server is not in the graded copy.
    let files = work.join("files");
    copy_dir(&task_named("serve-sum"), &files.join("serve-sum"));
    std::fs::write(
        files.join("serve-sum/forkd.toml"),
        "[environment]\nlive = false\n",
    )
    .unwrap();
    let (ok, v) = json(&["validate", files.to_str().unwrap()]);
    assert!(!ok, "{v}");
    assert_eq!(
        (
            &v["tasks"][0]["live"],
            &v["tasks"][0]["solution"],
            &v["invalid"]
        ),
        (&false.into(), &"fail".into(), &1.into()),
        "{v}"
    );

    // The matrix, with a rescuer that fixes the file and starts nothing.
    let fix = work.join("fix-sum.sh");
    std::fs::write(
        &fix,
        "#!/bin/sh\nmkdir -p /app/public\nawk '{ s += $1 } END { print s }' /app/numbers.txt > /app/public/sum.txt\n",
    )
    .unwrap();
    let run = work.join("run");
    let agents = format!("oracle,noop,script:{}", fix.display());
    let (ok, v) = json(&[
        "run",
        suite.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--agents",
        &agents,
        "--conditions",
        "clean,residual,rescue_notice",
    ]);
    assert!(ok, "{v}");
    assert_eq!(
        (&v["status"], &v["trials"]),
        (&"done".into(), &9.into()),
        "{v}"
    );
    let rows = results(&run);
    assert_eq!(rows.len(), 9);
    for r in &rows {
        let want = match (r.agent.as_str(), r.condition) {
            ("oracle", _) => forkd_analysis::Outcome::Pass,
            ("noop", _) => forkd_analysis::Outcome::Fail,
            // The server it needs is the predecessor's, alive in the residual state.
            ("fix-sum", forkd_analysis::Condition::Clean) => forkd_analysis::Outcome::Fail,
            ("fix-sum", _) => forkd_analysis::Outcome::Pass,
            (a, _) => panic!("unexpected agent {a}"),
        };
        assert_eq!(r.outcome, want, "{r:?}");
    }
    // The residual state is live, and a branch of it has the predecessor's server
    // answering its wrong sum, nothing started in it.
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(run.join("states/serve-sum.last-line-lost.json")).unwrap(),
    )
    .unwrap();
    let ck = state["checkpoint"].as_str().unwrap();
    let cks: Vec<forkd::api::CheckpointInfo> =
        d.client.call("GET", "/v1/checkpoints", None).unwrap();
    assert!(cks.iter().any(|c| c.id == ck && c.live), "{cks:?}");
    let b = d.fork(ck, 1, false);
    let sb = &b.branches[0].id;
    let (code, got, err) = d.sh(
        sb,
        "python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://127.0.0.1:8080/sum.txt\", timeout=5).read().decode().strip())'",
    );
    let (_, all, _) = d.sh(sb, "awk '{ s += $1 } END { print s }' /app/numbers.txt");
    let (_, last, _) = d.sh(sb, "tail -n 1 /app/numbers.txt");
    assert_eq!(code, 0, "{err}");
    let (got, all, last): (i64, i64, i64) = (
        got.trim().parse().unwrap(),
        all.trim().parse().unwrap(),
        last.trim().parse().unwrap(),
    );
    assert_eq!(got, all - last, "the predecessor's near miss, served");
    d.remove(sb);
    // What ran when each trial was graded is kept, and a review sheet shows the state's.
    let oracle = rows.iter().find(|r| r.agent == "oracle").unwrap();
    let ps = std::fs::read_to_string(
        run.join("trials")
            .join(&oracle.trial_id)
            .join("processes.txt"),
    )
    .unwrap();
    assert!(ps.contains("python3 -m http.server 8080"), "{ps}");
    let (ok, v) = json(&["review", run.to_str().unwrap()]);
    assert!(ok, "{v}");
    let sheet = std::fs::read_to_string(run.join("review/serve-sum.last-line-lost.md")).unwrap();
    assert!(
        sheet.contains("## Processes running in the state") && sheet.contains("http.server"),
        "{sheet}"
    );

    // A final state CRIU cannot keep (a connection the server has not accepted):
    // an infrastructure failure naming the process, no grade on a copy of its files.
    let stuck = work.join("stuck.sh");
    std::fs::write(
        &stuck,
        "#!/bin/sh\nsetsid python3 -c 'import socket, time\n\
         s = socket.socket(); s.bind((\"127.0.0.1\", 7000)); s.listen(5)\n\
         c = socket.socket(); c.connect((\"127.0.0.1\", 7000)); time.sleep(100000)' \
         </dev/null >/dev/null 2>&1 &\nsleep 1\n",
    )
    .unwrap();
    let run2 = work.join("run-stuck");
    let agents = format!("script:{}", stuck.display());
    let (ok, v) = json(&[
        "run",
        suite.to_str().unwrap(),
        "--out",
        run2.to_str().unwrap(),
        "--agents",
        &agents,
        "--conditions",
        "clean",
        "--retries",
        "0",
    ]);
    assert!(ok, "{v}");
    let rows = results(&run2);
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].outcome,
        forkd_analysis::Outcome::InfraError,
        "{rows:?}"
    );
    let why = std::fs::read_to_string(
        run2.join("trials")
            .join(&rows[0].trial_id)
            .join("infra_error.txt"),
    )
    .unwrap();
    assert!(
        why.contains("seal the final state")
            && why.contains("live")
            && why.contains("(python3: python3 -c")
            && why.contains("In-flight connection"),
        "{why}"
    );
    assert!(!run2
        .join("trials")
        .join(&rows[0].trial_id)
        .join("verifier.log")
        .exists());
    // Nothing of the trial is left in the daemon.
    let cks: Vec<forkd::api::CheckpointInfo> =
        d.client.call("GET", "/v1/checkpoints", None).unwrap();
    assert!(
        !cks.iter()
            .any(|c| c.labels.get("forkd.eval.trial") == Some(&rows[0].trial_id)),
        "{cks:?}"
    );
    let left: Vec<serde_json::Value> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// Harbor's own E2B backend (`harbor run --env e2b`, E2B's SDK 2.63 in Harbor's
/// environment) pointed at forkd: each task's Dockerfile becomes an E2B template that
/// forkd builds (a start command's state checkpointed), trials are sandboxes of it, and
/// the oracle solves the fixture suite while nop does not. The multi-stage task is left
/// out: E2B's SDK refuses multi-stage Dockerfiles itself, before any request.
#[test]
fn harbor_runs_the_fixture_suite_through_its_e2b_backend() {
    let name = "harbor_runs_the_fixture_suite_through_its_e2b_backend";
    let Some(py) = harbor_python(name) else {
        return;
    };
    let e2b_ok = Command::new(&py)
        .args([
            "-c",
            "import harbor.environments.e2b as m; assert m._HAS_E2B",
        ])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !require(
        name,
        e2b_ok,
        "Harbor's environment lacks e2b (run fixtures/setup.sh harbor)",
    ) || !can_run_criu(name)
    {
        return;
    }
    let Some(debian) = fixture(name, "images/debian.tar.zst", "debian") else {
        return;
    };
    let port = free_port();
    let listen = format!("tcp://127.0.0.1:{port}");
    let d = TestDaemon::start_with_env("harbor-e2b", &[("FORKD_LISTEN", &listen)]);
    d.import(&debian, "debian");
    let key = make_key(&d.root, "harbor", "own");
    let url = format!("http://127.0.0.1:{port}");
    let jobs = d.root.parent().unwrap().join("jobs");
    let tasks = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/harbor/tasks");
    let run = |agent: &str| {
        let args = ["--agent", agent, "-n", "3", "-x", "word-count"];
        let out = Command::new(py.parent().unwrap().join("harbor"))
            .args(["run", "--env", "e2b", "-p"])
            .arg(&tasks)
            .arg("-o")
            .arg(&jobs)
            .args(args)
            .env_remove("FORKD_SOCKET")
            .env("E2B_API_KEY", &key)
            .env("E2B_API_URL", &url)
            .env("E2B_SANDBOX_URL", &url)
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .output()
            .expect("run harbor");
        harbor_result(out, &jobs, &args)
    };
    let oracle = run("oracle");
    assert_eq!(summary(&oracle), (3, 0, 1.0), "{oracle}");
    let nop = run("nop");
    assert_eq!(summary(&nop), (3, 0, 0.0), "{nop}");
    // Every task became an image of its own (built once: the second run found them),
    // and every trial's sandbox is gone.
    let images: Vec<forkd::api::ImageInfo> = d.client.call("GET", "/v1/images", None).unwrap();
    for t in ["edit-greeting", "serve-sum", "service-status"] {
        assert_eq!(
            images
                .iter()
                .filter(|i| i.name.starts_with(&format!("{t}__")))
                .count(),
            1,
            "{t}: {:?}",
            images.iter().map(|i| &i.name).collect::<Vec<_>>()
        );
    }
    let left: Vec<serde_json::Value> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    assert!(left.is_empty(), "sandboxes left: {left:?}");
}
