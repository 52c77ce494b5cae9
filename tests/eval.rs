//! The evaluator end to end against a real daemon, on the mini suite (busybox): validate,
//! residual states (kept and dropped, with reasons), the condition matrix, grading on
//! pristine forks, infrastructure failures kept apart, resume and its fingerprint, and
//! the report over the run.

#![forbid(unsafe_code)]

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
        // noop never passes; the oracle passes from every start state but the partial
        // fix, over which its patch does not apply (it submits nothing).
        let want = match (r.agent.as_str(), r.start_state.as_str()) {
            ("noop", _) => Outcome::Fail,
            ("oracle", "add.partial") => Outcome::NoSubmit,
            ("oracle", _) => Outcome::Pass,
            (agent, _) => panic!("unexpected agent {agent}"),
        };
        assert_eq!(r.outcome, want, "{r:?}");
        if r.condition == Condition::Clean {
            assert_eq!(r.predecessor, None);
        } else {
            assert!(r.predecessor.is_some(), "{r:?}");
        }
        let dir = run.join("trials").join(&r.trial_id);
        assert!(dir.join("attempts.jsonl").exists());
        assert!(dir.join("trajectory.jsonl").exists());
        // The SWE task is graded on a pristine copy of its files, no process of its state
        // there; the terminal task in a live fork of the final machine: the service runs
        // where noop left it, and not where the oracle stopped it, as asked.
        let ps = std::fs::read_to_string(dir.join("processes.txt"));
        match (r.task.as_str(), r.agent.as_str()) {
            ("add", _) => assert!(ps.is_err(), "{r:?}: {ps:?}"),
            (_, agent) => {
                let ps = ps.unwrap();
                assert_eq!(ps.contains("while true"), agent == "noop", "{r:?}: {ps}");
                assert!(!ps.contains("forkd-init"), "{ps}");
            }
        }
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
    // Rescues from the stray state pass (the oracle's); the note condition runs only where
    // the predecessor left a note, which the stray one does not.
    let stray_rescues: Vec<&TrialRow> = rows
        .iter()
        .filter(|r| {
            r.start_state == "add.stray"
                && r.agent == "oracle"
                && matches!(r.condition, Condition::RescueNotice | Condition::RescueNote)
        })
        .collect();
    assert!(!stray_rescues.is_empty());
    assert!(stray_rescues.iter().all(|r| r.outcome == Outcome::Pass));
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
    d.eval_run_clean(&suite, &run, &agents);
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

