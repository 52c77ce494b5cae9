//! `__fs`: one file operation ([`FsOp`]) carried out inside the sandbox by forkd's own
//! tool, as the user the caller names, so paths resolve in the sandbox's root and the
//! kernel checks every permission. It answers [`FsAnswer`] as JSON on stdout (`read`:
//! the file's bytes), or a message on stderr and exit status 1 (2: not found; 3:
//! already exists; 4: permission denied), which the daemon turns into its errors.

use crate::proto::{FsAnswer, FsEntry, FsKind, FsOp};
use std::collections::HashMap;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Runs the operation `json` and exits.
pub fn fs_main(json: &str) -> ! {
    let result = serde_json::from_str::<FsOp>(json)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("request: {e}")))
        .and_then(|op| {
            op.validate()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            run(&op)
        });
    let code = match result {
        Ok(None) => 0,
        Ok(Some(answer)) => {
            let mut out = io::stdout().lock();
            match serde_json::to_writer(&mut out, &answer).map_err(io::Error::from) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("write answer: {e}");
                    1
                }
            }
        }
        Err(e) => {
            eprintln!("{e}");
            exit_code(&e)
        }
    };
    std::process::exit(code)
}

/// The exit status that tells the daemon which error it was.
fn exit_code(e: &io::Error) -> i32 {
    match e.kind() {
        io::ErrorKind::NotFound => 2,
        io::ErrorKind::AlreadyExists => 3,
        io::ErrorKind::PermissionDenied => 4,
        _ => 1,
    }
}

/// Names an error with the path it concerns.
fn at(path: &str) -> impl Fn(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("{path}: {e}"))
}

fn run(op: &FsOp) -> io::Result<Option<FsAnswer>> {
    let mut names = Names::default();
    let one = |entries| {
        Ok(Some(FsAnswer {
            entries,
            created: None,
        }))
    };
    match op {
        FsOp::Stat { path } => one(vec![entry(Path::new(path), &mut names).map_err(at(path))?]),
        FsOp::List { path, depth } => {
            let meta = std::fs::metadata(path).map_err(at(path))?;
            if !meta.is_dir() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{path}: not a directory"),
                ));
            }
            let mut entries = Vec::new();
            list(Path::new(path), *depth, &mut names, &mut entries).map_err(at(path))?;
            one(entries)
        }
        FsOp::MakeDir { path, owner } => {
            let created = match std::fs::symlink_metadata(path) {
                Ok(m) if m.is_dir() => false,
                Ok(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{path}: exists and is not a directory"),
                    ))
                }
                Err(_) => {
                    let made = make_dirs(Path::new(path)).map_err(at(path))?;
                    give(owner.as_deref(), &made).map_err(at(path))?;
                    true
                }
            };
            Ok(Some(FsAnswer {
                entries: vec![entry(Path::new(path), &mut names).map_err(at(path))?],
                created: Some(created),
            }))
        }
        FsOp::Move { from, to } => {
            std::fs::symlink_metadata(from).map_err(at(from))?;
            std::fs::rename(from, to).map_err(at(to))?;
            one(vec![entry(Path::new(to), &mut names).map_err(at(to))?])
        }
        FsOp::Remove { path } => {
            let meta = std::fs::symlink_metadata(path).map_err(at(path))?;
            if meta.is_dir() {
                std::fs::remove_dir_all(path).map_err(at(path))?;
            } else {
                std::fs::remove_file(path).map_err(at(path))?;
            }
            one(Vec::new())
        }
        FsOp::Read { path } => {
            let mut f = std::fs::File::open(path).map_err(at(path))?;
            if f.metadata().map_err(at(path))?.is_dir() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{path}: is a directory"),
                ));
            }
            let mut out = io::stdout().lock();
            io::copy(&mut f, &mut out).map_err(at(path))?;
            out.flush()?;
            Ok(None)
        }
        FsOp::Write { path, owner } => {
            let mut made = match Path::new(path).parent() {
                Some(parent) => make_dirs(parent).map_err(at(path))?,
                None => Vec::new(),
            };
            let mut f = std::fs::File::create(path).map_err(at(path))?;
            io::copy(&mut io::stdin().lock(), &mut f).map_err(at(path))?;
            f.sync_data().map_err(at(path))?;
            drop(f);
            made.push(PathBuf::from(path));
            give(owner.as_deref(), &made).map_err(at(path))?;
            one(vec![entry(Path::new(path), &mut names).map_err(at(path))?])
        }
    }
}

/// Makes `dir` and its missing parents; the directories it made, outermost first.
fn make_dirs(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut missing = Vec::new();
    let mut p = Some(dir);
    while let Some(d) =
        p.filter(|d| !d.as_os_str().is_empty() && std::fs::symlink_metadata(d).is_err())
    {
        missing.push(d.to_path_buf());
        p = d.parent();
    }
    missing.reverse();
    std::fs::create_dir_all(dir)?;
    Ok(missing)
}

