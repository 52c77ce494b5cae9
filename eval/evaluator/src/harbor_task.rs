//! Harbor task directories as evaluator tasks, unchanged.
//!
//! A Harbor task (`task.toml` schema 1.x with `[metadata]`, `[agent]`, `[verifier]`,
//! `[environment]`; `instruction.md`; `environment/`; `tests/test.sh` writing
//! `/logs/verifier/reward.txt` or `reward.json`; `solution/solve.sh`) maps onto the
//! evaluator's own task format ([`super::task`]) so:
//!
//! | Harbor                                | forkd                                          |
//! |---------------------------------------|------------------------------------------------|
//! | `[environment] docker_image`          | `[task] image`, `pull = true`: pulled from its registry when forkd lacks it |
//! | `environment/Dockerfile`              | `[task] build = "environment"`: the image is built from it (when there is no docker_image, or it cannot be pulled), with egress unless the network is `no-network` |
//! | `[environment] workdir` (default `/app`) | `[task] workdir`; `environment/` copied into it when it is not a build context (as Harbor uploads it for prebuilt images) |
//! | `tests/` uploaded to `/tests`, `bash /tests/test.sh` | `[verifier] tests_dir = "/tests"`, that command, `format = "reward"` |
//! | `/logs/verifier/reward.txt` or `reward.json` | `reward_path` (either file is read)   |
//! | `/logs/verifier/ctrf.json` (per-test results) | `ctrf_path`: each test's outcome kept beside the reward |
//! | `[verifier] timeout_sec`, `[agent] timeout_sec` | `timeout_secs` of each                |
//! | `solution/solve.sh`                   | the oracle's solution                          |
//! | `[environment] network_mode` / `allow_internet`, `allowed_hosts` | `[environment] network`: `no-network` is `none`, `public` (Harbor's default) is `egress`, `allowlist` is `allowlist=HOSTS` |
//!
//! Harbor tasks are machines, so they are `kind = "terminal"`. forkd's own extensions,
//! none required, go in a `forkd.toml` beside `task.toml` (Harbor never reads it), with
//! the evaluator's sections: `[task] kind`, `[environment] setup`, `background`, `live`,
//! `[agent] max_steps`, `[residual] ignore`; and `predecessors/` as in forkd's tasks.
//! A task with neither a `docker_image` nor an `environment/Dockerfile` is refused by name.

use super::task_toml::{
    AgentSection, EnvSection, ResidualSection, TaskSection, TaskToml, VerifierSection,
};
use anyhow::Context;
use serde::Deserialize;
use std::path::Path;

/// Where Harbor puts the tests and where its verifier writes the reward.
pub const TESTS_DIR: &str = "/tests";
pub const REWARD_PATH: &str = "/logs/verifier/reward.txt";
/// Where Terminal-Bench-style `tests/test.sh` write per-test results (pytest-json-ctrf).
pub const CTRF_PATH: &str = "/logs/verifier/ctrf.json";

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
    healthcheck: Option<HarborHealthcheck>,
    /// `public` (Harbor's default), `no-network` or `allowlist`.
    network_mode: Option<String>,
    allowed_hosts: Option<Vec<String>>,
    /// The older spelling: false is `no-network`, true `public`.
    allow_internet: Option<bool>,
    /// What the environment may write, MiB: forkd's `[environment] disk_mb`.
    storage_mb: Option<u64>,
}

impl HarborEnvironment {
    /// The task's network policy in forkd's task-file form.
    fn network(&self, task: &Path) -> anyhow::Result<String> {
        let mode = match (&self.network_mode, self.allow_internet) {
            (Some(m), _) => m.as_str(),
            (None, Some(false)) => "no-network",
            (None, _) => "public",
        };
        let hosts = self.allowed_hosts.clone().unwrap_or_default();
        if mode != "allowlist" && !hosts.is_empty() {
            anyhow::bail!(
                "{}: allowed_hosts is only valid with network_mode = \"allowlist\"",
                task.display()
            );
        }
        let net = match mode {
            "no-network" => "none".to_string(),
            "public" => "egress".to_string(),
            "allowlist" => format!("allowlist={}", hosts.join(",")),
            other => anyhow::bail!(
                "{}: [environment] network_mode {other:?} is not one of public, no-network, allowlist",
                task.display()
            ),
        };
        net.parse::<forkd_net::Network>()
            .map_err(|e| anyhow::anyhow!("{}: [environment] network: {e}", task.display()))?;
        Ok(net)
    }
}

#[derive(Debug, Default, Deserialize)]
struct HarborHealthcheck {
    command: String,
    interval_sec: Option<f64>,
    retries: Option<u64>,
    start_period_sec: Option<f64>,
}