/// The forkd CLI where an agent's user can run it: a hard link (or copy) in `dir`, which
/// is world-readable, whatever the permissions of the checkout's directories.
fn cli_for_agents(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("forkd");
    if std::fs::hard_link(BIN, &bin).is_err() {
        std::fs::copy(BIN, &bin).unwrap();
    }
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

#[test]
fn agents_reach_only_their_own_trial_and_budget() {
    let name = "agents_reach_only_their_own_trial_and_budget";
    // The raw requests are Python's: without python3 they would be "refused" for nothing.
    if !can_run_criu(name) || !have_program(name, "python3") {
        return;
    }
    let d = TestDaemon::start("evalconfine");
    let work = d.root.parent().unwrap().to_path_buf();
    let suite = work.join("suite");
    copy_dir(&mini().join("add"), &suite.join("add"));
    let toml = std::fs::read_to_string(suite.join("add/task.toml")).unwrap();
    std::fs::write(
        suite.join("add/task.toml"),
        toml.replace("max_steps = 20", "max_steps = 4"),
    )
    .unwrap();
    let bin = cli_for_agents(&work);
    // A sibling trial's sandbox and a checkpoint of it, made on the daemon's own socket.
    let sibling: serde_json::Value = d
        .client
        .call(
            "POST",
            "/v1/sandboxes",
            Some(&serde_json::json!({ "image": "busybox" })),
        )
        .unwrap();
    let sibling = sibling["id"].as_str().unwrap().to_string();
    let ckpt: serde_json::Value = d
        .client
        .call(
            "POST",
            &format!("/v1/sandboxes/{sibling}/checkpoint"),
            Some(&serde_json::json!({})),
        )
        .unwrap();
    let ckpt = ckpt["id"].as_str().unwrap().to_string();
    let run = work.join("run");
    // Tries everything it must not do, says what happened, then fixes the bug with one
    // exec in its own sandbox.
    // A raw exec request on whatever socket FORKD_SOCKET names: exits 0 if it ran.
    let raw_exec = work.join("raw_exec.py");
    std::fs::write(
        &raw_exec,
        "import os, socket, sys\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.connect(os.environ['FORKD_SOCKET'])\n\
         body = b'{\"argv\": [\"true\"]}'\n\
         head = 'POST /v1/sandboxes/%s/exec HTTP/1.1\\r\\nHost: forkd\\r\\nContent-Length: %d\\r\\n\\r\\n' % (sys.argv[1], len(body))\n\
         s.sendall(head.encode() + body)\n\
         answer = s.recv(64)\n\
         sys.exit(0 if b' 200 ' in answer else 1)\n",
    )
    .unwrap();
    let hostile = work.join("hostile.sh");
    std::fs::write(
        &hostile,
        format!(
            r#"#!/bin/sh
F={bin}
try() {{ what=$1; shift; if "$@" >/dev/null 2>&1; then echo "LEAK $what"; else echo "refused $what"; fi; }}
echo "uid $(id -u)"
try read-tests cat {suite}/add/tests/check.sh
try read-solution cat {suite}/add/solution/patch.diff
try read-manifest cat {run}/manifest.json
echo "trials: $(ls {run}/trials | tr '\n' ' ')"
try main-socket $F --socket {main} ps
try exec-sibling $F exec {sibling} -- true
try exec-sibling-raw python3 {raw_exec} {sibling}
try own-exec-raw python3 {raw_exec} "$FORKD_SANDBOX"
try fork $F fork {ckpt}
try remove-checkpoint $F checkpoint rm -f {ckpt}
try remove-sibling $F rm -f {sibling}
try list-sandboxes $F ps
try own-inspect $F inspect "$FORKD_SANDBOX"
$F exec "$FORKD_SANDBOX" --sh -- "cd $FORKD_WORKDIR && sed -i 's/\$1 - \$2/\$1 + \$2/' app/add.sh"
"#,
            bin = bin.display(),
            suite = suite.display(),
            run = run.display(),
            main = d.socket.display(),
            raw_exec = raw_exec.display(),
        ),
    )
    .unwrap();
    // Runs one exec more than its budget, then claims success.
    let greedy = work.join("greedy.sh");
    std::fs::write(
        &greedy,
        format!(
            "#!/bin/sh\nfor i in 1 2 3 4 5; do {} exec \"$FORKD_SANDBOX\" -- true || echo \"refused step $i\"; done\nexit 0\n",
            bin.display()
        ),
    )
    .unwrap();
    let agents = format!(
        "oracle,hostile=sh {},greedy=sh {}",
        hostile.display(),
        greedy.display()
    );
    d.eval_run_clean(&suite, &run, &agents);
    let rows = results(&run);
    let by = |a: &str| {
        rows.iter()
            .find(|r| r.agent == a)
            .unwrap_or_else(|| panic!("no row for {a}: {rows:?}"))
    };
    let trial = |a: &str| run.join("trials").join(&by(a).trial_id);
    let grant = |a: &str| -> forkd::api::GrantInfo {
        serde_json::from_slice(&std::fs::read(trial(a).join("grant.json")).unwrap()).unwrap()
    };

    // The hostile agent: every attempt failed, and it says so in its own output.
    let said = std::fs::read_to_string(trial("hostile").join("agent.out")).unwrap();
    let uid: u32 = said
        .lines()
        .find_map(|l| l.strip_prefix("uid "))
        .unwrap_or_else(|| panic!("no uid line: {said}"))
        .parse()
        .unwrap();
    assert!(uid >= forkd::eval::confine::DEFAULT_UID_BASE, "{said}");
    for what in [
        "read-tests",
        "read-solution",
        "read-manifest",
        "main-socket",
        "exec-sibling",
        "exec-sibling-raw",
        "fork",
        "remove-checkpoint",
        "remove-sibling",
        "list-sandboxes",
    ] {
        assert!(said.contains(&format!("refused {what}")), "{what}: {said}");
    }
    assert!(
        said.contains("LEAK own-inspect"),
        "its own sandbox is its to inspect: {said}"
    );
    assert!(said.contains("LEAK own-exec-raw"), "and to exec in: {said}");
    // Of the run directory it sees only the way to its own directory.
    assert!(
        said.contains(&format!("trials: {} \n", by("hostile").trial_id)),
        "{said}"
    );
    assert!(
        !said.contains("LEAK read")
            && !said.contains("LEAK exec")
            && !said.contains("LEAK fork")
            && !said.contains("LEAK remove")
            && !said.contains("LEAK list")
            && !said.contains("LEAK main"),
        "{said}"
    );
    // The daemon refused each API attempt, and the trial's record keeps them.
    let g = grant("hostile");
    assert!(!g.active);
    assert_eq!(g.uid, uid);
    let refused: Vec<(&str, &str)> = g
        .refusals
        .iter()
        .map(|r| (r.method.as_str(), r.path.as_str()))
        .collect();
    // (The CLI's exec looks the sandbox up first: that is where it is refused.)
    for (method, path) in [
        ("GET", format!("/v1/sandboxes/{sibling}")),
        ("POST", format!("/v1/sandboxes/{sibling}/exec")),
        ("POST", format!("/v1/checkpoints/{ckpt}/fork")),
        ("DELETE", format!("/v1/checkpoints/{ckpt}")),
        ("DELETE", format!("/v1/sandboxes/{sibling}")),
        ("GET", "/v1/sandboxes".to_string()),
    ] {
        assert!(
            refused.iter().any(|(m, p)| *m == method && *p == path),
            "{method} {path} not among the refusals: {refused:?}"
        );
    }
    assert!(g.refusals.iter().all(|r| !r.budget), "{:?}", g.refusals);
    assert_eq!(g.steps, 2, "inspect is not a step; its two execs are");
    // Its grade is the oracle's: the attempts changed nothing it was graded on.
    assert_eq!(by("hostile").outcome, Outcome::Pass, "{:?}", by("hostile"));
    assert_eq!(by("hostile").tests, by("oracle").tests);
    assert_eq!(by("hostile").steps, 2);
    // The sibling and the checkpoint are untouched: no exec in the sibling's trajectory.
    let execs = d
        .client
        .raw("GET", &format!("/v1/sandboxes/{sibling}/execs"), &[])
        .unwrap()
        .body;
    assert!(execs.is_empty(), "{}", String::from_utf8_lossy(&execs));
    let _: serde_json::Value = d
        .client
        .call("GET", &format!("/v1/checkpoints/{ckpt}"), None)
        .expect("the checkpoint is still there");

    // The greedy agent: four execs ran, the fifth was refused for the budget, and the
    // trial is a budget exhaustion whatever the agent claimed.
    let g = grant("greedy");
    assert_eq!(g.steps, 4);
    assert!(
        g.refusals
            .iter()
            .any(|r| r.budget && r.reason.contains("4 execs")),
        "{:?}",
        g.refusals
    );
    assert_eq!(
        by("greedy").outcome,
        Outcome::BudgetExhausted,
        "{:?}",
        by("greedy")
    );
    assert_eq!(by("greedy").steps, 4);
    // Nothing of the grants is left.
    let left: Vec<_> = std::fs::read_dir(work.join("forkd.sock.grants"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name() != ".stage")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Every `forkd eval` subcommand prints JSON under `--json` (the one answer on stdout;
/// progress stays on stderr): validate, residualize, run, resume, decide, review,
/// report, and a sharded run's plan, shards, merge and status (`eval note` is checked
/// with its harness, tests/harness.rs).
#[test]
fn every_eval_subcommand_prints_json() {
    if !can_run_criu("every_eval_subcommand_prints_json") {
        return;
    }
    let d = TestDaemon::start("evaljson");
    let work = d.root.parent().unwrap().to_path_buf();
    let suite = work.join("suite");
    copy_dir(&mini(), &suite);
    let suite = suite.to_str().unwrap();
    let json = |args: &[&str], code: i32| -> serde_json::Value {
        let mut all = vec!["--json", "eval"];
        all.extend_from_slice(args);
        let out = d.cli(&all);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {text}"))
    };
    let path = |p: &Path| p.to_str().unwrap().to_string();

    let v = json(&["validate", suite], 0);
    assert_eq!((&v["valid"], &v["invalid"]), (&2.into(), &0.into()), "{v}");
    let names: Vec<&str> = v["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["add", "counter"], "{v}");
    // The terminal task is graded live, the SWE task on its files.
    assert_eq!(
        (&v["tasks"][0]["live"], &v["tasks"][1]["live"]),
        (&false.into(), &true.into())
    );

    let states = work.join("states");
    let v = json(&["residualize", suite, "--out", &path(&states)], 0);
    assert_eq!(v["status"], "states", "{v}");
    assert_eq!(v["states"].as_array().unwrap().len(), 3, "{v}");
    assert!(v["clean"]["add"].is_string(), "{v}");

    let run = work.join("run");
    let v = json(
        &[
            "run",
            suite,
            "--out",
            &path(&run),
            "--agents",
            "oracle,noop",
            "--conditions",
            "clean",
        ],
        0,
    );
    assert_eq!(
        (&v["status"], &v["trials"]),
        (&"done".into(), &4.into()),
        "{v}"
    );
    let oracle = v["summary"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["agent"] == "oracle")
        .unwrap();
    assert_eq!(
        (&oracle["pass"], &oracle["success"]),
        (&2.into(), &1.0.into()),
        "{v}"
    );
    let v = json(&["resume", &path(&run)], 0);
    assert_eq!(
        (&v["status"], &v["trials"]),
        (&"done".into(), &4.into()),
        "{v}"
    );
    let v = json(&["decide", &path(&run), "--note", "checked"], 0);
    assert_eq!(v["note"], "checked", "{v}");
    let v = json(&["review", &path(&states)], 0);
    assert_eq!(v["candidates"].as_array().unwrap().len(), 3, "{v}");
    assert_eq!(v["sheets"].as_array().unwrap().len(), 3, "{v}");
    let report = work.join("report");
    let v = json(
        &[
            "report",
            &path(&run),
            "--out",
            &path(&report),
            "--draws",
            "100",
        ],
        0,
    );
    assert!(
        v["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str().unwrap().ends_with("report.html")),
        "{v}"
    );

    // A sharded run: planned as a Kubernetes job, its shards run here by hand.
    let sharded = work.join("sharded");
    let job = work.join("job.json");
    let v = json(
        &[
            "run",
            suite,
            "--out",
            &path(&sharded),
            "--agents",
            "noop",
            "--conditions",
            "clean",
            "--kube",
            &path(&job),
        ],
        0,
    );
    assert_eq!(
        (&v["status"], &v["shards"]),
        (&"planned".into(), &2.into()),
        "{v}"
    );
    let v = json(&["shard", &path(&sharded), "--index", "0"], 0);
    assert_eq!(
        (&v["status"], &v["shard"]),
        (&"done".into(), &0.into()),
        "{v}"
    );
    // One shard of two done: the merge says which is not, with its own exit status.
    let v = json(&["merge", &path(&sharded)], 3);
    assert_eq!(
        (&v["status"], &v["unfinished_shards"]),
        (&"unfinished".into(), &serde_json::json!([1])),
        "{v}"
    );
    json(&["shard", &path(&sharded), "--index", "1"], 0);
    let v = json(&["merge", &path(&sharded)], 0);
    assert_eq!(
        (&v["status"], &v["trials"]),
        (&"done".into(), &2.into()),
        "{v}"
    );
    let v = json(&["status", &path(&sharded)], 0);
    let shards = v["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 2, "{v}");
    assert!(shards.iter().all(|s| s["state"] == "done"), "{v}");
}
