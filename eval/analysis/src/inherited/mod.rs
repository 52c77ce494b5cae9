//! Inherited-start metrics: success from residual states against the clean
//! start, per agent and per predecessor, and the behaviour signatures of the
//! continuations.
//!
//! For agent A, with c_i its clean success on task i and r_i its residual
//! success (cells averaged over replicates, then over the task's states):
//! - Res(A) = mean_i r_i, Clean(A) = mean_i c_i over the same N tasks (those
//!   with both values); Gap(A) = 100 (Clean - Res) points, as the mean of
//!   the per-task differences so that its interval is paired.
//! - Conditional failure rate = sum_i c_i (1 - r_i) / sum_i c_i: the mean of
//!   1 - r_i over C_A = {i : c_i = 1} when clean outcomes are 0/1; with
//!   replicates a task counts with the fraction of its clean runs that
//!   passed. Undefined when A solved nothing from the clean start.
//!
//! All four share one bootstrap family per (agent, predecessor group).
//!
//! The success numbers live in [`success`], the signatures in
//! [`signatures`]; [`analyze`] makes both.

mod signatures;
mod success;

use std::collections::BTreeSet;

use crate::analysis::{Exclusion, Inherited};
use crate::cells::Cells;
use crate::model::{Condition, Dataset};
use crate::Options;

use signatures::signatures;
use success::success_row;

pub(crate) fn analyze(
    ds: &Dataset,
    cells: &Cells<'_>,
    opts: &Options,
    exclusions: &mut Vec<Exclusion>,
) -> Inherited {
    let mut agents: BTreeSet<&str> = BTreeSet::new();
    let mut pairs: BTreeSet<(&str, &str)> = BTreeSet::new();
    for (cond, agent, pred) in cells.groups.keys() {
        if *cond == Condition::Residual {
            agents.insert(agent);
            if let Some(p) = pred {
                pairs.insert((agent, p));
            }
        }
    }
    let by_agent = agents
        .iter()
        .map(|a| success_row(cells, a, None, opts, Some(&mut *exclusions)))
        .collect();
    let by_predecessor = pairs
        .iter()
        .map(|(a, p)| success_row(cells, a, Some(p), opts, None))
        .collect();
    Inherited {
        by_agent,
        by_predecessor,
        signatures: signatures(ds),
    }
}
