//! Grading: a state (a checkpoint) is forked afresh, the hidden tests are copied in, and
//! the task's verifier runs there, never in the agent's sandbox. A live task's fork
//! restores the state's processes (the services the agent left running, as Harbor's
//! verifier meets them in the trial's machine); a files-only task's has its files alone. Its output becomes
//! per-test outcomes (pytest's `-rA` summary, a JUnit XML file, or a reward file).

use super::session::{Infra, InfraResult, Session};
use super::task::Task;
use forkd_analysis::TestResult;
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
pub struct Grade {
    pub tests: BTreeMap<String, TestResult>,
    /// Every fail_to_pass and pass_to_pass test passed (or reward >= 1).
    pub passed: bool,
    /// `git diff --binary` of the workdir against the clean state's commit, when the
    /// workdir is a git repository.
    pub patch: String,
    pub verifier_output: String,
    /// The processes of a live state as the verifier met them (`PID COMMAND LINE`, one a
    /// line, the sandbox's init left out); `None` when the files alone were graded.
    pub processes: Option<String>,
    /// Milliseconds per grading phase: `fork`, `processes`, `diff`, `copy_tests`,
    /// `verifier`, `remove`.
    pub phases_ms: BTreeMap<String, f64>,
}

/// Lists a sandbox's processes with nothing but a POSIX shell and `tr`, so in any image:
/// each pid and its command line; forkd's own (the init, pid 1, and the listing's exec
/// relay, its shell's parent) and the listing's shell left out.
const LIST_PROCESSES: &str = "for d in /proc/[0-9]*; do p=${d#/proc/}; \
    if [ \"$p\" = 1 ] || [ \"$p\" = $$ ] || [ \"$p\" = \"$PPID\" ]; then continue; fi; \
    c=$(tr '\\000' ' ' < \"$d/cmdline\" 2>/dev/null); [ -n \"$c\" ] && echo \"$p $c\"; done; true";

