//! Residual start states as SWE-Residual built them: patch-on-base reconstruction (the
//! predecessor's changes uncommitted on the base commit, its history and messages gone),
//! a patch that no longer applies recorded as a loss, recorded human review with its
//! rule and fingerprint, and the loss table of `forkd eval report`. On the bundled task
//! `mi-windowed-step` (Debian fixture) and its `commits` predecessor, which works in two
//! commits with messages.

#![forbid(unsafe_code)]

mod common;

use common::*;
use std::path::{Path, PathBuf};

const MARKERS: &[&str] = &[
    "predecessor-marker-commit-one",
    "predecessor-marker-commit-two",
];

/// A daemon with the Debian image, and a suite holding a copy of `mi-windowed-step` whose
/// predecessors are only `keep` (plus `extra` files written into predecessors/), with
/// `residual` appended to its `[residual]` section.
fn setup(
    name: &str,
    tag: &str,
    keep: &[&str],
    extra: &[(&str, &str)],
    residual: &str,
) -> Option<(TestDaemon, PathBuf, PathBuf)> {
    if !can_run_criu(name) {
        return None;
    }
    let src = fixture(name, "suite/mi-windowed-step", "suite")?;
    let debian = fixture(name, "images/debian.tar.zst", "debian")?;
    let d = TestDaemon::start(tag);
    d.import(&debian, "debian");
    let work = d.root.parent().unwrap().to_path_buf();
    let task = work.join("suite/mi-windowed-step");
    copy_dir(&src, &task);
    for e in std::fs::read_dir(task.join("predecessors"))
        .unwrap()
        .flatten()
    {
        let n = e.file_name().to_string_lossy().to_string();
        if !keep.iter().any(|k| n.starts_with(&format!("{k}."))) {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    for (file, text) in extra {
        std::fs::write(task.join("predecessors").join(file), text).unwrap();
    }
    let toml = std::fs::read_to_string(task.join("task.toml")).unwrap();
    assert!(toml.contains("[residual]\n"));
    std::fs::write(
        task.join("task.toml"),
        toml.replace("[residual]\n", &format!("[residual]\n{residual}\n")),
    )
    .unwrap();
    Some((d, work.join("suite"), work))
}

/// `eval run` of the suite with noop on the residual condition, two reviewers needed.
fn run_args<'a>(suite: &'a str, run: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        suite,
        "--out",
        run,
        "--agents",
        "noop",
        "--conditions",
        "residual",
        "--reviewers",
        "2",
    ]
}

fn eval(d: &TestDaemon, args: &[&str]) -> std::process::Output {
    let mut a = vec!["eval"];
    a.extend_from_slice(args);
    d.cli(&a)
}

/// `forkd eval residualize SUITE --out RUN`, which must succeed.
fn residualize(d: &TestDaemon, suite: &Path, run: &Path) {
    ok(&eval(
        d,
        &[
            "residualize",
            suite.to_str().unwrap(),
            "--out",
            run.to_str().unwrap(),
        ],
    ));
}

fn ok(out: &std::process::Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    text
}

