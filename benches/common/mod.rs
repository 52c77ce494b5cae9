//! Shared pieces of forkd's benchmarks: a daemon on a private temporary state root that
//! cleans up after itself, sampling with warm-up and percentiles, host readings,
//! fixtures, machine facts, and the report (JSON for tools, a markdown table for people).
//! The peers the benchmarks measure forkd against (podman, the raw CRIU command line,
//! tar + zstd) are in `benches/peers/`.
//!
//! Every benchmark binary includes this module with `mod common;` (or
//! `#[path = "../common/mod.rs"] mod common;` from a directory of its own) and uses a
//! subset of it, hence the `dead_code` allowance. Everything is reachable as
//! `common::NAME`; the files below hold it by concern:
//!
//! - `env.rs`: configuration from the environment, `SKIP`, Ctrl-C, running commands,
//!   temporary directories, polling;
//! - `stats.rs`: sampling, percentiles, formatting of times and sizes;
//! - `host.rs`: `/proc` memory readings, mounts, cgroups and processes of sandboxes;
//! - `daemon.rs`: [`DaemonGuard`], the daemon under test;
//! - `fixtures.rs`: fixture images and the QEMU guest's helpers;
//! - `run_info.rs`: git revision, date, machine and load;
//! - `report.rs`: [`Report`] and its rows, checks and tables, and the output files;
//! - `plot.rs`: a line plot as an SVG file (`common::plot::svg`).
#![allow(dead_code)]

mod daemon;
mod env;
mod fixtures;
mod guest_serial;
mod host;
pub mod plot;
mod report;
mod run_info;
mod stats;

#[allow(unused_imports)]
pub use daemon::{Cleanup, DaemonGuard};
#[allow(unused_imports)]
pub use env::{
    check_interrupted, describe, env_count, env_usize, in_ci, install_interrupt_handler,
    run_checked, skip, time_command, unique_temp_dir, wait_until,
};
#[allow(unused_imports)]
pub use fixtures::{
    cache_dir, fixture_image, qemu_argv, read_guest_counter, read_guest_serial, root_and_debian,
    GuestSerial,
};
#[allow(unused_imports)]
pub use host::{
    cgroup_pids, cgroups_left, comms, cpu_ticks, host_cpu_over, mem_available_kib, mem_total_kib,
    mounts_under, pss_kib, rss_kib,
};
#[allow(unused_imports)]
pub use report::{bench_output_dir, write_outputs, Check, Report, Row, Table};
#[allow(unused_imports)]
pub use run_info::{git_revision, load_average, machine, utc_now, RunInfo};
#[allow(unused_imports)]
pub use stats::{fmt_kib, fmt_ms, fmt_us, sample, summarize, Summary};
