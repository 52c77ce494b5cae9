//! forkd: sandboxes, checkpoints and copy-on-write forks of whole machine states.
//!
//! This crate is the product on top of the mechanism crates in `runtime/`:
//! - [`daemon`]: `forkd daemon`, which owns the state root and serves the API;
//! - [`cli`]: the `forkd` command line;
//! - [`private_daemon`]: a daemon of one's own for a while (the demo, tests, benchmarks);
//! - re-exported for one set of paths: [`api`] and [`client`] (the `forkd-api` crate in
//!   `api/`: the API's types, errors, route table and a blocking client) and [`eval`]
//!   (the `forkd-eval` crate in `eval/evaluator/`, a client of the daemon's API).

// `unsafe` lives in runtime/sys only.
#![forbid(unsafe_code)]

pub use forkd_api as api;
pub use forkd_api::client;
pub mod cli;
pub mod daemon;
pub mod private_daemon;
pub use forkd_eval as eval;
