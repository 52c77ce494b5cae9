//! Benchmark: analysis and report over a large synthetic dataset.
//!
//! 100,000 trial rows (seeded): 300 tasks, 4 agents, 1-3 residual states per
//! task from 3 predecessors, clean and residual trials with final patches
//! and trajectories, and rescue / note / pristine-control trials on each
//! agent's failure set; replicates are added round by round until the row
//! budget is spent. Times `analyze` (5,000 bootstrap draws) and
//! `write_report` separately, after one warm-up, and prints one JSON line
//! followed by a readable summary. `FORKD_BENCH_SAMPLES` sets the number of
//! timed samples (default 3), `FORKD_BENCH_DRAWS` the bootstrap draws
//! (default 5,000; 0 times everything but the bootstrap).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use forkd_analysis::stats::Xoshiro256;
use forkd_analysis::{
    analyze, write_report, Condition, Dataset, Format, Options, Outcome, Patch, StateInfo,
    TaskInfo, TestResult, TrajectoryCommand, Trial, TrialRow,
};

const ROWS: usize = 100_000;
const TASKS: usize = 300;
const AGENTS: [&str; 4] = ["alpha", "beta", "gamma", "delta"];
const PREDECESSORS: [&str; 3] = ["pred-x", "pred-y", "pred-z"];

fn diff(files: &[(String, Vec<String>)]) -> Patch {
    let mut text = String::new();
    for (path, lines) in files {
        text.push_str(&format!(
            "diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1,0 +1,{} @@\n",
            lines.len()
        ));
        for l in lines {
            text.push('+');
            text.push_str(l);
            text.push('\n');
        }
    }
    Patch::parse(&text).expect("synthetic patch parses")
}

struct Gen {
    rng: Xoshiro256,
    ds: Dataset,
    next_id: usize,
}

impl Gen {
    fn chance(&mut self, p: f64) -> bool {
        (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        task: usize,
        cond: Condition,
        state: &str,
        pred: Option<&str>,
        agent: &str,
        rep: u32,
        p_pass: f64,
    ) {
        let outcome = if self.chance(0.02) {
            Outcome::InfraError
        } else if self.chance(0.05) {
            Outcome::BudgetExhausted
        } else if self.chance(p_pass) {
            Outcome::Pass
        } else {
            Outcome::Fail
        };
        let mut tests = BTreeMap::new();
        for k in 0..4 {
            let ok = outcome == Outcome::Pass || self.chance(0.7);
            tests.insert(
                format!("test_{k}"),
                if ok {
                    TestResult::Pass
                } else {
                    TestResult::Fail
                },
            );
        }
        self.next_id += 1;
        let row = TrialRow {
            run_id: "bench".into(),
            trial_id: format!("trial-{}", self.next_id),
            task: format!("task-{task:03}"),
            condition: cond,
            start_state: state.into(),
            predecessor: pred.map(str::to_string),
            agent: agent.into(),
            replicate: rep,
            outcome,
            submitted: matches!(outcome, Outcome::Pass | Outcome::Fail),
            tests,
            steps: 20 + self.rng.below(200) as u64,
            wall_ms: 60_000,
            infra_attempts: 1,
        };
        let mut trial = Trial::new(row);
        if matches!(cond, Condition::Clean | Condition::Residual)
            && trial.row.is_normally_submitted()
        {
            let mut files = Vec::new();
            for f in 0..3 {
                if self.chance(0.5) {
                    let id = self.next_id;
                    let lines: Vec<String> = (0..20)
                        .filter(|_| self.chance(0.9))
                        .map(|l| format!("line {l} of file {f} in {task}"))
                        .chain(std::iter::once(format!("new {id}")))
                        .collect();
                    files.push((format!("src/mod{f}/file{f}.rs"), lines));
                }
            }
            trial.final_patch = Some(diff(&files));
            let f = self.rng.below(3);
            trial.trajectory = Some(vec![
                TrajectoryCommand::Shell("cd /repo && git status && git diff --stat".into()),
                TrajectoryCommand::Shell(format!("grep -rn 'fn main' --include='*.rs' src/mod{f}")),
                TrajectoryCommand::Shell("ls -la src && find . -name '*.rs' | head".into()),
                TrajectoryCommand::Shell(format!("sed -n '1,80p' /repo/src/mod{f}/file{f}.rs")),
                TrajectoryCommand::Shell(
                    "cat > /tmp/notes.txt <<'EOF'\ncat src/mod2/file2.rs\nEOF".into(),
                ),
                TrajectoryCommand::Argv(vec![
                    "bash".into(),
                    "-lc".into(),
                    "cargo test 2>&1 | tail -30".into(),
                ]),
                TrajectoryCommand::Keys("rg -n todo src/mod1\n".into()),
            ]);
        }
        self.ds.trials.push(trial);
    }
}

fn generate(seed: u64) -> Dataset {
    let mut g = Gen {
        rng: Xoshiro256::seed_from(seed),
        ds: Dataset::default(),
        next_id: 0,
    };
    // Tasks, residual states and failure sets.
    let mut states: Vec<Vec<(String, &str)>> = Vec::new();
    let mut failure_sets: Vec<Vec<usize>> = vec![Vec::new(); AGENTS.len()];
    for t in 0..TASKS {
        let task = format!("task-{t:03}");
        g.ds.tasks.insert(
            task.clone(),
            TaskInfo {
                task: task.clone(),
                reference_changed_files: (0..3).map(|f| format!("src/mod{f}/file{f}.rs")).collect(),
                f2p: vec!["test_0".into()],
                p2p: vec![],
            },
        );
        let k = 1 + g.rng.below(3);
        let mut list = Vec::new();
        for s in 0..k {
            let id = format!("{task}-s{s}");
            let pred = PREDECESSORS[g.rng.below(PREDECESSORS.len())];
            let touched = 1 + g.rng.below(2);
            let files: Vec<(String, Vec<String>)> = (0..touched)
                .map(|f| {
                    let lines = (0..20)
                        .map(|l| format!("line {l} of file {f} in {t}"))
                        .collect();
                    (format!("src/mod{f}/file{f}.rs"), lines)
                })
                .collect();
            g.ds.states.insert(
                id.clone(),
                StateInfo {
                    state_id: id.clone(),
                    task: task.clone(),
                    predecessor: Some(pred.into()),
                    failing_tests: ["test_1".to_string()].into_iter().collect(),
                    patch: Some(diff(&files)),
                },
            );
            list.push((id, pred));
        }
        states.push(list);
        for fs in failure_sets.iter_mut() {
            if g.chance(0.5) {
                fs.push(t);
            }
        }
    }
    let skill = [0.55, 0.5, 0.45, 0.4];
    let mut rep = 0u32;
    'rounds: loop {
        for (t, task_states) in states.iter().enumerate() {
            for (a, agent) in AGENTS.iter().enumerate() {
                g.push(t, Condition::Clean, "clean", None, agent, rep, skill[a]);
                for (sid, pred) in task_states {
                    g.push(
                        t,
                        Condition::Residual,
                        sid,
                        Some(pred),
                        agent,
                        rep,
                        skill[a] / 2.0,
                    );
                }
                if g.ds.trials.len() >= ROWS {
                    break 'rounds;
                }
            }
        }
        for (p, pred) in AGENTS.iter().enumerate() {
            for &t in &failure_sets[p].clone() {
                let state = format!("fail-{pred}-{t}");
                for (a, agent) in AGENTS.iter().enumerate() {
                    g.push(
                        t,
                        Condition::RescueNotice,
                        &state,
                        Some(pred),
                        agent,
                        rep,
                        skill[a] / 3.0,
                    );
                    g.push(
                        t,
                        Condition::RescueNote,
                        &state,
                        Some(pred),
                        agent,
                        rep,
                        skill[a] / 3.0,
                    );
                    g.push(
                        t,
                        Condition::PristineControl,
                        "clean",
                        Some(pred),
                        agent,
                        rep,
                        skill[a] / 2.5,
                    );
                    if g.ds.trials.len() >= ROWS {
                        break 'rounds;
                    }
                }
            }
        }
        rep += 1;
    }
    g.ds.trials.truncate(ROWS);
    g.ds
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((s.len() - 1) as f64 * p).round() as usize;
    s[i]
}

