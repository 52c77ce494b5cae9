//! File operations inside a sandbox: what the daemon asks forkd's own tool in the
//! sandbox to do (`/.forkd/init __fs JSON`, run as the caller's user, so the kernel
//! checks every permission), and what it answers on its standard output.

use serde::{Deserialize, Serialize};

/// One file operation. Paths are absolute paths inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FsOp {
    /// What `path` is (a symlink is described, not followed).
    Stat { path: String },
    /// The entries of the directory `path`, and of its subdirectories down to `depth`
    /// levels (1: the directory's own entries).
    List {
        path: String,
        #[serde(default = "one")]
        depth: u32,
    },
    /// Creates the directory `path` and its missing parents; `created` says whether it
    /// was new. With `owner`, what it made is given to that user of the sandbox.
    MakeDir {
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
    },
    /// Renames `from` to `to` (within the sandbox's filesystem).
    Move { from: String, to: String },
    /// Removes `path`, a directory with everything in it.
    Remove { path: String },
    /// The bytes of the file `path`, on the tool's standard output.
    Read { path: String },
    /// Writes the tool's standard input to the file `path` (made, or cut to size),
    /// making missing parent directories. With `owner`, the file and the directories
    /// made for it are given to that user of the sandbox (E2B's envd writes so: as root,
    /// for the user).
    Write {
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
    },
}

fn one() -> u32 {
    1
}

impl FsOp {
    /// The paths the operation names.
    pub fn paths(&self) -> Vec<&str> {
        match self {
            FsOp::Stat { path }
            | FsOp::List { path, .. }
            | FsOp::MakeDir { path, .. }
            | FsOp::Remove { path }
            | FsOp::Read { path }
            | FsOp::Write { path, .. } => vec![path],
            FsOp::Move { from, to } => vec![from, to],
        }
    }

    /// Checks the request before anything runs: paths are absolute, without NUL bytes.
    pub fn validate(&self) -> Result<(), String> {
        for p in self.paths() {
            if !p.starts_with('/') {
                return Err(format!("path {p:?} must be absolute"));
            }
            if p.contains('\0') {
                return Err(format!("path {p:?} contains a NUL byte"));
            }
        }
        if let FsOp::List { depth, .. } = self {
            if *depth == 0 || *depth > 64 {
                return Err(format!("depth {depth} must be from 1 to 64"));
            }
        }
        Ok(())
    }
}

/// What a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// One file, as `lstat` sees it inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEntry {
    pub name: String,
    pub path: String,
    pub kind: FsKind,
    pub size: u64,
    /// The whole `st_mode` (type and permission bits).
    pub mode: u32,
    /// The owner's and group's names in the sandbox's `/etc/passwd` and `/etc/group`,
    /// else their numbers.
    pub owner: String,
    pub group: String,
    /// Last modification, nanoseconds since the epoch.
    pub modified_ns: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

/// What a file operation answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsAnswer {
    /// `stat`, `make_dir`, `move` (the new path) and `write`: the one file; `list`:
    /// the directory's entries, depth first; `remove`: none.
    pub entries: Vec<FsEntry>,
    /// `make_dir`: whether the directory was made (false: it was there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<bool>,
}