impl Grade {
    pub fn failing(&self) -> Vec<String> {
        self.tests
            .iter()
            .filter(|(_, r)| matches!(r, TestResult::Fail | TestResult::Error))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// Grades the state held by checkpoint `state`.
pub fn grade(s: &Session, task: &Task, state: &str) -> InfraResult<Grade> {
    let t = std::time::Instant::now();
    // Files-only tasks need no process of the graded state: a fresh init is enough.
    let sb = s.fork(state, !task.config.live())?;
    let fork_ms = ms(t);
    let result = grade_in(s, task, &sb);
    let t = std::time::Instant::now();
    s.remove(&sb);
    let remove_ms = ms(t);
    result.map(|mut g| {
        g.phases_ms.insert("fork".into(), fork_ms);
        g.phases_ms.insert("remove".into(), remove_ms);
        g
    })
}

pub fn ms(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn grade_in(s: &Session, task: &Task, sb: &str) -> InfraResult<Grade> {
    let wd = task.workdir();
    let v = &task.config.verifier;
    let mut phases_ms = BTreeMap::new();
    // What a live state runs, before anything of the grading does.
    let processes = if task.config.live() {
        let t = std::time::Instant::now();
        let r = s.sh(sb, LIST_PROCESSES, "/", Some(30))?;
        phases_ms.insert("processes".into(), ms(t));
        Some(r.out())
    } else {
        None
    };
    let t = std::time::Instant::now();
    // Against the base commit: the predecessor's own commits are part of what it did.
    let base = task.base_commit.get().map(String::as_str).unwrap_or("HEAD");
    let patch = s
        .sh(sb, &format!("if [ -d .git ]; then git add -A >/dev/null 2>&1 && git diff --cached --binary {base}; fi"), wd, Some(120))?
        .out();
    phases_ms.insert("diff".into(), ms(t));
    let t = std::time::Instant::now();
    s.put_dir(sb, &task.dir.join("tests"), &v.tests_dir)?;
    phases_ms.insert("copy_tests".into(), ms(t));
    let t = std::time::Instant::now();
    let ran = s.sh(sb, &v.command, wd, Some(v.timeout_secs))?;
    phases_ms.insert("verifier".into(), ms(t));
    let output = format!("{}{}", ran.out(), ran.err());
    if ran.timed_out {
        return Err(Infra(format!(
            "verifier of {} timed out after {} s",
            task.name, v.timeout_secs
        )));
    }
    if ran.code == 126 || ran.code == 127 {
        return Err(Infra(format!(
            "verifier of {} could not run (exit {}): {}",
            task.name,
            ran.code,
            tail(&output)
        )));
    }
    let (tests, reward) = match v.format.as_str() {
        "pytest" => (parse_pytest(&output), None),
        "junit" => {
            let path = v.junit_path.as_deref().unwrap_or_default();
            let xml = s.sh(sb, &format!("cat '{path}'"), wd, Some(60))?;
            if xml.code != 0 {
                return Err(Infra(format!(
                    "verifier of {} wrote no JUnit file {path}: {}",
                    task.name,
                    tail(&output)
                )));
            }
            (parse_junit(&xml.out()), None)
        }
        _ => {
            let path = v.reward_path.as_deref().unwrap_or_default();
            // The reward file, or its JSON form beside it (Harbor writes either).
            let json_path = std::path::Path::new(path).with_extension("json");
            let json_path = json_path.to_string_lossy();
            let r = s.sh(
                sb,
                &format!("cat '{path}' 2>/dev/null || cat '{json_path}'"),
                wd,
                Some(60),
            )?;
            if r.code != 0 {
                return Err(Infra(format!(
                    "verifier of {} wrote no reward file {path} (nor {json_path}): {}",
                    task.name,
                    tail(&output)
                )));
            }
            let reward = parse_reward(&r.out()).ok_or_else(|| {
                Infra(format!(
                    "reward file {path} of {} holds {:?}",
                    task.name,
                    r.out().trim()
                ))
            })?;
            // Per-test outcomes, when the verifier wrote a CTRF report too.
            let mut t = match v.ctrf_path.as_deref() {
                Some(ctrf) => {
                    let c = s.sh(sb, &format!("cat '{ctrf}' 2>/dev/null"), wd, Some(60))?;
                    if c.code == 0 {
                        parse_ctrf(&c.out())
                    } else {
                        BTreeMap::new()
                    }
                }
                None => BTreeMap::new(),
            };
            t.insert(
                "reward".to_string(),
                if reward >= 1.0 {
                    TestResult::Pass
                } else {
                    TestResult::Fail
                },
            );
            (t, Some(reward))
        }
    };
    let mut tests = tests;
    // Listed tests that did not report are failures (e.g. they could not be collected).
    for id in v.fail_to_pass.iter().chain(&v.pass_to_pass) {
        tests.entry(id.clone()).or_insert(TestResult::Fail);
    }
    let passed = match reward {
        Some(r) => r >= 1.0,
        None => {
            let listed: Vec<&String> = v.fail_to_pass.iter().chain(&v.pass_to_pass).collect();
            if listed.is_empty() {
                ran.code == 0 && !tests.is_empty()
            } else {
                listed
                    .iter()
                    .all(|id| tests.get(*id) == Some(&TestResult::Pass))
            }
        }
    };
    Ok(Grade {
        tests,
        passed,
        patch,
        verifier_output: output,
        processes,
        phases_ms,
    })
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// Per-test outcomes from pytest's `-rA` short summary (`PASSED id`, `FAILED id - why`).
pub fn parse_pytest(out: &str) -> BTreeMap<String, TestResult> {
    let mut tests = BTreeMap::new();
    for line in out.lines() {
        let Some((word, rest)) = line.split_once(' ') else {
            continue;
        };
        let result = match word {
            "PASSED" | "XPASS" => TestResult::Pass,
            "FAILED" => TestResult::Fail,
            "ERROR" => TestResult::Error,
            "SKIPPED" | "XFAIL" => TestResult::Skip,
            _ => continue,
        };
        let id = rest.split(" - ").next().unwrap_or(rest).trim();
        // SKIPPED lines read "[1] file:line: reason"; keep ids that look like tests.
        if id.is_empty() || id.starts_with('[') {
            continue;
        }
        tests.insert(id.to_string(), result);
    }
    tests
}

/// Per-test outcomes from a CTRF report (Common Test Report Format, as
/// pytest-json-ctrf writes it): `results.tests[]` with `name` and `status` (`passed`,
/// `failed`, `skipped`, `pending`, `other`). A report that does not parse gives none.
pub fn parse_ctrf(json: &str) -> BTreeMap<String, TestResult> {
    #[derive(serde::Deserialize)]
    struct Report {
        results: Results,
    }
    #[derive(serde::Deserialize)]
    struct Results {
        #[serde(default)]
        tests: Vec<Test>,
    }
    #[derive(serde::Deserialize)]
    struct Test {
        name: String,
        status: String,
    }
    let Ok(r) = serde_json::from_str::<Report>(json) else {
        return BTreeMap::new();
    };
    r.results
        .tests
        .into_iter()
        .filter(|t| !t.name.is_empty() && t.name != "reward")
        .map(|t| {
            let outcome = match t.status.as_str() {
                "passed" => TestResult::Pass,
                "failed" => TestResult::Fail,
                "skipped" | "pending" => TestResult::Skip,
                _ => TestResult::Error,
            };
            (t.name, outcome)
        })
        .collect()
}

/// Per-test outcomes from a JUnit XML report (`classname::name`).
pub fn parse_junit(xml: &str) -> BTreeMap<String, TestResult> {
    let attr = |tag: &str, name: &str| -> Option<String> {
        let key = format!(" {name}=\"");
        let i = tag.find(&key)? + key.len();
        let j = tag[i..].find('"')? + i;
        Some(
            tag[i..j]
                .replace("&quot;", "\"")
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&amp;", "&"),
        )
    };
    let mut tests = BTreeMap::new();
    let mut rest = xml;
    while let Some(i) = rest.find("<testcase") {
        rest = &rest[i..];
        let end = rest.find('>').unwrap_or(rest.len());
        let tag = &rest[..end];
        let self_closing = tag.ends_with('/');
        let body_end = if self_closing {
            end
        } else {
            rest.find("</testcase>").unwrap_or(end)
        };
        let body = &rest[end.min(body_end)..body_end];
        let name = attr(tag, "name").unwrap_or_default();
        let id = match attr(tag, "classname") {
            Some(c) if !c.is_empty() => format!("{c}::{name}"),
            _ => name,
        };
        let result = if body.contains("<failure") {
            TestResult::Fail
        } else if body.contains("<error") {
            TestResult::Error
        } else if body.contains("<skipped") {
            TestResult::Skip
        } else {
            TestResult::Pass
        };
        tests.insert(id, result);
        rest = &rest[end.max(1)..];
    }
    tests
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytest_summary_lines_are_parsed() {
        let out = "..F\n=== short test summary info ===\nPASSED tests/t.py::test_a\nFAILED tests/t.py::test_b - assert 1 == 2\nERROR tests/t.py::test_c - ImportError\nSKIPPED [1] tests/t.py:9: no\n=== 1 failed ===\n";
        let t = parse_pytest(out);
        assert_eq!(t.len(), 3);
        assert_eq!(t["tests/t.py::test_a"], TestResult::Pass);
        assert_eq!(t["tests/t.py::test_b"], TestResult::Fail);
        assert_eq!(t["tests/t.py::test_c"], TestResult::Error);
    }

    #[test]
    fn junit_reports_are_parsed() {
        let xml = r#"<testsuite><testcase classname="m.T" name="a"/><testcase classname="m.T" name="b"><failure message="x">boom</failure></testcase><testcase name="c"><skipped/></testcase></testsuite>"#;
        let t = parse_junit(xml);
        assert_eq!(t["m.T::a"], TestResult::Pass);
        assert_eq!(t["m.T::b"], TestResult::Fail);
        assert_eq!(t["c"], TestResult::Skip);
    }

    #[test]
    fn ctrf_reports_are_parsed() {
        // As pytest-json-ctrf writes it (fields trimmed).
        let json = r#"{"results": {"tool": {"name": "pytest"}, "summary": {"tests": 4},
            "tests": [{"name": "test_outputs.py::test_a", "status": "passed", "duration": 1},
                      {"name": "test_outputs.py::test_b", "status": "failed", "message": "x"},
                      {"name": "test_outputs.py::test_c", "status": "skipped"},
                      {"name": "test_outputs.py::test_d", "status": "other"}]}}"#;
        let t = parse_ctrf(json);
        assert_eq!(t.len(), 4);
        assert_eq!(t["test_outputs.py::test_a"], TestResult::Pass);
        assert_eq!(t["test_outputs.py::test_b"], TestResult::Fail);
        assert_eq!(t["test_outputs.py::test_c"], TestResult::Skip);
        assert_eq!(t["test_outputs.py::test_d"], TestResult::Error);
        assert!(parse_ctrf("not json").is_empty());
        assert!(parse_ctrf(r#"{"results": {}}"#).is_empty());
    }
}

/// A reward file's value: a number, or a JSON object whose `reward` (or only) value is one.
fn parse_reward(text: &str) -> Option<f64> {
    let text = text.trim();
    if let Ok(r) = text.parse::<f64>() {
        return Some(r);
    }
    match serde_json::from_str::<serde_json::Value>(text).ok()? {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::Object(m) => match m.get("reward") {
            Some(v) => v.as_f64(),
            None if m.len() == 1 => m.values().next()?.as_f64(),
            None => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod reward_tests {
    #[test]
    fn rewards_are_numbers_or_harbors_json() {
        use super::parse_reward;
        assert_eq!(parse_reward("1\n"), Some(1.0));
        assert_eq!(parse_reward("0.25"), Some(0.25));
        assert_eq!(parse_reward("{\"reward\": 1.0, \"tests\": 3}"), Some(1.0));
        assert_eq!(parse_reward("{\"accuracy\": 0.5}"), Some(0.5));
        assert_eq!(parse_reward("{\"a\": 1, \"b\": 2}"), None);
        assert_eq!(parse_reward("passed"), None);
    }
}
