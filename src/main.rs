//! The `forkd` binary: the CLI and the daemon, and the daemon's set-up helper.
//!
//! The role is chosen by the first argument before anything else runs (no threads exist
//! yet, which the set-up helper relies on):
//! - `__setup`: the helper that builds a sandbox around its init (run by the daemon);
//! - anything else: the CLI, including `forkd daemon`.
//!
//! What runs inside a sandbox (its init, `cp`'s tar tools) is `forkd-init`
//! (`src/bin/forkd-init.rs`).

#![forbid(unsafe_code)]

fn main() {
    let args: Vec<String> = std::env::args().take(3).collect();
    match args.get(1).map(String::as_str) {
        Some("__setup") => forkd_sandbox::setup::setup_main(),
        _ => std::process::exit(forkd::cli::main()),
    }
}