fn state(run: &Path, id: &str) -> serde_json::Value {
    let p = run.join("states").join(format!("{id}.json"));
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

/// The last line of `states/candidates.jsonl` about `candidate`.
fn end_of(run: &Path, candidate: &str) -> serde_json::Value {
    std::fs::read_to_string(run.join("states/candidates.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .rfind(|v| v["candidate"] == candidate)
        .unwrap_or_else(|| panic!("no line for {candidate}"))
}

#[test]
fn patch_states_hold_the_changes_uncommitted_and_none_of_the_history() {
    let name = "patch_states_hold_the_changes_uncommitted_and_none_of_the_history";
    let Some((d, suite, work)) = setup(
        name,
        "res-patch",
        &["commits"],
        &[],
        "reconstruct = \"patch\"",
    ) else {
        return;
    };
    let run = work.join("run-patch");
    residualize(&d, &suite, &run);
    let st = state(&run, "mi-windowed-step.commits");
    assert_eq!(st["reconstruct"], "patch");
    let b = &d
        .fork(st["checkpoint"].as_str().unwrap(), 1, false)
        .branches[0];
    let wd = "cd /testbed && ";
    let (_, status, _) = d.sh(&b.id, &format!("{wd}git status --porcelain"));
    assert!(
        status.contains("more_itertools/more.py") && status.contains("NOTES-windowed.md"),
        "uncommitted changes: {status}"
    );
    let (_, log, _) = d.sh(&b.id, &format!("{wd}git log --format=%s"));
    assert_eq!(log.lines().count(), 1, "only the base commit: {log}");
    let (code, found, _) = d.sh(
        &b.id,
        &format!(
            "{wd}grep -rl -e {} -e {} .git; echo rc=$?",
            MARKERS[0], MARKERS[1]
        ),
    );
    assert!(
        code == 0 && found.trim() == "rc=1",
        "a predecessor message is in .git: {found}"
    );
    let (_, src, _) = d.sh(
        &b.id,
        &format!("{wd}grep -c '# predecessor: the last window' more_itertools/more.py"),
    );
    assert_eq!(
        src.trim(),
        "1",
        "the predecessor's change is in the work tree"
    );
    // The patch is against the base commit: both commits' changes are in it.
    let patch = std::fs::read_to_string(run.join("states/mi-windowed-step.commits.patch")).unwrap();
    assert!(
        patch.contains("NOTES-windowed.md") && patch.contains("test_windowed_note.py"),
        "{patch}"
    );
    d.remove(&b.id);

    // exact: the predecessor's final state, commits and messages kept.
    let toml = std::fs::read_to_string(suite.join("mi-windowed-step/task.toml")).unwrap();
    std::fs::write(
        suite.join("mi-windowed-step/task.toml"),
        toml.replace("reconstruct = \"patch\"", "reconstruct = \"exact\""),
    )
    .unwrap();
    let run = work.join("run-exact");
    residualize(&d, &suite, &run);
    let st = state(&run, "mi-windowed-step.commits");
    assert_eq!(st["reconstruct"], "exact");
    let b = &d
        .fork(st["checkpoint"].as_str().unwrap(), 1, false)
        .branches[0];
    let (_, log, _) = d.sh(&b.id, &format!("{wd}git log --format=%s"));
    assert_eq!(log.lines().count(), 3, "{log}");
    assert!(MARKERS.iter().all(|m| log.contains(m)), "{log}");
}

#[test]
fn a_patch_that_does_not_apply_is_a_recorded_loss() {
    let name = "a_patch_that_does_not_apply_is_a_recorded_loss";
    // A patch predecessor made against a more.py that is not the clean state's.
    let stale = "--- a/more_itertools/more.py\n+++ b/more_itertools/more.py\n@@ -1,3 +1,3 @@\n-this line is not in the file\n+nor is this one\n context that does not exist\n context either\n";
    let Some((d, suite, work)) = setup(
        name,
        "res-stale",
        &["step-padding", "stale"],
        &[("stale.patch", stale)],
        "reconstruct = \"patch\"",
    ) else {
        return;
    };
    let run = work.join("run");
    residualize(&d, &suite, &run);
    let end = end_of(&run, "mi-windowed-step.stale");
    assert_eq!(end["stage"], "reconstruction", "{end}");
    assert_eq!(end["kept"], false);
    let reason = end["reason"].as_str().unwrap();
    assert!(
        reason.contains("error: patch failed: more_itertools/more.py:1"),
        "{reason}"
    );
    assert!(!run.join("states/mi-windowed-step.stale.json").exists());
    // The other predecessor is rebuilt from its patch file and kept.
    assert_eq!(end_of(&run, "mi-windowed-step.step-padding")["kept"], true);
    assert_eq!(
        state(&run, "mi-windowed-step.step-padding")["reconstruct"],
        "patch"
    );

    // The loss table says where it went.
    let report = work.join("report");
    ok(&eval(
        &d,
        &[
            "report",
            run.to_str().unwrap(),
            "--out",
            report.to_str().unwrap(),
        ],
    ));
    let losses = std::fs::read_to_string(report.join("residual_losses.csv")).unwrap();
    assert!(
        losses.lines().any(|l| l.starts_with("reconstruction,2,1,")),
        "{losses}"
    );
    let drops = std::fs::read_to_string(report.join("residual_drops.csv")).unwrap();
    assert!(
        drops.contains("mi-windowed-step.stale") && drops.contains("patch failed"),
        "{drops}"
    );
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert!(md.contains("where candidates were lost"), "{md}");
}

#[test]
fn review_decides_which_candidates_become_states() {
    let name = "review_decides_which_candidates_become_states";
    let Some((d, suite, work)) = setup(
        name,
        "res-review",
        &["commits"],
        &[],
        "reconstruct = \"patch\"",
    ) else {
        return;
    };
    let c = "mi-windowed-step.commits";
    let s = suite.to_str().unwrap();
    // 1. The run stops before its trials while the candidate awaits review.
    let run = work.join("run-a");
    let text = ok(&eval(&d, &run_args(s, run.to_str().unwrap())));
    assert!(text.contains("await review"), "{text}");
    assert!(
        !run.join("results.jsonl").exists()
            || std::fs::read_to_string(run.join("results.jsonl"))
                .unwrap()
                .is_empty()
    );
    // Sheets: the request, the diff, the trajectory, the filters' verdict.
    ok(&eval(&d, &["review", run.to_str().unwrap()]));
    let sheet = std::fs::read_to_string(run.join(format!("review/{c}.md"))).unwrap();
    assert!(
        sheet.contains("## Request") && sheet.contains("windowed"),
        "{sheet}"
    );
    assert!(
        sheet.contains("NOTES-windowed.md") && sheet.contains("## Trajectory"),
        "{sheet}"
    );
    assert!(run.join(format!("review/{c}.html")).is_file());
    // Bad decisions are refused and write nothing.
    let log_before = std::fs::read_to_string(run.join("decisions.jsonl")).unwrap();
    let r = run.to_str().unwrap();
    for (args, want) in [
        (
            vec![
                "review",
                r,
                "--candidate",
                "mi-windowed-step.nobody",
                "--reviewer",
                "alice",
                "--accept",
            ],
            "no candidate",
        ),
        (
            vec![
                "review",
                r,
                "--candidate",
                c,
                "--reviewer",
                "alice",
                "--reject",
                "--criterion",
                "looks-odd",
            ],
            "unknown criterion",
        ),
        (
            vec![
                "review",
                r,
                "--candidate",
                c,
                "--reviewer",
                "alice",
                "--reject",
            ],
            "names the criterion",
        ),
    ] {
        let out = eval(&d, &args);
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    assert_eq!(
        std::fs::read_to_string(run.join("decisions.jsonl")).unwrap(),
        log_before
    );
    // Two reviewers, one rejecting: the candidate is dropped, with the criterion.
    ok(&eval(
        &d,
        &[
            "review",
            r,
            "--candidate",
            c,
            "--reviewer",
            "alice",
            "--accept",
        ],
    ));
    let out = eval(
        &d,
        &[
            "review",
            r,
            "--candidate",
            c,
            "--reviewer",
            "alice",
            "--accept",
        ],
    );
    assert!(!out.status.success(), "a reviewer decides once");
    ok(&eval(
        &d,
        &[
            "review",
            r,
            "--candidate",
            c,
            "--reviewer",
            "bob",
            "--reject",
            "--criterion",
            "task-verifier-consistent",
            "--reason",
            "the tests ask for more than the request",
        ],
    ));
    ok(&eval(&d, &["resume", r]));
    let end = end_of(&run, c);
    assert_eq!(
        (end["stage"].as_str(), end["kept"].as_bool()),
        (Some("review"), Some(false)),
        "{end}"
    );
    assert!(end["reason"]
        .as_str()
        .unwrap()
        .contains("task-verifier-consistent"));
    let rows = std::fs::read_to_string(run.join("results.jsonl")).unwrap_or_default();
    assert!(
        rows.trim().is_empty(),
        "no trial from a rejected state: {rows}"
    );
    let report = work.join("report-a");
    ok(&eval(&d, &["report", r, "--out", report.to_str().unwrap()]));
    let losses = std::fs::read_to_string(report.join("residual_losses.csv")).unwrap();
    assert!(
        losses.lines().any(|l| l.starts_with("review,1,1,")),
        "{losses}"
    );

    // 2. Accepted by both: trials run, and the decisions are fixed from then on.
    let run = work.join("run-b");
    ok(&eval(&d, &run_args(s, run.to_str().unwrap())));
    let r = run.to_str().unwrap();
    ok(&eval(
        &d,
        &[
            "review",
            r,
            "--candidate",
            c,
            "--reviewer",
            "alice",
            "--accept",
        ],
    ));
    ok(&eval(
        &d,
        &[
            "review",
            r,
            "--candidate",
            c,
            "--reviewer",
            "bob",
            "--accept",
        ],
    ));
    ok(&eval(&d, &["resume", r]));
    let rows = results(&run);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].start_state, c);
    // Decided and fixed: a further decision is refused...
    let out = eval(
        &d,
        &[
            "review",
            r,
            "--candidate",
            c,
            "--reviewer",
            "carol",
            "--reject",
            "--criterion",
            "task-directed",
        ],
    );
    assert!(
        !out.status.success(),
        "a decision after the trials started was accepted"
    );
    // ...and one written into the log by other means stops the resume by fingerprint.
    let line = serde_json::json!({ "t": 0, "event": "review", "detail": {
        "candidate": c, "reviewer": "carol", "accept": false, "criteria": ["task-directed"], "reason": "" } });
    let mut log = std::fs::read_to_string(run.join("decisions.jsonl")).unwrap();
    log.push_str(&format!("{line}\n"));
    std::fs::write(run.join("decisions.jsonl"), log).unwrap();
    let out = eval(&d, &["resume", r]);
    assert!(
        !out.status.success(),
        "changed decisions must stop a resume"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("changed after its trials started"));
}
