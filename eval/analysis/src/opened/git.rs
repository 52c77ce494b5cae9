//! `git` subcommands that show file content: `git grep` (a search over the
//! repository or the given paths), `git show REV:path` and
//! `git cat-file -p REV:path`, `git blame` / `git annotate FILE`. Global
//! options before the subcommand are skipped, `-C DIR` moves the working
//! directory.

use super::filter::Filter;
use super::interp::Interp;
use super::options::{parse_opts, Spec};
use super::paths::join;
use super::{Loc, PathPat, View};
use crate::shell::Word;

impl Interp {
    pub(super) fn git(&mut self, args: &[Word], cwd: &Option<String>) {
        // Global options before the subcommand; `-C dir` moves the cwd.
        let mut cwd = cwd.clone();
        let mut i = 0;
        while i < args.len() {
            let t = args[i].text.as_str();
            match t {
                "-C" if i + 1 < args.len() => {
                    cwd = join(&cwd, &args[i + 1].text).map(|l| match l {
                        Loc::Rel(r) => r,
                        Loc::Abs(a) => a,
                    });
                    i += 2;
                }
                "-c" | "--git-dir" | "--work-tree" | "--namespace" if i + 1 < args.len() => i += 2,
                _ if t.starts_with('-') => i += 1,
                _ => break,
            }
        }
        let Some(sub) = args.get(i) else { return };
        let rest = &args[i + 1..];
        match sub.text.as_str() {
            "grep" => {
                let p = parse_opts(
                    rest,
                    &Spec {
                        short_arg: "efABCm",
                        long_arg: &[
                            "regexp",
                            "file",
                            "after-context",
                            "before-context",
                            "context",
                            "max-count",
                            "max-depth",
                            "threads",
                        ],
                    },
                    false,
                );
                let Some(ops) = p.searched(&["-L", "--name-only", "-O", "--open-files-in-pager"])
                else {
                    return;
                };
                let paths: Vec<Word> = ops
                    .iter()
                    .filter(|w| !looks_like_rev(&w.text))
                    .cloned()
                    .collect();
                self.tree(&cwd, &paths, Filter::default());
            }
            "show" | "cat-file" => {
                for w in rest {
                    let Some((rev, path)) = w.text.split_once(':') else {
                        continue;
                    };
                    if rev.starts_with('-') || path.is_empty() {
                        continue;
                    }
                    // `REV:path` is relative to the repository root unless it
                    // starts with `./` or `../`.
                    let loc = if path.starts_with("./") || path.starts_with("../") {
                        join(&cwd, path)
                    } else {
                        join(&Some(String::new()), path)
                    };
                    if let Some(loc) = loc {
                        self.views.push(View::File(PathPat { loc, glob: false }));
                    }
                }
            }
            "blame" | "annotate" => {
                let p = parse_opts(
                    rest,
                    &Spec {
                        short_arg: "LS",
                        long_arg: &["contents"],
                    },
                    false,
                );
                if let Some(w) = p.positionals.last() {
                    if let Some(loc) = join(&cwd, &w.text) {
                        self.views.push(View::File(PathPat { loc, glob: false }));
                    }
                }
            }
            _ => {}
        }
    }
}

fn looks_like_rev(s: &str) -> bool {
    s.contains("HEAD")
        || s.contains("..")
        || s.contains('~')
        || s.contains('^')
        || s.contains('@')
        || ((7..=40).contains(&s.len()) && s.chars().all(|c| c.is_ascii_hexdigit()))
}
