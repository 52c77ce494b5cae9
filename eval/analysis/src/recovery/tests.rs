use crate::model::{Condition, Dataset, Outcome};
use crate::stats::Xoshiro256;
use crate::testutil::add;
use crate::{analyze, Analysis, Direction, Options};
use Condition::{PristineControl as Ctl, RescueNote as Note, RescueNotice as Notice};
use Outcome::{Fail, InfraError, Pass};

fn opts() -> Options {
    Options {
        draws: 500,
        ..Options::default()
    }
}

/// F_A = {t1, t2}, F_B = {t2, t3}; every per-task value is a multiple
/// of 1/4, so the floating-point arithmetic below is exact.
fn example() -> Dataset {
    let mut ds = Dataset::default();
    let a = Some("A");
    add(&mut ds, "t1", Notice, "fa1", a, "B", &[Pass, Fail]);
    add(
        &mut ds,
        "t2",
        Notice,
        "fa2",
        a,
        "B",
        &[Pass, Pass, InfraError],
    );
    add(&mut ds, "t1", Notice, "fa1", a, "A", &[Fail, Fail]);
    add(&mut ds, "t2", Notice, "fa2", a, "A", &[Pass, Fail]);
    add(&mut ds, "t1", Ctl, "clean", a, "B", &[Pass, Pass]);
    add(&mut ds, "t2", Ctl, "clean", a, "B", &[Fail, Fail]);
    add(&mut ds, "t1", Ctl, "clean", a, "A", &[Fail]);
    add(
        &mut ds,
        "t2",
        Ctl,
        "clean",
        a,
        "A",
        &[Pass, Fail, Pass, Fail],
    );
    add(&mut ds, "t1", Note, "fa1", a, "B", &[Pass]);
    add(&mut ds, "t2", Note, "fa2", a, "B", &[Fail]);
    let b = Some("B");
    add(&mut ds, "t2", Notice, "fb2", b, "A", &[Pass]);
    add(&mut ds, "t3", Notice, "fb3", b, "A", &[Fail]);
    add(&mut ds, "t2", Notice, "fb2", b, "B", &[Fail]);
    add(&mut ds, "t3", Notice, "fb3", b, "B", &[Fail, Pass]);
    add(&mut ds, "t2", Ctl, "clean", b, "A", &[Pass]);
    add(&mut ds, "t3", Ctl, "clean", b, "A", &[Fail]);
    add(&mut ds, "t2", Ctl, "clean", b, "B", &[Fail]);
    add(&mut ds, "t3", Ctl, "clean", b, "B", &[Fail]);
    ds
}

fn dir<'a>(a: &'a Analysis, p: &str, r: &str) -> &'a Direction {
    a.recovery
        .directions
        .iter()
        .find(|d| d.predecessor == p && d.rescuer == r)
        .unwrap()
}

#[test]
fn rates_and_contrasts_per_direction() {
    let a = analyze(&example(), &opts());
    assert_eq!(a.recovery.directions.len(), 4);
    let ab = dir(&a, "A", "B");
    assert_eq!(ab.failure_set, 2);
    // Per task: R(A->B) = (1/2, 1), R(A->A) = (0, 1/2), C(B) = (1, 0),
    // C(A) = (0, 1/2), Rnote(A->B) = (1, 0).
    assert_eq!(ab.rescue.value, Some(0.75));
    assert_eq!(ab.rescue_note.value, Some(0.5));
    assert_eq!(ab.control.value, Some(0.5));
    let hrg = ab.hrg.unwrap();
    assert_eq!(hrg.estimate.value, Some(0.5));
    assert_eq!(
        (hrg.tasks_positive, hrg.tasks_negative, hrg.tasks_zero),
        (2, 0, 0)
    );
    assert_eq!(ab.ftv.estimate.value, Some(0.25));
    assert_eq!((ab.ftv.tasks_positive, ab.ftv.tasks_negative), (1, 1));
    assert_eq!(ab.ctv.estimate.value, Some(-0.25));
    assert_eq!((ab.ctv.tasks_positive, ab.ctv.tasks_negative), (1, 1));

    let aa = dir(&a, "A", "A");
    assert!(aa.hrg.is_none() && aa.decomposition.is_none());
    assert_eq!(aa.ftv.estimate.value, Some(0.0));
    assert_eq!((aa.ftv.tasks_zero, aa.ftv.tasks_positive), (2, 0));
    // No note rescues by A: undefined, with no tasks behind it.
    assert_eq!(aa.rescue_note.value, None);
    assert_eq!(aa.ctv.estimate.value, None);
    assert_eq!(aa.ctv.estimate.tasks, 0);
}

