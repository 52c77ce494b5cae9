//! Reading run directories into a [`Dataset`]. The format is the contract
//! described in the crate header; every violation is an error that names the
//! file and, for line-oriented files, the line.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::AnalysisError;
use crate::model::{
    CandidateEnd, Condition, Dataset, RunInfo, StateInfo, TaskInfo, TrajectoryCommand, Trial,
    TrialRow,
};
use crate::patch::Patch;

#[derive(Deserialize)]
struct Manifest {
    run_id: String,
}

#[derive(Deserialize)]
struct StateFile {
    state_id: String,
    task: String,
    #[serde(default)]
    predecessor: Option<String>,
    #[serde(default)]
    failing_tests: Vec<String>,
    #[serde(default)]
    patch: Option<String>,
}

#[derive(Deserialize)]
struct TrajectoryLine {
    #[serde(default)]
    #[allow(dead_code)]
    t_ms: Option<u64>,
    #[serde(default)]
    argv: Option<Vec<String>>,
    #[serde(default)]
    shell: Option<String>,
    #[serde(default)]
    keys: Option<String>,
}

/// Read every run directory and merge them. States and tasks may appear in
/// several runs, but must then be identical.
pub fn load_runs(dirs: &[PathBuf]) -> Result<Dataset, AnalysisError> {
    let mut ds = Dataset::default();
    let mut state_src: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut task_src: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut seen_trials: HashMap<(String, String), (PathBuf, usize)> = HashMap::new();
    for dir in dirs {
        load_run(
            dir,
            &mut ds,
            &mut state_src,
            &mut task_src,
            &mut seen_trials,
        )?;
    }
    Ok(ds)
}

fn read(path: &Path) -> Result<String, AnalysisError> {
    fs::read_to_string(path).map_err(|e| AnalysisError::io("reading", path, e))
}

fn read_optional(path: &Path) -> Result<Option<String>, AnalysisError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(AnalysisError::io("reading", path, e)),
    }
}

/// `*.json` files of a directory, sorted; none if it does not exist.
fn json_files(dir: &Path) -> Result<Vec<PathBuf>, AnalysisError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(AnalysisError::io("listing", dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| AnalysisError::io("listing", dir, e))?;
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "json") {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// The stage of a candidate line written before lines named their stage.
fn legacy_stage(kept: bool, reason: &str) -> &'static str {
    if kept {
        "kept"
    } else if reason.starts_with("did not submit") {
        "no-submit"
    } else if reason.starts_with("passes") {
        "passes"
    } else if reason.starts_with("no change") {
        "no-change"
    } else if reason.starts_with("identical to") {
        "duplicate"
    } else {
        "infrastructure"
    }
}

/// A name used as one path component: no separators, no `.`/`..`.
fn is_plain_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\\', '\0'])
}

fn parse_patch(text: &str, path: &Path) -> Result<Patch, AnalysisError> {
    Patch::parse(text).map_err(|e| AnalysisError::invalid(path, Some(e.line), e.reason))
}

