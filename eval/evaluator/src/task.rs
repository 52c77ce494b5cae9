//! Task definitions: a suite is a directory of tasks, each laid out like Harbor's:
//!
//! ```text
//! <task>/task.toml          configuration (below)
//! <task>/instruction.md     the request shown to the agent
//! <task>/environment/       copied into the workdir before the set-up commands run
//! <task>/tests/             hidden tests, copied in only at grading
//! <task>/solution/          solve.sh (run in the workdir) or patch.diff (patch -p1)
//! <task>/predecessors/      <name>.patch | <name>.sh: scripted predecessor agents, and
//!                           <name>.note.md: that predecessor's handoff note
//! ```
//!
//! `task.toml` is [`super::task_toml`]'s.
//!
//! A Harbor task directory, as Harbor defines it, is a task too: see
//! [`super::harbor_task`] for the mapping.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

pub use super::task_toml::{
    AgentSection, EnvSection, ResidualSection, TaskSection, TaskToml, VerifierSection,
};

/// A loaded task.
#[derive(Debug, Clone)]
pub struct Task {
    pub name: String,
    pub dir: PathBuf,
    pub config: TaskToml,
    pub instruction: String,
    /// SHA-256 over every file of the task directory (paths and contents).
    pub checksum: String,
    /// Scripted predecessors: (name, file).
    pub predecessors: Vec<(String, PathBuf)>,
    /// SWE tasks: the commit the clean state's work tree is at (set when the run finds or
    /// builds the clean state); diffs of states are taken against it, so that commits a
    /// predecessor made are part of its patch.
    pub base_commit: std::sync::OnceLock<String>,
}

impl Task {
    pub fn load(dir: &Path) -> anyhow::Result<Task> {
        use anyhow::Context;
        let toml_path = dir.join("task.toml");
        let text = std::fs::read_to_string(&toml_path)
            .with_context(|| format!("read {}", toml_path.display()))?;
        let config: TaskToml = if super::harbor_task::is_harbor(&text, dir) {
            super::harbor_task::to_task_toml(&text, dir)?
        } else {
            toml::from_str(&text).with_context(|| format!("parse {}", toml_path.display()))?
        };
        let name = config.task.name.clone().unwrap_or_else(|| {
            dir.file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default()
        });
        anyhow::ensure!(
            valid_name(&name),
            "{}: task name {name:?} must be [A-Za-z0-9_.-]",
            toml_path.display()
        );
        anyhow::ensure!(
            ["swe", "terminal"].contains(&config.task.kind.as_str()),
            "{}: kind {:?} must be swe or terminal",
            toml_path.display(),
            config.task.kind
        );
        anyhow::ensure!(
            ["pytest", "junit", "reward"].contains(&config.verifier.format.as_str()),
            "{}: verifier format {:?} must be pytest, junit or reward",
            toml_path.display(),
            config.verifier.format
        );
        anyhow::ensure!(
            config.task.workdir.starts_with('/'),
            "{}: workdir must be absolute",
            toml_path.display()
        );
        anyhow::ensure!(
            config.verifier.tests_dir.starts_with('/'),
            "{}: tests_dir must be absolute",
            toml_path.display()
        );
        if config.verifier.format == "reward" {
            anyhow::ensure!(
                config.verifier.reward_path.is_some(),
                "{}: format reward needs reward_path",
                toml_path.display()
            );
        }
        if config.verifier.format == "junit" {
            anyhow::ensure!(
                config.verifier.junit_path.is_some(),
                "{}: format junit needs junit_path",
                toml_path.display()
            );
        }
        if config.residual.reconstruct == Some(super::task_toml::Reconstruct::Patch) {
            anyhow::ensure!(
                config.task.kind == "swe",
                "{}: [residual] reconstruct = \"patch\" rebuilds states from a git patch: it needs kind = \"swe\" (a terminal task's state is its live machine)",
                toml_path.display()
            );
        }
        for c in config.residual.carry.iter().flatten() {
            anyhow::ensure!(
                c.starts_with('/') && !c.split('/').any(|p| p == ".."),
                "{}: [residual] carry: {c:?} must be an absolute path without ..",
                toml_path.display()
            );
        }
        if let Some(s) = &config.environment.seccomp {
            s.parse::<forkd_api::Seccomp>().map_err(|e| {
                anyhow::anyhow!("{}: [environment] seccomp: {e}", toml_path.display())
            })?;
        }
        if config.environment.disk_mb == Some(0) {
            anyhow::bail!(
                "{}: [environment] disk_mb must be at least 1",
                toml_path.display()
            );
        }
        if let Some(n) = &config.environment.network {
            n.parse::<forkd_net::Network>().map_err(|e| {
                anyhow::anyhow!("{}: [environment] network: {e}", toml_path.display())
            })?;
        }
        let instr = dir.join("instruction.md");
        let instruction =
            std::fs::read_to_string(&instr).with_context(|| format!("read {}", instr.display()))?;
        for sub in ["tests", "solution"] {
            anyhow::ensure!(dir.join(sub).is_dir(), "{}: missing {sub}/", dir.display());
        }
        let mut predecessors = Vec::new();
        if let Ok(rd) = std::fs::read_dir(dir.join("predecessors")) {
            for e in rd.flatten() {
                let p = e.path();
                let ext = p.extension().and_then(|x| x.to_str()).unwrap_or("");
                if ext == "patch" || ext == "sh" {
                    let stem = p
                        .file_stem()
                        .map(|s| s.to_string_lossy().to_string())
                        .unwrap_or_default();
                    anyhow::ensure!(
                        valid_name(&stem),
                        "{}: predecessor name must be [A-Za-z0-9_.-]",
                        p.display()
                    );
                    predecessors.push((stem, p));
                }
            }
        }
        predecessors.sort();
        Ok(Task {
            checksum: dir_checksum(dir)?,
            name,
            dir: dir.to_path_buf(),
            config,
            instruction,
            predecessors,
            base_commit: std::sync::OnceLock::new(),
        })
    }

