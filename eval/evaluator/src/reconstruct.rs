//! How a residual start state is built from a predecessor's work (`[residual]
//! reconstruct` of a task, or `--reconstruct` for a whole run):
//!
//! - `exact` (the default; the recovery pilot's choice): the predecessor's final state as
//!   it was, a checkpoint of the whole machine (processes included for live tasks), its
//!   git history and commit messages included;
//! - `patch` (SWE-Residual's Stage IV; SWE tasks only): a fresh fork of the clean state,
//!   the task's environment at its base commit, with the predecessor's binary-safe patch
//!   (`git diff --binary` of the work tree against the base commit, so that commits the
//!   predecessor made are in it) applied to the work tree with `git apply`, **uncommitted**:
//!   `git status` and `git diff` show the changes, HEAD is the base commit, and nothing of
//!   the predecessor's history or commit messages is in `.git`. Traces a state carries
//!   naturally stay: what the predecessor wrote into the tree (tests, notes) is in the
//!   patch, and its shell history files (`[residual] carry`, by default root's bash and
//!   Python histories) are copied from its final state.
//!
//! A patch that does not apply is a recorded loss, with the first failing hunk as git
//! reports it, never a silent drop; the rebuilt state is then graded on a fresh fork,
//! which must still fail.

use super::session::{InfraResult, Session};
use super::task::Task;
use forkd_api::ExecRequest;

pub use super::task_toml::{Reconstruct, DEFAULT_CARRY};

/// Why a reconstruction produced no state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// `git apply` refused the patch: its first error line (the failing hunk's file and
    /// line), and the rest of what it said.
    DoesNotApply { hunk: String, detail: String },
    /// The patch is empty: there is nothing to rebuild.
    Empty,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::DoesNotApply { hunk, .. } => {
                write!(f, "the patch does not apply to the clean state: {hunk}")
            }
            Failure::Empty => f.write_str("the patch is empty"),
        }
    }
}

/// The first line of `git apply`'s complaint that names where it failed
/// (`error: patch failed: src/x.py:12`), else its first error line.
pub fn first_failing_hunk(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines
        .iter()
        .find(|l| l.starts_with("error: patch failed:"))
        .or_else(|| lines.iter().find(|l| l.starts_with("error:")))
        .or_else(|| lines.first())
        .map(|l| l.to_string())
        .unwrap_or_else(|| "git apply failed without saying why".into())
}

/// The files among `paths` in a layer tar (a checkpoint's delta, overlay form), with
/// their contents: the traces a patch-on-base state carries over.
pub fn carried_files(delta_tar: &[u8], paths: &[String]) -> Vec<(String, Vec<u8>)> {
    use std::io::Read;
    let mut out = Vec::new();
    let mut a = tar::Archive::new(delta_tar);
    let Ok(entries) = a.entries() else {
        return out;
    };
    for e in entries.flatten() {
        let mut e = e;
        if e.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let Ok(p) = e.path() else { continue };
        let abs = format!("/{}", p.to_string_lossy().trim_start_matches("./"));
        if paths.contains(&abs) {
            let mut data = Vec::new();
            if e.read_to_end(&mut data).is_ok() {
                out.push((abs, data));
            }
        }
    }
    out
}

/// Builds a patch-on-base state: a fresh fork of `clean` with `patch` applied to the work
/// tree, uncommitted, and `carry` written in; checkpointed. `Ok(Err(..))` is a loss of
/// the candidate (the patch does not apply); `Err` an infrastructure failure.
pub fn patch_on_base(
    s: &Session,
    task: &Task,
    clean: &str,
    patch: &[u8],
    carry: &[(String, Vec<u8>)],
    labels: &[(&str, &str)],
) -> InfraResult<Result<String, Failure>> {
    if patch.iter().all(u8::is_ascii_whitespace) {
        return Ok(Err(Failure::Empty));
    }
    let wd = task.workdir();
    let sb = s.fork(clean, !task.config.live())?;
    let result = (|| -> InfraResult<Result<String, Failure>> {
        let apply = ExecRequest {
            argv: vec![
                "git".into(),
                "apply".into(),
                "--binary".into(),
                "--whitespace=nowarn".into(),
                "-".into(),
            ],
            cwd: Some(wd.to_string()),
            timeout_ms: Some(120_000),
            ..Default::default()
        };
        let r = s.exec(&sb, &apply, Some(patch))?;
        if r.code != 0 {
            let err = r.err();
            return Ok(Err(Failure::DoesNotApply {
                hunk: first_failing_hunk(&err),
                detail: err.trim().to_string(),
            }));
        }
        for (path, data) in carry {
            let write = ExecRequest {
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    "mkdir -p \"$(dirname \"$1\")\" && cat > \"$1\"".into(),
                    "sh".into(),
                    path.clone(),
                ],
                cwd: Some("/".into()),
                timeout_ms: Some(60_000),
                ..Default::default()
            };
            let w = s.exec(&sb, &write, Some(data))?;
            if w.code != 0 {
                return Err(super::session::Infra(format!(
                    "write {path} into the rebuilt state: {}",
                    w.err().trim()
                )));
            }
        }
        let ck = s.checkpoint(&sb, task.config.live(), labels)?;
        Ok(Ok(ck.id))
    })();
    s.remove(&sb);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failing_hunk_is_the_line_that_names_it() {
        let err = "error: patch failed: more_itertools/more.py:880\nerror: more_itertools/more.py: patch does not apply\n";
        assert_eq!(
            first_failing_hunk(err),
            "error: patch failed: more_itertools/more.py:880"
        );
        assert_eq!(
            first_failing_hunk("warning: x\nerror: corrupt patch at line 3\n"),
            "error: corrupt patch at line 3"
        );
        assert_eq!(
            first_failing_hunk(""),
            "git apply failed without saying why"
        );
    }

    #[test]
    fn carried_files_come_from_the_delta() {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in [("root/.bash_history", &b"ls\n"[..]), ("testbed/x.py", b"x")] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o600);
            h.set_cksum();
            b.append_data(&mut h, name, data).unwrap();
        }
        let tar = b.into_inner().unwrap();
        let got = carried_files(
            &tar,
            &["/root/.bash_history".into(), "/root/.python_history".into()],
        );
        assert_eq!(
            got,
            vec![("/root/.bash_history".to_string(), b"ls\n".to_vec())]
        );
    }

    #[test]
    fn modes_parse() {
        assert_eq!("patch".parse::<Reconstruct>().unwrap(), Reconstruct::Patch);
        assert!("copy"
            .parse::<Reconstruct>()
            .unwrap_err()
            .to_string()
            .contains("exact or patch"));
    }
}
