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

use std::collections::BTreeSet;

use crate::glob::glob_match;
use crate::model::TrajectoryCommand;
use crate::shell::{split_commands, SimpleCommand, Word};

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

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Filter {
    /// grep `--include`: basename globs, one must match when non-empty.
    include: Vec<String>,
    /// grep `--exclude`: basename globs.
    exclude: Vec<String>,
    /// grep `--exclude-dir`: directory-name globs.
    exclude_dir: Vec<String>,
    /// rg `-g`: (glob, negated); globs with `/` match the path, others the basename.
    globs: Vec<(String, bool)>,
    /// rg `-t`: allowed extensions (empty: any).
    types: Vec<&'static str>,
    /// rg `-T`: refused extensions.
    not_types: Vec<&'static str>,
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

/// `a/b/c` -> `a`, `a/b`, `a/b/c`.
fn prefixes(p: &str) -> impl Iterator<Item = &str> {
    p.match_indices('/')
        .map(move |(i, _)| &p[..i])
        .chain(std::iter::once(p))
}

impl Filter {
    fn admits(&self, p: &str) -> bool {
        let base = p.rsplit('/').next().unwrap_or(p);
        if !self.include.is_empty() && !self.include.iter().any(|g| glob_match(g, base)) {
            return false;
        }
        if self.exclude.iter().any(|g| glob_match(g, base)) {
            return false;
        }
        let dirs: Vec<&str> = p.split('/').collect();
        let dirs = &dirs[..dirs.len() - 1];
        if self
            .exclude_dir
            .iter()
            .any(|g| dirs.iter().any(|d| glob_match(g, d)))
        {
            return false;
        }
        let glob_hits = |g: &str| {
            if g.contains('/') {
                let g = g.strip_prefix('/').unwrap_or(g);
                glob_match(g, p) || glob_match(&format!("**/{g}"), p)
            } else {
                glob_match(g, base)
            }
        };
        if self.globs.iter().any(|(g, neg)| *neg && glob_hits(g)) {
            return false;
        }
        let positive: Vec<&str> = self
            .globs
            .iter()
            .filter(|(_, neg)| !neg)
            .map(|(g, _)| g.as_str())
            .collect();
        if !positive.is_empty() && !positive.iter().any(|g| glob_hits(g)) {
            return false;
        }
        let ext = base.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
        if !self.types.is_empty() && !self.types.contains(&ext) {
            return false;
        }
        !self.not_types.contains(&ext)
    }
}

/// Extensions of the common ripgrep file types; an unknown type filters nothing.
fn type_exts(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        "py" | "python" => &["py", "pyi"],
        "go" => &["go"],
        "rust" | "rs" => &["rs"],
        "js" => &["js", "jsx", "mjs", "cjs"],
        "ts" | "typescript" => &["ts", "tsx", "mts", "cts"],
        "java" => &["java"],
        "c" => &["c", "h"],
        "cpp" => &["cpp", "cc", "cxx", "hpp", "hh", "hxx", "h"],
        "ruby" | "rb" => &["rb"],
        "sh" => &["sh", "bash", "zsh"],
        "md" | "markdown" => &["md", "markdown"],
        "json" => &["json"],
        "yaml" => &["yaml", "yml"],
        "toml" => &["toml"],
        "html" => &["html", "htm"],
        "css" => &["css"],
        "php" => &["php"],
        "cs" | "csharp" => &["cs"],
        "kotlin" => &["kt", "kts"],
        "swift" => &["swift"],
        "scala" => &["scala"],
        _ => return None,
    })
}

/// Options of one command: which take an argument.
struct Spec {
    short_arg: &'static str,
    long_arg: &'static [&'static str],
}

#[derive(Debug, Default)]
struct Parsed {
    /// `-x` or `--name`, with the value when the option takes one.
    flags: Vec<(String, Option<String>)>,
    positionals: Vec<Word>,
}

impl Parsed {
    fn has(&self, names: &[&str]) -> bool {
        self.flags.iter().any(|(f, _)| names.contains(&f.as_str()))
    }

