//! Path arithmetic on operands: joining to the working directory,
//! normalising `.` and `..`, the directory prefixes of a path and a
//! command's base name.

use super::Loc;

/// `a/b/c` -> `a`, `a/b`, `a/b/c`.
pub(super) fn prefixes(p: &str) -> impl Iterator<Item = &str> {
    p.match_indices('/')
        .map(move |(i, _)| &p[..i])
        .chain(std::iter::once(p))
}

pub(super) fn base(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// Join an operand to the working directory and normalise `.` and `..`.
/// `None` when the result cannot be known (unknown cwd, `~`, variables).
pub(super) fn join(cwd: &Option<String>, op: &str) -> Option<Loc> {
    if op.starts_with('~') || op.contains('$') || op.contains('`') || op.is_empty() {
        return None;
    }
    if op.starts_with('/') {
        return Some(Loc::Abs(normalize(op, true)));
    }
    let cwd = cwd.as_ref()?;
    if cwd.starts_with('/') {
        Some(Loc::Abs(normalize(&format!("{cwd}/{op}"), true)))
    } else if cwd.is_empty() {
        Some(Loc::Rel(normalize(op, false)))
    } else {
        Some(Loc::Rel(normalize(&format!("{cwd}/{op}"), false)))
    }
}

fn normalize(p: &str, absolute: bool) -> String {
    let mut segs: Vec<&str> = Vec::new();
    for s in p.split('/') {
        match s {
            "" | "." => {}
            ".." => {
                if segs.last().is_some_and(|l| *l != "..") {
                    segs.pop();
                } else if !absolute {
                    segs.push("..");
                }
            }
            s => segs.push(s),
        }
    }
    let joined = segs.join("/");
    if absolute {
        format!("/{joined}")
    } else {
        joined
    }
}
