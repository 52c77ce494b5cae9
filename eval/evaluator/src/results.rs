//! A run's results as people read them: the CSV beside results.jsonl, the summary
//! table, and the words of an outcome.
use super::*;

pub fn write_csv(path: &Path, rows: &[TrialRow]) -> anyhow::Result<()> {
    let mut out = String::from(
        "run_id,trial_id,task,condition,start_state,predecessor,agent,replicate,outcome,submitted,tests_passed,tests_failed,steps,wall_ms,infra_attempts,tests\n",
    );
    for r in rows {
        let v = serde_json::to_value(r)?;
        let passed = r
            .tests
            .values()
            .filter(|t| **t == forkd_analysis::TestResult::Pass)
            .count();
        let fields = [
            r.run_id.clone(),
            r.trial_id.clone(),
            r.task.clone(),
            v["condition"].as_str().unwrap_or_default().to_string(),
            r.start_state.clone(),
            r.predecessor.clone().unwrap_or_default(),
            r.agent.clone(),
            r.replicate.to_string(),
            v["outcome"].as_str().unwrap_or_default().to_string(),
            r.submitted.to_string(),
            passed.to_string(),
            (r.tests.len() - passed).to_string(),
            r.steps.to_string(),
            r.wall_ms.to_string(),
            r.infra_attempts.to_string(),
            serde_json::to_string(&v["tests"])?,
        ];
        out.push_str(
            &fields
                .iter()
                .map(|f| forkd_analysis::csv_field(f))
                .collect::<Vec<_>>()
                .join(","),
        );
        out.push('\n');
    }
    std::fs::write(path, out)?;
    Ok(())
}

/// Trials per condition and agent: passes, failures, infrastructure failures and the
/// success rate among graded trials; as JSON cells and as a table.
pub fn summary(rows: &[TrialRow]) -> (serde_json::Value, String) {
    let mut cells: BTreeMap<(String, String), (u32, u32, u32)> = BTreeMap::new();
    for r in rows {
        let cond = serde_json::to_value(r.condition)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        let e = cells.entry((cond, r.agent.clone())).or_default();
        match r.outcome {
            Outcome::Pass => e.0 += 1,
            Outcome::InfraError => e.2 += 1,
            _ => e.1 += 1,
        }
    }
    let mut text = format!(
        "{:<18} {:<20} {:>6} {:>6} {:>6} {:>8}\n",
        "CONDITION", "AGENT", "PASS", "FAIL", "INFRA", "SUCCESS"
    );
    let mut json = Vec::new();
    for ((cond, agent), (p, f, i)) in cells {
        let rate = (p + f > 0).then(|| p as f64 / (p + f) as f64);
        let shown = rate
            .map(|r| format!("{:.0}%", 100.0 * r))
            .unwrap_or_else(|| "-".into());
        text.push_str(&format!(
            "{cond:<18} {agent:<20} {p:>6} {f:>6} {i:>6} {shown:>8}\n"
        ));
        json.push(
            serde_json::json!({ "condition": cond, "agent": agent, "pass": p,
            "fail": f, "infra_error": i, "success": rate }),
        );
    }
    (serde_json::Value::Array(json), text)
}
