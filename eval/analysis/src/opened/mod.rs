//! Which files a trajectory showed the content of ("opened" in the
//! left-out-files signature).
//!
//! A file counts as opened when a command printed (part of) its content to
//! the agent:
//! - `cat`, `tac`, `nl`, `head`, `tail`, `less`, `more`, `most`, `bat`,
//!   `sed` (not `sed -i`: an in-place edit prints nothing), `awk`/`gawk`/
//!   `mawk`/`nawk`, with the file as an operand;
//! - `grep`/`egrep`/`fgrep`, `rg`, `ag`, `ack` and `git grep` printing
//!   matching lines: the file is an operand, or lies under a recursive
//!   search root (default `.` for `rg`, `ag`, `ack`, `git grep` and
//!   `grep -r`) and passes its `--include`/`--exclude`/`--exclude-dir`,
//!   `-g`/`--glob` and `-t`/`-T` filters. Listing or counting modes (`-l`,
//!   `-L`, `-c`, `-q`, `--files`, `ag -g`, `ack -f`) show no content;
//! - `git show REV:path`, `git cat-file -p REV:path`, `git blame FILE`;
//! - an editor opened on the file: `vim`, `vi`, `nvim`, `view`, `vimdiff`,
//!   `nano`, `pico`, `emacs`, `emacsclient`, `micro`.
//!
//! Not counted: `ls`, `find`, `tree`, `rg --files`, `grep -l`,
//! `git diff` (any form: it shows changed lines, never an unchanged file's
//! content, and a left-out file is by definition unchanged at the start),
//! `git show` without `REV:path`, `python -c`, `xargs cat`, `find -exec` and
//! command substitutions (their file names are not on the command line or
//! not evaluated), and any command whose standard output is redirected to a
//! file, `/dev/null` included.
//!
//! Paths: operands are joined to the working directory. A trajectory starts
//! at the repository root. `cd` moves it; for `shell` and `argv` entries
//! (each run in a fresh process) the change lasts until the end of that
//! entry, for `keys` entries (a persistent terminal) until the next `cd`.
//! Absolute paths are mapped into the repository by roots inferred from the
//! trajectory itself: an absolute operand ending in `/<a path the task is
//! known to involve>` (a reference file, a file of the start state or of the
//! final patch) reveals the root in front of it. Without an inferred root an
//! absolute path matches a repository path it ends with.
//!
//! Layout: this module holds the views and the questions asked of them;
//! [`interp`] walks the command lines (assignments, wrappers, `cd`, nested
//! shells) and dispatches each command by name to its handler in
//! [`viewers`] (pagers, printers, editors), [`search`] (grep and friends)
//! or [`git`]; [`options`] parses their options, [`filter`] holds the
//! recursive-search filters and [`paths`] the path arithmetic.

mod filter;
mod git;
mod interp;
mod options;
mod paths;
mod search;
mod viewers;

use std::collections::BTreeSet;

use crate::glob::glob_match;
use crate::model::TrajectoryCommand;
use crate::shell::{SimpleCommand, Word};

use filter::Filter;
use interp::Interp;
use paths::prefixes;

