//! Recovery metrics: rescue of a failed run by the same or another agent.
//!
//! F_A is the set of tasks with recovery trials (`rescue_notice`,
//! `rescue_note`, `pristine_control`) whose predecessor is A. On F_A, per
//! task (replicates averaged within a start state, then states averaged):
//! R(A->B) from `rescue_notice` rows of agent B, Rnote(A->B) from
//! `rescue_note`, C(B) from `pristine_control` rows of agent B. Then
//! - HRG(A->B) = R(A->B) - R(A->A)       (A != B)
//! - FTV(A->B) = R(A->B) - C(B)
//! - CTV(A->B) = Rnote(A->B) - R(A->B)
//! - HRG(A->B) = [C(B) - C(A)] + [FTV(A->B) - FTV(A->A)], per task and so in
//!   the mean, on the tasks where all four rates exist.
//!
//! Each contrast is the mean over tasks of the per-task difference, on the
//! tasks where both sides exist. One bootstrap family per direction
//! resamples F_A once per draw for every number of that direction.
//!
//! Pooled estimates (per pair of agents {A, B}, and over all directions when
//! there are more than two agents) weigh every (direction, task) pair the
//! same: the mean over pairs of the per-pair difference, which equals the
//! difference of the pooled success rates when every cell has the same
//! replicates. Their bootstrap resamples the distinct tasks of the union of
//! the failure sets, each task carrying all its directions with it. HRG and
//! its decomposition pool the cross directions (A->B, B->A); FTV and CTV pool
//! all four (A->A, A->B, B->A, B->B).

use std::collections::{BTreeMap, BTreeSet};

use crate::analysis::{
    Contrast, Decomposition, Direction, Effect, Estimate, Exclusion, Pooled, Recovery, Section,
};
use crate::cells::Cells;
use crate::model::Condition;
use crate::stats::{bootstrap, Column};
use crate::Options;

const CONDITIONS: [Condition; 3] = [
    Condition::RescueNotice,
    Condition::RescueNote,
    Condition::PristineControl,
];

/// Differences within this distance of zero count as zero when counting
/// tasks by sign (per-task values are means of a few 0/1 outcomes).
const ZERO: f64 = 1e-12;

/// Per-task values of one direction, indexed like `tasks`.
struct DirData<'a> {
    pred: &'a str,
    rescuer: &'a str,
    tasks: Vec<&'a str>,
    r: Vec<Option<f64>>,
    rn: Vec<Option<f64>>,
    cb: Vec<Option<f64>>,
    ftv: Vec<Option<f64>>,
    ctv: Vec<Option<f64>>,
    hrg: Option<Vec<Option<f64>>>,
    /// On the tasks with all four rates: HRG, capability, state.
    dec: Option<[Vec<Option<f64>>; 3]>,
    /// R(A->B), R(A->A), C(B), C(A) on those tasks.
    dec_rates: Option<[Vec<Option<f64>>; 4]>,
}

fn label(cond: Condition, pred: &str, agent: &str) -> String {
    match cond {
        Condition::RescueNotice => format!("R({pred}->{agent})"),
        Condition::RescueNote => format!("Rnote({pred}->{agent})"),
        Condition::PristineControl => format!("C({agent}) on F_{pred}"),
        other => other.as_str().to_string(),
    }
}