fn load_run(
    dir: &Path,
    ds: &mut Dataset,
    state_src: &mut BTreeMap<String, PathBuf>,
    task_src: &mut BTreeMap<String, PathBuf>,
    seen_trials: &mut HashMap<(String, String), (PathBuf, usize)>,
) -> Result<(), AnalysisError> {
    let manifest_path = dir.join("manifest.json");
    let manifest: Manifest =
        serde_json::from_str(&read(&manifest_path)?).map_err(|source| AnalysisError::Json {
            path: manifest_path.clone(),
            line: None,
            source,
        })?;
    ds.runs.push(RunInfo {
        run_id: manifest.run_id.clone(),
        dir: Some(dir.to_path_buf()),
    });

    // States of this run, checked against other runs' copies.
    let mut run_states: BTreeMap<String, StateInfo> = BTreeMap::new();
    for path in json_files(&dir.join("states"))? {
        let file: StateFile =
            serde_json::from_str(&read(&path)?).map_err(|source| AnalysisError::Json {
                path: path.clone(),
                line: None,
                source,
            })?;
        if !is_plain_name(&file.state_id) {
            return Err(AnalysisError::invalid(
                &path,
                None,
                format!("invalid state id {:?}", file.state_id),
            ));
        }
        let patch = match &file.patch {
            Some(name) if !is_plain_name(name) => {
                return Err(AnalysisError::invalid(
                    &path,
                    None,
                    format!("patch {name:?} is not a file name"),
                ));
            }
            Some(name) => {
                let patch_path = dir.join("states").join(name);
                Some(parse_patch(&read(&patch_path)?, &patch_path)?)
            }
            None => None,
        };
        let info = StateInfo {
            state_id: file.state_id.clone(),
            task: file.task,
            predecessor: file.predecessor,
            failing_tests: file.failing_tests.into_iter().collect(),
            patch,
        };
        if let Some(prev) = ds.states.get(&info.state_id) {
            if *prev != info {
                return Err(AnalysisError::Conflict {
                    what: format!("state {}", info.state_id),
                    first: state_src[&info.state_id].clone(),
                    second: path,
                });
            }
        } else {
            state_src.insert(info.state_id.clone(), path.clone());
            ds.states.insert(info.state_id.clone(), info.clone());
        }
        run_states.insert(info.state_id.clone(), info);
    }

    // Where each residual candidate ended (its last line). A state whose candidate was
    // dropped after its record was written (a review rejection) is no start state.
    let cand_path = dir.join("states/candidates.jsonl");
    if let Some(text) = read_optional(&cand_path)? {
        let mut last: BTreeMap<String, CandidateEnd> = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: serde_json::Value =
                serde_json::from_str(line).map_err(|source| AnalysisError::Json {
                    path: cand_path.clone(),
                    line: Some(i + 1),
                    source,
                })?;
            let Some(candidate) = v["candidate"].as_str() else {
                return Err(AnalysisError::invalid(
                    &cand_path,
                    Some(i + 1),
                    "no candidate",
                ));
            };
            let kept = v["kept"].as_bool().unwrap_or(false);
            let reason = v["reason"].as_str().unwrap_or_default().to_string();
            let stage = v["stage"]
                .as_str()
                .map(String::from)
                .unwrap_or_else(|| legacy_stage(kept, &reason).to_string());
            last.insert(
                candidate.to_string(),
                CandidateEnd {
                    run_id: manifest.run_id.clone(),
                    candidate: candidate.to_string(),
                    task: v["task"].as_str().unwrap_or_default().to_string(),
                    predecessor: v["predecessor"].as_str().unwrap_or_default().to_string(),
                    stage,
                    kept,
                    reason,
                },
            );
        }
        for end in last.into_values() {
            // Dropped here; gone from the dataset too unless another run (whose copy was
            // read first) keeps it.
            if !end.kept
                && run_states.remove(&end.candidate).is_some()
                && state_src
                    .get(&end.candidate)
                    .is_some_and(|p| p.starts_with(dir))
            {
                ds.states.remove(&end.candidate);
                state_src.remove(&end.candidate);
            }
            ds.candidates.push(end);
        }
    }

    for path in json_files(&dir.join("tasks"))? {
        let info: TaskInfo =
            serde_json::from_str(&read(&path)?).map_err(|source| AnalysisError::Json {
                path: path.clone(),
                line: None,
                source,
            })?;
        if let Some(prev) = ds.tasks.get(&info.task) {
            if *prev != info {
                return Err(AnalysisError::Conflict {
                    what: format!("task {}", info.task),
                    first: task_src[&info.task].clone(),
                    second: path,
                });
            }
        } else {
            task_src.insert(info.task.clone(), path.clone());
            ds.tasks.insert(info.task.clone(), info);
        }
    }

    // A run stopped after its start states (residualize, or awaiting review) has none.
    let results_path = dir.join("results.jsonl");
    let text = read_optional(&results_path)?.unwrap_or_default();
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let row: TrialRow = serde_json::from_str(line).map_err(|source| AnalysisError::Json {
            path: results_path.clone(),
            line: Some(lineno),
            source,
        })?;
        let bad = |reason: String| AnalysisError::invalid(&results_path, Some(lineno), reason);
        if row.run_id != manifest.run_id {
            return Err(bad(format!(
                "run_id {:?} differs from the manifest's {:?}",
                row.run_id, manifest.run_id
            )));
        }
        if !is_plain_name(&row.trial_id) {
            return Err(bad(format!("invalid trial id {:?}", row.trial_id)));
        }
        match (row.condition.needs_predecessor(), &row.predecessor) {
            (true, None) => {
                return Err(bad(format!(
                    "a {} trial needs a predecessor",
                    row.condition.as_str()
                )));
            }
            (false, Some(p)) => {
                return Err(bad(format!(
                    "a clean trial has no predecessor, found {p:?}"
                )));
            }
            _ => {}
        }
        if let Some(state) = run_states.get(&row.start_state) {
            if state.task != row.task {
                return Err(bad(format!(
                    "start state {} belongs to task {}, not {}",
                    row.start_state, state.task, row.task
                )));
            }
            if row.condition == Condition::Residual
                && state.predecessor.is_some()
                && state.predecessor != row.predecessor
            {
                return Err(bad(format!(
                    "start state {} comes from predecessor {:?}, not {:?}",
                    row.start_state, state.predecessor, row.predecessor
                )));
            }
        }
        let key = (row.run_id.clone(), row.trial_id.clone());
        if let Some((_, first)) = seen_trials.get(&key) {
            return Err(bad(format!(
                "duplicate trial id {:?} (first on line {first})",
                row.trial_id
            )));
        }
        seen_trials.insert(key, (results_path.clone(), lineno));

        let mut trial = Trial::new(row);
        let wants_artifacts = matches!(trial.row.condition, Condition::Clean | Condition::Residual)
            && trial.row.is_normally_submitted();
        if wants_artifacts {
            let tdir = dir.join("trials").join(&trial.row.trial_id);
            let patch_path = tdir.join("final.patch");
            if let Some(text) = read_optional(&patch_path)? {
                trial.final_patch = Some(parse_patch(&text, &patch_path)?);
            }
            let traj_path = tdir.join("trajectory.jsonl");
            if let Some(text) = read_optional(&traj_path)? {
                trial.trajectory = Some(parse_trajectory(&text, &traj_path)?);
            }
        }
        ds.trials.push(trial);
    }
    Ok(())
}

fn parse_trajectory(text: &str, path: &Path) -> Result<Vec<TrajectoryCommand>, AnalysisError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let t: TrajectoryLine =
            serde_json::from_str(line).map_err(|source| AnalysisError::Json {
                path: path.to_path_buf(),
                line: Some(i + 1),
                source,
            })?;
        let cmd = match (t.argv, t.shell, t.keys) {
            (Some(a), None, None) => TrajectoryCommand::Argv(a),
            (None, Some(s), None) => TrajectoryCommand::Shell(s),
            (None, None, Some(k)) => TrajectoryCommand::Keys(k),
            _ => {
                return Err(AnalysisError::invalid(
                    path,
                    Some(i + 1),
                    "a trajectory line needs exactly one of argv, shell, keys",
                ))
            }
        };
        out.push(cmd);
    }
    Ok(out)
}
