//! `forkd eval ...`: the evaluator. `report` turns run directories into the paired
//! statistics and the report (pure computation, see `forkd_analysis`).

use clap::{Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum EvalCmd {
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

pub fn run(cmd: EvalCmd) -> anyhow::Result<i32> {
    match cmd {
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
            println!("{}", out.display());
            Ok(0)
        }
    }
}
