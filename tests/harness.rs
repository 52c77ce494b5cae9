//! Real agent harnesses in `forkd eval`, end to end: mini-swe-agent 2.4.6 (the PyPI
//! package, through LiteLLM) with its model pointed at scripted OpenAI-compatible
//! endpoints on loopback (the one stand-in), run by `forkd eval run --agents ...` on a
//! bundled SWE task (more-itertools, Debian image) under the clean and residual
//! conditions, graded on pristine forks. One endpoint solves the task, one never
//! submits (the step budget ends it), one fails its first requests with 503 (retried
//! from the identical state, then passes), one is always down (infrastructure, kept apart).

#![forbid(unsafe_code)]

mod common;

use common::*;
use forkd_analysis::{Condition, Outcome, TrialRow};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A daemon and a copy of the bundled SWE task `mi-collapse-missing` in its work
/// directory's `suite/`: (daemon, harness Python, work directory, task directory).
fn bundled_task(name: &str, tag: &str) -> Option<(TestDaemon, String, PathBuf, PathBuf)> {
    if !can_run_criu(name) {
        return None;
    }
    let py = harness_python(name)?;
    let task_src = fixture(name, "suite/mi-collapse-missing", "suite")?;
    let d = TestDaemon::start(tag);
    let work = d.root.parent().unwrap().to_path_buf();
    let task = work.join("suite/mi-collapse-missing");
    copy_dir(&task_src, &task);
    Some((d, py, work, task))
}

/// `forkd eval run SUITE --out RUN ARGS...` with the harness environment.
fn eval_run(
    d: &TestDaemon,
    py: &str,
    suite: &Path,
    run: &Path,
    args: &[&str],
) -> std::process::Output {
    Command::new(BIN)
        .args(["--socket", d.socket.to_str().unwrap(), "eval", "run"])
        .arg(suite)
        .arg("--out")
        .arg(run)
        .args(args)
        .env("FORKD_PYTHON", py)
        .env(
            "PYTHONPATH",
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/src"),
        )
        // No retries inside the harness: an endpoint failure ends the attempt at once.
        .env("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")
        .output()
        .unwrap()
}

/// A mini-swe-agent config (JSON is YAML) whose model is the endpoint on `port`.
fn config(dir: &Path, name: &str, port: u16) -> PathBuf {
    let cfg = serde_json::json!({
        "agent": {
            "system_template": "You are a careful engineer.",
            "instance_template": "{{task}}",
            "cost_limit": 0,
        },
        "environment": { "timeout": 120, "interpreter": ["bash", "-c"], "env": { "PAGER": "cat" } },
        "model": {
            "model_name": "openai/scripted",
            // No retries in the OpenAI client either (it retries 5xx twice by default).
            "model_kwargs": {
                "api_base": format!("http://127.0.0.1:{port}/v1"),
                "api_key": "unused",
                "max_retries": 0,
            },
            "cost_tracking": "ignore_errors",
        },
    });
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    path
}