#[test]
fn decomposition_adds_up_exactly() {
    let a = analyze(&example(), &opts());
    let d = dir(&a, "A", "B").decomposition.unwrap();
    assert_eq!(d.tasks, 2);
    // HRG 0.5 = [C(B) - C(A)] 0.25 + [FTV(A->B) - FTV(A->A)] (0.25 - 0).
    assert_eq!(d.hrg.value, Some(0.5));
    assert_eq!(d.capability.value, Some(0.25));
    assert_eq!(d.state.value, Some(0.25));
    assert_eq!(
        d.hrg.value.unwrap(),
        d.capability.value.unwrap() + d.state.value.unwrap()
    );
    assert_eq!(
        (
            d.rescue,
            d.rescue_same,
            d.control_rescuer,
            d.control_predecessor
        ),
        (Some(0.75), Some(0.25), Some(0.5), Some(0.25))
    );
    let d = dir(&a, "B", "A").decomposition.unwrap();
    // HRG(B->A) = 1/2 - 1/4 = 1/4 = (1/2 - 0) + ((1/2 - 1/2) - (1/4 - 0)).
    assert_eq!(
        (d.hrg.value, d.capability.value, d.state.value),
        (Some(0.25), Some(0.5), Some(-0.25))
    );
}

#[test]
fn pooled_over_direction_task_pairs() {
    let a = analyze(&example(), &opts());
    assert_eq!(a.recovery.pooled.len(), 1);
    let p = &a.recovery.pooled[0];
    assert_eq!((p.scope.as_str(), p.tasks), ("A+B", 3));
    // HRG pairs: A->B (1/2, 1/2), B->A (1, -1/2): 3/2 over 4.
    assert_eq!(p.hrg.value, Some(0.375));
    // FTV over all four directions: (0 + 0) + (-1/2 + 1) + (0 + 0) + (0 + 1/2), over 8.
    assert_eq!(p.ftv.value, Some(0.125));
    // Only A->B has note rescues.
    assert_eq!(p.ctv.value, Some(-0.25));
    assert_eq!(p.capability.value, Some(0.375));
    assert_eq!(p.state.value, Some(0.0));
    assert_eq!(p.decomposition_hrg.value, Some(0.375));
    // Same-model rescue: A->A (0, 1/2), B->B (0, 1/2).
    assert_eq!(p.rescue_same.value, Some(0.25));
    assert_eq!(p.rescue_other.value, Some(0.625));
}

#[test]
fn identical_sides_have_a_zero_width_interval() {
    // Note and plain rescue agree on every task while success varies
    // across tasks: R has a wide interval, CTV exactly [0, 0].
    let mut ds = Dataset::default();
    for (i, reps) in [
        [Pass, Pass],
        [Fail, Fail],
        [Pass, Fail],
        [Fail, Fail],
        [Pass, Pass],
    ]
    .iter()
    .enumerate()
    {
        let t = format!("t{i}");
        add(&mut ds, &t, Notice, "s", Some("A"), "B", reps);
        add(&mut ds, &t, Note, "s", Some("A"), "B", reps);
    }
    let a = analyze(
        &ds,
        &Options {
            draws: 1000,
            ..opts()
        },
    );
    let d = &a.recovery.directions[0];
    let r = d.rescue.ci.unwrap();
    assert!(r.hi - r.lo > 0.3, "{r:?}");
    let ctv = d.ctv.estimate.ci.unwrap();
    assert_eq!((ctv.lo, ctv.hi), (0.0, 0.0));
    assert_eq!(d.rescue.ci, d.rescue_note.ci);
}