pub(crate) fn analyze<'a>(
    cells: &Cells<'a>,
    opts: &Options,
    exclusions: &mut Vec<Exclusion>,
) -> Recovery {
    let mut failure_sets: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut agents: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for ((cond, agent, pred), g) in &cells.groups {
        let Some(pred) = pred else { continue };
        if CONDITIONS.contains(cond) {
            failure_sets
                .entry(pred)
                .or_default()
                .extend(g.keys().copied());
            agents.entry(pred).or_default().insert(agent);
        }
    }

    let mut dirs: Vec<DirData<'a>> = Vec::new();
    for (pred, task_set) in &failure_sets {
        let tasks: Vec<&str> = task_set.iter().copied().collect();
        // The start states of each task (failed states for the rescues, the
        // pristine start for the control) as run by any agent: one an agent
        // lacks is reported, not silently averaged away.
        let mut expected: BTreeMap<(bool, &str), BTreeSet<&str>> = BTreeMap::new();
        for agent in &agents[pred] {
            for cond in CONDITIONS {
                let Some(g) = cells.group(cond, agent, Some(pred)) else {
                    continue;
                };
                let control = cond == Condition::PristineControl;
                for (task, states) in g {
                    expected
                        .entry((control, task))
                        .or_default()
                        .extend(states.keys().copied());
                }
            }
        }
        // Per-task values of every (condition, agent) group on F_pred.
        let mut values: BTreeMap<(Condition, &str), Vec<Option<f64>>> = BTreeMap::new();
        for agent in &agents[pred] {
            for cond in CONDITIONS {
                let Some(g) = cells.group(cond, agent, Some(pred)) else {
                    continue;
                };
                let quantity = label(cond, pred, agent);
                let mut v = Vec::with_capacity(tasks.len());
                for task in &tasks {
                    match g.get(task) {
                        Some(states) => {
                            let m = cells.task_mean(states.iter().map(|(k, c)| (*k, c)));
                            cells.record(
                                exclusions,
                                Section::Recovery,
                                &quantity,
                                agent,
                                Some(pred),
                                task,
                                &m,
                            );
                            let control = cond == Condition::PristineControl;
                            for state in &expected[&(control, *task)] {
                                if !states.contains_key(state) {
                                    exclusions.push(Exclusion {
                                        section: Section::Recovery,
                                        quantity: quantity.clone(),
                                        agent: agent.to_string(),
                                        predecessor: Some(pred.to_string()),
                                        task: task.to_string(),
                                        state: Some(state.to_string()),
                                        valid_trials: 0,
                                        infra_errors: 0,
                                        reason: "no trials".into(),
                                        effect: if m.value.is_some() {
                                            Effect::StateExcluded
                                        } else {
                                            Effect::TaskExcluded
                                        },
                                    });
                                }
                            }
                            v.push(m.value);
                        }
                        None => {
                            exclusions.push(Exclusion {
                                section: Section::Recovery,
                                quantity: quantity.clone(),
                                agent: agent.to_string(),
                                predecessor: Some(pred.to_string()),
                                task: task.to_string(),
                                state: None,
                                valid_trials: 0,
                                infra_errors: 0,
                                reason: "no trials".into(),
                                effect: Effect::TaskExcluded,
                            });
                            v.push(None);
                        }
                    }
                }
                values.insert((cond, agent), v);
            }
        }
        let none = vec![None; tasks.len()];
        let get = |cond: Condition, agent: &'a str| values.get(&(cond, agent));
        for rescuer in &agents[pred] {
            let r = get(Condition::RescueNotice, rescuer)
                .unwrap_or(&none)
                .clone();
            let rn = get(Condition::RescueNote, rescuer).unwrap_or(&none).clone();
            let cb = get(Condition::PristineControl, rescuer)
                .unwrap_or(&none)
                .clone();
            let diff = |a: &[Option<f64>], b: &[Option<f64>]| -> Vec<Option<f64>> {
                a.iter().zip(b).map(|(x, y)| Some((*x)? - (*y)?)).collect()
            };
            let ftv = diff(&r, &cb);
            let ctv = diff(&rn, &r);
            let same = get(Condition::RescueNotice, pred);
            let (hrg, dec, dec_rates) = match (rescuer != pred, same) {
                (true, Some(raa)) => {
                    let ca = get(Condition::PristineControl, pred).unwrap_or(&none);
                    let hrg = diff(&r, raa);
                    let mut dh = Vec::with_capacity(tasks.len());
                    let mut cap = Vec::with_capacity(tasks.len());
                    let mut st = Vec::with_capacity(tasks.len());
                    let mut rates: [Vec<Option<f64>>; 4] = Default::default();
                    for t in 0..tasks.len() {
                        let all = (r[t], raa[t], cb[t], ca[t]);
                        if let (Some(rab), Some(raa), Some(cb), Some(ca)) = all {
                            dh.push(Some(rab - raa));
                            cap.push(Some(cb - ca));
                            st.push(Some((rab - cb) - (raa - ca)));
                            for (slot, v) in rates.iter_mut().zip([rab, raa, cb, ca]) {
                                slot.push(Some(v));
                            }
                        } else {
                            dh.push(None);
                            cap.push(None);
                            st.push(None);
                            for slot in rates.iter_mut() {
                                slot.push(None);
                            }
                        }
                    }
                    (Some(hrg), Some([dh, cap, st]), Some(rates))
                }
                _ => (None, None, None),
            };
            dirs.push(DirData {
                pred,
                rescuer,
                tasks: tasks.clone(),
                r,
                rn,
                cb,
                ftv,
                ctv,
                hrg,
                dec,
                dec_rates,
            });
        }
    }

    let directions = dirs.iter().map(|d| direction(d, opts)).collect();
    Recovery {
        directions,
        pooled: pooled_all(&dirs, opts),
    }
}

