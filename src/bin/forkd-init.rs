//! `forkd-init`: the program forkd puts into every sandbox as `/.forkd/init`.
//!
//! Its roles, chosen by the first argument:
//! - `__init`: PID 1 of the sandbox, which serves execs through relays it forks
//!   (`forkd_sandbox::init`, `forkd_sandbox::relay`);
//! - `__tar`, `__untar`: `forkd cp` out of and into the sandbox, run inside it
//!   (`forkd_sandbox::files`);
//! - `__mkdirs`: an image build's COPY and WORKDIR steps;
//! - `__fs`: one file operation (stat, list, make a directory, move, remove, read,
//!   write) as the caller's user;
//! - `__watch`: changes under a directory as they happen (inotify), as the caller's user;
//! - `__setup`: on the host, the helper the daemon runs to build a sandbox around its
//!   init (`forkd_sandbox::setup`), from the runtime layer's copy of this file. It needs
//!   a process that started no threads, which holds until the role is chosen here.
//!
//! It is a program of its own, apart from the `forkd` CLI and daemon, because every
//! sandbox and every branch holds copies of it: it links only what runs inside a
//! sandbox (a fraction of the daemon's size, so fewer page tables in each of its
//! processes), and it is linked as a static executable at a fixed address (the package's
//! `build.rs`), so nothing in it is relocated at start: its read-only data stays clean
//! pages of the one file in the page cache, shared by every sandbox, where a
//! position-independent executable writes ~160 KiB of relocated pointers into private
//! pages of each init (and each branch restores its own copy). The daemon keeps its
//! position independence.

#![forbid(unsafe_code)]

fn main() {
    let args: Vec<String> = std::env::args().take(3).collect();
    let arg = || args.get(2).map(String::as_str).unwrap_or("");
    match args.get(1).map(String::as_str) {
        Some("__init") => {
            // Where a fresh init says it listens; gone before anything it starts runs.
            let ready = std::env::var(forkd_sandbox::layout::READY_FD_ENV).ok();
            std::env::remove_var(forkd_sandbox::layout::READY_FD_ENV);
            forkd_sandbox::init::init_main(ready.and_then(|v| v.parse().ok()))
        }
        Some("__tar") => forkd_sandbox::files::tar_main(arg()),
        Some("__untar") => forkd_sandbox::files::untar_main(arg()),
        Some("__mkdirs") => forkd_sandbox::files::mkdirs_main(arg()),
        Some("__fs") => forkd_sandbox::fsops::fs_main(arg()),
        Some("__watch") => forkd_sandbox::watch::watch_main(arg()),
        Some("__setup") => forkd_sandbox::setup::setup_main(),
        other => {
            eprintln!(
                "forkd-init runs inside forkd's sandboxes (roles __init, __tar, __untar, __mkdirs, __fs, __watch, __setup), not {:?}",
                other.unwrap_or("")
            );
            std::process::exit(2);
        }
    }
}
