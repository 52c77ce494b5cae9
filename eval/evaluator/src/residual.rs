//! Residual start states: each predecessor run once from the clean state (or, for a
//! patch predecessor under `reconstruct = "patch"`, its patch taken as it is), its work
//! turned into a state by the task's reconstruction ([`super::reconstruct`]), and kept
//! only when it passes the automatic filters. Every candidate's end is a line of
//! `states/candidates.jsonl` naming its stage; human review ([`super::review`]) comes
//! after.

use super::delta;
use super::grade::grade;
use super::records::{append_jsonl, StateRecord};
use super::run::{run_trial, Ctx, TrialSpec};
use super::session::Session;
use forkd_analysis::{Condition, Outcome};
use std::collections::{BTreeMap, HashSet};

/// What one candidate came to: its state record and patch, or why it was dropped; and
/// its predecessor run's outcome, if it ran.
type CandidateEnd = (Result<(StateRecord, String), Dropped>, Option<Outcome>);

/// A candidate that did not become a state: the stage that dropped it (a stage of the
/// loss table: `infrastructure`, `no-submit`, `passes`, `reconstruction`,
/// `verification`, `no-change`, `duplicate`, `review`) and why.
struct Dropped(&'static str, String);

/// Runs one predecessor (or, for a patch predecessor under `patch`, takes its file) and
/// turns its work into a state record, or says why not.
fn candidate_state(
    ctx: &Ctx,
    s: &Session,
    clean: &BTreeMap<String, String>,
    ti: usize,
    ai: usize,
    candidate: &str,
    kept: &[StateRecord],
) -> anyhow::Result<CandidateEnd> {
    use super::reconstruct::{self, Reconstruct};
    let task = &ctx.tasks[ti];
    let pred = ctx.agents[ai].name();
    let recon = ctx.reconstruct_for(task);
    let clean_ck = &clean[&task.name];
    // 1. The predecessor's work: a run from the clean state, or a patch file as it is.
    let mut outcome = None;
    let (patch, final_ck, attempt) = match (&ctx.agents[ai], recon) {
        (super::agent::AgentSpec::Patch(file), Reconstruct::Patch) => {
            eprintln!(
                "[eval] predecessor {pred} on {}: its patch, rebuilt on the clean state",
                task.name
            );
            (std::fs::read(file)?, None, None)
        }
        _ => {
            let spec = TrialSpec {
                id: format!("predecessor.{candidate}"),
                task: ti,
                condition: Condition::Clean,
                start_state: "clean".into(),
                start_checkpoint: clean_ck.clone(),
                predecessor: None,
                agent: ai,
                replicate: 0,
            };
            eprintln!("[eval] predecessor {pred} on {}", task.name);
            let (row, attempt) = run_trial(ctx, &spec, true);
            outcome = Some(row.outcome);
            let Some(a) = attempt else {
                let why = format!(
                    "infrastructure failure after {} attempts",
                    row.infra_attempts
                );
                return Ok((Err(Dropped("infrastructure", why)), outcome));
            };
            let cp = a.final_checkpoint.clone().unwrap_or_default();
            let drop = |stage, why: String| {
                s.remove_checkpoint(&cp);
                Ok((Err(Dropped(stage, why)), outcome))
            };
            if !a.submitted {
                return drop("no-submit", format!("did not submit ({:?})", a.outcome));
            }
            if a.grade.passed {
                return drop("passes", "passes the verifier".into());
            }
            (a.grade.patch.clone().into_bytes(), Some(cp), Some(a))
        }
    };
    // 2. The state: the final state itself, or the patch rebuilt on the clean state.
    let (checkpoint, failing, patch_text) = match recon {
        Reconstruct::Exact => {
            let a = attempt.expect("an exact state comes from a run");
            (
                final_ck.expect("a kept final state"),
                a.grade.failing(),
                a.grade.patch,
            )
        }
        Reconstruct::Patch => {
            let carry = match &final_ck {
                Some(cp) => s
                    .delta(cp)
                    .map(|tar| reconstruct::carried_files(&tar, &task.config.residual.carry()))
                    .unwrap_or_default(),
                None => Vec::new(),
            };
            if let Some(cp) = &final_ck {
                s.remove_checkpoint(cp);
            }
            let labels = [
                ("forkd.eval.state", candidate),
                ("forkd.eval.task", task.name.as_str()),
            ];
            let rebuilt =
                match reconstruct::patch_on_base(s, task, clean_ck, &patch, &carry, &labels) {
                    Err(e) => {
                        return Ok((
                            Err(Dropped(
                                "infrastructure",
                                format!("rebuilding on the clean state: {}", e.0),
                            )),
                            outcome,
                        ))
                    }
                    // An empty patch is no change at all, as under `exact`.
                    Ok(Err(reconstruct::Failure::Empty)) => {
                        let why = "no change beyond ignored byproducts".to_string();
                        return Ok((Err(Dropped("no-change", why)), outcome));
                    }
                    Ok(Err(f)) => {
                        return Ok((Err(Dropped("reconstruction", f.to_string())), outcome))
                    }
                    Ok(Ok(ck)) => ck,
                };
            // Its verification: graded on a fresh fork, it must still fail.
            match grade(s, task, &rebuilt) {
                Err(e) => {
                    s.remove_checkpoint(&rebuilt);
                    return Ok((
                        Err(Dropped(
                            "infrastructure",
                            format!("grading the rebuilt state: {}", e.0),
                        )),
                        outcome,
                    ));
                }
                Ok(g) if g.passed => {
                    s.remove_checkpoint(&rebuilt);
                    let why = "passes the verifier once rebuilt on the clean state".to_string();
                    return Ok((Err(Dropped("verification", why)), outcome));
                }
                Ok(g) => (rebuilt, g.failing(), g.patch),
            }
        }
    };
    // 3. What it changed, beyond the task's ignored byproducts, and whether a kept state
    //    already has exactly that.
    let drop = |stage, why: String| {
        s.remove_checkpoint(&checkpoint);
        Ok((Err(Dropped(stage, why)), outcome))
    };
    let changes = match s
        .delta(&checkpoint)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .and_then(|tar| delta::changes(&tar, task.workdir(), &task.config.residual.ignore))
    {
        Err(e) => return drop("infrastructure", format!("could not read its changes: {e}")),
        Ok(c) if c.is_empty() => {
            return drop("no-change", "no change beyond ignored byproducts".into())
        }
        Ok(c) => c,
    };
    let key = delta::content_key(&changes);
    if let Some(dup) = kept
        .iter()
        .find(|k| k.task == task.name && k.content_key == key)
    {
        return drop("duplicate", format!("identical to state {}", dup.state_id));
    }
    let tree_hash = s
        .checkpoints()
        .ok()
        .and_then(|l| l.into_iter().find(|x| x.id == checkpoint))
        .and_then(|x| x.tree_hash);
    Ok((
        Ok((
            StateRecord {
                state_id: candidate.to_string(),
                task: task.name.clone(),
                predecessor: Some(pred),
                failing_tests: failing,
                patch: format!("{candidate}.patch"),
                checkpoint,
                tree_hash,
                changed_files: changes.iter().map(|c| c.path.clone()).collect(),
                content_key: key,
                reconstruct: recon,
            },
            patch_text,
        )),
        outcome,
    ))
}

/// Builds the residual start states: each predecessor once from the clean state, its
/// work kept as a state when it passes the automatic filters (submitted, fails the
/// verifier, changed the work tree, not a duplicate; under `patch`, also rebuilt on the
/// clean state and still failing there). Every candidate's end is a line of
/// `states/candidates.jsonl` with its stage; states are `states/<candidate>.json` and
/// `.patch`. Candidates decided by an earlier invocation are not run again.
pub fn residualize(
    ctx: &Ctx,
    clean: &BTreeMap<String, String>,
    predecessor_agents: &[(usize, usize)],
) -> anyhow::Result<Vec<StateRecord>> {
    let states_dir = ctx.run_dir.join("states");
    std::fs::create_dir_all(&states_dir)?;
    let mut kept: Vec<StateRecord> = Vec::new();
    // Reuse states a previous (resumed) invocation kept.
    if let Ok(rd) = std::fs::read_dir(&states_dir) {
        for e in rd.flatten() {
            if e.path().extension().is_some_and(|x| x == "json") {
                if let Ok(r) = serde_json::from_slice::<StateRecord>(&std::fs::read(e.path())?) {
                    kept.push(r);
                }
            }
        }
    }
    let s = Session::new(&ctx.socket);
    // In a sharded run, states kept by an earlier attempt (perhaps on another node) are
    // imported from their archives; one whose archive is missing or refused is built
    // again.
    if let Some(sh) = ctx.shard {
        sh.settle_states(&s, &ctx.run_dir, &mut kept)?;
    }
    let decided: HashSet<String> = std::fs::read_to_string(states_dir.join("candidates.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["candidate"].as_str().map(String::from))
        .collect();
    for &(ti, ai) in predecessor_agents {
        let task = &ctx.tasks[ti];
        let pred = ctx.agents[ai].name();
        let candidate = format!("{}.{}", task.name, pred);
        if decided.contains(&candidate) {
            continue;
        }
        let (result, outcome) = candidate_state(ctx, &s, clean, ti, ai, &candidate, &kept)?;
        let (stage, reason, record) = match result {
            Ok((r, patch)) => {
                // A harness predecessor's handoff note, by its own model.
                if let super::agent::AgentSpec::MiniSweAgent(h) = &ctx.agents[ai] {
                    let traj = ctx
                        .run_dir
                        .join("trials")
                        .join(format!("predecessor.{candidate}"))
                        .join("agent/trajectory.json");
                    let out = states_dir.join(format!("{candidate}.note.md"));
                    match h.write_note(&ctx.socket, &traj, &out) {
                        Ok(()) => eprintln!("[eval]   {candidate}: handoff note written"),
                        Err(e) => eprintln!("[eval]   {candidate}: no handoff note: {e:#}"),
                    }
                }
                if let Some(sh) = ctx.shard {
                    sh.archives
                        .publish(&s, &r.task, &r.state_id, &r.checkpoint)?;
                }
                std::fs::write(states_dir.join(&r.patch), &patch)?;
                std::fs::write(
                    states_dir.join(format!("{candidate}.json")),
                    serde_json::to_vec_pretty(&r)?,
                )?;
                let how = match r.reconstruct {
                    super::reconstruct::Reconstruct::Exact => "its final state",
                    super::reconstruct::Reconstruct::Patch => {
                        "its patch on the clean state, uncommitted"
                    }
                };
                (
                    "kept",
                    format!("kept: submitted, fails the verifier, changed the workdir ({how})"),
                    Some(r),
                )
            }
            Err(Dropped(stage, why)) => (stage, why, None),
        };
        append_jsonl(
            &states_dir.join("candidates.jsonl"),
            &serde_json::json!({
                "candidate": candidate, "task": task.name, "predecessor": pred,
                "kept": record.is_some(), "stage": stage, "reason": reason,
                "outcome": outcome,
            }),
        )?;
        eprintln!(
            "[eval]   {candidate}: {}",
            if record.is_some() {
                "kept".to_string()
            } else {
                format!("dropped ({stage}): {reason}")
            }
        );
        if let Some(r) = record {
            kept.push(r);
        }
    }
    kept.sort_by(|a, b| a.state_id.cmp(&b.state_id));
    Ok(kept)
}
