//! The `forkd` binary: the CLI and the daemon.
//!
//! What runs inside a sandbox (its init, `cp`'s tar tools) and the helper that builds a
//! sandbox around its init is `forkd-init` (`src/bin/forkd-init.rs`).

#![forbid(unsafe_code)]

fn main() {
    std::process::exit(forkd::cli::main())
}
