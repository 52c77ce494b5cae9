//! Human review of residual candidates (SWE-Residual's Stage III).
//!
//! With `--reviewers N` a run's residualization stops after the automatic filters: each
//! candidate that passed them has a state record (`states/<candidate>.json`) but becomes
//! a start state only once reviewed. `forkd eval review RUN` writes a review sheet per
//! candidate (`review/<candidate>.md` and `.html`: the request, the state's diff against
//! the clean state, the predecessor's trajectory, the automatic filters' verdicts, and a
//! machine-written summary when one exists, marked as such) and records decisions:
//!
//! ```text
//! forkd eval review RUN --candidate C --reviewer alice --accept
//! forkd eval review RUN --candidate C --reviewer bob --reject --criterion task-verifier-consistent --reason "..."
//! ```
//!
//! Two criteria: `task-directed` (the changes are a coherent attempt at the request) and
//! `task-verifier-consistent` (the request and the hidden tests agree on what completion
//! means). A decision is an event `review` appended to the run's decision log, never
//! rewritten; one per reviewer and candidate. The rule decides (`--review-rule`): `all`
//! (the study's: N reviewers, every one accepting; one rejection drops the candidate) or
//! `majority` (decided once N reviewers decided: more accepts than rejects). When the
//! trials start, the decisions that chose the states are fingerprinted into the
//! manifest: a resumed run whose decisions changed since is refused.

use super::records::{decision, StateRecord};
pub use super::records::{Policy, Rule};
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const CRITERIA: &[&str] = &["task-directed", "task-verifier-consistent"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub candidate: String,
    pub reviewer: String,
    pub accept: bool,
    /// The criteria a rejection names (an acceptance holds for both).
    #[serde(default)]
    pub criteria: Vec<String>,
    #[serde(default)]
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pending {
        decided: usize,
        needed: usize,
    },
    Accepted,
    /// The criteria and reasons of the rejections.
    Rejected {
        criteria: Vec<String>,
        reasons: Vec<String>,
    },
}