fn signs(values: &[Option<f64>]) -> (usize, usize, usize) {
    let (mut pos, mut neg, mut zero) = (0, 0, 0);
    for v in values.iter().flatten() {
        if *v > ZERO {
            pos += 1;
        } else if *v < -ZERO {
            neg += 1;
        } else {
            zero += 1;
        }
    }
    (pos, neg, zero)
}

fn contrast(values: &[Option<f64>], col: &Column, ci: Option<crate::stats::Interval>) -> Contrast {
    let (p, n, z) = signs(values);
    Contrast {
        estimate: Estimate::from_column(col, ci),
        tasks_positive: p,
        tasks_negative: n,
        tasks_zero: z,
    }
}

fn direction(d: &DirData<'_>, opts: &Options) -> Direction {
    let mut cols = vec![
        Column::mean_of(&d.r),
        Column::mean_of(&d.rn),
        Column::mean_of(&d.cb),
        Column::mean_of(&d.ftv),
        Column::mean_of(&d.ctv),
    ];
    if let Some(h) = &d.hrg {
        cols.push(Column::mean_of(h));
    }
    if let Some(dec) = &d.dec {
        cols.extend(dec.iter().map(|v| Column::mean_of(v)));
    }
    let key = format!("recovery/{}->{}", d.pred, d.rescuer);
    let ci = bootstrap(&cols, opts.draws, opts.seed, &key);
    let hrg = d.hrg.as_ref().map(|h| contrast(h, &cols[5], ci[5]));
    let decomposition = d
        .dec
        .as_ref()
        .zip(d.dec_rates.as_ref())
        .map(|(dec, rates)| {
            let base = 6;
            let point = |v: &Vec<Option<f64>>| Column::mean_of(v).point();
            Decomposition {
                tasks: cols[base].support(),
                hrg: Estimate::from_column(&cols[base], ci[base]),
                capability: Estimate::from_column(&cols[base + 1], ci[base + 1]),
                state: Estimate::from_column(&cols[base + 2], ci[base + 2]),
                rescue: point(&rates[0]),
                rescue_same: point(&rates[1]),
                control_rescuer: point(&rates[2]),
                control_predecessor: point(&rates[3]),
            }
            .checked(dec)
        });
    Direction {
        predecessor: d.pred.to_string(),
        rescuer: d.rescuer.to_string(),
        failure_set: d.tasks.len(),
        rescue: Estimate::from_column(&cols[0], ci[0]),
        rescue_note: Estimate::from_column(&cols[1], ci[1]),
        control: Estimate::from_column(&cols[2], ci[2]),
        ftv: contrast(&d.ftv, &cols[3], ci[3]),
        ctv: contrast(&d.ctv, &cols[4], ci[4]),
        hrg,
        decomposition,
    }
}

