//! forkd: sandboxes, checkpoints and copy-on-write forks of whole machine states.
//!
//! This crate is the product on top of the mechanism crates in `runtime/`:
//! - [`api`]: the HTTP+JSON API's types, errors and route table (`docs/openapi.json`);
//! - [`daemon`]: `forkd daemon`, which owns the state root and serves the API;
//! - [`client`]: a blocking client for the API;
//! - [`cli`]: the `forkd` command line;
//! - [`eval`]: the evaluator for coding agents, a client of the daemon's API.

// `unsafe` lives in runtime/sys; the one exception here is tokio's registration of a
// pidfd with its reactor (`daemon::sandboxes`), whose API is `unsafe` and is allowed at
// that one call.
#![deny(unsafe_code)]

pub mod api;
pub mod cli;
pub mod client;
pub mod daemon;
pub mod eval;
