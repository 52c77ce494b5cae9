//! Harbor task directories as evaluator tasks, unchanged.
//!
//! A Harbor task (`task.toml` schema 1.x with `[metadata]`, `[agent]`, `[verifier]`,
//! `[environment]`; `instruction.md`; `environment/`; `tests/test.sh` writing
//! `/logs/verifier/reward.txt` or `reward.json`; `solution/solve.sh`) maps onto the
//! evaluator's own task format ([`super::task`]) so:
//!
//! | Harbor                                | forkd                                          |
//! |---------------------------------------|------------------------------------------------|
//! | `[environment] docker_image`          | `[task] image` (a forkd image name)            |
//! | `[environment] workdir` (default `/app`) | `[task] workdir`; `environment/` copied into it |
//! | `tests/` uploaded to `/tests`, `bash /tests/test.sh` | `[verifier] tests_dir = "/tests"`, that command, `format = "reward"` |
//! | `/logs/verifier/reward.txt` or `reward.json` | `reward_path` (either file is read)   |
//! | `[verifier] timeout_sec`, `[agent] timeout_sec` | `timeout_secs` of each                |
//! | `solution/solve.sh`                   | the oracle's solution                          |
//!
//! Harbor tasks are machines, so they are `kind = "terminal"`. forkd's own extensions,
//! none required, go in a `forkd.toml` beside `task.toml` (Harbor never reads it), with
//! the evaluator's sections: `[task] kind`, `[environment] setup`, `background`, `live`,
//! `[agent] max_steps`, `[residual] ignore`; and `predecessors/` as in forkd's tasks.
//! A task that only has `environment/Dockerfile` is refused by name until forkd builds
//! Dockerfiles.

use super::task::{
    AgentSection, EnvSection, ResidualSection, TaskSection, TaskToml, VerifierSection,
};
use anyhow::Context;
use serde::Deserialize;
use std::path::Path;

/// Where Harbor puts the tests and where its verifier writes the reward.
pub const TESTS_DIR: &str = "/tests";
pub const REWARD_PATH: &str = "/logs/verifier/reward.txt";

/// The part of Harbor's `task.toml` the evaluator reads (everything else is Harbor's).
#[derive(Debug, Deserialize)]
struct HarborToml {
    #[serde(default)]
    environment: HarborEnvironment,
    #[serde(default)]
    agent: HarborPhase,
    #[serde(default)]
    verifier: HarborPhase,
}