    fn values<'a>(&'a self, names: &'a [&'a str]) -> impl Iterator<Item = &'a str> + 'a {
        self.flags
            .iter()
            .filter(move |(f, _)| names.contains(&f.as_str()))
            .filter_map(|(_, v)| v.as_deref())
    }
}

/// GNU-style option parsing; with `stop_at_operand`, everything from the
/// first operand on is an operand (wrappers such as `sudo` and `timeout`).
fn parse_opts(args: &[Word], spec: &Spec, stop_at_operand: bool) -> Parsed {
    let mut out = Parsed::default();
    let mut i = 0;
    let mut only_operands = false;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        let t = a.text.as_str();
        if only_operands || t == "-" || !t.starts_with('-') || t.len() < 2 {
            out.positionals.push(a.clone());
            if stop_at_operand {
                only_operands = true;
            }
            continue;
        }
        if t == "--" {
            only_operands = true;
            continue;
        }
        if let Some(long) = t.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let value = if value.is_none() && spec.long_arg.contains(&name) && i < args.len() {
                i += 1;
                Some(args[i - 1].text.clone())
            } else {
                value
            };
            out.flags.push((format!("--{name}"), value));
            continue;
        }
        let chars: Vec<char> = t[1..].chars().collect();
        for (j, c) in chars.iter().enumerate() {
            if spec.short_arg.contains(*c) {
                let rest: String = chars[j + 1..].iter().collect();
                let value = if !rest.is_empty() {
                    Some(rest)
                } else if i < args.len() {
                    i += 1;
                    Some(args[i - 1].text.clone())
                } else {
                    None
                };
                out.flags.push((format!("-{c}"), value));
                break;
            }
            out.flags.push((format!("-{c}"), None));
        }
    }
    out
}

const NO_ARGS: Spec = Spec {
    short_arg: "",
    long_arg: &[],
};

#[derive(Default)]
struct Interp {
    views: Vec<View>,
}

impl Interp {
    fn line(&mut self, text: &str, cwd: &mut Option<String>, depth: usize) {
        if depth > 4 {
            return;
        }
        for cmd in split_commands(text) {
            self.command(&cmd, cwd, depth);
        }
    }