/// Whether a Dockerfile declares an ENTRYPOINT (whose processes a live state must keep).
fn declares_entrypoint(dockerfile: &Path) -> bool {
    std::fs::read_to_string(dockerfile)
        .ok()
        .and_then(|t| forkd_build::plan(&t).ok())
        .map(|p| {
            p.stages.iter().any(|s| {
                s.steps
                    .iter()
                    .any(|st| matches!(st.kind, forkd_build::StepKind::Entrypoint(_)))
            })
        })
        .unwrap_or(false)
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
    let network = h.environment.network(&toml_path)?;
    let dockerfile = dir.join("environment/Dockerfile");
    let build = dockerfile.is_file().then(|| "environment".to_string());
    // A task built from its Dockerfile gets an image of its own, named after its
    // directory; the build's step cache keeps it current at little cost.
    let rebuild = h.environment.docker_image.is_none();
    let image = match (&h.environment.docker_image, &build) {
        (Some(i), _) => i.clone(),
        (None, Some(_)) => {
            let base = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let slug: String = base
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "._-".contains(c) {
                        c
                    } else {
                        '-'
                    }
                })
                .collect();
            format!("harbor-task/{}", slug.trim_matches(['.', '-']))
        }
        (None, None) => anyhow::bail!(
            "{}: [environment] has no docker_image and there is no {}: name a forkd image in \
             docker_image or add the Dockerfile",
            toml_path.display(),
            dockerfile.display()
        ),
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
            build,
            rebuild,
            pull: h.environment.docker_image.is_some(),
        },
        environment: {
            let mut env = ext.environment.unwrap_or_default();
            env.entrypoint = true;
            if env.network.is_none() {
                env.network = Some(network);
            }
            if env.disk_mb.is_none() {
                env.disk_mb = h.environment.storage_mb.filter(|&mb| mb > 0);
            }
            // A start-up script's services are part of the state: keep them live, whatever
            // the kind (terminal tasks are live anyway, TaskToml::live).
            if env.live.is_none() && declares_entrypoint(&dockerfile) {
                env.live = Some(true);
            }
            if let (None, Some(hc)) = (&env.ready, &h.environment.healthcheck) {
                env.ready = Some(hc.command.clone());
                let tries = hc.retries.unwrap_or(3) as f64;
                let secs = hc.start_period_sec.unwrap_or(0.0)
                    + tries * hc.interval_sec.unwrap_or(5.0).max(0.2);
                env.ready_timeout_secs = secs.ceil().max(5.0) as u64;
            }
            env
        },
        verifier: VerifierSection {
            command: format!("mkdir -p /logs/verifier && bash {TESTS_DIR}/test.sh"),
            tests_dir: TESTS_DIR.into(),
            format: "reward".into(),
            junit_path: None,
            reward_path: Some(REWARD_PATH.into()),
            ctrf_path: Some(CTRF_PATH.into()),
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
                    workdir = \"/srv\"\nallow_internet = false\ncpus = 1\nstorage_mb = 2048\n";
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
        // storage_mb is every trial's disk limit.
        assert_eq!(t.environment.disk_mb, Some(2048));
        // Graded as Harbor grades: in the trial's machine, its processes alive.
        assert!(t.live());
        assert_eq!(t.verifier.reward_path.as_deref(), Some(REWARD_PATH));
        std::fs::write(
            dir.join("forkd.toml"),
            "[agent]\nmax_steps = 7\n[residual]\nignore = [\"*.log\"]\n[environment]\nlive = true\n",
        )
        .unwrap();
        let t = to_task_toml(text, &dir).unwrap();
        assert_eq!(t.agent.max_steps, 7);
        assert!(t.live() && t.residual.ignore == ["*.log"]);
        // A task may declare that its files alone are graded.
        std::fs::write(dir.join("forkd.toml"), "[environment]\nlive = false\n").unwrap();
        assert!(!to_task_toml(text, &dir).unwrap().live());
        std::fs::write(dir.join("forkd.toml"), "[task]\nkind = \"swe\"\n").unwrap();
        assert!(!to_task_toml(text, &dir).unwrap().live());
        std::fs::write(dir.join("forkd.toml"), "[agent]\nbudget = 1\n").unwrap();
        assert!(
            to_task_toml(text, &dir).is_err(),
            "unknown extension keys are refused"
        );
        std::fs::remove_file(dir.join("forkd.toml")).unwrap();
        let e = to_task_toml("[environment]\nworkdir = \"/app\"\n", &dir).unwrap_err();
        assert!(format!("{e:#}").contains("docker_image"), "{e:#}");
        // With a Dockerfile and no docker_image, the task's image is built from it.
        std::fs::create_dir_all(dir.join("environment")).unwrap();
        std::fs::write(dir.join("environment/Dockerfile"), "FROM debian\n").unwrap();
        let t = to_task_toml("[environment]\n", &dir).unwrap();
        assert_eq!(t.task.build.as_deref(), Some("environment"));
        assert!(t.task.rebuild);
        assert!(
            t.task.image.starts_with("harbor-task/forkd-harbor-task-"),
            "{}",
            t.task.image
        );
        let t = to_task_toml(text, &dir).unwrap();
        assert_eq!((t.task.image.as_str(), t.task.rebuild), ("debian", false));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
