//! `forkd eval validate`: whether each task of a suite is solvable and fails as given,
//! checked on the daemon before any agent runs.
use super::*;

/// One task's verdict in `forkd eval validate`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Validity {
    pub task: String,
    /// Graded with its processes (a live fork of the state), as terminal tasks are.
    pub live: bool,
    /// `fails`, `passes` or `error` (the unchanged start could not be graded).
    pub start: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_error: Option<String>,
    /// The reference solution's outcome, as a trial's.
    pub solution: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub solution_error: Option<String>,
    /// The start fails and the solution passes.
    pub valid: bool,
}

/// `forkd eval validate`: the reference solution passes and the unchanged start fails.
pub fn validate(socket: &Path, suite: &Path) -> anyhow::Result<Said> {
    let tasks = task::load_suite(suite)?;
    let s = Session::new(socket);
    let images = clean::ensure_images(&s, &tasks)?;
    let agents = vec![AgentSpec::Oracle];
    let dir = std::env::temp_dir().join(format!("forkd-validate-{}", std::process::id()));
    let ctx = Ctx {
        socket: socket.to_path_buf(),
        run_dir: dir.clone(),
        run_id: "validate".into(),
        tasks: &tasks,
        agents: &agents,
        retries: 1,
        results: Mutex::new(()),
        reconstruct: None,
        shard: None,
    };
    let mut verdicts = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        let clean = clean::clean_state(&s, t, &images[&t.config.task.image])?;
        let start = grade::grade(&s, t, &clean);
        let spec = TrialSpec {
            id: format!("validate.{}", t.name),
            task: i,
            condition: Condition::Clean,
            start_state: "clean".into(),
            start_checkpoint: clean,
            predecessor: None,
            agent: 0,
            replicate: 0,
        };
        let (row, _) = run::run_trial(&ctx, &spec, false);
        let solution_error = (row.outcome == Outcome::InfraError)
            .then(|| {
                std::fs::read_to_string(dir.join("trials").join(&spec.id).join("infra_error.txt"))
                    .ok()
            })
            .flatten();
        let (start_word, start_error) = match &start {
            Ok(g) if g.passed => ("passes", None),
            Ok(_) => ("fails", None),
            Err(e) => ("error", Some(e.0.clone())),
        };
        verdicts.push(Validity {
            task: t.name.clone(),
            live: t.config.live(),
            start: start_word.into(),
            start_error,
            solution: row.outcome,
            solution_error,
            valid: start_word == "fails" && row.outcome == Outcome::Pass,
        });
    }
    session::drain();
    let _ = std::fs::remove_dir_all(&dir);
    let invalid = verdicts.iter().filter(|v| !v.valid).count();
    let mut text = format!(
        "{:<32} {:<6} {:<10} {:<12} VERDICT\n",
        "TASK", "GRADED", "START", "SOLUTION"
    );
    for v in &verdicts {
        let why = match (&v.start_error, &v.solution_error) {
            (Some(e), _) => format!(" (start: {e})"),
            (None, Some(e)) => format!(" (solution: {})", e.trim()),
            _ => String::new(),
        };
        text.push_str(&format!(
            "{:<32} {:<6} {:<10} {:<12} {}{why}\n",
            v.task,
            if v.live { "live" } else { "files" },
            v.start,
            outcome_word(v.solution),
            if v.valid {
                "valid"
            } else {
                "INVALID (the start must fail and the solution pass)"
            }
        ));
    }
    let json = serde_json::json!({
        "suite": std::path::absolute(suite).unwrap_or_else(|_| suite.to_path_buf()),
        "tasks": verdicts,
        "valid": verdicts.len() - invalid,
        "invalid": invalid,
    });
    Ok(Said::new(json, text).with_code(if invalid == 0 { 0 } else { 1 }))
}