    fn command(&mut self, cmd: &SimpleCommand, cwd: &mut Option<String>, depth: usize) {
        let mut words: &[Word] = &cmd.words;
        // Leading `NAME=value` assignments.
        while let Some(w) = words.first() {
            let is_assignment = w.text.split_once('=').is_some_and(|(n, _)| {
                !n.is_empty()
                    && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !n.starts_with(|c: char| c.is_ascii_digit())
            });
            if !is_assignment {
                break;
            }
            words = &words[1..];
        }
        // Wrappers that run their operand as a command.
        loop {
            let Some(first) = words.first() else { return };
            let spec = match base(&first.text) {
                "sudo" => Spec {
                    short_arg: "ugCDhprtTU",
                    long_arg: &["user", "group", "chdir", "host", "prompt", "role", "type"],
                },
                "env" => Spec {
                    short_arg: "uCS",
                    long_arg: &["unset", "chdir", "split-string"],
                },
                "timeout" => Spec {
                    short_arg: "sk",
                    long_arg: &["signal", "kill-after"],
                },
                "nice" => Spec {
                    short_arg: "n",
                    long_arg: &["adjustment"],
                },
                "stdbuf" => Spec {
                    short_arg: "ioe",
                    long_arg: &["input", "output", "error"],
                },
                "ionice" => Spec {
                    short_arg: "cnp",
                    long_arg: &["class", "classdata", "pid"],
                },
                "exec" => Spec {
                    short_arg: "a",
                    long_arg: &[],
                },
                "nohup" | "time" | "command" | "builtin" | "unbuffer" => NO_ARGS,
                _ => break,
            };
            let name = base(&first.text).to_string();
            let parsed = parse_opts(&words[1..], &spec, true);
            let mut ops: &[Word] = &words[words.len() - parsed.positionals.len()..];
            if name == "env" {
                while ops.first().is_some_and(|w| w.text.contains('=')) {
                    ops = &ops[1..];
                }
            }
            if name == "timeout" && !ops.is_empty() {
                ops = &ops[1..];
            }
            words = ops;
        }
        let name = base(&words[0].text);
        let args = &words[1..];
        match name {
            "cd" | "pushd" => {
                let parsed = parse_opts(args, &NO_ARGS, false);
                *cwd = match parsed.positionals.first() {
                    Some(w) => join(cwd, &w.text).map(|l| match l {
                        Loc::Rel(r) => r,
                        Loc::Abs(a) => a,
                    }),
                    None => None,
                };
                return;
            }
            "bash" | "sh" | "zsh" | "dash" | "ksh" => {
                let parsed = parse_opts(
                    args,
                    &Spec {
                        short_arg: "oO",
                        long_arg: &[],
                    },
                    false,
                );
                if parsed.has(&["-c"]) {
                    if let Some(script) = parsed.positionals.first() {
                        let mut inner = cwd.clone();
                        self.line(&script.text, &mut inner, depth + 1);
                    }
                }
                return;
            }
            _ => {}
        }
        if cmd.stdout_to_file() {
            return;
        }
        let files = |this: &mut Self, cwd: &Option<String>, ops: &[Word]| {
            for w in ops {
                if w.text == "-" {
                    continue;
                }
                if let Some(loc) = join(cwd, &w.text) {
                    this.views.push(View::File(PathPat { loc, glob: w.glob }));
                }
            }
        };
        match name {
            "cat" | "tac" | "more" | "most" => {
                let p = parse_opts(args, &NO_ARGS, false);
                let ops: Vec<Word> = p
                    .positionals
                    .into_iter()
                    .filter(|w| !w.text.starts_with('+'))
                    .collect();
                files(self, cwd, &ops);
            }
            "less" => {
                let p = parse_opts(
                    args,
                    &Spec {
                        short_arg: "bhjkoOpPtTxyz#",
                        long_arg: &[],
                    },
                    false,
                );
                let ops: Vec<Word> = p
                    .positionals
                    .into_iter()
                    .filter(|w| !w.text.starts_with('+'))
                    .collect();
                files(self, cwd, &ops);
            }
            "nl" => {
                let p = parse_opts(
                    args,
                    &Spec {
                        short_arg: "bdfhilnsvw",
                        long_arg: &[],
                    },
                    false,
                );
                files(self, cwd, &p.positionals);
            }
            "bat" | "batcat" => {
                let p = parse_opts(
                    args,
                    &Spec {
                        short_arg: "lrHm",
                        long_arg: &[
                            "language",
                            "line-range",
                            "highlight-line",
                            "style",
                            "theme",
                            "map-syntax",
                            "tabs",
                            "wrap",
                            "terminal-width",
                            "color",
                            "paging",
                            "decorations",
                            "file-name",
                            "diff-context",
                            "italic-text",
                            "pager",
                            "squeeze-limit",
                            "nonprintable-notation",
                            "binary",
                        ],
                    },
                    false,
                );
                files(self, cwd, &p.positionals);
            }
            "head" | "tail" => {
                let p = parse_opts(
                    args,
                    &Spec {
                        short_arg: "ncs",
                        long_arg: &[
                            "lines",
                            "bytes",
                            "sleep-interval",
                            "pid",
                            "max-unchanged-stats",
                        ],
                    },
                    false,
                );
                files(self, cwd, &p.positionals);
            }
            "sed" => {
                let p = parse_opts(
                    args,
                    &Spec {
                        short_arg: "efl",
                        long_arg: &["expression", "file", "line-length"],
                    },
                    false,
                );
                if p.has(&["-i", "--in-place"]) {
                    return;
                }
                let script_given = p.has(&["-e", "-f", "--expression", "--file"]);
                let ops = if script_given {
                    &p.positionals[..]
                } else {
                    p.positionals.get(1..).unwrap_or(&[])
                };
                files(self, cwd, ops);
            }
            "awk" | "gawk" | "mawk" | "nawk" => {
                let p = parse_opts(
                    args,
                    &Spec {
                        short_arg: "fvF",
                        long_arg: &["file", "assign", "field-separator"],
                    },
                    false,
                );
                let prog_given = p.has(&["-f", "--file"]);
                let ops = if prog_given {
                    &p.positionals[..]
                } else {
                    p.positionals.get(1..).unwrap_or(&[])
                };
                let ops: Vec<Word> = ops
                    .iter()
                    .filter(|w| !w.text.contains('='))
                    .cloned()
                    .collect();
                files(self, cwd, &ops);
            }
            "grep" | "egrep" | "fgrep" | "zgrep" => self.grep(args, cwd),
            "rg" => self.rg(args, cwd),
            "ag" | "ack" | "ack-grep" => self.ag(name, args, cwd),
            "git" => self.git(args, cwd),
            "vim" | "vi" | "nvim" | "view" | "vimdiff" | "gvim" => {
                let p = parse_opts(
                    args,
                    &Spec {
                        short_arg: "cSuiTtqwWs",
                        long_arg: &["cmd"],
                    },
                    false,
                );
                let ops: Vec<Word> = p
                    .positionals
                    .into_iter()
                    .filter(|w| !w.text.starts_with('+'))
                    .collect();
                files(self, cwd, &ops);
            }
            "nano" | "pico" | "emacs" | "emacsclient" | "micro" => {
                let p = parse_opts(args, &NO_ARGS, false);
                let ops: Vec<Word> = p
                    .positionals
                    .into_iter()
                    .filter(|w| !w.text.starts_with('+'))
                    .collect();
                files(self, cwd, &ops);
            }
            _ => {}
        }
    }

