//! `__watch`: changes under a directory of the sandbox as they happen, from inotify,
//! run by forkd's own tool as the caller's user (so it sees what the user may). It
//! prints one JSON line per change, `{"name": PATH, "type": KIND}` with PATH relative
//! to the watched directory and KIND one of `create`, `write`, `remove`, `rename`,
//! `chmod`; first `{"ready": true}` once every watch is set, so that a caller who waits
//! for it misses nothing after. With `recursive`, directories made later are watched
//! too. It ends when the directory goes, or when it is killed (its caller's way).

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What `__watch` is asked: `{"path": ..., "recursive": bool}`.
#[derive(Debug, serde::Deserialize)]
pub struct WatchRequest {
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
}

/// The deepest a recursive watch goes below its directory.
const MAX_DEPTH: usize = 64;

pub fn watch_main(json: &str) -> ! {
    let code = match serde_json::from_str::<WatchRequest>(json) {
        Ok(req) if req.path.starts_with('/') => match run(&req) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("{}: {e}", req.path);
                if e.kind() == std::io::ErrorKind::NotFound {
                    2
                } else {
                    1
                }
            }
        },
        Ok(req) => {
            eprintln!("path {:?} must be absolute", req.path);
            1
        }
        Err(e) => {
            eprintln!("request: {e}");
            1
        }
    };
    std::process::exit(code)
}

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

struct Watching {
    inotify: Inotify,
    root: PathBuf,
    /// Each watch's directory, relative to the root ("" for the root).
    dirs: HashMap<WatchDescriptor, PathBuf>,
    recursive: bool,
}

impl Watching {
    fn add(&mut self, rel: &Path, depth: usize) -> std::io::Result<()> {
        let wd = self
            .inotify
            .add_watch(&self.root.join(rel), mask())
            .map_err(std::io::Error::from)?;
        self.dirs.insert(wd, rel.to_path_buf());
        if self.recursive && depth < MAX_DEPTH {
            if let Ok(entries) = std::fs::read_dir(self.root.join(rel)) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        // A directory that goes meanwhile, or that the user may not
                        // read, is not watched.
                        let _ = self.add(&rel.join(e.file_name()), depth + 1);
                    }
                }
            }
        }
        Ok(())
    }
}

fn run(req: &WatchRequest) -> std::io::Result<()> {
    let root = PathBuf::from(&req.path);
    if !std::fs::metadata(&root)?.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a directory",
        ));
    }
    let mut w = Watching {
        inotify: Inotify::init(InitFlags::IN_CLOEXEC).map_err(std::io::Error::from)?,
        root,
        dirs: HashMap::new(),
        recursive: req.recursive,
    };
    w.add(Path::new(""), 0)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::json!({ "ready": true }))?;
    out.flush()?;
    loop {
        let events = w.inotify.read_events().map_err(std::io::Error::from)?;
        for ev in events {
            let Some(dir) = w.dirs.get(&ev.wd).cloned() else {
                continue;
            };
            if ev.mask.contains(AddWatchFlags::IN_DELETE_SELF) && dir.as_os_str().is_empty() {
                // The watched directory itself is gone.
                return Ok(());
            }
            let Some(name) = &ev.name else {
                continue;
            };
            let rel = dir.join(name);
            let kind = if ev.mask.contains(AddWatchFlags::IN_CREATE) {
                "create"
            } else if ev.mask.contains(AddWatchFlags::IN_DELETE) {
                "remove"
            } else if ev
                .mask
                .intersects(AddWatchFlags::IN_MOVED_FROM | AddWatchFlags::IN_MOVED_TO)
            {
                "rename"
            } else if ev.mask.contains(AddWatchFlags::IN_MODIFY) {
                "write"
            } else if ev.mask.contains(AddWatchFlags::IN_ATTRIB) {
                "chmod"
            } else {
                continue;
            };
            let made_dir = ev.mask.contains(AddWatchFlags::IN_ISDIR)
                && ev
                    .mask
                    .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO);
            if w.recursive && made_dir {
                let depth = rel.components().count();
                let _ = w.add(&rel, depth);
            }
            let line = serde_json::json!({ "name": rel.to_string_lossy(), "type": kind });
            writeln!(out, "{line}")?;
        }
        out.flush()?;
    }
}