#[derive(Debug, Default, Deserialize)]
struct HarborEnvironment {
    docker_image: Option<String>,
    workdir: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct HarborPhase {
    timeout_sec: Option<f64>,
}

/// forkd's optional extensions of a Harbor task (`forkd.toml`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Extensions {
    #[serde(default)]
    task: ExtTask,
    #[serde(default)]
    environment: Option<EnvSection>,
    #[serde(default)]
    agent: ExtAgent,
    #[serde(default)]
    residual: Option<ResidualSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExtTask {
    kind: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExtAgent {
    max_steps: Option<u64>,
}

/// Whether `text` (a `task.toml` in `dir`) is a Harbor task rather than forkd's own:
/// no `[task]` table with an image, and a `tests/test.sh`.
pub fn is_harbor(text: &str, dir: &Path) -> bool {
    let table: Result<toml::Table, _> = toml::from_str(text);
    let forkd_task = table
        .as_ref()
        .map(|t| t.get("task").and_then(|v| v.get("image")).is_some())
        .unwrap_or(false);
    !forkd_task && dir.join("tests/test.sh").is_file()
}

/// Maps a Harbor `task.toml` (and the optional `forkd.toml`) onto the evaluator's format.
pub fn to_task_toml(text: &str, dir: &Path) -> anyhow::Result<TaskToml> {
    let toml_path = dir.join("task.toml");
    let h: HarborToml = toml::from_str(text)
        .with_context(|| format!("parse {} as a Harbor task", toml_path.display()))?;
    let ext_path = dir.join("forkd.toml");
    let ext: Extensions = match std::fs::read_to_string(&ext_path) {
        Ok(t) => toml::from_str(&t).with_context(|| format!("parse {}", ext_path.display()))?,
        Err(_) => Extensions::default(),
    };
    let Some(image) = h.environment.docker_image.clone() else {
        anyhow::bail!(
            "{}: [environment] has no docker_image; building {} is not supported yet: import \
             the image into forkd and name it in docker_image",
            toml_path.display(),
            dir.join("environment/Dockerfile").display()
        );
    };
    let secs = |p: &HarborPhase, default: u64| {
        p.timeout_sec
            .map(|s| s.ceil().max(1.0) as u64)
            .unwrap_or(default)
    };
    let mut agent = AgentSection::default();
    agent.timeout_secs = secs(&h.agent, agent.timeout_secs);
    if let Some(n) = ext.agent.max_steps {
        agent.max_steps = n;
    }
    Ok(TaskToml {
        task: TaskSection {
            name: None,
            kind: ext.task.kind.unwrap_or_else(|| "terminal".into()),
            image,
            workdir: h.environment.workdir.unwrap_or_else(|| "/app".into()),
            description: None,
        },
        environment: ext.environment.unwrap_or_default(),
        verifier: VerifierSection {
            command: format!("mkdir -p /logs/verifier && bash {TESTS_DIR}/test.sh"),
            tests_dir: TESTS_DIR.into(),
            format: "reward".into(),
            junit_path: None,
            reward_path: Some(REWARD_PATH.into()),
            timeout_secs: secs(&h.verifier, 600),
            fail_to_pass: Vec::new(),
            pass_to_pass: Vec::new(),
        },
        agent,
        residual: ext.residual.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harbor_tasks_map_onto_the_evaluators_format() {
        let dir = std::env::temp_dir().join(format!("forkd-harbor-task-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("tests")).unwrap();
        std::fs::write(
            dir.join("tests/test.sh"),
            "echo 1 > /logs/verifier/reward.txt\n",
        )
        .unwrap();
        let text = "schema_version = \"1.4\"\n[metadata]\nx = 1\n[agent]\ntimeout_sec = 120.5\n\
                    [verifier]\ntimeout_sec = 30\n[environment]\ndocker_image = \"debian\"\n\
                    workdir = \"/srv\"\nallow_internet = false\ncpus = 1\n";
        assert!(is_harbor(text, &dir));
        assert!(!is_harbor("[task]\nimage = \"x\"\n", &dir));
        let t = to_task_toml(text, &dir).unwrap();
        assert_eq!(
            (
                t.task.image.as_str(),
                t.task.workdir.as_str(),
                t.task.kind.as_str()
            ),
            ("debian", "/srv", "terminal")
        );
        assert_eq!((t.agent.timeout_secs, t.verifier.timeout_secs), (121, 30));
        assert_eq!(t.verifier.reward_path.as_deref(), Some(REWARD_PATH));
        std::fs::write(
            dir.join("forkd.toml"),
            "[agent]\nmax_steps = 7\n[residual]\nignore = [\"*.log\"]\n[environment]\nlive = true\n",
        )
        .unwrap();
        let t = to_task_toml(text, &dir).unwrap();
        assert_eq!(t.agent.max_steps, 7);
        assert!(t.environment.live && t.residual.ignore == ["*.log"]);
        std::fs::write(dir.join("forkd.toml"), "[agent]\nbudget = 1\n").unwrap();
        assert!(
            to_task_toml(text, &dir).is_err(),
            "unknown extension keys are refused"
        );
        std::fs::remove_file(dir.join("forkd.toml")).unwrap();
        let e = to_task_toml("[environment]\nworkdir = \"/app\"\n", &dir).unwrap_err();
        assert!(format!("{e:#}").contains("docker_image"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
