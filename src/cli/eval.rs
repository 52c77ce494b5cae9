//! `forkd eval ...`: the evaluator. `report` turns run directories into the paired
//! statistics and the report (pure computation, see `forkd_analysis`).

use clap::{Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(clap::Args, Clone)]
pub struct MatrixArgs {
    /// The suite: a directory of tasks
    pub suite: PathBuf,
    /// The run directory to write
    #[arg(long)]
    pub out: PathBuf,
    /// Agents: oracle, noop, patch:FILE, script:FILE, replay:FILE, mini-swe-agent[:CONFIG][#MODEL] or NAME=COMMAND (comma-separated or repeated)
    #[arg(long, value_delimiter = ',', default_value = "oracle,noop")]
    pub agents: Vec<String>,
    /// Model of the harness agents that name none (a LiteLLM model string, e.g. hosted_vllm/Qwen/Qwen3-8B; base URL and key from the environment)
    #[arg(long)]
    pub model: Option<String>,
    /// Predecessor agents for residual states (default: each task's scripted predecessors)
    #[arg(long, value_delimiter = ',')]
    pub predecessors: Vec<String>,
    /// Conditions: clean, residual, rescue_notice, rescue_note, pristine_control
    #[arg(long, value_delimiter = ',', default_value = "clean,residual")]
    pub conditions: Vec<String>,
    /// Replicates per cell, each forked from the identical checkpoint
    #[arg(short = 'k', long, default_value_t = 1)]
    pub replicates: u32,
    /// Trials run at once
    #[arg(long, default_value_t = 2)]
    pub parallel: usize,
    /// Retries of a trial after an infrastructure failure
    #[arg(long, default_value_t = 2)]
    pub retries: u32,
    /// How residual states are built, for every task: exact (the predecessor's final
    /// state) or patch (SWE tasks: its patch on the clean state, uncommitted); default:
    /// each task's [residual] reconstruct, else exact
    #[arg(long)]
    pub reconstruct: Option<crate::eval::reconstruct::Reconstruct>,
    /// Reviewers each residual candidate needs before it becomes a state (0: no review);
    /// the run stops for `forkd eval review` and continues with `forkd eval resume`
    #[arg(long, default_value_t = 0)]
    pub reviewers: usize,
    /// How reviewers decide: all (every one accepts; one rejection drops) or majority
    #[arg(long, default_value = "all")]
    pub review_rule: crate::eval::review::Rule,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Running the trials as shards on a cluster's nodes (docs/EVAL.md, "Sharded runs").
#[derive(clap::Args, Clone, Default)]
pub struct ClusterArgs {
    /// Run the shards as one Slurm array job; the value (optional) is passed to sbatch,
    /// split at white space, e.g. --slurm "-p batch --time=4:00:00"
    #[arg(long, num_args = 0..=1, default_missing_value = "", value_name = "SBATCH_OPTIONS")]
    pub slurm: Option<String>,
    /// Write the shards as a Kubernetes Indexed Job manifest (JSON) to this file instead
    /// of running them
    #[arg(long, value_name = "FILE", conflicts_with = "slurm")]
    pub kube: Option<PathBuf>,
    /// Container image of the Kubernetes pods (forkd itself is mounted from the host)
    #[arg(long, default_value = "debian:bookworm-slim", requires = "kube")]
    pub kube_image: String,
    /// Shards (default: one per task; tasks are never split)
    #[arg(long)]
    pub shards: Option<usize>,
    /// Each node's daemon: its state root, %n standing for the node's name (socket
    /// ROOT.sock beside it; started by the shard when none answers). Default: the node's
    /// own daemon (FORKD_SOCKET or the default socket)
    #[arg(long, value_name = "TEMPLATE")]
    pub node_root: Option<String>,
    /// Return once the shards are submitted (follow with `forkd eval status`, merge
    /// with `forkd eval resume`)
    #[arg(long)]
    pub no_wait: bool,
}

impl ClusterArgs {
    fn sharded(&self) -> bool {
        self.slurm.is_some() || self.kube.is_some()
    }
}

impl MatrixArgs {
    fn options(&self, states_only: bool) -> anyhow::Result<forkd_eval_opts::RunOptions> {
        Ok(forkd_eval_opts::RunOptions {
            suite: self.suite.clone(),
            out: self.out.clone(),
            agents: self
                .agents
                .iter()
                .map(|a| match &self.model {
                    Some(m) => crate::eval::harness::MiniSweAgent::with_default_model(a, m),
                    None => a.clone(),
                })
                .collect(),
            predecessors: self.predecessors.clone(),
            conditions: self
                .conditions
                .iter()
                .map(|c| crate::eval::parse_condition(c))
                .collect::<anyhow::Result<_>>()?,
            replicates: self.replicates,
            parallel: self.parallel,
            retries: self.retries,
            states_only,
            reconstruct: self.reconstruct,
            review: crate::eval::review::Policy {
                reviewers: self.reviewers,
                rule: self.review_rule,
            },
            shard: None,
        })
    }
}

use crate::eval as forkd_eval_opts;

#[derive(Subcommand)]
pub enum EvalCmd {
    /// Check every task: the reference solution passes and the unchanged start fails
    Validate { suite: PathBuf },
    /// Build residual start states from the predecessors (clean states too)
    Residualize(MatrixArgs),
    /// Run the trial matrix: agents x conditions x start states x replicates
    Run(MatrixArgs),
    /// Continue a run that was stopped (refused if its configuration changed); a sharded
    /// run's unfinished shards are submitted again
    Resume {
        run: PathBuf,
        #[arg(long, default_value_t = 2)]
        parallel: usize,
        /// Sharded runs: return once the shards are submitted
        #[arg(long)]
        no_wait: bool,
    },
    /// Run one shard of a sharded run on this node (what each array task or pod runs)
    Shard {
        run: PathBuf,
        /// The shard (default: SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX)
        #[arg(long)]
        index: Option<usize>,
    },
    /// Where the shards of a sharded run stand (Slurm's queue and their files)
    Status { run: PathBuf },
    /// Merge the shards' results into the run directory
    Merge { run: PathBuf },
    /// Write a handoff note from a mini-swe-agent trajectory: one tool-free request to the agent's own model
    Note {
        /// The trajectory (e.g. RUN/trials/<id>/agent/trajectory.json)
        trajectory: PathBuf,
        /// The agent whose model writes it: mini-swe-agent[:CONFIG][#MODEL]
        #[arg(long)]
        agent: String,
        /// Model, when the agent spec names none
        #[arg(long)]
        model: Option<String>,
        /// The note file to write
        #[arg(long)]
        out: PathBuf,
    },
    /// Review residual candidates: write their sheets (RUN/review/), or record one
    /// reviewer's decision on one candidate
    Review {
        run: PathBuf,
        #[arg(long, requires = "reviewer")]
        candidate: Option<String>,
        #[arg(long, requires = "candidate")]
        reviewer: Option<String>,
        #[arg(long, conflicts_with = "reject")]
        accept: bool,
        #[arg(long)]
        reject: bool,
        /// The criterion a rejection fails: task-directed or task-verifier-consistent
        /// (repeatable)
        #[arg(long)]
        criterion: Vec<String>,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Append a protocol decision to a run's decision log
    Decide {
        run: PathBuf,
        #[arg(long)]
        note: String,
    },
    /// Analyse one or more run directories and write a report
    Report {
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        #[arg(long)]
        out: PathBuf,
        /// `report`: markdown, HTML with SVG plots, and CSVs; `json`: analysis.json
        #[arg(long, value_enum, default_value_t = ReportFormat::Report)]
        format: ReportFormat,
        /// Bootstrap draws per interval
        #[arg(long, default_value_t = forkd_analysis::Options::DEFAULT_DRAWS)]
        draws: usize,
        #[arg(long, default_value_t = forkd_analysis::Options::DEFAULT_SEED)]
        seed: u64,
        /// Trials a cell needs to enter a success number
        #[arg(long, default_value_t = 1)]
        min_trials: usize,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ReportFormat {
    Report,
    Json,
}

/// Runs an eval subcommand and prints what it says: JSON with `--json`, else its text.
pub fn run(socket: &std::path::Path, cmd: EvalCmd, json: bool) -> anyhow::Result<i32> {
    let said = said(socket, cmd)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&said.json).expect("json")
        );
    } else {
        print!("{}", said.text);
    }
    Ok(said.code)
}

fn said(socket: &std::path::Path, cmd: EvalCmd) -> anyhow::Result<crate::eval::Said> {
    use crate::eval::Said;
    match cmd {
        EvalCmd::Validate { suite } => crate::eval::validate(socket, &suite),
        EvalCmd::Residualize(m) => crate::eval::execute(socket, &m.options(true)?, false),
        EvalCmd::Run(m) if m.cluster.sharded() => sharded_run(socket, &m),
        EvalCmd::Run(m) => crate::eval::execute(socket, &m.options(false)?, false),
        EvalCmd::Resume {
            run,
            parallel,
            no_wait,
        } => match crate::eval::shard::load_plan(&run)? {
            Some(plan) => {
                // The configuration must still be the run's (the shards check theirs).
                crate::eval::begin(socket, &crate::eval::options_of(&run, parallel)?, true)?;
                match plan.scheduler.as_str() {
                    "slurm" => {
                        let last = crate::eval::slurm::submissions(&run).pop();
                        let o = crate::eval::slurm::SlurmOptions {
                            sbatch: last.map(|s| s.sbatch).unwrap_or_default(),
                            no_wait,
                            retries: 0,
                        };
                        crate::eval::slurm::drive(&run, &plan, &o, "resume")
                    }
                    _ => crate::eval::slurm::finish(&run),
                }
            }
            None => crate::eval::execute(socket, &crate::eval::options_of(&run, parallel)?, true),
        },
        EvalCmd::Shard { run, index } => crate::eval::shard::run_shard(&run, index),
        EvalCmd::Status { run } => crate::eval::slurm::status(&run),
        EvalCmd::Merge { run } => crate::eval::slurm::finish(&run),
        EvalCmd::Note {
            trajectory,
            agent,
            model,
            out,
        } => {
            let spec = match &model {
                Some(m) => crate::eval::harness::MiniSweAgent::with_default_model(&agent, m),
                None => agent.clone(),
            };
            let crate::eval::agent::AgentSpec::MiniSweAgent(h) =
                crate::eval::agent::AgentSpec::parse(&spec)?
            else {
                anyhow::bail!("--agent {agent:?}: a note needs a harness agent (mini-swe-agent[:CONFIG][#MODEL])");
            };
            anyhow::ensure!(
                trajectory.is_file(),
                "trajectory {} does not exist",
                trajectory.display()
            );
            h.write_note(socket, &trajectory, &out)?;
            Ok(Said::new(
                serde_json::json!({ "note": out, "trajectory": trajectory, "agent": h.name() }),
                format!("{}\n", out.display()),
            ))
        }
        EvalCmd::Review {
            run,
            candidate,
            reviewer,
            accept,
            reject,
            criterion,
            reason,
        } => crate::eval::review_command(
            &run, candidate, reviewer, accept, reject, criterion, reason,
        ),
        EvalCmd::Decide { run, note } => {
            anyhow::ensure!(
                run.join("manifest.json").exists(),
                "{} is not a run directory",
                run.display()
            );
            crate::eval::records::decision(&run, "protocol", serde_json::json!({ "note": note }))?;
            Ok(Said::new(
                serde_json::json!({ "run": run, "decision": "protocol", "note": note }),
                "",
            ))
        }
        EvalCmd::Report {
            runs,
            out,
            format,
            draws,
            seed,
            min_trials,
        } => {
            let t = std::time::Instant::now();
            let ds = forkd_analysis::load_runs(&runs)?;
            eprintln!(
                "loaded {} run(s) in {:.2}s; analysing with {draws} bootstrap draws ...",
                runs.len(),
                t.elapsed().as_secs_f64()
            );
            let analysis = forkd_analysis::analyze(
                &ds,
                &forkd_analysis::Options {
                    draws,
                    seed,
                    min_trials,
                },
            );
            let fmt = match format {
                ReportFormat::Report => forkd_analysis::Format::Report,
                ReportFormat::Json => forkd_analysis::Format::Json,
            };
            let files = forkd_analysis::write_report(&analysis, &out, fmt)?;
            eprintln!(
                "wrote {} files in {:.2}s",
                files.len(),
                t.elapsed().as_secs_f64()
            );
            Ok(Said::new(
                serde_json::json!({ "out": out, "files": files }),
                format!("{}\n", out.display()),
            ))
        }
    }
}

/// `forkd eval run --slurm|--kube`: plans the shards, then submits them (Slurm) or writes
/// the Indexed Job manifest (Kubernetes).
fn sharded_run(socket: &std::path::Path, m: &MatrixArgs) -> anyhow::Result<crate::eval::Said> {
    let c = &m.cluster;
    let opts = m.options(false)?;
    let scheduler = if c.slurm.is_some() { "slurm" } else { "kube" };
    let plan =
        crate::eval::shard::plan_run(socket, &opts, c.shards, c.node_root.clone(), scheduler)?;
    if let Some(file) = &c.kube {
        let job = crate::eval::slurm::kube_job(&opts.out, &plan, &c.kube_image, opts.retries)?;
        std::fs::write(file, serde_json::to_vec_pretty(&job)?)
            .map_err(|e| anyhow::anyhow!("write {}: {e}", file.display()))?;
        eprintln!(
            "[eval] {} shard(s) as an Indexed Job in {}: `kubectl apply -f` it, then `forkd eval merge {}`",
            plan.shards.len(),
            file.display(),
            opts.out.display()
        );
        return Ok(crate::eval::Said::new(
            serde_json::json!({ "run": opts.out, "status": "planned", "kube_job": file,
                "shards": plan.shards.len() }),
            format!("{}\n", file.display()),
        ));
    }
    let o = crate::eval::slurm::SlurmOptions {
        sbatch: c.slurm.clone().unwrap_or_default(),
        no_wait: c.no_wait,
        retries: opts.retries,
    };
    crate::eval::slurm::drive(&opts.out, &plan, &o, "run")
}