/// Every review decision in the run's decision log, in order.
pub fn decisions(run_dir: &Path) -> Vec<Decision> {
    std::fs::read_to_string(run_dir.join("decisions.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "review")
        .filter_map(|v| serde_json::from_value(v["detail"].clone()).ok())
        .collect()
}

/// The verdict on one candidate under `policy`, from its decisions.
pub fn verdict(policy: Policy, of: &[&Decision]) -> Verdict {
    let accepts = of.iter().filter(|d| d.accept).count();
    let rejects: Vec<&&Decision> = of.iter().filter(|d| !d.accept).collect();
    let rejected = || {
        let mut criteria: Vec<String> = rejects.iter().flat_map(|d| d.criteria.clone()).collect();
        criteria.sort();
        criteria.dedup();
        Verdict::Rejected {
            criteria,
            reasons: rejects
                .iter()
                .map(|d| format!("{}: {}", d.reviewer, d.reason))
                .collect(),
        }
    };
    match policy.rule {
        Rule::All if !rejects.is_empty() => rejected(),
        Rule::All if accepts >= policy.reviewers => Verdict::Accepted,
        Rule::Majority if of.len() >= policy.reviewers => {
            if accepts > rejects.len() {
                Verdict::Accepted
            } else {
                rejected()
            }
        }
        _ => Verdict::Pending {
            decided: of.len(),
            needed: policy.reviewers,
        },
    }
}

/// The verdict on each of `candidates`.
pub fn verdicts(
    run_dir: &Path,
    policy: Policy,
    candidates: &[String],
) -> BTreeMap<String, Verdict> {
    let all = decisions(run_dir);
    candidates
        .iter()
        .map(|c| {
            let of: Vec<&Decision> = all.iter().filter(|d| &d.candidate == c).collect();
            (c.clone(), verdict(policy, &of))
        })
        .collect()
}

/// A hash over the decisions about `candidates` (order-independent).
pub fn fingerprint(run_dir: &Path, candidates: &[String]) -> String {
    let mut ds: Vec<String> = decisions(run_dir)
        .into_iter()
        .filter(|d| candidates.contains(&d.candidate))
        .map(|d| serde_json::to_string(&d).unwrap_or_default())
        .collect();
    ds.sort();
    let h = Sha256::digest(ds.join("\n").as_bytes());
    h.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The candidates that passed the automatic filters (they have a state record).
pub fn candidates(run_dir: &Path) -> anyhow::Result<Vec<StateRecord>> {
    let dir = run_dir.join("states");
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Ok(out);
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "json") {
            let r: StateRecord = serde_json::from_slice(&std::fs::read(&p)?)
                .with_context(|| format!("read {}", p.display()))?;
            out.push(r);
        }
    }
    out.sort_by(|a, b| a.state_id.cmp(&b.state_id));
    Ok(out)
}

/// Records one decision, after checking it: the run's trials have not started from
/// reviewed states yet (`fixed`: then the decisions are fixed), the candidate is one
/// under review and still undecided under `policy`, the criteria are known, a rejection
/// names at least one, and this reviewer has not decided on it already. Nothing is
/// written when a check fails.
pub fn record(run_dir: &Path, policy: Policy, fixed: bool, d: &Decision) -> anyhow::Result<()> {
    anyhow::ensure!(
        run_dir.join("manifest.json").is_file(),
        "{} is not a run directory",
        run_dir.display()
    );
    anyhow::ensure!(
        !fixed,
        "the trials of run {} started from its reviewed states: its decisions are fixed",
        run_dir.display()
    );
    let known: Vec<String> = candidates(run_dir)?
        .into_iter()
        .map(|r| r.state_id)
        .collect();
    if !known.contains(&d.candidate) {
        bail!(
            "no candidate {:?} in {} (candidates under review: {})",
            d.candidate,
            run_dir.display(),
            if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            }
        );
    }
    for c in &d.criteria {
        if !CRITERIA.contains(&c.as_str()) {
            bail!(
                "unknown criterion {c:?}: the criteria are {}",
                CRITERIA.join(" and ")
            );
        }
    }
    if !d.accept && d.criteria.is_empty() {
        bail!(
            "a rejection names the criterion it fails (--criterion {})",
            CRITERIA.join(" or --criterion ")
        );
    }
    let reviewer = d.reviewer.trim();
    if reviewer.is_empty() || reviewer.chars().any(char::is_control) {
        bail!("--reviewer: a name, without control characters");
    }
    let all = decisions(run_dir);
    let of: Vec<&Decision> = all.iter().filter(|x| x.candidate == d.candidate).collect();
    match verdict(policy, &of) {
        Verdict::Pending { .. } => {}
        Verdict::Accepted => bail!("{} is already accepted: decisions are final", d.candidate),
        Verdict::Rejected { .. } => {
            bail!("{} is already rejected: decisions are final", d.candidate)
        }
    }
    if of.iter().any(|x| x.reviewer == reviewer) {
        bail!(
            "reviewer {reviewer:?} already decided on {}: decisions are final (the log is append-only)",
            d.candidate
        );
    }
    let mut d = d.clone();
    d.reviewer = reviewer.to_string();
    decision(run_dir, "review", serde_json::to_value(&d)?)
}

fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Writes the review sheet of every candidate under `run_dir/review/`; returns the
/// markdown files written.
pub fn write_sheets(
    run_dir: &Path,
    instructions: &BTreeMap<String, String>,
) -> anyhow::Result<Vec<PathBuf>> {
    let out_dir = run_dir.join("review");
    std::fs::create_dir_all(&out_dir)?;
    let verdict_lines: BTreeMap<String, String> =
        std::fs::read_to_string(run_dir.join("states/candidates.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| {
                Some((
                    v["candidate"].as_str()?.to_string(),
                    v["reason"].as_str().unwrap_or("").to_string(),
                ))
            })
            .collect();
    let mut written = Vec::new();
    for r in candidates(run_dir)? {
        let c = &r.state_id;
        let diff =
            std::fs::read_to_string(run_dir.join("states").join(&r.patch)).unwrap_or_default();
        let trajectory = std::fs::read_to_string(
            run_dir
                .join("trials")
                .join(format!("predecessor.{c}"))
                .join("trajectory.jsonl"),
        )
        .unwrap_or_default();
        let steps: Vec<String> = trajectory
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|v| {
                if let Some(argv) = v["argv"].as_array() {
                    argv.iter()
                        .filter_map(|a| a.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                } else if let Some(keys) = v["keys"].as_str() {
                    format!("(keys) {keys}")
                } else {
                    v["shell"].as_str().unwrap_or_default().to_string()
                }
            })
            .collect();
        let summary =
            std::fs::read_to_string(run_dir.join("states").join(format!("{c}.note.md"))).ok();
        // A live state's processes, as its grading met them: part of what a rescuer inherits.
        let processes = std::fs::read_to_string(
            run_dir
                .join("trials")
                .join(format!("predecessor.{c}"))
                .join("processes.txt"),
        )
        .ok();
        let mut md = String::new();
        md.push_str(&format!(
            "# Review: {c}\n\nTask `{}`, predecessor `{}`, reconstruction `{}`.\n\n",
            r.task,
            r.predecessor.as_deref().unwrap_or("-"),
            serde_json::to_value(r.reconstruct)?.as_str().unwrap_or("")
        ));
        md.push_str("Decide on two criteria: **task-directed** (the changes are a coherent attempt at the request) and **task-verifier-consistent** (the request and the hidden tests agree on what completion means).\n\n");
        md.push_str(&format!(
            "## Request\n\n{}\n\n",
            instructions
                .get(&r.task)
                .map(String::as_str)
                .unwrap_or("(the task's instruction is not in this suite)")
        ));
        md.push_str(&format!(
            "## Automatic filters\n\n- {}\n- failing tests: {}\n- changed files: {}\n\n",
            verdict_lines.get(c).map(String::as_str).unwrap_or("kept"),
            if r.failing_tests.is_empty() {
                "(reward below 1)".to_string()
            } else {
                r.failing_tests.join(", ")
            },
            r.changed_files.join(", ")
        ));
        md.push_str(&format!(
            "## Diff against the clean state\n\n```diff\n{}\n```\n\n",
            diff.trim_end()
        ));
        if let Some(p) = &processes {
            md.push_str(&format!(
                "## Processes running in the state\n\nThe state is live: these run in every rescuer's start.\n\n```\n{}\n```\n\n",
                if p.trim().is_empty() { "(none but the sandbox's init)" } else { p.trim_end() }
            ));
        }
        md.push_str(&format!("## Trajectory ({} commands)\n\n", steps.len()));
        for (i, s) in steps.iter().enumerate() {
            md.push_str(&format!("{}. `{}`\n", i + 1, s.replace('`', "'")));
        }
        md.push_str("\n## Summary\n\n");
        match &summary {
            Some(s) => md.push_str(&format!("*Machine-written (the predecessor's own model's handoff note); people decide.*\n\n{}\n", s.trim())),
            None => md.push_str("(none: no model wrote a summary of this trajectory)\n"),
        }
        md.push_str(&format!("\n## Decide\n\n```sh\nforkd eval review {} --candidate {c} --reviewer NAME --accept\nforkd eval review {} --candidate {c} --reviewer NAME --reject --criterion task-directed|task-verifier-consistent --reason \"...\"\n```\n", run_dir.display(), run_dir.display()));
        let html = format!(
            "<!doctype html><meta charset=\"utf-8\"><title>Review: {t}</title><style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}pre{{background:#f4f4f4;padding:1em;overflow:auto}}</style><pre>{}</pre>",
            escape_html(&md),
            t = escape_html(c)
        );
        let md_path = out_dir.join(format!("{c}.md"));
        std::fs::write(&md_path, &md)?;
        std::fs::write(out_dir.join(format!("{c}.html")), html)?;
        written.push(md_path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(reviewer: &str, accept: bool, criteria: &[&str]) -> Decision {
        Decision {
            candidate: "t.p".into(),
            reviewer: reviewer.into(),
            accept,
            criteria: criteria.iter().map(|c| c.to_string()).collect(),
            reason: "r".into(),
        }
    }

    #[test]
    fn all_needs_every_reviewer_and_one_rejection_drops() {
        let p = Policy {
            reviewers: 2,
            rule: Rule::All,
        };
        let a = d("a", true, &[]);
        let b = d("b", false, &["task-verifier-consistent"]);
        assert_eq!(
            verdict(p, &[]),
            Verdict::Pending {
                decided: 0,
                needed: 2
            }
        );
        assert_eq!(
            verdict(p, &[&a]),
            Verdict::Pending {
                decided: 1,
                needed: 2
            }
        );
        assert_eq!(verdict(p, &[&a, &d("c", true, &[])]), Verdict::Accepted);
        match verdict(p, &[&a, &b]) {
            Verdict::Rejected { criteria, .. } => {
                assert_eq!(criteria, vec!["task-verifier-consistent"])
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn majority_waits_for_enough_decisions() {
        let p = Policy {
            reviewers: 3,
            rule: Rule::Majority,
        };
        let (a, b, c) = (
            d("a", true, &[]),
            d("b", false, &["task-directed"]),
            d("c", true, &[]),
        );
        assert!(matches!(verdict(p, &[&a, &b]), Verdict::Pending { .. }));
        assert_eq!(verdict(p, &[&a, &b, &c]), Verdict::Accepted);
        assert!(matches!(
            verdict(
                Policy {
                    reviewers: 2,
                    rule: Rule::Majority
                },
                &[&a, &b]
            ),
            Verdict::Rejected { .. }
        ));
    }
}