#[test]
fn mini_swe_agent_runs_in_forkd_eval_with_budgets_and_infrastructure_apart() {
    let name = "mini_swe_agent_runs_in_forkd_eval_with_budgets_and_infrastructure_apart";
    let Some((d, py, work, task)) = bundled_task(name, "harness") else {
        return;
    };
    // A small step budget, so the agent that never submits reaches it quickly.
    let toml = std::fs::read_to_string(task.join("task.toml")).unwrap();
    std::fs::write(
        task.join("task.toml"),
        toml.replace("max_steps = 150", "max_steps = 6"),
    )
    .unwrap();
    let instruction = std::fs::read_to_string(task.join("instruction.md")).unwrap();

    // The solving script: inspect, edit the file, check, submit (5 model turns).
    let patch = std::fs::read_to_string(task.join("solution/patch.diff")).unwrap();
    let edit = format!(
        "git checkout -q HEAD -- more_itertools/more.py more_itertools/more.pyi && \
         patch -p1 --no-backup-if-mismatch <<'FORKD_PATCH'\n{patch}FORKD_PATCH"
    );
    let solve = serde_json::json!([
        {"command": "git status --short"},
        {"command": "grep -n 'def collapse' more_itertools/more.py || echo 'no collapse'"},
        {"command": edit},
        {"command": "python3 -c 'import more_itertools as m; print(list(m.collapse([[1, [2]], 3])))'"},
        {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"},
    ]);
    let scripts = [
        ("solve", serde_json::json!({ "steps": solve })),
        (
            "idle",
            serde_json::json!({ "steps": [{"command": "ls"}], "repeat_last": true }),
        ),
        (
            "flaky",
            serde_json::json!({ "steps": solve, "fail_first": 2 }),
        ),
        (
            "down",
            serde_json::json!({ "steps": [], "always_fail": true }),
        ),
    ];
    let mut endpoints = Vec::new();
    let mut agents = Vec::new();
    for (n, script) in &scripts {
        let dir = work.join(format!("model-{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("script.json");
        std::fs::write(&path, serde_json::to_vec(script).unwrap()).unwrap();
        let e = endpoint(&py, &path);
        agents.push(format!(
            "mini-swe-agent:{}",
            config(&dir, n, e.port).display()
        ));
        endpoints.push(e);
    }
    let run = work.join("run");
    let pred = task.join("predecessors/bytes-split.patch");
    let agents = agents.join(",");
    let pred = format!("patch:{}", pred.display());
    let out = eval_run(
        &d,
        &py,
        &work.join("suite"),
        &run,
        &[
            "--agents",
            &agents,
            "--predecessors",
            &pred,
            "--conditions",
            "clean,residual",
            "--parallel",
            "2",
        ],
    );
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{log}");
    let rows = results(&run);
    assert_eq!(rows.len(), 8, "4 agents x (clean + 1 residual): {log}");
    let of = |agent: &str| -> Vec<&TrialRow> {
        rows.iter()
            .filter(|r| r.agent == format!("mini-swe-agent.{agent}"))
            .collect()
    };
    let trial = |r: &TrialRow| run.join("trials").join(&r.trial_id);

    // The solving agent passes from both starts, graded on pristine forks, with its
    // own steps and its trajectory kept with the trial.
    for r in of("solve") {
        assert_eq!(r.outcome, Outcome::Pass, "{r:?}\n{log}");
        assert!(r.submitted && r.infra_attempts == 0);
        assert_eq!(r.steps, 5, "model calls are the trial's steps");
        assert!(
            r.tests.len() >= 11
                && r.tests
                    .values()
                    .all(|t| *t == forkd_analysis::TestResult::Pass),
            "{:?}",
            r.tests
        );
        let traj: serde_json::Value =
            serde_json::from_slice(&std::fs::read(trial(r).join("agent/trajectory.json")).unwrap())
                .unwrap();
        assert_eq!(traj["info"]["exit_status"], "Submitted");
        assert_eq!(traj["info"]["mini_version"], "2.4.6");
        let messages = traj["messages"].as_array().unwrap();
        // The condition's text reaches the agent exactly (the instance template is `{{task}}`).
        assert_eq!(
            messages[1]["content"].as_str().unwrap().trim_end(),
            instruction.trim_end()
        );
        assert_eq!(
            messages.iter().filter(|m| m["role"] == "assistant").count(),
            5
        );
        // Its first observation is `git status` of its start: clean, or the predecessor's change.
        let first = messages[3]["content"].as_str().unwrap();
        match r.condition {
            Condition::Clean => assert!(!first.contains(" M more_itertools"), "{first}"),
            _ => assert!(first.contains(" M more_itertools/more.py"), "{first}"),
        }
        // The daemon's own trajectory of the trial: every command of the agent.
        let execs = std::fs::read_to_string(trial(r).join("trajectory.jsonl")).unwrap();
        assert_eq!(execs.lines().count(), 5, "{execs}");
    }
    // Never submits: the step budget ends it, recorded as such.
    for r in of("idle") {
        assert_eq!(r.outcome, Outcome::BudgetExhausted, "{r:?}");
        assert!(!r.submitted);
        assert_eq!(r.steps, 6);
    }
    // 503s on its first two requests: those attempts are infrastructure, retried from
    // the identical start, and the trial then passes; nothing is counted against it.
    let flaky = of("flaky");
    assert!(
        flaky.iter().all(|r| r.outcome == Outcome::Pass),
        "{flaky:?}"
    );
    assert_eq!(
        flaky.iter().map(|r| r.infra_attempts).sum::<u32>(),
        2,
        "{flaky:?}"
    );
    // Always down: an infrastructure failure after every retry, kept apart from failures.
    for r in of("down") {
        assert_eq!(r.outcome, Outcome::InfraError, "{r:?}");
        assert_eq!(r.infra_attempts, 3);
        let attempts = std::fs::read_to_string(trial(r).join("attempts.jsonl")).unwrap();
        assert_eq!(
            attempts
                .lines()
                .filter(|l| l.contains("infra_error"))
                .count(),
            3
        );
        assert!(
            attempts.contains("503") || attempts.contains("ServiceUnavailable"),
            "{attempts}"
        );
    }
    // Every sandbox and branch of the run is gone.
    let left: Vec<serde_json::Value> = d.client.call("GET", "/v1/sandboxes", None).unwrap();
    assert!(left.is_empty(), "{left:?}");
    drop(endpoints);
}

#[test]
fn broken_harness_configuration_fails_the_run_before_any_trial() {
    let name = "broken_harness_configuration_fails_the_run_before_any_trial";
    if !can_run(name) {
        return;
    }
    let Some(py) = harness_python(name) else {
        return;
    };
    let d = TestDaemon::start("harness-bad");
    let work = d.root.parent().unwrap().to_path_buf();
    let suite = work.join("suite");
    copy_dir(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/suites/mini"),
        &suite,
    );
    let bad = work.join("bad.yaml");
    std::fs::write(
        &bad,
        "model:\n  model_class: no.such.ModelClass\n  model_name: x\n",
    )
    .unwrap();
    let run = work.join("run");
    let out = Command::new(BIN)
        .args(["--socket", d.socket.to_str().unwrap(), "eval", "run"])
        .arg(&suite)
        .arg("--out")
        .arg(&run)
        .arg("--agents")
        .arg(format!("mini-swe-agent:{}", bad.display()))
        .env("FORKD_PYTHON", &py)
        .env(
            "PYTHONPATH",
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/src"),
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("mini-swe-agent.bad") && err.contains("no.such.ModelClass"),
        "{err}"
    );
    assert!(!run.join("results.jsonl").exists(), "no trial ran");
    let out = d.cli(&[
        "eval",
        "run",
        suite.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--agents",
        "mini-swe-agent:/no/such.yaml",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such.yaml"));
}

#[test]
fn harness_predecessor_leaves_a_handoff_note_for_rescue_note() {
    let name = "harness_predecessor_leaves_a_handoff_note_for_rescue_note";
    let Some((d, py, work, task)) = bundled_task(name, "harness-note") else {
        return;
    };
    // The task's own scripted predecessors are not used here: the harness one is.
    std::fs::remove_dir_all(task.join("predecessors")).unwrap();
    let note =
        "HANDOFF-7f3a: I added a stub collapse() that returns its input; it does not flatten.";
    let pred_script = serde_json::json!({
        "steps": [
            {"command": "git status --short"},
            {"command": "printf '\\ndef collapse(iterable, base_type=None, levels=None):\\n    return iterable\\n' >> more_itertools/more.py"},
            {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"},
        ],
        "note": note,
    });
    let patch = std::fs::read_to_string(task.join("solution/patch.diff")).unwrap();
    let solve_script = serde_json::json!({ "steps": [
        {"command": format!("git checkout -q HEAD -- more_itertools/more.py more_itertools/more.pyi && patch -p1 --no-backup-if-mismatch <<'FORKD_PATCH'\n{patch}FORKD_PATCH")},
        {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"},
    ]});
    let mut endpoints = Vec::new();
    let mut specs = Vec::new();
    for (n, script) in [("pred", pred_script), ("rescuer", solve_script)] {
        let dir = work.join(format!("model-{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("script.json");
        std::fs::write(&path, serde_json::to_vec(&script).unwrap()).unwrap();
        let e = endpoint(&py, &path);
        specs.push(format!(
            "mini-swe-agent:{}",
            config(&dir, n, e.port).display()
        ));
        endpoints.push(e);
    }
    let run = work.join("run");
    let out = eval_run(
        &d,
        &py,
        &work.join("suite"),
        &run,
        &[
            "--agents",
            &specs[1],
            "--predecessors",
            &specs[0],
            "--conditions",
            "rescue_note",
        ],
    );
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{log}");
    let state = "mi-collapse-missing.mini-swe-agent.pred";
    let written = std::fs::read_to_string(run.join(format!("states/{state}.note.md"))).unwrap();
    assert_eq!(written.trim(), note, "{log}");
    let rows = results(&run);
    assert_eq!(rows.len(), 1, "{log}");
    let r = &rows[0];
    assert_eq!(
        (r.condition, r.outcome),
        (Condition::RescueNote, Outcome::Pass),
        "{r:?}"
    );
    // The rescuer was told the notice, the request and the note, exactly as the condition defines.
    let traj: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            run.join("trials")
                .join(&r.trial_id)
                .join("agent/trajectory.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let told = traj["messages"][1]["content"].as_str().unwrap();
    assert!(
        told.starts_with("A previous coding agent attempted this task but did not solve it."),
        "{told}"
    );
    assert!(told.contains(note), "{told}");
    // The same note by hand, from the predecessor's trajectory.
    let pred_traj = run
        .join("trials")
        .join(format!("predecessor.{state}"))
        .join("agent/trajectory.json");
    let by_hand = work.join("note.md");
    let out = Command::new(BIN)
        .args([
            "--socket",
            d.socket.to_str().unwrap(),
            "--json",
            "eval",
            "note",
        ])
        .arg(&pred_traj)
        .args(["--agent", &specs[0], "--out"])
        .arg(&by_hand)
        .env("FORKD_PYTHON", &py)
        .env(
            "PYTHONPATH",
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/src"),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&by_hand).unwrap().trim(), note);
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(said["note"], by_hand.to_str().unwrap(), "{said}");
    drop(endpoints);
}
