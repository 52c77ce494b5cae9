//! A sandbox's states and the one table of what each allows.
//!
//! A sandbox is `running` or `stopped` while nothing is being done to it; those are the
//! only states `state.json` holds. An operation that takes time (a stop's grace period,
//! a CRIU dump, a removal) first moves the sandbox to `stopping`, `checkpointing` or
//! `removing` under the record's lock, then does its work with no lock held, and
//! settles the state at the end ([`Held::settle`]). So a `ps` or an `inspect` during a
//! ten-second stop answers at once (saying `stopping`), and a request that conflicts
//! gets a 409 naming the state instead of waiting behind a lock.
//!
//! Execs run beside each other: an exec is allowed only while the sandbox is `running`,
//! and is counted (under the same lock) for as long as it lives, so that a live
//! checkpoint, which needs none in flight, and an exec never both start.

use super::record::RecordGuard;
use super::sandboxes::{Sandbox, SandboxRecord};
use crate::api::{ApiError, SandboxStatus};
use std::sync::atomic::Ordering;

/// What a request, or the daemon itself, wants to do to a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// Run a command (API execs, `cp`, logs of a running command).
    Exec,
    Checkpoint {
        live: bool,
    },
    Stop,
    Remove {
        force: bool,
    },
    /// The sandbox's init exited on its own: clean up after it.
    Exited,
}

/// What the table says to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Go ahead beside whatever else runs (the state does not change).
    Beside,
    /// Go ahead, holding the sandbox in this state until the operation settles it.
    Hold(SandboxStatus),
    /// Nothing to do: the sandbox is already where the verb would take it, or the
    /// operation in progress will take it there.
    Nothing,
}

/// Why a verb is refused in a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The state is wrong for the verb, and will stay so.
    Wrong(&'static str),
    /// An operation is in progress; the verb may be asked again once it settles.
    Busy,
}

/// The transition table. Exhaustive, without a catch-all arm: a new state or verb must
/// say what it allows.
pub fn transition(state: SandboxStatus, verb: Verb) -> Result<Step, Refusal> {
    use SandboxStatus::*;
    match (state, verb) {
        (Running, Verb::Exec) => Ok(Step::Beside),
        (Running, Verb::Checkpoint { .. }) => Ok(Step::Hold(Checkpointing)),
        (Running, Verb::Stop | Verb::Exited) => Ok(Step::Hold(Stopping)),
        (Running, Verb::Remove { force: true }) => Ok(Step::Hold(Removing)),
        (Running, Verb::Remove { force: false }) => {
            Err(Refusal::Wrong("stop it first, or remove it with force"))
        }
        (Stopped, Verb::Exec) => Err(Refusal::Wrong("not running")),
        (Stopped, Verb::Checkpoint { live: true }) => {
            Err(Refusal::Wrong("a live checkpoint needs it running"))
        }
        (Stopped, Verb::Checkpoint { live: false }) => Ok(Step::Hold(Checkpointing)),
        (Stopped, Verb::Stop | Verb::Exited) => Ok(Step::Nothing),
        (Stopped, Verb::Remove { .. }) => Ok(Step::Hold(Removing)),
        // Whoever stops or removes the sandbox cleans up after its init too.
        (Stopping | Removing, Verb::Exited) => Ok(Step::Nothing),
        (Stopping | Removing, Verb::Exec | Verb::Checkpoint { .. } | Verb::Stop) => {
            Err(Refusal::Busy)
        }
        (Stopping | Removing, Verb::Remove { .. }) => Err(Refusal::Busy),
        // The checkpoint settles the state first; the init's exit is handled after.
        (Checkpointing, Verb::Exited) => Err(Refusal::Busy),
        (Checkpointing, Verb::Exec | Verb::Checkpoint { .. } | Verb::Stop) => Err(Refusal::Busy),
        (Checkpointing, Verb::Remove { .. }) => Err(Refusal::Busy),
    }
}

/// The 409 a refused verb answers.
fn refusal_error(
    id: &impl std::fmt::Display,
    state: SandboxStatus,
    verb: Verb,
    r: Refusal,
) -> ApiError {
    let what = match verb {
        Verb::Exec => "exec",
        Verb::Checkpoint { live: true } => "live checkpoint",
        Verb::Checkpoint { live: false } => "checkpoint",
        Verb::Stop => "stop",
        Verb::Remove { .. } => "remove",
        Verb::Exited => "clean-up",
    };
    match r {
        Refusal::Wrong(why) => ApiError::conflict(format!("sandbox {id} is {state}: {why}")),
        Refusal::Busy => ApiError::conflict(format!(
            "sandbox {id} is {state}: the {what} can be asked again once that is done"
        )),
    }
}

/// An operation holding a sandbox in a passing state. Dropped without [`Held::settle`]
/// (the operation failed before it changed anything), it puts the state back.
pub struct Held<'a> {
    sb: &'a Sandbox,
    prior: SandboxStatus,
    done: bool,
}

/// What [`Sandbox::begin`] grants.
pub enum Begun<'a> {
    Held(Held<'a>),
    Nothing,
}

/// An exec in flight: counted until dropped.
pub struct ExecSession {
    sb: std::sync::Arc<Sandbox>,
}