fn main() {
    let samples: usize = std::env::var("FORKD_BENCH_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1);
    let t = Instant::now();
    let ds = generate(0xBE7C);
    let generate_ms = ms(t);
    let mut opts = Options::default();
    if let Some(d) = std::env::var("FORKD_BENCH_DRAWS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        opts.draws = d;
    }
    // `FORKD_BENCH_OUT=dir` keeps the last report there for inspection.
    let keep = std::env::var_os("FORKD_BENCH_OUT").map(PathBuf::from);
    let out: PathBuf = keep.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("forkd-analysis-bench-{}", std::process::id()))
    });

    // Warm-up, not timed.
    let a = analyze(&ds, &opts);
    let files = write_report(&a, &out, Format::Report).expect("report written");

    let (mut analyze_ms, mut write_ms) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let t = Instant::now();
        let a = analyze(&ds, &opts);
        analyze_ms.push(ms(t));
        let t = Instant::now();
        write_report(&a, &out, Format::Report).expect("report written");
        write_ms.push(ms(t));
    }
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&out);
    }

    let stats = |v: &[f64]| {
        format!(
            "{{\"p50\":{:.1},\"p90\":{:.1},\"min\":{:.1},\"max\":{:.1}}}",
            percentile(v, 0.5),
            percentile(v, 0.9),
            percentile(v, 0.0),
            percentile(v, 1.0)
        )
    };
    println!(
        "{{\"rows\":{},\"draws\":{},\"samples\":{samples},\"analyze_ms\":{:.1},\"write_ms\":{:.1},\
         \"analyze\":{},\"write\":{},\"generate_ms\":{generate_ms:.1},\"files\":{},\"directions\":{},\"exclusions\":{}}}",
        ds.trials.len(),
        opts.draws,
        percentile(&analyze_ms, 0.5),
        percentile(&write_ms, 0.5),
        stats(&analyze_ms),
        stats(&write_ms),
        files.len(),
        a.recovery.directions.len(),
        a.exclusions.len(),
    );
    println!(
        "report over {} rows, {} draws: analyze p50 {:.0} ms, write p50 {:.0} ms ({} samples)",
        ds.trials.len(),
        opts.draws,
        percentile(&analyze_ms, 0.5),
        percentile(&write_ms, 0.5),
        samples
    );
}