    fn tree(&mut self, cwd: &Option<String>, roots: &[Word], filter: Filter) {
        if roots.is_empty() {
            if let Some(loc) = join(cwd, ".") {
                self.views.push(View::Tree {
                    root: PathPat { loc, glob: false },
                    filter,
                });
            }
            return;
        }
        for w in roots {
            if let Some(loc) = join(cwd, &w.text) {
                self.views.push(View::Tree {
                    root: PathPat { loc, glob: w.glob },
                    filter: filter.clone(),
                });
            }
        }
    }

    fn grep(&mut self, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(
            args,
            &Spec {
                short_arg: "efmABCdD",
                long_arg: &[
                    "regexp",
                    "file",
                    "max-count",
                    "after-context",
                    "before-context",
                    "context",
                    "include",
                    "exclude",
                    "exclude-dir",
                    "exclude-from",
                    "label",
                    "binary-files",
                    "devices",
                    "directories",
                    "group-separator",
                ],
            },
            false,
        );
        if p.has(&[
            "-l",
            "-L",
            "-c",
            "-q",
            "--files-with-matches",
            "--files-without-match",
            "--count",
            "--quiet",
            "--silent",
        ]) {
            return;
        }
        let pattern_given = p.has(&["-e", "-f", "--regexp", "--file"]);
        let ops = if pattern_given {
            &p.positionals[..]
        } else {
            p.positionals.get(1..).unwrap_or(&[])
        };
        let recursive = p.has(&["-r", "-R", "--recursive", "--dereference-recursive"])
            || p.values(&["-d", "--directories"]).any(|v| v == "recurse");
        if recursive {
            let filter = Filter {
                include: p.values(&["--include"]).map(str::to_string).collect(),
                exclude: p.values(&["--exclude"]).map(str::to_string).collect(),
                exclude_dir: p.values(&["--exclude-dir"]).map(str::to_string).collect(),
                ..Filter::default()
            };
            self.tree(cwd, ops, filter);
        } else {
            for w in ops {
                if let Some(loc) = join(cwd, &w.text) {
                    self.views.push(View::File(PathPat { loc, glob: w.glob }));
                }
            }
        }
    }