/// A normalised path as typed: repository-relative, or absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Loc {
    Rel(String),
    Abs(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PathPat {
    loc: Loc,
    glob: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum View {
    File(PathPat),
    Tree { root: PathPat, filter: Filter },
}

/// The content views of one trajectory, ready to be asked about files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContentViews {
    views: Vec<View>,
    roots: Vec<String>,
}

impl ContentViews {
    /// Read a trajectory. `known` are repository paths the task involves,
    /// used only to infer where the repository root is.
    pub fn from_trajectory<'a>(
        commands: &[TrajectoryCommand],
        known: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let mut interp = Interp::default();
        let mut terminal_cwd = Some(String::new());
        for cmd in commands {
            match cmd {
                TrajectoryCommand::Shell(s) => {
                    let mut cwd = Some(String::new());
                    interp.line(s, &mut cwd, 0);
                }
                TrajectoryCommand::Keys(k) => interp.line(strip_key_names(k), &mut terminal_cwd, 0),
                TrajectoryCommand::Argv(argv) => {
                    let mut cwd = Some(String::new());
                    let words: Vec<Word> = argv
                        .iter()
                        .map(|a| Word {
                            text: a.clone(),
                            glob: false,
                        })
                        .collect();
                    interp.command(
                        &SimpleCommand {
                            words,
                            redirects: Vec::new(),
                        },
                        &mut cwd,
                        0,
                    );
                }
            }
        }
        let known: BTreeSet<&str> = known.into_iter().filter(|k| !k.is_empty()).collect();
        let mut roots = BTreeSet::new();
        for v in &interp.views {
            let loc = match v {
                View::File(p) => &p.loc,
                View::Tree { root, .. } => &root.loc,
            };
            if let Loc::Abs(a) = loc {
                for k in &known {
                    if let Some(root) = a.strip_suffix(k).and_then(|r| r.strip_suffix('/')) {
                        if !root.is_empty() {
                            roots.insert(root.to_string());
                        }
                    }
                }
            }
        }
        ContentViews {
            views: interp.views,
            roots: roots.into_iter().collect(),
        }
    }

    /// Whether any command showed the content of the repository file `path`.
    pub fn shows(&self, path: &str) -> bool {
        self.views.iter().any(|v| self.view_shows(v, path))
    }

    fn view_shows(&self, view: &View, p: &str) -> bool {
        match view {
            View::File(pat) => match self.to_repo(&pat.loc) {
                Some(Mapped::Rel(r)) => r == p || (pat.glob && glob_match(&r, p)),
                Some(Mapped::Suffix(a)) => {
                    if pat.glob {
                        let segs = p.split('/').count();
                        let tail: Vec<&str> = a.rsplit('/').take(segs).collect();
                        let tail: Vec<&str> = tail.into_iter().rev().collect();
                        glob_match(&tail.join("/"), p)
                    } else {
                        a.ends_with(&format!("/{p}"))
                    }
                }
                None => false,
            },
            View::Tree { root, filter } => {
                let under = match self.to_repo(&root.loc) {
                    Some(Mapped::Rel(r)) => {
                        r.is_empty()
                            || prefixes(p)
                                .any(|q| if root.glob { glob_match(&r, q) } else { r == q })
                    }
                    Some(Mapped::Suffix(a)) => prefixes(p).any(|q| a.ends_with(&format!("/{q}"))),
                    None => false,
                };
                under && filter.admits(p)
            }
        }
    }

    fn to_repo(&self, loc: &Loc) -> Option<Mapped> {
        match loc {
            Loc::Rel(r) => (!r.starts_with("..")).then(|| Mapped::Rel(r.clone())),
            Loc::Abs(a) if self.roots.is_empty() => Some(Mapped::Suffix(a.clone())),
            Loc::Abs(a) => self.roots.iter().find_map(|root| {
                if a == root {
                    Some(Mapped::Rel(String::new()))
                } else {
                    a.strip_prefix(root.as_str())
                        .and_then(|r| r.strip_prefix('/'))
                        .map(|r| Mapped::Rel(r.to_string()))
                }
            }),
        }
    }
}

enum Mapped {
    Rel(String),
    /// An absolute path with no known root: matched by suffix.
    Suffix(String),
}