#[test]
fn missing_cells_are_reported() {
    let mut ds = Dataset::default();
    add(&mut ds, "t1", Notice, "f1", Some("A"), "B", &[Pass]);
    add(&mut ds, "t1", Notice, "f2", Some("A"), "B", &[Fail]);
    add(&mut ds, "t1", Notice, "f1", Some("A"), "A", &[Pass]);
    add(&mut ds, "t2", Notice, "f3", Some("A"), "B", &[Pass]);
    add(&mut ds, "t2", Notice, "f3", Some("A"), "A", &[InfraError]);
    let a = analyze(&ds, &opts());
    let ex: Vec<_> = a
        .exclusions
        .iter()
        .map(|e| {
            (
                e.quantity.as_str(),
                e.task.as_str(),
                e.state.as_deref(),
                e.effect,
                e.reason.as_str(),
            )
        })
        .collect();
    assert_eq!(
        ex,
        vec![
            (
                "R(A->A)",
                "t1",
                Some("f2"),
                crate::Effect::StateExcluded,
                "no trials"
            ),
            (
                "R(A->A)",
                "t2",
                Some("f3"),
                crate::Effect::TaskExcluded,
                "no valid trial (1 infra_error)"
            ),
        ]
    );
    let ab = dir(&a, "A", "B");
    assert_eq!(ab.rescue.value, Some(0.75));
    assert_eq!(ab.hrg.unwrap().estimate.tasks, 1);
}

#[test]
fn decomposition_holds_on_random_data() {
    // Three agents, uneven replicates (means in thirds), missing cells.
    let mut rng = Xoshiro256::seed_from(11);
    let agents = ["A", "B", "C"];
    let mut ds = Dataset::default();
    for pred in agents {
        for t in 0..40 {
            let task = format!("t{t}");
            for agent in agents {
                for cond in [Notice, Note, Ctl] {
                    if rng.below(10) == 0 {
                        continue;
                    }
                    let reps: Vec<Outcome> = (0..1 + rng.below(3))
                        .map(|_| if rng.below(3) == 0 { Pass } else { Fail })
                        .collect();
                    add(&mut ds, &task, cond, "s", Some(pred), agent, &reps);
                }
            }
        }
    }
    let a = analyze(
        &ds,
        &Options {
            draws: 50,
            ..opts()
        },
    );
    let mut checked = 0;
    for d in &a.recovery.directions {
        if let Some(x) = d.decomposition {
            let (h, c, s) = (
                x.hrg.value.unwrap(),
                x.capability.value.unwrap(),
                x.state.value.unwrap(),
            );
            assert!((h - (c + s)).abs() <= 1e-12, "{h} {c} {s}");
            // Rates on the decomposition's tasks give the same identity.
            let via_rates = (x.control_rescuer.unwrap() - x.control_predecessor.unwrap())
                + ((x.rescue.unwrap() - x.control_rescuer.unwrap())
                    - (x.rescue_same.unwrap() - x.control_predecessor.unwrap()));
            assert!((h - via_rates).abs() <= 1e-12);
            assert!(x.tasks <= d.hrg.unwrap().estimate.tasks);
            checked += 1;
        }
    }
    assert_eq!(checked, 6);
    // Pairs {A,B}, {A,C}, {B,C} and all directions together.
    assert_eq!(a.recovery.pooled.len(), 4);
    for p in &a.recovery.pooled {
        let (h, c, s) = (
            p.decomposition_hrg.value.unwrap(),
            p.capability.value.unwrap(),
            p.state.value.unwrap(),
        );
        assert!((h - (c + s)).abs() <= 1e-12);
    }
    assert!(a.exclusions.iter().any(|e| e.reason == "no trials"));
}