    fn rg(&mut self, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(
            args,
            &Spec {
                short_arg: "efgtTABCmMjErd",
                long_arg: &[
                    "regexp",
                    "file",
                    "glob",
                    "iglob",
                    "type",
                    "type-not",
                    "after-context",
                    "before-context",
                    "context",
                    "max-count",
                    "max-columns",
                    "threads",
                    "encoding",
                    "replace",
                    "max-depth",
                    "type-add",
                    "type-clear",
                    "color",
                    "colors",
                    "sort",
                    "sortr",
                    "pre",
                    "pre-glob",
                    "path-separator",
                    "context-separator",
                    "field-match-separator",
                    "field-context-separator",
                    "ignore-file",
                    "max-filesize",
                    "dfa-size-limit",
                    "regex-size-limit",
                    "engine",
                    "generate",
                    "hyperlink-format",
                ],
            },
            false,
        );
        if p.has(&[
            "-l",
            "-c",
            "-q",
            "--files",
            "--files-with-matches",
            "--files-without-match",
            "--count",
            "--count-matches",
            "--quiet",
            "--type-list",
        ]) {
            return;
        }
        let pattern_given = p.has(&["-e", "-f", "--regexp", "--file"]);
        let ops = if pattern_given {
            &p.positionals[..]
        } else {
            p.positionals.get(1..).unwrap_or(&[])
        };
        let mut filter = Filter::default();
        for g in p.values(&["-g", "--glob", "--iglob"]) {
            match g.strip_prefix('!') {
                Some(neg) => filter.globs.push((neg.to_string(), true)),
                None => filter.globs.push((g.to_string(), false)),
            }
        }
        for t in p.values(&["-t", "--type"]) {
            if let Some(exts) = type_exts(t) {
                filter.types.extend_from_slice(exts);
            }
        }
        for t in p.values(&["-T", "--type-not"]) {
            if let Some(exts) = type_exts(t) {
                filter.not_types.extend_from_slice(exts);
            }
        }
        self.tree(cwd, ops, filter);
    }

    fn ag(&mut self, name: &str, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(
            args,
            &Spec {
                short_arg: "ABCGmp",
                long_arg: &[
                    "after",
                    "before",
                    "context",
                    "file-search-regex",
                    "max-count",
                    "path-to-ignore",
                    "depth",
                    "ignore",
                    "ignore-dir",
                    "type",
                    "match",
                ],
            },
            false,
        );
        let listing: &[&str] = if name == "ag" {
            &[
                "-l",
                "-L",
                "-c",
                "-g",
                "--count",
                "--files-with-matches",
                "--files-without-matches",
                "--list-file-types",
            ]
        } else {
            &[
                "-l",
                "-L",
                "-c",
                "-f",
                "-g",
                "--count",
                "--files-with-matches",
                "--files-without-matches",
                "--help-types",
            ]
        };
        if p.has(listing) {
            return;
        }
        let ops = p.positionals.get(1..).unwrap_or(&[]);
        self.tree(cwd, ops, Filter::default());
    }

    fn git(&mut self, args: &[Word], cwd: &Option<String>) {
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
                if p.has(&[
                    "-l",
                    "-L",
                    "-c",
                    "-q",
                    "--name-only",
                    "--files-with-matches",
                    "--files-without-match",
                    "--count",
                    "--quiet",
                    "-O",
                    "--open-files-in-pager",
                ]) {
                    return;
                }
                let pattern_given = p.has(&["-e", "-f", "--regexp", "--file"]);
                let ops = if pattern_given {
                    &p.positionals[..]
                } else {
                    p.positionals.get(1..).unwrap_or(&[])
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

fn looks_like_rev(s: &str) -> bool {
    s.contains("HEAD")
        || s.contains("..")
        || s.contains('~')
        || s.contains('^')
        || s.contains('@')
        || ((7..=40).contains(&s.len()) && s.chars().all(|c| c.is_ascii_hexdigit()))
}

fn base(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// Join an operand to the working directory and normalise `.` and `..`.
/// `None` when the result cannot be known (unknown cwd, `~`, variables).
fn join(cwd: &Option<String>, op: &str) -> Option<Loc> {
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

#[cfg(test)]
mod tests {
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
