//! The run directory's records: the run's configuration and manifest, residual start
//! states, and the append-only JSON-lines logs (decisions, results). What the modules
//! of a run share, below all of them.

use anyhow::bail;
use forkd_analysis::Condition;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rule {
    #[default]
    All,
    Majority,
}

impl std::str::FromStr for Rule {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Rule> {
        match s {
            "all" => Ok(Rule::All),
            "majority" => Ok(Rule::Majority),
            other => bail!("review rule {other:?}: use all or majority"),
        }
    }
}

/// How many reviewers a candidate needs and how they decide; part of the run's
/// configuration (and so of its fingerprint).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// 0: no review, every candidate that passes the automatic filters is kept.
    pub reviewers: usize,
    pub rule: Rule,
}

/// Everything that decides what a run measures; its hash is the run's fingerprint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    pub suite: PathBuf,
    /// Task name -> checksum of the task directory.
    pub tasks: BTreeMap<String, String>,
    /// Agent specs as given on the command line, and their fingerprints.
    pub agents: Vec<String>,
    pub agent_fingerprints: Vec<String>,
    /// Predecessor specs; empty means each task's own scripted predecessors.
    pub predecessors: Vec<String>,
    pub conditions: Vec<Condition>,
    pub replicates: u32,
    pub retries: u32,
    /// Image name -> its layers.
    pub images: BTreeMap<String, Vec<String>>,
    pub forkd_version: String,
    /// `--reconstruct` for every task, over their own `[residual] reconstruct`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconstruct: Option<super::task_toml::Reconstruct>,
    /// Human review of the residual candidates (none by default).
    #[serde(default, skip_serializing_if = "review_off")]
    pub review: Policy,
}

fn review_off(p: &Policy) -> bool {
    p.reviewers == 0
}

impl RunConfig {
    pub fn fingerprint(&self) -> String {
        use sha2::Digest;
        let body = serde_json::to_vec(self).expect("json");
        sha2::Sha256::digest(&body)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub run_id: String,
    pub fingerprint: String,
    pub created: u64,
    pub config: RunConfig,
    /// With review: the fingerprint of the decisions that chose the start states, fixed
    /// when the trials first start ([`super::review::fingerprint`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review_fingerprint: Option<String>,
    /// Started by `residualize`: a resume builds start states only, too (so that one
    /// stopped for review continues with them, not with trials).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub states_only: bool,
}

/// A residual start state, as written to `states/<id>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StateRecord {
    pub state_id: String,
    pub task: String,
    pub predecessor: Option<String>,
    pub failing_tests: Vec<String>,
    pub patch: String,
    pub checkpoint: String,
    pub tree_hash: Option<String>,
    pub changed_files: Vec<String>,
    pub content_key: String,
    /// How the state was built from the predecessor's work.
    #[serde(default)]
    pub reconstruct: super::task_toml::Reconstruct,
}

pub fn append_jsonl(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    writeln!(f, "{}", serde_json::to_string(value)?)?;
    f.sync_data()?;
    Ok(())
}

pub fn decision(run_dir: &Path, event: &str, detail: serde_json::Value) -> anyhow::Result<()> {
    append_jsonl(
        &run_dir.join("decisions.jsonl"),
        &serde_json::json!({ "t": super::now_secs(), "event": event, "detail": detail }),
    )
}
