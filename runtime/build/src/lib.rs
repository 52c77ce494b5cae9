//! The Dockerfile front end of `forkd image build`: what a Dockerfile asks for, in a
//! form the daemon's builder runs step by step.
//!
//! - [`dockerfile`]: the plan (stages of steps with their lines), every instruction
//!   either understood or refused by name;
//! - [`words`]: `$VAR` expansion, quoting, `KEY=VALUE` lists;
//! - [`context`]: the build context, `.dockerignore`, COPY sources and their digest.
//!
//! Nothing here touches a sandbox: the daemon (`src/daemon/build.rs`) runs the plan.

#![forbid(unsafe_code)]

pub mod context;
pub mod dockerfile;
pub mod words;

pub use context::{Context, Selection};
pub use dockerfile::{plan, Cmd, CopySpec, Plan, PlanError, Stage, Step, StepKind};