    pub fn workdir(&self) -> &str {
        &self.config.task.workdir
    }

    /// The handoff note of a predecessor, if it left one.
    pub fn note_of(&self, predecessor: &str) -> Option<String> {
        std::fs::read_to_string(
            self.dir
                .join("predecessors")
                .join(format!("{predecessor}.note.md")),
        )
        .ok()
    }

    /// Files the reference solution changes (from patch.diff), relative to the workdir.
    pub fn reference_changed_files(&self) -> Vec<String> {
        let Ok(text) = std::fs::read_to_string(self.dir.join("solution/patch.diff")) else {
            return Vec::new();
        };
        let mut out: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("+++ "))
            .map(|p| p.split('\t').next().unwrap_or(p).trim())
            .filter(|p| *p != "/dev/null")
            .map(|p| p.strip_prefix("b/").unwrap_or(p).to_string())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// SHA-256 over a directory's files, in sorted order (paths, types and contents).
pub fn dir_checksum(dir: &Path) -> anyhow::Result<String> {
    fn walk(base: &Path, rel: &Path, h: &mut Sha256) -> anyhow::Result<()> {
        let mut names: Vec<_> = std::fs::read_dir(base.join(rel))?
            .flatten()
            .map(|e| e.file_name())
            .collect();
        names.sort();
        for n in names {
            let r = rel.join(&n);
            let p = base.join(&r);
            let m = std::fs::symlink_metadata(&p)?;
            h.update(r.to_string_lossy().as_bytes());
            h.update([0]);
            if m.is_dir() {
                h.update(b"d");
                walk(base, &r, h)?;
            } else if m.file_type().is_symlink() {
                h.update(b"l");
                h.update(std::fs::read_link(&p)?.to_string_lossy().as_bytes());
            } else {
                h.update(b"f");
                h.update(std::fs::read(&p)?);
            }
            h.update([0]);
        }
        Ok(())
    }
    let mut h = Sha256::new();
    walk(dir, Path::new(""), &mut h)?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Loads every task of a suite (each subdirectory with a task.toml), sorted by name.
pub fn load_suite(dir: &Path) -> anyhow::Result<Vec<Task>> {
    // Absolute, as the daemon takes build contexts and every path it is given.
    let dir =
        &std::path::absolute(dir).map_err(|e| anyhow::anyhow!("suite {}: {e}", dir.display()))?;
    let mut tasks = Vec::new();
    let rd =
        std::fs::read_dir(dir).map_err(|e| anyhow::anyhow!("read suite {}: {e}", dir.display()))?;
    for e in rd.flatten() {
        if e.path().join("task.toml").is_file() {
            tasks.push(Task::load(&e.path())?);
        }
    }
    anyhow::ensure!(
        !tasks.is_empty(),
        "suite {} has no tasks (directories with a task.toml)",
        dir.display()
    );
    tasks.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task_dir(tag: &str, environment: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("forkd-task-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["tests", "solution"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::fs::write(dir.join("instruction.md"), "Do it.\n").unwrap();
        std::fs::write(
            dir.join("task.toml"),
            format!(
                "[task]\nkind = \"swe\"\nimage = \"busybox\"\nworkdir = \"/w\"\n\
                 [environment]\n{environment}\n\
                 [verifier]\ncommand = \"true\"\ntests_dir = \"/w/.t\"\n"
            ),
        )
        .unwrap();
        dir
    }

    #[test]
    fn the_filter_and_the_disk_limit_are_task_settings_checked_by_name() {
        let dir = task_dir("walls-ok", "seccomp = \"unconfined\"\ndisk_mb = 512");
        let t = Task::load(&dir).unwrap();
        assert_eq!(t.config.environment.seccomp.as_deref(), Some("unconfined"));
        assert_eq!(t.config.environment.disk_mb, Some(512));
        let dir = task_dir("walls-bad", "seccomp = \"off\"");
        let e = Task::load(&dir).unwrap_err().to_string();
        assert!(
            e.contains("[environment] seccomp") && e.contains("\"off\""),
            "{e}"
        );
        let dir = task_dir("walls-zero", "disk_mb = 0");
        let e = Task::load(&dir).unwrap_err().to_string();
        assert!(e.contains("disk_mb must be at least 1"), "{e}");
    }

    #[test]
    fn terminal_tasks_are_live_unless_they_say_otherwise() {
        let load = |tag: &str, kind: &str, env: &str| {
            let dir = task_dir(tag, env);
            let toml = std::fs::read_to_string(dir.join("task.toml")).unwrap();
            std::fs::write(
                dir.join("task.toml"),
                toml.replace("kind = \"swe\"", &format!("kind = \"{kind}\"")),
            )
            .unwrap();
            let live = Task::load(&dir).unwrap().config.live();
            std::fs::remove_dir_all(&dir).unwrap();
            live
        };
        assert!(load("live-t", "terminal", ""));
        assert!(!load("live-tf", "terminal", "live = false"));
        assert!(!load("live-s", "swe", ""));
        assert!(load("live-st", "swe", "live = true"));
    }
}
