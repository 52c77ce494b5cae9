//! Human review in a run: the residual states a run goes on with once reviewers have
//! decided on their candidates, and `forkd eval review`.
use super::*;

/// The residual states a run goes on with. With review: those whose candidates were
/// accepted. Rejections are recorded as losses (stage `review`, once). While a candidate
/// awaits a decision the run stops before its trials (`Err`: the candidates pending),
/// saying what to do; when the trials start, the decisions are fingerprinted into the
/// manifest, and a later resume whose decisions differ is refused.
pub(crate) fn reviewed(
    run_dir: &Path,
    policy: review::Policy,
    states: Vec<records::StateRecord>,
    states_only: bool,
) -> anyhow::Result<Result<Vec<records::StateRecord>, Vec<String>>> {
    if policy.reviewers == 0 {
        return Ok(Ok(states));
    }
    let names: Vec<String> = states.iter().map(|s| s.state_id.clone()).collect();
    // Once trials have started from reviewed states, their decisions are fixed.
    let fp = review::fingerprint(run_dir, &names);
    let path = run_dir.join("manifest.json");
    let mut m: records::Manifest = serde_json::from_slice(&std::fs::read(&path)?)?;
    if let Some(old) = &m.review_fingerprint {
        anyhow::ensure!(
            *old == fp,
            "the review decisions of run {} changed after its trials started (fingerprint {old} then, {fp} now): start a new run",
            run_dir.display()
        );
    }
    let verdicts = review::verdicts(run_dir, policy, &names);
    let lines =
        std::fs::read_to_string(run_dir.join("states/candidates.jsonl")).unwrap_or_default();
    let recorded = |c: &str| {
        lines
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|v| v["candidate"] == c && v["stage"] == "review")
    };
    let mut pending = Vec::new();
    let mut accepted = Vec::new();
    for st in states {
        match &verdicts[&st.state_id] {
            review::Verdict::Accepted => {
                if !recorded(&st.state_id) {
                    records::append_jsonl(
                        &run_dir.join("states/candidates.jsonl"),
                        &serde_json::json!({ "candidate": st.state_id, "task": st.task, "predecessor": st.predecessor,
                            "kept": true, "stage": "review", "reason": "accepted by review" }),
                    )?;
                }
                accepted.push(st);
            }
            review::Verdict::Rejected { criteria, reasons } => {
                if !recorded(&st.state_id) {
                    records::append_jsonl(
                        &run_dir.join("states/candidates.jsonl"),
                        &serde_json::json!({ "candidate": st.state_id, "task": st.task, "predecessor": st.predecessor,
                            "kept": false, "stage": "review", "criteria": criteria,
                            "reason": format!("rejected by review ({}): {}", criteria.join(", "), reasons.join("; ")) }),
                    )?;
                }
            }
            review::Verdict::Pending { decided, needed } => {
                pending.push(format!("{} ({decided} of {needed} reviews)", st.state_id))
            }
        }
    }
    if !pending.is_empty() {
        eprintln!(
            "[eval] {} candidate(s) await review: {}
[eval] write the sheets and decide with `forkd eval review {}`, then `forkd eval resume {}`",
            pending.len(),
            pending.join(", "),
            run_dir.display(),
            run_dir.display()
        );
        return Ok(Err(pending));
    }
    if states_only {
        return Ok(Ok(accepted));
    }
    // The trials start from these states: fix the decisions that chose them.
    if m.review_fingerprint.is_none() {
        m.review_fingerprint = Some(fp.clone());
        std::fs::write(&path, serde_json::to_vec_pretty(&m)?)?;
        records::decision(
            run_dir,
            "review-fixed",
            serde_json::json!({ "fingerprint": fp, "states": accepted.len() }),
        )?;
    }
    Ok(Ok(accepted))
}

/// `forkd eval review RUN [--candidate C --reviewer R --accept|--reject ...]`.
#[allow(clippy::too_many_arguments)]
pub fn review_command(
    run_dir: &Path,
    candidate: Option<String>,
    reviewer: Option<String>,
    accept: bool,
    reject: bool,
    criteria: Vec<String>,
    reason: String,
) -> anyhow::Result<Said> {
    let m: Manifest = serde_json::from_slice(
        &std::fs::read(run_dir.join("manifest.json"))
            .map_err(|e| anyhow::anyhow!("{} is not a run directory: {e}", run_dir.display()))?,
    )?;
    let policy = m.config.review;
    let mut json = serde_json::json!({ "run": run_dir });
    if let (Some(c), Some(r)) = (candidate, reviewer) {
        anyhow::ensure!(accept || reject, "say --accept or --reject");
        anyhow::ensure!(
            policy.reviewers > 0,
            "run {} was started without review (--reviewers): its candidates are not reviewed",
            run_dir.display()
        );
        let decision = review::Decision {
            candidate: c.clone(),
            reviewer: r,
            accept,
            criteria,
            reason,
        };
        review::record(run_dir, policy, m.review_fingerprint.is_some(), &decision)?;
        json["recorded"] = serde_json::to_value(&decision)?;
        eprintln!(
            "[eval] recorded; continue the run with `forkd eval resume {}`",
            run_dir.display()
        );
    } else {
        anyhow::ensure!(
            !accept && !reject && criteria.is_empty(),
            "a decision needs --candidate and --reviewer"
        );
        let tasks = task::load_suite(&m.config.suite).unwrap_or_default();
        let instructions = tasks
            .iter()
            .map(|t| (t.name.clone(), t.instruction.clone()))
            .collect();
        let sheets = review::write_sheets(run_dir, &instructions)?;
        json["sheets"] = serde_json::to_value(&sheets)?;
        eprintln!(
            "[eval] {} review sheet(s) in {}",
            sheets.len(),
            run_dir.join("review").display()
        );
    }
    let names: Vec<String> = review::candidates(run_dir)?
        .into_iter()
        .map(|r| r.state_id)
        .collect();
    let mut text = format!("{:<48} VERDICT\n", "CANDIDATE");
    let mut listed = Vec::new();
    for (c, v) in review::verdicts(run_dir, policy, &names) {
        let (shown, entry) = match v {
            review::Verdict::Accepted => (
                "accepted".to_string(),
                serde_json::json!({ "candidate": c, "verdict": "accepted" }),
            ),
            review::Verdict::Rejected { criteria, reasons } => (
                format!("rejected ({})", criteria.join(", ")),
                serde_json::json!({ "candidate": c, "verdict": "rejected",
                    "criteria": criteria, "reasons": reasons }),
            ),
            review::Verdict::Pending { decided, needed } => (
                format!("pending ({decided} of {needed})"),
                serde_json::json!({ "candidate": c, "verdict": "pending",
                    "decided": decided, "needed": needed }),
            ),
        };
        text.push_str(&format!("{c:<48} {shown}\n"));
        listed.push(entry);
    }
    json["candidates"] = serde_json::Value::Array(listed);
    Ok(Said::new(json, text))
}