/// tmux names the Enter key instead of typing a newline (`send-keys "ls" Enter`).
fn strip_key_names(keys: &str) -> &str {
    let t = keys.trim_end();
    for name in ["Enter", "C-m", "KPEnter"] {
        if let Some(rest) = t.strip_suffix(name) {
            if rest.is_empty() || rest.ends_with(char::is_whitespace) {
                return rest;
            }
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::paths::join;
    use super::*;

    fn sh(lines: &[&str]) -> Vec<TrajectoryCommand> {
        lines
            .iter()
            .map(|l| TrajectoryCommand::Shell(l.to_string()))
            .collect()
    }

    fn shows(lines: &[&str], path: &str) -> bool {
        ContentViews::from_trajectory(&sh(lines), [path]).shows(path)
    }

    const F: &str = "encryption/encryption.go";

    #[test]
    fn content_commands_count() {
        for line in [
            "cat encryption/encryption.go",
            "cat -n ./encryption/encryption.go | head -50",
            "head -n 40 encryption/encryption.go",
            "tail -20 encryption/encryption.go",
            "sed -n '1,80p' encryption/encryption.go",
            "sed -e 's/a/b/' encryption/encryption.go",
            "awk 'NR<10' encryption/encryption.go",
            "nl -ba encryption/encryption.go",
            "less +G encryption/encryption.go",
            "grep -n Encrypt encryption/encryption.go",
            "grep -rn Encrypt .",
            "grep -rn Encrypt",
            "grep -rn --include='*.go' Encrypt encryption",
            "grep -R -e Encrypt encryption/",
            "rg Encrypt",
            "rg -n Encrypt -g '*.go' encryption",
            "rg -t go Encrypt",
            "ag Encrypt",
            "git grep -n Encrypt",
            "git grep Encrypt -- encryption",
            "git show HEAD:encryption/encryption.go",
            "git blame encryption/encryption.go",
            "vim encryption/encryption.go",
            "nano +12 encryption/encryption.go",
            "cd encryption && cat encryption.go",
            "cd encryption; grep -n x *.go",
            "cat encryption/*.go",
            "sudo -u dev timeout 10 cat encryption/encryption.go",
            "FOO=1 env BAR=2 cat encryption/encryption.go",
            "bash -lc 'cd encryption && cat encryption.go'",
            "cat /testbed/encryption/encryption.go",
        ] {
            assert!(shows(&[line], F), "should count: {line}");
        }
    }

    #[test]
    fn path_only_commands_do_not_count() {
        for line in [
            "ls encryption",
            "ls -la encryption/encryption.go",
            "find . -name '*.go'",
            "rg --files",
            "rg --files | grep encryption",
            "rg -l Encrypt",
            "grep -rl Encrypt .",
            "grep -c Encrypt encryption/encryption.go",
            "grep -q Encrypt encryption/encryption.go",
            "git diff --stat",
            "git diff encryption/encryption.go",
            "git status",
            "git show HEAD",
            "ag -g encryption",
            "grep Encrypt encryption",
            "grep -rn Encrypt other/",
            "grep -rn --include='*.py' Encrypt .",
            "grep -rn --exclude-dir=encryption Encrypt .",
            "rg Encrypt -g '!*.go'",
            "rg -t py Encrypt",
            "sed -i 's/a/b/' encryption/encryption.go",
            "cat encryption/encryption.go > /tmp/copy",
            "cat encryption/encryption.go >/dev/null 2>&1",
            "cat > encryption/encryption.go <<'EOF'\npackage encryption\nEOF",
            "python3 -c \"print(open('encryption/encryption.go').read())\"",
            "find . -name '*.go' | xargs cat",
            "cat encryption.go",
            "cd ~ && cat encryption/encryption.go",
            "echo 'cat encryption/encryption.go'",
            "cat other/encryption/encryption.go.bak",
        ] {
            assert!(!shows(&[line], F), "should not count: {line}");
        }
    }

    #[test]
    fn cwd_scope_per_entry_kind() {
        // Each shell entry starts again at the repository root ...
        assert!(!shows(&["cd encryption", "cat encryption.go"], F));
        // ... while a terminal keeps its working directory.
        let keys = vec![
            TrajectoryCommand::Keys("cd encryption\n".into()),
            TrajectoryCommand::Keys("cat encryption.go Enter".into()),
        ];
        assert_eq!(strip_key_names("ls C-m"), "ls ");
        assert_eq!(strip_key_names("echo xEnter"), "echo xEnter");
        assert!(ContentViews::from_trajectory(&keys, [F]).shows(F));
        let argv = vec![TrajectoryCommand::Argv(vec!["cat".into(), F.into()])];
        assert!(ContentViews::from_trajectory(&argv, [F]).shows(F));
        let argv = vec![TrajectoryCommand::Argv(vec![
            "bash".into(),
            "-c".into(),
            format!("head {F}"),
        ])];
        assert!(ContentViews::from_trajectory(&argv, [F]).shows(F));
    }

    #[test]
    fn absolute_paths_use_inferred_roots() {
        // The root /testbed is inferred from a file the task involves, so a
        // recursive grep over /testbed covers the left-out file.
        let cmds = sh(&["cat /testbed/main.go", "grep -rn Encrypt /testbed"]);
        let v = ContentViews::from_trajectory(&cmds, ["main.go", F]);
        assert_eq!(v.roots, vec!["/testbed".to_string()]);
        assert!(v.shows(F));
        // Without any evidence of the root, only a suffix can match.
        let cmds = sh(&["grep -rn Encrypt /testbed"]);
        assert!(!ContentViews::from_trajectory(&cmds, [F]).shows(F));
        let cmds = sh(&["grep -rn Encrypt /testbed/encryption"]);
        assert!(ContentViews::from_trajectory(&cmds, [F]).shows(F));
        // With a known root, paths outside it do not match by suffix.
        let cmds = sh(&["grep -rn Encrypt /opt/encryption"]);
        assert!(ContentViews::from_trajectory(&cmds, [F]).shows(F));
        let cmds = sh(&["cat /testbed/main.go", "grep -rn Encrypt /opt/encryption"]);
        assert!(!ContentViews::from_trajectory(&cmds, ["main.go", F]).shows(F));
    }

    #[test]
    fn normalisation() {
        assert_eq!(
            join(&Some("a/b".into()), "../c"),
            Some(Loc::Rel("a/c".into()))
        );
        assert_eq!(
            join(&Some(String::new()), "./x/./y"),
            Some(Loc::Rel("x/y".into()))
        );
        assert_eq!(
            join(&Some("/r".into()), "x/../y"),
            Some(Loc::Abs("/r/y".into()))
        );
        assert_eq!(join(&None, "x"), None);
        assert_eq!(join(&None, "/x"), Some(Loc::Abs("/x".into())));
        assert_eq!(join(&Some(String::new()), "$HOME/x"), None);
    }
}