impl Drop for ExecSession {
    fn drop(&mut self) {
        self.sb.execs.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Sandbox {
    /// Checks the table for `verb` and, if it says so, moves the sandbox to the state
    /// the verb holds. Only the record's lock is taken, and only for this.
    pub fn begin(&self, verb: Verb) -> Result<Begun<'_>, ApiError> {
        let mut rec = self.record.locked();
        let state = rec.status;
        match transition(state, verb).map_err(|r| refusal_error(&self.id, state, verb, r))? {
            Step::Nothing => Ok(Begun::Nothing),
            Step::Beside => Err(ApiError::internal(format!(
                "sandbox {}: {verb:?} runs beside others; use begin_exec",
                self.id
            ))),
            Step::Hold(next) => {
                if let Verb::Checkpoint { live: true } = verb {
                    let busy = self.execs.load(Ordering::SeqCst);
                    if busy > 0 {
                        return Err(ApiError::conflict(format!(
                            "sandbox {} has {busy} exec session(s) open to the host; a live checkpoint needs them finished",
                            self.id
                        )));
                    }
                }
                rec.status = next;
                Ok(Begun::Held(Held {
                    sb: self,
                    prior: state,
                    done: false,
                }))
            }
        }
    }

    /// Starts an exec: allowed while the sandbox runs; it counts until the session is
    /// dropped. Returns the pid of the init it goes through.
    pub fn begin_exec(self: &std::sync::Arc<Self>) -> Result<(ExecSession, i32), ApiError> {
        let rec = self.record.locked();
        let state = rec.status;
        match transition(state, Verb::Exec) {
            Ok(Step::Beside) => {}
            Ok(other) => {
                return Err(ApiError::internal(format!(
                    "sandbox {}: exec in state {state} gave {other:?}",
                    self.id
                )))
            }
            Err(r) => return Err(refusal_error(&self.id, state, Verb::Exec, r)),
        }
        let pid = rec
            .init_pid
            .ok_or_else(|| ApiError::conflict(format!("sandbox {} has no init", self.id)))?;
        self.execs.fetch_add(1, Ordering::SeqCst);
        Ok((ExecSession { sb: self.clone() }, pid))
    }

    /// Waits until no operation holds the sandbox.
    pub fn wait_settled(&self) {
        let mut rec = self.record.locked();
        while !rec.status.is_settled() && rec.status != SandboxStatus::Removing {
            rec = rec.wait(&self.changed);
        }
    }
}

impl Held<'_> {
    /// The record, for reading what the operation needs (held briefly: never across the
    /// operation's slow steps).
    pub fn record(&self) -> RecordGuard<'_> {
        self.sb.record.locked()
    }

    /// The state the sandbox was in before.
    pub fn prior(&self) -> SandboxStatus {
        self.prior
    }

    /// Passes the sandbox on to another passing state without settling (a checkpoint
    /// that stops the sandbox goes on as a stop).
    pub fn pass_to(&mut self, next: SandboxStatus) {
        self.sb.record.locked().status = next;
        self.sb.changed.notify_all();
    }

    /// Ends the operation: `update` writes what it changed into the record, and the
    /// sandbox settles in `state` (`removing` for a sandbox that is gone). The state is
    /// set whatever `update` returns, since the work is done either way.
    pub fn settle(
        mut self,
        state: SandboxStatus,
        update: impl FnOnce(&mut SandboxRecord) -> Result<(), ApiError>,
    ) -> Result<(), ApiError> {
        let mut rec = self.sb.record.locked();
        rec.status = state;
        let res = update(&mut rec);
        self.done = true;
        drop(rec);
        self.sb.changed.notify_all();
        res
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.sb.record.locked().status = self.prior;
            self.sb.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SandboxStatus::*;

    const ALL: [SandboxStatus; 5] = [Running, Stopping, Checkpointing, Removing, Stopped];
    const VERBS: [Verb; 7] = [
        Verb::Exec,
        Verb::Checkpoint { live: true },
        Verb::Checkpoint { live: false },
        Verb::Stop,
        Verb::Remove { force: true },
        Verb::Remove { force: false },
        Verb::Exited,
    ];

    #[test]
    fn passing_states_refuse_every_request_and_hold_only_from_settled_ones() {
        for s in ALL {
            for v in VERBS {
                let t = transition(s, v);
                if !s.is_settled() && v != Verb::Exited {
                    assert_eq!(t, Err(Refusal::Busy), "{s} {v:?}");
                }
                if let Ok(Step::Hold(next)) = t {
                    assert!(s.is_settled(), "{s} {v:?} holds from a passing state");
                    assert!(!next.is_settled(), "{s} {v:?} holds a settled state");
                }
            }
        }
    }

    #[test]
    fn the_table_says_what_a_user_expects() {
        assert_eq!(transition(Running, Verb::Exec), Ok(Step::Beside));
        assert_eq!(transition(Stopped, Verb::Stop), Ok(Step::Nothing));
        assert_eq!(transition(Running, Verb::Stop), Ok(Step::Hold(Stopping)));
        assert!(matches!(
            transition(Running, Verb::Remove { force: false }),
            Err(Refusal::Wrong(_))
        ));
        assert!(matches!(
            transition(Stopped, Verb::Checkpoint { live: true }),
            Err(Refusal::Wrong(_))
        ));
        assert_eq!(
            transition(Stopped, Verb::Checkpoint { live: false }),
            Ok(Step::Hold(Checkpointing))
        );
        // An init that exits during a checkpoint is cleaned up after it, not forgotten.
        assert_eq!(transition(Checkpointing, Verb::Exited), Err(Refusal::Busy));
        assert_eq!(transition(Stopping, Verb::Exited), Ok(Step::Nothing));
    }

    #[test]
    fn refusals_name_the_state_and_the_verb() {
        let e = refusal_error(&"abcd", Stopping, Verb::Exec, Refusal::Busy);
        assert_eq!(e.status(), 409);
        assert!(
            e.message.contains("is stopping") && e.message.contains("exec"),
            "{}",
            e.message
        );
    }
}