impl Decomposition {
    /// The identity holds per task by construction; a violation beyond
    /// rounding is a bug in this module.
    fn checked(self, dec: &[Vec<Option<f64>>; 3]) -> Self {
        for ((h, c), s) in dec[0].iter().zip(&dec[1]).zip(&dec[2]) {
            if let (Some(h), Some(c), Some(s)) = (h, c, s) {
                debug_assert!((h - (c + s)).abs() <= 1e-12, "HRG {h} != {c} + {s}");
            }
        }
        if let (Some(h), Some(c), Some(s)) =
            (self.hrg.value, self.capability.value, self.state.value)
        {
            debug_assert!((h - (c + s)).abs() <= 1e-12, "HRG {h} != {c} + {s}");
        }
        self
    }
}

/// Pooled estimates for every pair of agents with both cross directions,
/// and over all directions when there is more than one such pair.
fn pooled_all(dirs: &[DirData<'_>], opts: &Options) -> Vec<Pooled> {
    let has = |a: &str, b: &str| dirs.iter().any(|d| d.pred == a && d.rescuer == b);
    let preds: BTreeSet<&str> = dirs.iter().map(|d| d.pred).collect();
    let mut out = Vec::new();
    for a in &preds {
        for b in &preds {
            if a < b && has(a, b) && has(b, a) {
                let members: Vec<&DirData<'_>> = dirs
                    .iter()
                    .filter(|d| [*a, *b].contains(&d.pred) && [*a, *b].contains(&d.rescuer))
                    .collect();
                out.push(pooled(&format!("{a}+{b}"), &members, opts));
            }
        }
    }
    if out.len() > 1 {
        let members: Vec<&DirData<'_>> = dirs.iter().collect();
        out.push(pooled("all", &members, opts));
    }
    out
}

fn pooled(scope: &str, members: &[&DirData<'_>], opts: &Options) -> Pooled {
    let union: BTreeSet<&str> = members
        .iter()
        .flat_map(|d| d.tasks.iter().copied())
        .collect();
    let index: BTreeMap<&str, usize> = union.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let n = union.len();
    let add = |col: &mut Column, d: &DirData<'_>, values: &[Option<f64>]| {
        for (task, v) in d.tasks.iter().zip(values) {
            if let Some(v) = v {
                let i = index[task];
                col.num[i] += v;
                col.den[i] += 1.0;
            }
        }
    };
    // hrg, ftv, ctv, dec hrg, cap, state, r same/other, note same/other, control same/other
    let mut cols: Vec<Column> = (0..12).map(|_| Column::zeros(n)).collect();
    for d in members {
        let cross = d.pred != d.rescuer;
        if let Some(h) = &d.hrg {
            add(&mut cols[0], d, h);
        }
        add(&mut cols[1], d, &d.ftv);
        add(&mut cols[2], d, &d.ctv);
        if let Some(dec) = &d.dec {
            for (k, v) in dec.iter().enumerate() {
                add(&mut cols[3 + k], d, v);
            }
        }
        let off = usize::from(cross);
        add(&mut cols[6 + off], d, &d.r);
        add(&mut cols[8 + off], d, &d.rn);
        add(&mut cols[10 + off], d, &d.cb);
    }
    let ci = bootstrap(
        &cols,
        opts.draws,
        opts.seed,
        &format!("recovery/pooled/{scope}"),
    );
    let e = |i: usize| Estimate::from_column(&cols[i], ci[i]);
    Pooled {
        scope: scope.to_string(),
        directions: members
            .iter()
            .map(|d| format!("{}->{}", d.pred, d.rescuer))
            .collect(),
        tasks: n,
        hrg: e(0),
        ftv: e(1),
        ctv: e(2),
        decomposition_hrg: e(3),
        capability: e(4),
        state: e(5),
        rescue_same: e(6),
        rescue_other: e(7),
        note_same: e(8),
        note_other: e(9),
        control_same: e(10),
        control_other: e(11),
    }
}

#[cfg(test)]
mod tests;
