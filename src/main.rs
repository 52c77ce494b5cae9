//! The `forkd` binary: CLI, daemon, and, inside every sandbox, the init.
//!
//! The same static executable plays three roles, chosen by the first argument before
//! anything else runs (no threads exist yet, which the set-up helper and the init rely
//! on):
//! - `__init`: PID 1 of a sandbox (see `forkd_sandbox::init`);
//! - `__setup`: the helper that builds a sandbox around its init;
//! - `__tar`, `__untar`: run inside a sandbox for `forkd cp` (and image builds);
//! - `__mkdirs`: run inside a sandbox by an image build's COPY and WORKDIR steps;
//! - anything else: the CLI, including `forkd daemon`.

#![forbid(unsafe_code)]

fn main() {
    let args: Vec<String> = std::env::args().take(3).collect();
    match args.get(1).map(String::as_str) {
        Some("__init") => forkd_sandbox::init::init_main(),
        Some("__setup") => forkd_sandbox::setup::setup_main(),
        // Inside a sandbox, for `forkd cp` (see forkd_sandbox::files).
        Some("__tar") => {
            forkd_sandbox::files::tar_main(args.get(2).map(String::as_str).unwrap_or(""))
        }
        Some("__untar") => {
            forkd_sandbox::files::untar_main(args.get(2).map(String::as_str).unwrap_or(""))
        }
        Some("__mkdirs") => {
            forkd_sandbox::files::mkdirs_main(args.get(2).map(String::as_str).unwrap_or(""))
        }
        _ => std::process::exit(forkd::cli::main()),
    }
}
