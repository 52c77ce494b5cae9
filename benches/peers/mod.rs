//! The tools forkd's benchmarks measure it against, one file per peer:
//!
//! - `podman.rs`: finding podman, its run flags, containers removed when dropped, and the
//!   checkpoint/restore peer of a process tree;
//! - `raw_criu.rs`: the raw CRIU command line restoring a forkd checkpoint's images;
//! - `tar_zstd.rs`: tar + zstd archives of a directory.
//!
//! A benchmark includes this module with `mod peers;` (or
//! `#[path = "../peers/mod.rs"] mod peers;` from a directory of its own), next to
//! `mod common;`, which the peers use. Each benchmark uses a subset, hence the
//! `dead_code` allowance.
#![allow(dead_code)]

pub mod podman;
pub mod raw_criu;
pub mod tar_zstd;