/// Gives `paths` to the sandbox's user `owner` (its uid and primary group), if given.
fn give(owner: Option<&str>, paths: &[PathBuf]) -> io::Result<()> {
    let Some(owner) = owner.filter(|o| !o.is_empty()) else {
        return Ok(());
    };
    let (uid, gid) = user_ids(owner)?;
    for p in paths {
        std::os::unix::fs::lchown(p, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// A user's uid and primary gid: by name in the sandbox's `/etc/passwd`, or numeric.
fn user_ids(user: &str) -> io::Result<(u32, u32)> {
    for line in std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
    {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 4 && (f[0] == user || f[2] == user) {
            if let (Ok(u), Ok(g)) = (f[2].parse(), f[3].parse()) {
                return Ok((u, g));
            }
        }
    }
    match user.parse::<u32>() {
        Ok(n) => Ok((n, n)),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("user {user:?} not found in the sandbox's /etc/passwd"),
        )),
    }
}

fn list(dir: &Path, depth: u32, names: &mut Names, out: &mut Vec<FsEntry>) -> io::Result<()> {
    let mut children: Vec<_> = std::fs::read_dir(dir)?.filter_map(Result::ok).collect();
    children.sort_by_key(|c| c.file_name());
    for c in children {
        let path = c.path();
        let e = match entry(&path, names) {
            Ok(e) => e,
            // Gone since the directory was read.
            Err(_) => continue,
        };
        let descend = e.kind == FsKind::Dir && depth > 1;
        out.push(e);
        if descend {
            // A subdirectory the user may not read is listed, not entered.
            let _ = list(&path, depth - 1, names, out);
        }
    }
    Ok(())
}

fn entry(path: &Path, names: &mut Names) -> io::Result<FsEntry> {
    let m = std::fs::symlink_metadata(path)?;
    let ft = m.file_type();
    let kind = if ft.is_symlink() {
        FsKind::Symlink
    } else if ft.is_dir() {
        FsKind::Dir
    } else if ft.is_file() {
        FsKind::File
    } else {
        FsKind::Other
    };
    let symlink_target = ft
        .is_symlink()
        .then(|| std::fs::read_link(path).ok())
        .flatten()
        .map(|t| t.to_string_lossy().into_owned());
    Ok(FsEntry {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into()),
        path: path.to_string_lossy().into_owned(),
        kind,
        size: m.len(),
        mode: m.mode(),
        owner: names.user(m.uid()),
        group: names.group(m.gid()),
        modified_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        symlink_target,
    })
}

/// The sandbox's user and group names, read once.
#[derive(Default)]
struct Names {
    users: Option<HashMap<u32, String>>,
    groups: Option<HashMap<u32, String>>,
}

impl Names {
    fn user(&mut self, uid: u32) -> String {
        let users = self.users.get_or_insert_with(|| read_ids("/etc/passwd"));
        users.get(&uid).cloned().unwrap_or_else(|| uid.to_string())
    }

    fn group(&mut self, gid: u32) -> String {
        let groups = self.groups.get_or_insert_with(|| read_ids("/etc/group"));
        groups.get(&gid).cloned().unwrap_or_else(|| gid.to_string())
    }
}

/// `name:x:id:...` lines of a passwd or group file: id to name (the first name wins).
fn read_ids(file: &str) -> HashMap<u32, String> {
    let mut out = HashMap::new();
    for line in std::fs::read_to_string(file).unwrap_or_default().lines() {
        let mut f = line.split(':');
        if let (Some(name), Some(_), Some(id)) = (f.next(), f.next(), f.next()) {
            if let Ok(id) = id.parse() {
                out.entry(id).or_insert_with(|| name.to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_depth_first_with_names_and_kinds() {
        let dir = std::env::temp_dir().join(format!("forkd-fsops-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/b/f"), b"xyz").unwrap();
        std::os::unix::fs::symlink("a/b/f", dir.join("l")).unwrap();
        let d = dir.to_str().unwrap();
        let ans = run(&FsOp::List {
            path: d.into(),
            depth: 3,
        })
        .unwrap()
        .unwrap();
        let got: Vec<_> = ans
            .entries
            .iter()
            .map(|e| (e.path.strip_prefix(d).unwrap().to_string(), e.kind))
            .collect();
        assert_eq!(
            got,
            vec![
                ("/a".into(), FsKind::Dir),
                ("/a/b".into(), FsKind::Dir),
                ("/a/b/f".into(), FsKind::File),
                ("/l".into(), FsKind::Symlink),
            ]
        );
        assert_eq!(ans.entries[2].size, 3);
        assert_eq!(ans.entries[3].symlink_target.as_deref(), Some("a/b/f"));
        let shallow = run(&FsOp::List {
            path: d.into(),
            depth: 1,
        })
        .unwrap()
        .unwrap();
        assert_eq!(shallow.entries.len(), 2);
        let made = run(&FsOp::MakeDir {
            path: format!("{d}/a/b"),
            owner: None,
        })
        .unwrap()
        .unwrap();
        assert_eq!(made.created, Some(false));
        let err = run(&FsOp::Stat {
            path: format!("{d}/missing"),
        })
        .unwrap_err();
        assert_eq!(exit_code(&err), 2);
        assert!(err.to_string().contains("missing"), "{err}");
        run(&FsOp::Move {
            from: format!("{d}/a"),
            to: format!("{d}/c"),
        })
        .unwrap();
        run(&FsOp::Remove {
            path: format!("{d}/c"),
        })
        .unwrap();
        assert!(!dir.join("c").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
