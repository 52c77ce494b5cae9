//! The evaluator end to end against a real daemon, on the mini suite (busybox): validate,
//! residual states (kept and dropped, with reasons), the condition matrix, grading on
//! pristine forks, infrastructure failures kept apart, resume and its fingerprint, and
//! the report over the run.

mod common;

use common::*;
use forkd_analysis::{Condition, Outcome, TrialRow};
use std::path::{Path, PathBuf};

fn mini() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/suites/mini")
}

#[test]
fn evaluator_runs_the_matrix_and_grades_on_pristine_forks() {
    if !can_run_criu("evaluator_runs_the_matrix_and_grades_on_pristine_forks") {
        return;
    }
    let d = TestDaemon::start("eval");
    let sock = d.socket.to_str().unwrap().to_string();
    let work = d.root.parent().unwrap().to_path_buf();
    let suite = work.join("suite");
    copy_dir(&mini(), &suite);

    let out = d.cli(&["eval", "validate", suite.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches(" valid").count(), 2, "{text}");

    let run = work.join("run");
    let out = d.cli(&[
        "--socket",
        &sock,
        "eval",
        "run",
        suite.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--agents",
        "oracle,noop",
        "--conditions",
        "clean,residual,rescue_notice,rescue_note,pristine_control",
        "-k",
        "2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Residual states: kept when submitted, failing and changed; dropped otherwise, with reasons.
    let candidates: Vec<serde_json::Value> =
        std::fs::read_to_string(run.join("states/candidates.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    let kept: Vec<&str> = candidates
        .iter()
        .filter(|c| c["kept"] == true)
        .map(|c| c["candidate"].as_str().unwrap())
        .collect();
    assert_eq!(kept, ["add.partial", "add.stray", "counter.racy"]);
    let dropped = candidates
        .iter()
        .find(|c| c["candidate"] == "add.byproducts")
        .unwrap();
    assert!(
        dropped["reason"].as_str().unwrap().contains("byproducts"),
        "{dropped}"
    );
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("states/add.partial.json")).unwrap())
            .unwrap();
    assert_eq!(state["changed_files"], serde_json::json!(["app/add.sh"]));
    // Each kept state is a live checkpoint in the daemon.
    let cps: Vec<forkd::api::CheckpointInfo> =
        d.client.call("GET", "/v1/checkpoints", None).unwrap();
    let live_state = cps
        .iter()
        .find(|c| c.id == state["checkpoint"].as_str().unwrap())
        .unwrap();
    assert!(live_state.live);

    let rows = results(&run);
    // 2 tasks x clean (1 start) + residual/notice (3 states) + note (2 states with notes)
    // + pristine control (3 predecessors), x 2 agents x 2 replicates.
    assert_eq!(rows.len(), (2 + 3 + 3 + 2 + 3) * 2 * 2);
    for r in &rows {
        assert_ne!(r.outcome, Outcome::InfraError, "{r:?}");
        match (r.agent.as_str(), r.condition) {
            ("noop", _) => assert_eq!(r.outcome, Outcome::Fail, "{r:?}"),
            ("oracle", Condition::Clean | Condition::PristineControl) => {
                assert_eq!(r.outcome, Outcome::Pass, "{r:?}")
            }
            _ => {}
        }
        if r.condition == Condition::Clean {
            assert_eq!(r.predecessor, None);
        } else {
            assert!(r.predecessor.is_some(), "{r:?}");
        }
        let dir = run.join("trials").join(&r.trial_id);
        assert!(dir.join("attempts.jsonl").exists());
        assert!(dir.join("trajectory.jsonl").exists());
    }
    // The oracle's patch does not apply over the partial fix: inherited state hurts.
    let partial: Vec<&TrialRow> = rows
        .iter()
        .filter(|r| r.start_state == "add.partial" && r.agent == "oracle")
        .collect();
    assert!(
        partial.iter().all(|r| r.outcome == Outcome::NoSubmit),
        "{partial:?}"
    );
    // Rescues from the stray state pass; the note condition only where a note exists.
    assert!(rows
        .iter()
        .filter(|r| r.condition == Condition::RescueNote)
        .all(|r| r.predecessor.as_deref() != Some("stray")));
    // The trajectory of an oracle trial has its commands, the hidden tests never appear in it.
    let t = rows
        .iter()
        .find(|r| r.agent == "oracle" && r.task == "add" && r.condition == Condition::Clean)
        .unwrap();
    let traj = std::fs::read_to_string(
        run.join("trials")
            .join(&t.trial_id)
            .join("trajectory.jsonl"),
    )
    .unwrap();
    assert!(traj.contains("patch -p1"), "{traj}");
    assert!(!traj.contains(".tests"), "{traj}");
    assert!(
        std::fs::read_to_string(run.join("trials").join(&t.trial_id).join("final.patch")).is_ok()
    );
    assert!(run.join("results.csv").exists());

    // Resume: nothing left to do; the same rows.
    let out = d.cli(&["--socket", &sock, "eval", "resume", run.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(super_rows_len(&run), rows.len());
    // A changed task changes the fingerprint: resume is refused.
    std::fs::write(suite.join("add/instruction.md"), "changed\n").unwrap();
    let out = d.cli(&["--socket", &sock, "eval", "resume", run.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("different configuration"));
    let decisions = std::fs::read_to_string(run.join("decisions.jsonl")).unwrap();
    assert!(decisions.contains("\"start\"") && decisions.contains("\"resume\""));

    // The report reads the run.
    let report = work.join("report");
    let out = d.cli(&[
        "eval",
        "report",
        run.to_str().unwrap(),
        "--out",
        report.to_str().unwrap(),
        "--draws",
        "200",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(report.join("report.html")).unwrap();
    assert!(html.contains("<svg"));
}

fn super_rows_len(run: &Path) -> usize {
    results(run).len()
}

#[test]
fn infrastructure_failures_are_kept_apart_and_retried() {
    if !can_run_criu("infrastructure_failures_are_kept_apart_and_retried") {
        return;
    }
    let d = TestDaemon::start("evalinfra");
    let work = d.root.parent().unwrap().to_path_buf();
    let suite = work.join("suite");
    copy_dir(&mini().join("add"), &suite.join("add"));
    // A verifier that cannot run (command not found) is an infrastructure failure.
    let toml = std::fs::read_to_string(suite.join("add/task.toml")).unwrap();
    std::fs::write(
        suite.join("add/task.toml"),
        toml.replace("sh /testbed/.tests/check.sh", "no-such-verifier"),
    )
    .unwrap();
    let run = work.join("run");
    let out = d.cli(&[
        "--socket",
        d.socket.to_str().unwrap(),
        "eval",
        "run",
        suite.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--agents",
        "oracle",
        "--conditions",
        "clean",
        "--retries",
        "1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = results(&run);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].outcome, Outcome::InfraError);
    assert_eq!(rows[0].infra_attempts, 2);
    let attempts = std::fs::read_to_string(
        run.join("trials")
            .join(&rows[0].trial_id)
            .join("attempts.jsonl"),
    )
    .unwrap();
    assert_eq!(attempts.lines().count(), 2);
    assert!(attempts.contains("could not run"), "{attempts}");
}

#[test]
fn external_and_replay_agents_act_through_forkd_within_budgets() {
    if !can_run_criu("external_and_replay_agents_act_through_forkd_within_budgets") {
        return;
    }
    let d = TestDaemon::start("evalagents");
    let work = d.root.parent().unwrap().to_path_buf();
    let suite = work.join("suite");
    copy_dir(&mini().join("add"), &suite.join("add"));
    let toml = std::fs::read_to_string(suite.join("add/task.toml")).unwrap();
    std::fs::write(
        suite.join("add/task.toml"),
        toml.replace(
            "timeout_secs = 60\nmax_steps = 20",
            "timeout_secs = 5\nmax_steps = 4",
        ),
    )
    .unwrap();
    // An external agent: reads its request, acts with the forkd CLI on its sandbox.
    let fixer = work.join("fixer.sh");
    std::fs::write(
        &fixer,
        format!(
            "#!/bin/sh\nset -e\ngrep -q 'sum' \"$FORKD_INSTRUCTION\"\n{bin} --socket \"$FORKD_SOCKET\" exec \"$FORKD_SANDBOX\" --sh -- \"cd $FORKD_WORKDIR && sed -i 's/\\$1 - \\$2/\\$1 + \\$2/' app/add.sh\"\n",
            bin = BIN
        ),
    )
    .unwrap();
    // One that keeps running commands: stopped by the step budget.
    let busy = work.join("busy.sh");
    std::fs::write(&busy, format!("#!/bin/sh\nwhile true; do {BIN} --socket \"$FORKD_SOCKET\" exec \"$FORKD_SANDBOX\" -- true; done\n")).unwrap();
    // One that never ends: stopped by the wall clock.
    let slow = work.join("slow.sh");
    std::fs::write(&slow, "#!/bin/sh\nsleep 600\n").unwrap();
    // A replayed trajectory of shell lines.
    let replay = work.join("fixreplay.jsonl");
    std::fs::write(
        &replay,
        "cat app/add.sh\n{\"shell\": \"sed -i 's/- \\\\$2/+ \\\\$2/' app/add.sh\"}\n",
    )
    .unwrap();
    let agents = format!(
        "fixer=sh {},busy=sh {},slow=sh {},replay:{}",
        fixer.display(),
        busy.display(),
        slow.display(),
        replay.display()
    );
    let run = work.join("run");
    let out = d.cli(&[
        "--socket",
        d.socket.to_str().unwrap(),
        "eval",
        "run",
        suite.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--agents",
        &agents,
        "--conditions",
        "clean",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = results(&run);
    let by = |a: &str| {
        rows.iter()
            .find(|r| r.agent == a)
            .unwrap_or_else(|| panic!("no row for {a}: {rows:?}"))
    };
    assert_eq!(by("fixer").outcome, Outcome::Pass, "{:?}", by("fixer"));
    assert_eq!(by("fixer").steps, 1);
    assert_eq!(
        by("busy").outcome,
        Outcome::BudgetExhausted,
        "{:?}",
        by("busy")
    );
    assert_eq!(
        by("slow").outcome,
        Outcome::BudgetExhausted,
        "{:?}",
        by("slow")
    );
    assert_eq!(
        by("fixreplay").outcome,
        Outcome::Pass,
        "{:?}",
        by("fixreplay")
    );
    assert_eq!(by("fixreplay").steps, 2);
    let traj = std::fs::read_to_string(
        run.join("trials")
            .join(&by("fixreplay").trial_id)
            .join("trajectory.jsonl"),
    )
    .unwrap();
    assert!(
        traj.lines().next().unwrap().contains("cat app/add.sh"),
        "{traj}"
    );
}
